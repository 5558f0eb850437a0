//! The free lists of one block size, per stream, over chunks of an upstream: what `FixedSize` is and each `Binning` bin is.

use super::growth::{order_or_wait, FirstPanic, InFlight, Locks};
use super::usage::{Meter, Usage};
use crate::resource::{AllocError, AllocErrorKind, MemoryResource};
use crate::stream::{Held, IdMap, StreamId, StreamKeeper, StreamRef};
use std::ptr::NonNull;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Block sizes are multiples of this, which is also the alignment every block meets.
pub(crate) const GRANULE: usize = 256;

/// What a [`Bin`] takes chunks from: the owner's upstream, the meter that counts what the owner
/// holds (a `Binning` has one meter for all its bins), and the owner's name for errors.
#[derive(Debug)]
pub(crate) struct Upstream<'a, U> {
    pub(crate) upstream: &'a U,
    pub(crate) meter: &'a Meter,
    pub(crate) name: &'static str,
}

impl<U> Clone for Upstream<'_, U> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<U> Copy for Upstream<'_, U> {}

/// How a [`Bin`] with no free block grows: decided in the slow path, off the hot one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Growth {
    /// By this many blocks (FixedSize's `blocks_to_preallocate`).
    Fixed(usize),
    /// By as many blocks as the bin holds, between 1 and this many (Binning's geometric refill).
    Double(usize),
}

/// The state of one block size: free lists per stream and the chunks they were carved from. It
/// does not own its upstream, so that [`Binning`](crate::suballoc::Binning) can keep one per bin
/// over the upstream it owns: every call that needs the upstream is given it.
///
/// The stream used last owns `lists[0]`, the current list; every other list holds at least one
/// free block (a current list left empty is dropped when another stream becomes current), so the
/// lists are at most one more than the streams with free blocks, and "another stream with free
/// blocks" is `lists[1]`, found without a scan. `index` finds a stream's list by its identity.
/// Each list and each chunk holds its stream in the keeper; a list that goes releases it, so a
/// stream with no free block and no chunk here is no longer kept.
#[derive(Debug)]
pub(crate) struct Bin {
    block: usize,
    /// Free block addresses per stream; `lists[0]` is the current stream's.
    lists: Vec<List>,
    /// The position in `lists` of each stream's list, by the stream's identity.
    index: IdMap<usize>,
    /// The identity of `lists[0]`'s stream, for the fast path's one comparison.
    first: StreamId,
    chunks: Vec<BinChunk>,
    /// Bytes held from the upstream.
    held: usize,
    /// Growths under way, with the lock let go (see [`Bin::pop`]).
    in_flight: InFlight,
    /// Keeps alive every stream a `Held` above names (declared last: dropped after them).
    streams: StreamKeeper,
}

/// A [`Bin`] under its lock, with the condition its growths signal when they end.
#[derive(Debug)]
pub(crate) struct BinLock {
    bin: Mutex<Bin>,
    grown: Condvar,
    /// The bin's block size, which never changes: read without the lock.
    block: usize,
}

impl BinLock {
    /// An empty bin of `block`-byte blocks.
    pub(crate) fn new(block: usize) -> Self {
        BinLock {
            bin: Mutex::new(Bin::new(block)),
            grown: Condvar::new(),
            block,
        }
    }

