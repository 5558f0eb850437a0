//! The free lists of one block size, per stream, over chunks of an upstream: what `FixedSize` is and each `Binning` bin is.

use super::usage::{Meter, Usage};
use crate::resource::{AllocError, AllocErrorKind, MemoryResource};
use crate::stream::{Held, StreamId, StreamKeeper, StreamRef};
use std::ptr::NonNull;

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
/// does not own its upstream, so that [`Binning`](crate::adaptor::Binning) can keep one per bin
/// over the upstream it owns: every call that needs the upstream is given it.
#[derive(Debug)]
pub(crate) struct Bin {
    block: usize,
    /// Free block addresses per stream; the stream used last is usually first.
    lists: Vec<(Held, Vec<usize>)>,
    /// The identity of `lists[0]`'s stream, for the fast path's one comparison.
    first: StreamId,
    chunks: Vec<BinChunk>,
    /// Bytes held from the upstream.
    held: usize,
    /// Keeps alive every stream a `Held` above names (declared last: dropped after them).
    streams: StreamKeeper,
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
            chunks: Vec::new(),
            held: 0,
            first: StreamId::DEFAULT,
            streams: StreamKeeper::default(),
        }
    }

    /// The size of every block.
    pub(crate) fn block(&self) -> usize {
        self.block
    }

    /// Free blocks, over all streams.
    pub(crate) fn free_blocks(&self) -> usize {
        self.lists.iter().map(|(_, l)| l.len()).sum()
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

    /// A free block for work on `stream`: one freed on `stream`, else one freed on another stream
    /// once `stream` is ordered after it, else one from a new chunk that `growth` sizes (fewer
    /// blocks if the upstream is short of memory). `size`/`align`/`name` only label errors.
    #[inline]
    pub(crate) fn pop<U: MemoryResource>(
        &mut self,
        from: Upstream<'_, U>,
        stream: StreamRef,
        growth: Growth,
        size: usize,
        align: usize,
    ) -> Result<usize, AllocError> {
        if let Some((_, list)) = self.lists.first_mut() {
            if self.first == stream.id() {
                if let Some(addr) = list.pop() {
                    return Ok(addr);
                }
            }
        }
        self.pop_slow(from, stream, growth, size, align)
    }

    #[cold]
    fn pop_slow<U: MemoryResource>(
        &mut self,
        from: Upstream<'_, U>,
        stream: StreamRef,
        growth: Growth,
        size: usize,
        align: usize,
    ) -> Result<usize, AllocError> {
        // Streams whose free blocks are all in use keep empty lists; drop them here, off the hot
        // path, so that short-lived streams do not lengthen the list scan.
        let streams = &self.streams;
        self.lists
            .retain(|(s, l)| streams.is(*s, stream) || !l.is_empty());
        self.sync_first();
        let li = self.list_index(stream);
        if let Some(addr) = self.lists[li].1.pop() {
            return Ok(addr);
        }
        if let Some(other) = self
            .lists
            .iter()
            .position(|(s, l)| !self.streams.is(*s, stream) && !l.is_empty())
        {
            from.upstream
                .order_after(stream, self.streams.get(self.lists[other].0))?;
            let (_, blocks) = self.lists.swap_remove(other);
            self.sync_first();
            let li = self.list_index(stream);
            self.lists[li].1.extend(blocks);
        } else {
            let count = match growth {
                Growth::Fixed(n) => n,
                Growth::Double(max) => (self.held / self.block).clamp(1, max),
            };
            self.grow(from, count, true, stream, size, align)?;
        }
        let li = self.list_index(stream);
        self.lists[li]
            .1
            .pop()
            .ok_or(AllocError::out_of_memory(size, align, from.name))
    }

    /// Makes `addr` free on `stream`.
    #[inline]
    pub(crate) fn push(&mut self, addr: usize, stream: StreamRef) {
        if let Some((_, list)) = self.lists.first_mut() {
            if self.first == stream.id() {
                list.push(addr);
                return;
            }
        }
        let li = self.list_index(stream);
        self.lists[li].1.push(addr);
    }

    /// The list of `stream`, created if missing, moved to the front so that the next call on the
    /// same stream finds it first.
    fn list_index(&mut self, stream: StreamRef) -> usize {
        let id = stream.id();
        match self
            .lists
            .iter()
            .position(|(s, _)| self.streams.id(*s) == id)
        {
            Some(i) => {
                self.lists.swap(0, i);
            }
            None => {
                let held = self.streams.hold(stream);
                self.lists.push((held, Vec::new()));
                let last = self.lists.len() - 1;
                self.lists.swap(0, last);
            }
        }
        self.first = id;
        0
    }

    /// Sets `first` to `lists[0]`'s identity after the lists were reordered: the fast paths pop
    /// from and push to `lists[0]` on that comparison alone, so it must never be stale.
    fn sync_first(&mut self) {
        if let Some(&(held, _)) = self.lists.first() {
            self.first = self.streams.id(held);
        }
    }

    /// Takes a chunk of `count` blocks from the upstream on `stream` and frees them there. With
    /// `shrink`, an upstream short of memory is asked for half as many, down to one block.
    pub(crate) fn grow<U: MemoryResource>(
        &mut self,
        from: Upstream<'_, U>,
        mut count: usize,
        shrink: bool,
        stream: StreamRef,
        size: usize,
        align: usize,
    ) -> Result<(), AllocError> {
        let Upstream {
            upstream,
            meter,
            name,
        } = from;
        let too_big = AllocError::new(
            AllocErrorKind::InvalidArgument("block size times block count overflows"),
            size,
            align,
            name,
        );
        // A chunk no allocation could hold (over isize::MAX) is asked as the largest one that fits.
        count = count.min(((isize::MAX as usize - GRANULE) / self.block).max(1));
        loop {
            let bytes = count.checked_mul(self.block).ok_or(too_big)?;
            match upstream.allocate(bytes, GRANULE, stream) {
                Ok(ptr) => {
                    let addr = ptr.as_ptr() as usize;
                    let li = self.list_index(stream);
                    // One address per block: a count the host cannot list is out of memory, and
                    // the chunk goes straight back (never an abort on a huge preallocation).
                    if self.lists[li].1.try_reserve(count).is_err() {
                        // SAFETY: the chunk was just allocated with these arguments, unused.
                        unsafe { upstream.deallocate(ptr, bytes, GRANULE, stream) };
                        if shrink && count > 1 {
                            count /= 2;
                            continue;
                        }
                        return Err(AllocError::out_of_memory(bytes, align, name));
                    }
                    let held = self.streams.hold(stream);
                    self.chunks.push(BinChunk {
                        addr,
                        size: bytes,
                        stream: held,
                    });
                    self.held += bytes;
                    meter.grew(bytes);
                    let list = &mut self.lists[li].1;
                    // Highest address first, so that pops hand out the chunk from its start.
                    list.extend((0..count).rev().map(|i| addr + i * self.block));
                    return Ok(());
                }
                Err(e) if shrink && e.is_out_of_memory() && count > 1 => count /= 2,
                Err(e) => return Err(e),
            }
        }
    }

    /// Gives every chunk back to the upstream, each on its own stream after ordering that stream
    /// behind every stream holding free blocks.
    ///
    /// # Safety
    ///
    /// No block of this bin is in use or will be handed out again.
    pub(crate) unsafe fn release_all<U: MemoryResource>(&mut self, from: Upstream<'_, U>) {
        let Upstream {
            upstream, meter, ..
        } = from;
        let streams: Vec<Held> = self
            .lists
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|&(s, _)| s)
            .collect();
        self.lists.clear();
        for chunk in std::mem::take(&mut self.chunks) {
            for &s in &streams {
                if s != chunk.stream
                    && upstream
                        .order_after(self.streams.get(chunk.stream), self.streams.get(s))
                        .is_err()
                {
                    // No event: wait for the stream instead; a failure here leaves nothing
                    // better to do than give the memory back.
                    let _ = upstream.synchronize(self.streams.get(s));
                }
            }
            self.held -= chunk.size;
            meter.shrank(chunk.size);
            if let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut(chunk.addr)) {
                // SAFETY: the chunk came from `upstream.allocate(chunk.size, GRANULE, chunk.stream)`
                // and was taken out of `chunks`, so it is given back once; the caller promises none
                // of its blocks is in use, and its stream is ordered after every stream that freed
                // one.
                unsafe {
                    upstream.deallocate(ptr, chunk.size, GRANULE, self.streams.get(chunk.stream))
                };
            }
        }
    }
}
