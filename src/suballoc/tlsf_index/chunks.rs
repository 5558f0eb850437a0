//! Chunks: added as one free block, and given back once wholly free (through [`Chunks`], the
//! growth rule's view of the index).

use super::{Block, Chunk, TlsfIndex, NIL};
use crate::stream::{Held, StreamKeeper, StreamRef};
use crate::suballoc::growth::{Chunks, FreeChunk, InFlight};

impl TlsfIndex {
    /// Adds a chunk `[addr, addr + size)` (granule multiples) as one free block on `stream`;
    /// false (nothing added) when the index has no room for another record.
    #[must_use]
    pub(crate) fn add_chunk(&mut self, addr: usize, size: usize, stream: StreamRef) -> bool {
        if !self.room_for(1) {
            return false;
        }
        let chunk_stream = self.streams.hold(stream);
        let held = self.list_for(stream);
        let i = self.record(Block {
            addr,
            size,
            prev: NIL,
            next: NIL,
            prev_free: NIL,
            next_free: NIL,
            stream: held,
            free: true,
        });
        self.push(i);
        self.chunks.insert(
            addr,
            Chunk {
                size,
                stream: chunk_stream,
                first: i,
            },
        );
        self.size += size;
        self.peak = self.peak.max(self.size);
        true
    }

    /// The free blocks of the chunk at `start` and the streams they are on, if the chunk is
    /// wholly free; `None` while a block of it is allocated. O(blocks in the chunk).
    pub(crate) fn free_chunk_streams(&self, start: usize) -> Option<Vec<Held>> {
        let chunk = self.chunks.get(&start)?;
        let mut streams = Vec::new();
        let mut i = chunk.first;
        while i != NIL {
            let b = &self.blocks[i as usize];
            if !b.free {
                return None;
            }
            streams.push(b.stream);
            i = b.next;
        }
        // Sorted rather than searched as they come: O(n log n) for blocks freed on many streams.
        streams.sort_unstable();
        streams.dedup();
        Some(streams)
    }

    /// Forgets the wholly free chunk at `start` and its blocks; returns it. The chunk's stream
    /// stays held: the caller releases it once it is done with it.
    pub(crate) fn remove_chunk(&mut self, start: usize) -> Option<Chunk> {
        let chunk = self.chunks.remove(&start)?;
        let mut i = chunk.first;
        while i != NIL {
            let b = self.blocks[i as usize];
            self.unlink(i);
            self.drop_if_empty(b.stream);
            self.spare.push(i);
            i = b.next;
        }
        self.size -= chunk.size;
        Some(chunk)
    }
}

impl Chunks for TlsfIndex {
    fn held(&self) -> usize {
        self.size
    }

    fn add(&mut self, addr: usize, size: usize, stream: StreamRef) -> bool {
        self.add_chunk(addr, size, stream)
    }

    fn free_chunks(&self) -> Vec<FreeChunk> {
        self.chunks
            .iter()
            .filter_map(|(&start, chunk)| {
                Some(FreeChunk {
                    start,
                    size: chunk.size,
                    stream: chunk.stream,
                    freed_on: self.free_chunk_streams(start)?,
                })
            })
            .collect()
    }

    fn forget(&mut self, starts: &[usize]) {
        for &start in starts {
            self.remove_chunk(start);
        }
    }

    fn streams(&mut self) -> &mut StreamKeeper {
        &mut self.streams
    }

    fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    fn in_flight_mut(&mut self) -> &mut InFlight {
        &mut self.in_flight
    }
}