    /// The size of every block.
    pub(crate) fn block(&self) -> usize {
        self.block
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Bin> {
        // Bin's updates complete before any upstream call (the only thing that may panic while
        // it is locked), so the state behind a poisoned lock is consistent.
        self.bin.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bin, for a drop.
    pub(crate) fn get_mut(&mut self) -> &mut Bin {
        self.bin.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    fn locks(&self) -> Locks<'_, Bin> {
        Locks {
            state: &self.bin,
            grown: &self.grown,
            in_flight: Bin::in_flight,
        }
    }

    /// A free block for work on `stream` ([`Bin::pop`]), with the bin's lock, held since.
    #[inline]
    pub(crate) fn pop<U: MemoryResource>(
        &self,
        from: Upstream<'_, U>,
        stream: StreamRef,
        growth: Growth,
        size: usize,
        align: usize,
    ) -> Result<(usize, MutexGuard<'_, Bin>), AllocError> {
        Bin::pop(
            self.lock(),
            &self.locks(),
            from,
            stream,
            growth,
            size,
            align,
        )
    }

    /// Takes a chunk of `count` blocks on `stream` ([`Bin::grow`]): a preallocation, before
    /// any other thread can use the bin.
    pub(crate) fn grow<U: MemoryResource>(
        &self,
        from: Upstream<'_, U>,
        count: usize,
        stream: StreamRef,
    ) -> Result<(), AllocError> {
        let block = self.block;
        Bin::grow(
            self.lock(),
            &self.locks(),
            from,
            count,
            false,
            stream,
            block,
            GRANULE,
        )
        .map(drop)
    }
}

#[derive(Debug)]
struct List {
    stream: Held,
    /// Blocks freed on the stream, one address each.
    blocks: Vec<usize>,
    /// Fresh chunks (or what is left of them) not handed out yet, each a range of whole blocks:
    /// listed as a range, not block by block, so that the host holds O(chunks) for them however
    /// many blocks a chunk holds (a preallocation of a billion blocks takes no host memory).
    fresh: Vec<Fresh>,
}

/// `[next, end)`: blocks of a fresh chunk not handed out yet.
#[derive(Debug, Clone, Copy)]
struct Fresh {
    next: usize,
    end: usize,
}

impl List {
    fn new(stream: Held) -> Self {
        List {
            stream,
            blocks: Vec::new(),
            fresh: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.fresh.is_empty()
    }

    /// Free blocks, of `block` bytes.
    fn len(&self, block: usize) -> usize {
        self.blocks.len()
            + self
                .fresh
                .iter()
                .map(|f| (f.end - f.next) / block)
                .sum::<usize>()
    }

    /// A free block: the last freed, else the next of a fresh chunk (from its start).
    #[inline]
    fn pop(&mut self, block: usize) -> Option<usize> {
        if let Some(addr) = self.blocks.pop() {
            return Some(addr);
        }
        let fresh = self.fresh.last_mut()?;
        let addr = fresh.next;
        fresh.next += block;
        if fresh.next >= fresh.end {
            self.fresh.pop();
        }
        Some(addr)
    }

    /// Takes every block of `other`.
    fn absorb(&mut self, other: List) {
        self.blocks.extend(other.blocks);
        self.fresh.extend(other.fresh);
    }
}

#[derive(Debug, Clone, Copy)]
struct BinChunk {
    addr: usize,
    size: usize,
    stream: Held,
}

impl Bin {
    /// An empty bin of `block`-byte blocks (`block` a positive multiple of 256).
    pub(crate) fn new(block: usize) -> Self {
        Bin {
            block,
            lists: Vec::new(),
            index: IdMap::default(),
            first: StreamId::DEFAULT,
            chunks: Vec::new(),
            held: 0,
            in_flight: InFlight::default(),
            streams: StreamKeeper::default(),
        }
    }

    /// Its growths under way.
    fn in_flight(&mut self) -> &mut InFlight {
        &mut self.in_flight
    }

    /// The size of every block.
    pub(crate) fn block(&self) -> usize {
        self.block
    }

    /// Free blocks, over all streams.
    pub(crate) fn free_blocks(&self) -> usize {
        // Summed when asked (a report), not counted on every pop and push.
        self.lists.iter().map(|l| l.len(self.block)).sum()
    }

    /// This bin's part of a [`Usage`] (all but the peak, which the owner's [`Meter`] keeps).
    pub(crate) fn usage(&self) -> Usage {
        let free_blocks = self.free_blocks();
        Usage {
            held: self.held,
            peak_held: 0,
            allocated: self.held - free_blocks * self.block,
            free_blocks,
            chunks: self.chunks.len(),
        }
    }

    /// Per-stream lists and streams kept (the default stream included), for the bounds tests.
    pub(crate) fn tracked(&self) -> (usize, usize) {
        (self.lists.len(), self.streams.held())
    }

    /// A free block for work on `stream`: one freed on `stream`, else one freed on another stream
    /// once `stream` is ordered after it, else one from a new chunk that `growth` sizes (fewer
    /// blocks if the upstream is short of memory). `size`/`align`/`name` only label errors.
    ///
    /// `bin` is the locked bin and `lock` takes its lock again: a growth lets the lock go around
    /// the upstream's `allocate`, which may run the caller's code (a
    /// [`Retry`](crate::adaptor::Retry) callback freeing blocks through the owner). Returns the
    /// block and the lock.
    #[inline]
    fn pop<'m, U: MemoryResource>(
        mut bin: MutexGuard<'m, Bin>,
        locks: &Locks<'m, Bin>,
        from: Upstream<'_, U>,
        stream: StreamRef,
        growth: Growth,
        size: usize,
        align: usize,
    ) -> Result<(usize, MutexGuard<'m, Bin>), AllocError> {
        if bin.first == stream.id() {
            let block = bin.block;
            if let Some(addr) = bin.lists.first_mut().and_then(|l| l.pop(block)) {
                return Ok((addr, bin));
            }
        }
        Self::pop_slow(bin, locks, from, stream, growth, size, align)
    }

    #[cold]
    fn pop_slow<'m, U: MemoryResource>(
        mut bin: MutexGuard<'m, Bin>,
        locks: &Locks<'m, Bin>,
        from: Upstream<'_, U>,
        stream: StreamRef,
        growth: Growth,
        size: usize,
        align: usize,
    ) -> Result<(usize, MutexGuard<'m, Bin>), AllocError> {
        loop {
            bin.make_current(stream);
            if !bin.lists[0].is_empty() {
                break;
            }
            // Every list but the current one holds free blocks.
            if let Some(other) = bin.lists.get(1) {
                from.upstream
                    .order_after(stream, bin.streams.get(other.stream))?;
                let other = bin.remove_list(1);
                bin.lists[0].absorb(other);
                break;
            }
            // One growth at a time (but a thread's own, from inside its growth): another thread's
            // chunk may serve this request, as it did when the lock was held around the upstream.
            if bin.in_flight.worth_waiting() {
                bin = locks.wait(bin);
                continue;
            }
            let count = match growth {
                Growth::Fixed(n) => n,
                Growth::Double(max) => (bin.held / bin.block).clamp(1, max),
            };
            bin = Self::grow(bin, locks, from, count, true, stream, size, align)?;
            break;
        }
        let block = bin.block;
        let addr = bin.lists[0]
            .pop(block)
            .ok_or(AllocError::out_of_memory(size, align, from.name))?;
        Ok((addr, bin))
    }

    /// Moves up to `n` more free blocks of `stream` to `out`, when `stream`'s list is the current
    /// one (as after a [`pop`](Self::pop) for it): a thread cache's refill, with no ordering and
    /// no growth.
    pub(crate) fn pop_more(&mut self, stream: StreamRef, n: usize, out: &mut Vec<usize>) {
        if self.first != stream.id() {
            return;
        }
        if let Some(list) = self.lists.first_mut() {
            let at = list.blocks.len().saturating_sub(n);
            let mut more = list.blocks.len() - at;
            out.extend(list.blocks.drain(at..));
            while more < n && !list.fresh.is_empty() {
                out.extend(list.pop(self.block));
                more += 1;
            }
        }
    }

    /// Makes each of `addrs` free on `stream`.
    pub(crate) fn push_all(&mut self, addrs: impl IntoIterator<Item = usize>, stream: StreamRef) {
        if self.lists.is_empty() || self.first != stream.id() {
            self.make_current(stream);
        }
        if let Some(list) = self.lists.first_mut() {
            list.blocks.extend(addrs);
        }
    }

    /// Makes `addr` free on `stream`.
    #[inline]
    pub(crate) fn push(&mut self, addr: usize, stream: StreamRef) {
        if self.lists.is_empty() || self.first != stream.id() {
            self.make_current(stream);
        }
        if let Some(list) = self.lists.first_mut() {
            list.blocks.push(addr);
        }
    }

    /// Makes `stream`'s list (created if missing) `lists[0]`, so that the next calls on the same
    /// stream find it first; the previous current list goes if it is empty. O(1) expected.
    fn make_current(&mut self, stream: StreamRef) {
        let id = stream.id();
        if !self.lists.is_empty() && self.first == id {
            return;
        }
        if self.lists.first().is_some_and(List::is_empty) {
            self.remove_list(0);
        }
        match self.index.get(&id) {
            Some(&i) => self.swap(0, i),
            None => {
                let held = self.streams.hold(stream);
                self.index.insert(id, self.lists.len());
                self.lists.push(List::new(held));
                self.swap(0, self.lists.len() - 1);
            }
        }
        self.first = id;
    }

    /// Swaps two lists, keeping `index` right (not `first`: the caller sets it).
    fn swap(&mut self, i: usize, j: usize) {
        if i == j {
            return;
        }
        self.lists.swap(i, j);
        for k in [i, j] {
            let id = self.streams.id(self.lists[k].stream);
            self.index.insert(id, k);
        }
    }

    /// Removes list `i` (moving the last list into its place) and releases its stream; returns
    /// it, its blocks for the caller to account for. Removing list 0 leaves `first` stale: the
    /// caller makes a list current next.
    fn remove_list(&mut self, i: usize) -> List {
        let list = self.lists.swap_remove(i);
        self.index.remove(&self.streams.id(list.stream));
        if let Some(moved) = self.lists.get(i) {
            self.index.insert(self.streams.id(moved.stream), i);
        }
        self.streams.release(list.stream);
        list
    }

    /// Takes a chunk of `count` blocks from the upstream on `stream` and frees them there, its
    /// lock let go around the upstream's `allocate` (see [`pop`](Self::pop)) and the bytes asked
    /// for in `in_flight` meanwhile; returns the lock, held since the blocks went in, with
    /// `stream`'s list current. With `shrink`, an upstream short of memory is asked for half as
    /// many, down to one block.
    #[allow(clippy::too_many_arguments)]
    fn grow<'m, U: MemoryResource>(
        mut bin: MutexGuard<'m, Bin>,
        locks: &Locks<'m, Bin>,
        from: Upstream<'_, U>,
        mut count: usize,
        shrink: bool,
        stream: StreamRef,
        size: usize,
        align: usize,
    ) -> Result<MutexGuard<'m, Bin>, AllocError> {
        let Upstream {
            upstream,
            meter,
            name,
        } = from;
        let block = bin.block;
        let too_big = AllocError::new(
            AllocErrorKind::InvalidArgument("block size times block count overflows"),
            size,
            align,
            name,
        );
        // No allocation exceeds isize::MAX bytes: a block larger than that is out of memory for
        // the request, and a chunk no allocation could hold is asked as the largest that fits.
        let most = (isize::MAX as usize - GRANULE) / block;
        if most == 0 {
            return Err(AllocError::out_of_memory(size, align, name));
        }
        count = count.min(most);
        loop {
            let bytes = count.checked_mul(block).ok_or(too_big)?;
            let got;
            (bin, got) = locks.unlocked(bin, bytes, || upstream.allocate(bytes, GRANULE, stream));
            let ptr = match got {
                Ok(ptr) => ptr,
                Err(e) if shrink && e.is_out_of_memory() && count > 1 => {
                    count /= 2;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let addr = ptr.as_ptr() as usize;
            bin.make_current(stream);
            // A range, not an address per block: handed out from its start.
            bin.lists[0].fresh.push(Fresh {
                next: addr,
                end: addr + bytes,
            });
            let held = bin.streams.hold(stream);
            bin.chunks.push(BinChunk {
                addr,
                size: bytes,
                stream: held,
            });
            bin.held += bytes;
            meter.grew(bytes);
            return Ok(bin);
        }
    }

    /// Gives every chunk whose blocks are all free back to the upstream, each on its own stream
    /// after ordering that stream behind every stream holding free blocks. A chunk with a block
    /// still allocated is leaked: that block's owner was leaked (`mem::forget` of a container),
    /// and device work queued before may still use it.
    ///
    /// # Safety
    ///
    /// No block of this bin will be handed out again.
    pub(crate) unsafe fn release_all<U: MemoryResource>(&mut self, from: Upstream<'_, U>) {
        let Upstream {
            upstream, meter, ..
        } = from;
        let streams: Vec<Held> = self
            .lists
            .iter()
            .filter(|l| !l.is_empty())
            .map(|l| l.stream)
            .collect();
        // Free blocks per chunk, by the chunks' start addresses (chunks never overlap).
        let mut starts: Vec<(usize, usize)> = self
            .chunks
            .iter()
            .enumerate()
            .map(|(i, c)| (c.addr, i))
            .collect();
        starts.sort_unstable();
        let mut free = vec![0usize; self.chunks.len()];
        let mut count = |addr: usize, blocks: usize| {
            let at = starts.partition_point(|&(start, _)| start <= addr);
            if let Some(&(_, i)) = at.checked_sub(1).and_then(|at| starts.get(at)) {
                free[i] += blocks;
            }
        };
        for list in &self.lists {
            for &addr in &list.blocks {
                count(addr, 1);
            }
            // A fresh range lies in one chunk.
            for f in &list.fresh {
                count(f.next, (f.end - f.next) / self.block);
            }
        }
        // The streams stay held (the keeper is dropped with the bin) for the ordering below.
        self.lists.clear();
        self.index.clear();
        let chunks = std::mem::take(&mut self.chunks);
        // An upstream that panics on one chunk still gets the others (a chunk whose ordering
        // panics is leaked, not given back unordered).
        let mut panicked = FirstPanic::default();
        for (chunk, free) in chunks.into_iter().zip(free) {
            if free * self.block < chunk.size {
                continue;
            }
            panicked.catch(|| {
                // Where a stream can be neither ordered after nor waited for, its work may still
                // use the chunk: it is leaked rather than given back unordered under it.
                let ordered = streams.iter().all(|&s| {
                    order_or_wait(
                        upstream,
                        self.streams.get(chunk.stream),
                        self.streams.get(s),
                    )
                });
                if !ordered {
                    return;
                }
                self.held -= chunk.size;
                meter.shrank(chunk.size);
                if let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut(chunk.addr)) {
                    // SAFETY: the chunk came from `upstream.allocate(chunk.size, GRANULE,
                    // chunk.stream)` and was taken out of `chunks`, so it is given back once;
                    // every block of it is free (counted above) and none is handed out again (the
                    // caller's promise), and its stream is ordered after every stream that freed
                    // one.
                    unsafe {
                        upstream.deallocate(
                            ptr,
                            chunk.size,
                            GRANULE,
                            self.streams.get(chunk.stream),
                        )
                    };
                }
            });
        }
        panicked.resume();
    }
}
