//! The CSV format of RMM's allocation logs: what [`Logging`](crate::adaptor::Logging) writes and
//! the replay's log reader reads (which re-exports these names as its own).

/// The header line of a log, without its newline: the column names, in the order RMM writes them.
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// The column of the thread that made a request; optional when reading (one thread).
pub const THREAD: &str = "Thread";
/// The column of the time of a request; not read.
pub const TIME: &str = "Time";
/// The column of what happened: [`ALLOCATE`], [`FREE`] or [`ALLOCATE_FAILURE`].
pub const ACTION: &str = "Action";
/// The column of the address, hexadecimal with `0x` (or decimal when reading).
pub const POINTER: &str = "Pointer";
/// The column of the size in bytes.
pub const SIZE: &str = "Size";
/// The column of the stream's handle; optional when reading (the default stream).
pub const STREAM: &str = "Stream";

/// The action of a request that got memory.
pub const ALLOCATE: &str = "allocate";
/// The action of a free.
pub const FREE: &str = "free";
/// The action of a request that failed; a replay skips it, as RMM's does.
pub const ALLOCATE_FAILURE: &str = "allocate failure";
