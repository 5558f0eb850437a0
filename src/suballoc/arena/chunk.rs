//! `Chunk`: one allocation from the upstream, and how the arena grows by taking another.

use super::global::{Global, Run};
use super::tags::Tags;
use super::{Arena, GRAN, MAX_CHUNKS, NAME};
use crate::resource::{AllocError, AllocErrorKind, MemoryResource};
use crate::suballoc::growth::Locks;
use std::sync::atomic::Ordering;

/// One allocation from the upstream.
#[derive(Debug)]
pub(super) struct Chunk {
    /// What the upstream returned, for giving it back.
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) align: usize,
    /// The usable range, rounded to 256.
    start: usize,
    end: usize,
}

impl Chunk {
    /// Bytes of the upstream allocation outside the usable range (alignment slack).
    pub(super) fn slack(&self) -> usize {
        self.len - (self.end - self.start)
    }
}

impl<U: MemoryResource> Arena<U> {
    /// The chunk that holds `addr`, with its index.
    pub(super) fn chunk_of(&self, addr: usize) -> Option<(u32, &Chunk)> {
        let n = self.nchunks.load(Ordering::Acquire);
        self.chunks[..n]
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i as u32, c.get()?)))
            .find(|(_, c)| c.start <= addr && addr < c.end)
    }

    /// Takes a new piece of at least `need` bytes from the upstream: all that is left to take if
    /// the upstream agrees, else halves down to `need`. Called with no lock of the arena held;
    /// the global lock is let go around the upstream's `allocate`, which may run the caller's
    /// code (a [`Retry`](crate::adaptor::Retry) callback that frees blocks through this arena),
    /// the bytes asked for counting against the size meanwhile ([`Global::in_flight`]). `Ok` when
    /// a chunk went in, or when another thread's growth was under way, which it waited for (one
    /// growth at a time): either way the caller looks again.
    pub(super) fn grow(&self, need: usize) -> Result<(), AllocError> {
        let oom = AllocError::out_of_memory(need, GRAN, NAME);
        let locks = Locks {
            state: &self.global,
            grown: &self.grown,
            in_flight: Global::in_flight,
        };
        let room =
            |g: &Global| self.max_size - self.taken.load(Ordering::Relaxed) - g.in_flight.bytes();
        let mut g = locks.lock();
        if need == 0 || self.nchunks.load(Ordering::Relaxed) == MAX_CHUNKS {
            return Err(oom);
        }
        // One growth at a time (but a thread's own, from inside its growth): another thread's
        // chunk may serve this request, as it did when the lock was held around the upstream.
        if g.in_flight.worth_waiting() {
            drop(locks.wait(g));
            return Ok(());
        }
        if need > room(&g) {
            return Err(oom);
        }
        let mut len = room(&g);
        loop {
            let taken;
            (g, taken) = locks.unlocked(g, len, || self.take_chunk(len));
            match taken {
                Ok((ptr, align)) => {
                    let n = self.nchunks.load(Ordering::Relaxed);
                    if n < MAX_CHUNKS {
                        self.add_chunk(&mut g, n, ptr, len, align);
                        return Ok(());
                    }
                    drop(g);
                    // Others filled the chunk table meanwhile: this one goes back.
                    self.give_chunk_back(ptr, len, align);
                    return Err(oom);
                }
                Err(e) if e.is_out_of_memory() && len > need => {
                    len = ((len / 2) & !(GRAN - 1)).max(need);
                }
                Err(e) => return Err(e),
            }
            // Re-entrant growths may have taken some room meanwhile.
            if need > room(&g) {
                return Err(oom);
            }
            len = len.min(room(&g));
        }
    }

    /// Gives back a chunk just taken with `len` and `align`, that nothing used.
    fn give_chunk_back(&self, ptr: usize, len: usize, align: usize) {
        if let Some(ptr) = std::ptr::NonNull::new(std::ptr::with_exposed_provenance_mut(ptr)) {
            // SAFETY: taken from the upstream by `take_chunk` (on the default stream, synchronized)
            // with this size and alignment, and recorded nowhere.
            unsafe {
                self.upstream
                    .deallocate(ptr, len, align, crate::stream::StreamRef::DEFAULT)
            };
        }
    }

    fn take_chunk(&self, len: usize) -> Result<(usize, usize), AllocError> {
        let mut refused = None;
        for align in [self.superblock_size(), GRAN, 1] {
            // allocate_sync: fresh memory may then go to any stream without ordering.
            match self.upstream.allocate_sync(len, align) {
                Ok(p) => return Ok((p.as_ptr() as usize, align)),
                Err(e) if matches!(e.kind, AllocErrorKind::Unsupported(_)) => refused = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(refused.unwrap_or(AllocError::out_of_memory(len, GRAN, NAME)))
    }

    fn add_chunk(&self, g: &mut Global, index: usize, ptr: usize, len: usize, align: usize) {
        let start = (ptr + GRAN - 1) & !(GRAN - 1);
        let end = ((ptr + len) & !(GRAN - 1)).max(start);
        let chunk = Chunk {
            ptr,
            len,
            align,
            start,
            end,
        };
        let _ = self.chunks[index].set(chunk);
        self.nchunks.store(index + 1, Ordering::Release);
        self.taken.fetch_add(len, Ordering::Relaxed);
        if end > start {
            g.insert(
                start,
                Run {
                    len: end - start,
                    chunk: index as u32,
                    tags: Tags::NONE,
                },
            );
        }
    }
}
