//! `Chunk`: one allocation from the upstream, and how the arena grows by taking another.

use super::global::{Global, Run};
use super::tags::Tags;
use super::{Arena, GRAN, MAX_CHUNKS, NAME};
use crate::resource::{AllocError, AllocErrorKind, MemoryResource};
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
    /// the upstream agrees, else halves down to `need`.
    pub(super) fn grow(&self, g: &mut Global, need: usize) -> Result<(), AllocError> {
        let remaining = self.max_size - self.taken.load(Ordering::Relaxed);
        let n = self.nchunks.load(Ordering::Relaxed);
        let oom = AllocError::out_of_memory(need, GRAN, NAME);
        if n == MAX_CHUNKS || need > remaining || need == 0 {
            return Err(oom);
        }
        let mut len = remaining;
        loop {
            match self.take_chunk(len) {
                Ok((ptr, align)) => {
                    self.add_chunk(g, n, ptr, len, align);
                    return Ok(());
                }
                Err(e) if e.is_out_of_memory() && len > need => {
                    len = ((len / 2) & !(GRAN - 1)).max(need);
                }
                Err(e) => return Err(e),
            }
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
