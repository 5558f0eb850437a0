//! RMM allocation logs: the CSV format ([`HEADER`], the column and action names), read into [`Workload`]s.

mod error;
mod input;
mod lines;
mod parser;
#[cfg(test)]
mod tests;

pub use crate::log_format::{
    ACTION, ALLOCATE, ALLOCATE_FAILURE, FREE, HEADER, POINTER, SIZE, STREAM, THREAD, TIME,
};
pub use error::{TraceError, TraceErrorKind};
pub(super) use input::file_stem;
pub use input::{open, parse, parse_with, read, read_from, read_with, workload_name};

use super::{Workload, ALIGN};
use std::fmt;

/// A parsed log: the workload, and what the log's numbers were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The ops, ids numbering allocations in log order; stream `i` is `stream_ids[i]`, and op
    /// `i` ran on the thread `thread_ids[workload.op_threads()[i]]` (thread 0 for all when the log
    /// has one thread).
    pub workload: Workload,
    /// The `Thread` values of the log, in order of first appearance.
    pub thread_ids: Vec<u64>,
    /// The `Stream` values of the log, in order of first appearance (stream index `i` of an op
    /// is `stream_ids[i]`; 0 is the default stream).
    pub stream_ids: Vec<u64>,
    /// `allocate failure` lines skipped.
    pub failures: usize,
    /// Zero-size requests at the null pointer skipped.
    pub skipped_empty: usize,
    /// Bad lines left out under [`OnError::Skip`] (a read error that ended the file early counts
    /// as one).
    pub skipped_lines: usize,
    /// The first [`MAX_SKIPPED_KEPT`] of them, with why.
    pub skipped: Vec<SkippedLine>,
}

/// What the parser does with a bad line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnError {
    /// Stop at the first bad line with a [`TraceError`] naming it.
    #[default]
    Stop,
    /// Leave bad lines out and go on, counting them in [`Trace::skipped_lines`]; a file that cannot
    /// be read further (truncated gzip) ends the log there. A log without a usable header is still
    /// an error.
    Skip,
}

/// How many skipped lines a [`Trace`] keeps the reasons of.
pub const MAX_SKIPPED_KEPT: usize = 100;

/// The longest line read, in bytes: a longer one is a bad line ([`TraceErrorKind::LineTooLong`]),
/// so that a file with no newlines (binary junk, a gzip bomb) cannot take memory of its size.
pub const MAX_LINE: usize = 64 * 1024;

/// The most ops (allocations and frees) a log may hold: a replay keeps them all in memory (some
/// 50 bytes each), and a small gzip file can hold many (a log of one repeated line compresses
/// 2000:1). A longer log is an error ([`TraceErrorKind::TooManyOps`]) after this many, not an
/// allocation failure; split it.
pub const MAX_OPS: usize = 1 << 26;

/// The most distinct streams a log may name: `mrstack replay` makes a CUDA stream for each, and
/// a stream-ordered suballocator keeps free lists per stream (some kilobytes each). More is an
/// error ([`TraceErrorKind::TooManyStreams`]).
pub const MAX_STREAMS: usize = 4096;

/// The largest allocation any resource can serve: `isize::MAX` rounded down to [`ALIGN`], since
/// a request is rounded up to its alignment and no allocation may exceed `isize::MAX` bytes.
pub const MAX_SIZE: usize = isize::MAX as usize & !(ALIGN - 1);

/// A line that [`OnError::Skip`] left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    /// The 1-based line number.
    pub line: usize,
    /// Why, as [`TraceErrorKind`] says it.
    pub reason: String,
}

impl fmt::Display for SkippedLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}
