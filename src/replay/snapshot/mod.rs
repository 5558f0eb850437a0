//! PyTorch memory snapshots: the pickle `torch.cuda.memory._dump_snapshot` writes (the dict
//! `torch.cuda.memory._snapshot()` returns), read into the same [`Trace`] an RMM log gives.
//!
//! # What is read
//!
//! A snapshot is a dict. Its `device_traces` is a list with one list per device of trace entries,
//! each a dict with `action`, `addr`, `size` and `stream` (and `time_us`, `frames`, … which are
//! not read). PyTorch records them only while `torch.cuda.memory._record_memory_history()` is on;
//! a snapshot taken without it has no entries, which is an error here ([`SnapshotErrorKind::NoHistory`]).
//!
//! The actions become ops as a log's lines do:
//!
//! * `alloc`: an allocation of `size` bytes (the size the program asked for) at `addr`, on
//!   `stream` (streams are numbered in order of first appearance, as a log's are);
//! * `free_completed`: the free of the allocation at `addr`, when its memory may be handed out
//!   again (PyTorch completes a free once the streams that used the block are done with it);
//! * `free_requested`: not an op (its `free_completed` is);
//! * `oom`: a request that failed, counted in [`Trace::failures`] and skipped, as a log's
//!   `allocate failure` is;
//! * `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`: what PyTorch's caching
//!   allocator took from and gave back to the driver; not ops, but with the snapshot's `segments`
//!   (the state at its end) they give the most bytes the caching allocator held during the
//!   recorded history ([`Snapshot::reserved_peak`]);
//! * any other action (`snapshot`, actions of later PyTorch versions): skipped, counted in
//!   [`Snapshot::other_entries`].
//!
//! PyTorch keeps the last `max_entries` entries only, so the history may begin after some of its
//! blocks were allocated: a `free_completed` of an address no earlier entry allocated is such a
//! block's, left out and counted in [`Snapshot::older_frees`], not an error. An `alloc` at an
//! address still live, or a `free_completed` of another size than its `alloc`, is an error naming
//! the entry. A snapshot of several devices replays one: the one asked for, or else the one with
//! the most allocations.
//!
//! # The pickle
//!
//! The file is a pickle (first byte 0x80, the protocol opcode; protocols 2 to 5), plain or
//! gzip-compressed (told by its first bytes, not its name). The reader here understands the
//! opcodes of plain data (dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None)
//! and keeps class references and the objects built from them as opaque values, which are an
//! error only where a value that is read is one. Every problem is a [`SnapshotError`] naming the
//! file and where: a byte offset in the pickle, or the entry (`device_traces[0][17]`). Nothing
//! here panics on bad input, and nothing unbounded is allocated: the file is at most
//! [`MAX_PICKLE_BYTES`] bytes, each value it builds is made by an opcode of it, and a length in
//! the pickle is checked against the bytes left before anything is read.

mod convert;
mod error;
mod file;
mod pickle;
#[cfg(test)]
mod tests;

pub use error::{SnapshotError, SnapshotErrorKind};
pub use file::{from_bytes, is_pickle_file, read, read_from, workload_name};

use super::rmm_log::Trace;

/// The largest pickle read, in bytes (after decompression): the whole pickle is held in memory
/// while it is read, with some 32 bytes per value it builds.
pub const MAX_PICKLE_BYTES: u64 = 4 << 30;

/// The first byte of a pickle of protocol 2 or later: the `PROTO` opcode.
pub const PICKLE_MAGIC: u8 = 0x80;

/// A snapshot's allocations and frees on one device, with what else it says of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The ops, as [`rmm_log::read`](super::rmm_log::read) gives a log's: one thread; stream `i`
    /// is `stream_ids[i]` (the `stream` values, as `cudaStream_t` bits; 0 is the default stream);
    /// `failures` counts the `oom` entries and `skipped_empty` the allocations of 0 bytes.
    pub trace: Trace,
    /// The device whose history the trace is.
    pub device: usize,
    /// The devices whose history has at least one entry, in order.
    pub devices: Vec<usize>,
    /// `free_completed` entries of blocks allocated before the recorded history begins.
    pub older_frees: usize,
    /// Entries of an action that is no op and tells nothing of the segments (`snapshot`,
    /// `free_requested`, actions this reader does not know).
    pub other_entries: usize,
    /// The most bytes PyTorch's caching allocator held from the driver on the device during the
    /// recorded history, from the `segments` at the snapshot's end and the segment entries before
    /// it; `None` when the snapshot has no `segments`.
    pub reserved_peak: Option<usize>,
}
