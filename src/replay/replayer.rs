//! [`Replayer`], a replay in op order on one thread, and what every replay shares: [`Replay`], [`ReplayError`], [`ALIGN`].

use super::{Op, Workload};
use crate::resource::{AllocError, MemoryResource};
use crate::stream::StreamHandle;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// The alignment every replayed allocation asks for: CUDA's 256 bytes, as RMM's resources use.
pub const ALIGN: usize = 256;

/// What went wrong in a replay or a capacity search.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// An allocation failed.
    #[error("op {op} (allocate {size} bytes): {error}")]
    Alloc {
        /// Index of the op in the workload.
        op: usize,
        /// Bytes it asked for.
        size: usize,
        /// Why it failed.
        error: AllocError,
    },
    /// Synchronizing a stream at the end of a pass failed.
    #[error("synchronizing after the pass: {0}")]
    Synchronize(AllocError),
    /// The stack could not be built.
    #[error("building the stack: {0}")]
    Build(AllocError),
    /// The replay was given fewer streams than the workload uses.
    #[error("the workload uses {needed} streams but the replay was given {given}")]
    Streams {
        /// Streams the workload uses.
        needed: usize,
        /// Streams given.
        given: usize,
    },
    /// An OS thread for a many-threaded replay could not be started.
    #[error("starting the OS thread for replay thread {thread}: {message}")]
    Thread {
        /// The workload's thread index.
        thread: usize,
        /// The operating system's reason.
        message: String,
    },
    /// The capacity search found no capacity, up to a limit, with which the workload completes.
    #[error("does not complete even with a capacity of {capacity} bytes; there: {last}")]
    NeverCompletes {
        /// The largest capacity tried.
        capacity: usize,
        /// How the replay failed at that capacity.
        last: Box<ReplayError>,
    },
}

impl ReplayError {
    /// `Err(Streams)` when `streams` has fewer streams than `workload` names.
    pub(crate) fn check_streams(workload: &Workload, streams: &[StreamHandle]) -> Result<(), Self> {
        if streams.len() < workload.stream_count() {
            return Err(ReplayError::Streams {
                needed: workload.stream_count(),
                given: streams.len(),
            });
        }
        Ok(())
    }

    /// True when the failure is running out of room: a larger capacity could cure it.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            ReplayError::Alloc { error, .. } | ReplayError::Build(error) => {
                error.is_out_of_memory()
            }
            _ => false,
        }
    }
}

/// A live block of a replay.
#[derive(Debug, Clone, Copy)]
struct Block {
    ptr: NonNull<u8>,
    size: usize,
    /// The index of its stream in the replay's streams.
    stream: usize,
}

/// Replays a [`Workload`] through a resource, pass after pass, on the same resource.
#[derive(Debug)]
pub struct Replayer<'w, R> {
    resource: R,
    workload: &'w Workload,
    streams: Vec<StreamHandle>,
    live: Vec<Option<Block>>,
}

impl<'w, R: MemoryResource> Replayer<'w, R> {
    /// A replay of `workload` through `resource`, stream index `i` mapping to `streams[i]`.
    pub fn new(
        resource: R,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Self, ReplayError> {
        ReplayError::check_streams(workload, &streams)?;
        Ok(Replayer {
            resource,
            workload,
            streams,
            live: vec![None; workload.allocations()],
        })
    }

    /// The resource replayed through.
    pub fn resource(&self) -> &R {
        &self.resource
    }

    /// Replays every op once, then synchronizes every stream, and returns the time that took.
    /// Blocks the workload leaves live are freed afterwards, untimed, so each pass starts empty;
    /// on a failure every block is freed before the error returns.
    pub fn pass(&mut self) -> Result<Duration, ReplayError> {
        let start = Instant::now();
        let ran = self.run_ops();
        let synced = self.synchronize();
        let elapsed = start.elapsed();
        self.release();
        ran?;
        synced?;
        Ok(elapsed)
    }

    fn run_ops(&mut self) -> Result<(), ReplayError> {
        for (op, &o) in self.workload.ops().iter().enumerate() {
            match o {
                Op::Alloc { id, size, stream } => {
                    match self
                        .resource
                        .allocate(size, ALIGN, self.streams[stream].as_ref())
                    {
                        Ok(ptr) => self.live[id] = Some(Block { ptr, size, stream }),
                        Err(error) => return Err(ReplayError::Alloc { op, size, error }),
                    }
                }
                Op::Free { id } => {
                    if let Some(b) = self.live[id].take() {
                        // SAFETY: b.ptr came from allocate on this resource with b.size and ALIGN;
                        // take() empties the slot, so it is freed once.
                        unsafe {
                            self.resource.deallocate(
                                b.ptr,
                                b.size,
                                ALIGN,
                                self.streams[b.stream].as_ref(),
                            )
                        };
                    }
                }
            }
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), ReplayError> {
        synchronize_streams(&self.resource, self.workload, &self.streams)
    }

    fn release(&mut self) {
        for slot in &mut self.live {
            if let Some(b) = slot.take() {
                // SAFETY: as in run_ops: a live block of this resource, freed once.
                unsafe {
                    self.resource
                        .deallocate(b.ptr, b.size, ALIGN, self.streams[b.stream].as_ref())
                };
            }
        }
    }
}

/// Synchronizes each distinct stream the workload uses, once.
pub(super) fn synchronize_streams<R: MemoryResource>(
    resource: &R,
    workload: &Workload,
    streams: &[StreamHandle],
) -> Result<(), ReplayError> {
    // Each distinct stream once: a set, since a log may name 100,000 streams.
    let mut seen = std::collections::HashSet::new();
    for s in &streams[..workload.stream_count()] {
        if seen.insert(s.id()) {
            resource
                .synchronize(s.as_ref())
                .map_err(ReplayError::Synchronize)?;
        }
    }
    Ok(())
}

/// A replay behind a trait object, so a table can hold stacks of different types.
pub trait Replay {
    /// One timed pass: see [`Replayer::pass`].
    fn pass(&mut self) -> Result<Duration, ReplayError>;
    /// The number of ops in a pass.
    fn ops(&self) -> usize;
    /// Counts, from the next pass on, the bytes the replay's threads hold at once, where their
    /// interleaving decides it ([`ThreadedReplayer::count_held`](super::ThreadedReplayer::count_held)).
    /// A replay in log order holds the workload's [`peak_live`](super::Workload::peak_live) at
    /// most, and counts nothing.
    fn count_held(&mut self) {}
    /// The most bytes the replay's threads held at once over the passes counted; None where it
    /// counts nothing.
    fn held_peak(&self) -> Option<usize> {
        None
    }
}

impl<R: MemoryResource> Replay for Replayer<'_, R> {
    fn pass(&mut self) -> Result<Duration, ReplayError> {
        Replayer::pass(self)
    }
    fn ops(&self) -> usize {
        self.workload.ops().len()
    }
}
