//! What can be wrong in a log ([`TraceErrorKind`]), and where ([`TraceError`]).

use super::{ALLOCATE, ALLOCATE_FAILURE, FREE, HEADER, MAX_LINE, MAX_OPS, MAX_SIZE, MAX_STREAMS};
use crate::replay::{WorkloadError, ALIGN};
use std::fmt;
use std::io;
use std::path::PathBuf;

/// A problem in a log, with where it is.
#[derive(Debug)]
pub struct TraceError {
    /// The file, when parsing one.
    pub path: Option<PathBuf>,
    /// The 1-based line number (0 when the file could not be opened).
    pub line: usize,
    /// What is wrong.
    pub kind: TraceErrorKind,
    /// Whether [`OnError::Skip`](super::OnError::Skip) would have left the line out and gone on
    /// (false for a file that cannot be opened, a missing or bad header, a read error before the
    /// first line).
    pub skippable: bool,
}

/// What is wrong in a log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// The file could not be opened.
    #[error("cannot open: {0}")]
    Open(#[source] io::Error),
    /// The path is a directory.
    #[error("is a directory, not a log file")]
    IsDirectory,
    /// Reading a plain file failed (a disk error).
    #[error("cannot read: {0}")]
    Read(#[source] io::Error),
    /// Decompressing a gzip file failed: it is truncated or corrupt.
    #[error("cannot decompress (a gzip file that is truncated or corrupt?): {0}")]
    Gzip(#[source] io::Error),
    /// A line is longer than [`MAX_LINE`] bytes.
    #[error("longer than {limit} bytes (a binary file, or a corrupt line?)", limit = MAX_LINE)]
    LineTooLong,
    /// A line is not UTF-8 text.
    #[error("not UTF-8 text (a binary file, or a corrupt line?)")]
    NotUtf8,
    /// The log has no header line.
    #[error("empty log: expected the header {header}", header = HEADER)]
    Empty,
    /// The header lacks a column the parser needs.
    #[error("the header has no `{0}` column: expected {header}", header = HEADER)]
    MissingColumn(&'static str),
    /// A line has a different number of fields than the header.
    #[error("{found} fields where the header has {expected}")]
    FieldCount {
        /// Fields in the header.
        expected: usize,
        /// Fields on this line.
        found: usize,
    },
    /// A field is not a number.
    #[error("{column} `{value}` is not a number (decimal, or hexadecimal with 0x)")]
    BadNumber {
        /// The column.
        column: &'static str,
        /// The text found.
        value: String,
    },
    /// The action is none of `allocate`, `free`, `allocate failure`.
    #[error(
        "unknown action `{0}`: expected {allocate}, {free} or {failure}",
        allocate = ALLOCATE,
        free = FREE,
        failure = ALLOCATE_FAILURE
    )]
    UnknownAction(String),
    /// A free of a pointer that no earlier line allocated (or that was freed already).
    #[error("free of {0:#x}, which is not a live allocation (never allocated, or freed twice)")]
    UnknownPointer(u64),
    /// An allocation at a pointer that is still live.
    #[error("allocate at {0:#x}, which is still live (a free missing from the log?)")]
    PointerLive(u64),
    /// An allocation larger than any resource can serve ([`MAX_SIZE`]).
    #[error(
        "allocation of {0} bytes, more than any resource can serve (at most {max} bytes: \
         isize::MAX less its rounding to {ALIGN} bytes)",
        max = MAX_SIZE
    )]
    SizeTooLarge(usize),
    /// The bytes live at once would overflow `usize`.
    #[error("allocation of {size} bytes with {live} bytes live: the live bytes overflow usize")]
    LiveOverflow {
        /// Bytes live before this line.
        live: usize,
        /// Bytes the line allocates.
        size: usize,
    },
    /// A free of an allocation that [`OnError::Skip`](super::OnError::Skip) left out.
    #[error("free of {pointer:#x}, whose allocation (line {line}) was left out")]
    FreeOfSkipped {
        /// The pointer.
        pointer: u64,
        /// The line of the allocation left out.
        line: usize,
    },
    /// A free whose size differs from its allocation's.
    #[error("free of {pointer:#x} with {freed} bytes, allocated with {allocated}")]
    SizeMismatch {
        /// The pointer.
        pointer: u64,
        /// Bytes allocated.
        allocated: usize,
        /// Bytes the free names.
        freed: usize,
    },
    /// The log holds more than [`MAX_OPS`] ops.
    #[error("more than {limit} allocations and frees: split the log", limit = MAX_OPS)]
    TooManyOps,
    /// The log names more than [`MAX_STREAMS`] distinct streams.
    #[error("more than {limit} distinct streams", limit = MAX_STREAMS)]
    TooManyStreams,
    /// The host has no memory for the ops read so far.
    #[error("no host memory left for the {0} ops read so far")]
    OutOfMemory(usize),
    /// The ops do not form a workload (cannot happen for ops built here; kept for completeness).
    #[error("{0}")]
    Workload(WorkloadError),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        if self.line > 0 {
            write!(f, "line {}: ", self.line)?;
        }
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.kind)
    }
}
