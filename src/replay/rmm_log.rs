//! RMM allocation logs: the CSV format ([`HEADER`], the column and action names), read into [`Workload`]s.

use super::{Op, Workload, WorkloadError, ALIGN};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

pub use crate::log_format::{
    ACTION, ALLOCATE, ALLOCATE_FAILURE, FREE, HEADER, POINTER, SIZE, STREAM, THREAD, TIME,
};

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

/// A problem in a log, with where it is.
#[derive(Debug)]
pub struct TraceError {
    /// The file, when parsing one.
    pub path: Option<PathBuf>,
    /// The 1-based line number (0 when the file could not be opened).
    pub line: usize,
    /// What is wrong.
    pub kind: TraceErrorKind,
    /// Whether [`OnError::Skip`] would have left the line out and gone on (false for a file that
    /// cannot be opened, a missing or bad header, a read error before the first line).
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
    /// A free of an allocation that [`OnError::Skip`] left out.
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

/// Reads the log at `path`, gzip-compressed or not (told by its first bytes, not its name),
/// stopping at the first bad line; the workload is named after the file, less `.csv` and `.gz`
/// (`resnet50_train`).
///
/// # The format
///
/// The first line is a header naming the columns, [`HEADER`]:
/// `Thread,Time,Action,Pointer,Size,Stream`. Columns are found by name, so their order may differ,
/// and `Thread`, `Time` and `Stream` may be missing (one thread, the default stream). `Action` is
/// `allocate`, `free` or `allocate failure` (a failed request: skipped, as RMM's replay does).
/// `Pointer` is hexadecimal with `0x` or decimal; so are `Stream` and `Thread`; `Time` is not read. Each free is paired with the live
/// allocation at its pointer, must free the size that was allocated, and is replayed on the
/// allocation's stream. Zero-size requests at the null pointer carry no memory and are skipped.
/// Allocations never freed are kept: a replay frees them after its timed part.
///
/// Parsing builds the whole op list first, so it costs nothing in a measurement. Every problem is a
/// [`TraceError`] naming the line: a malformed line, a free of a pointer not allocated, a file that
/// ends inside its gzip stream. Nothing here panics on bad input. [`OnError::Skip`] makes the
/// parser lenient instead: it leaves bad lines out, counts them, keeps the first few reasons, and
/// replays what a truncated file holds up to where it breaks.
///
/// A log of many threads keeps each op's thread ([`Workload::op_threads`]), so that a replay can
/// run each thread's ops on a thread of its own.
pub fn read(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    read_with(path, OnError::Stop)
}

/// [`read`], doing `on_error` with bad lines.
pub fn read_with(path: impl AsRef<Path>, on_error: OnError) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let file = open(path)?;
    read_from(file, workload_name(path), on_error).map_err(|e| TraceError {
        path: Some(path.to_owned()),
        ..e
    })
}

/// Opens the log at `path` for [`read_from`]: an error names the path, and says so where it is
/// a directory.
pub fn open(path: impl AsRef<Path>) -> Result<File, TraceError> {
    let path = path.as_ref();
    let fail = |kind| TraceError {
        path: Some(path.to_owned()),
        line: 0,
        kind,
        skippable: false,
    };
    let file = File::open(path).map_err(|e| fail(TraceErrorKind::Open(e)))?;
    match file.metadata() {
        Ok(m) if m.is_dir() => Err(fail(TraceErrorKind::IsDirectory)),
        _ => Ok(file),
    }
}

/// The name [`read`] gives the workload of the log at `path`: the file name less `.gz` and
/// `.csv`.
pub fn workload_name(path: &Path) -> String {
    let file_name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let name = file_name.strip_suffix(".gz").unwrap_or(&file_name);
    name.strip_suffix(".csv").unwrap_or(name).to_owned()
}

/// Parses the log `reader` yields, gzip-compressed or not (told by its first bytes), doing
/// `on_error` with bad lines: [`read_with`] for a reader that is not a file, or a file read through
/// a progress meter.
pub fn read_from(
    reader: impl Read,
    name: impl Into<String>,
    on_error: OnError,
) -> Result<Trace, TraceError> {
    let mut reader = BufReader::new(reader);
    let gzip = reader
        .fill_buf()
        .map_err(|e| TraceError {
            path: None,
            line: 1,
            kind: if e.kind() == io::ErrorKind::IsADirectory {
                TraceErrorKind::IsDirectory
            } else {
                TraceErrorKind::Read(e)
            },
            skippable: false,
        })?
        .starts_with(&[0x1f, 0x8b]);
    if gzip {
        parse_inner(
            BufReader::new(flate2::bufread::MultiGzDecoder::new(reader)),
            name.into(),
            on_error,
            TraceErrorKind::Gzip,
        )
    } else {
        parse_inner(reader, name.into(), on_error, TraceErrorKind::Read)
    }
}

/// Column positions found in the header.
struct Columns {
    count: usize,
    thread: Option<usize>,
    action: usize,
    pointer: usize,
    size: usize,
    stream: Option<usize>,
}

impl Columns {
    fn from_header(header: &str) -> Result<Self, TraceErrorKind> {
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        let find = |name: &str| names.iter().position(|n| n.eq_ignore_ascii_case(name));
        let need = |name: &'static str| find(name).ok_or(TraceErrorKind::MissingColumn(name));
        Ok(Columns {
            count: names.len(),
            thread: find(THREAD),
            action: need(ACTION)?,
            pointer: need(POINTER)?,
            size: need(SIZE)?,
            stream: find(STREAM),
        })
    }
}

/// Parses `0x`-prefixed hexadecimal or decimal.
fn number(column: &'static str, text: &str) -> Result<u64, TraceErrorKind> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| TraceErrorKind::BadNumber {
        column,
        value: text.to_owned(),
    })
}

/// Values numbered in order of first appearance (thread and stream ids), in time independent of
/// how many there are.
#[derive(Default)]
struct Numbering {
    values: Vec<u64>,
    index: HashMap<u64, usize>,
}

impl Numbering {
    /// The number of `value`, numbering it when new.
    fn of(&mut self, value: u64) -> usize {
        let values = &mut self.values;
        *self.index.entry(value).or_insert_with(|| {
            values.push(value);
            values.len() - 1
        })
    }
}

/// Reads the next line into `bytes` (cleared first), at most [`MAX_LINE`] bytes of it: `Ok(None)`
/// at the end, `Ok(Some(false))` for a line that was longer (with `drain`, the rest of it is read
/// and dropped, for a caller that goes on; without, it is left: the caller stops there, and a line
/// of gigabytes is not decompressed to the end first).
fn read_line(
    reader: &mut impl BufRead,
    bytes: &mut Vec<u8>,
    drain: bool,
) -> io::Result<Option<bool>> {
    bytes.clear();
    let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX);
    let read = reader.by_ref().take(limit + 1).read_until(b'\n', bytes)?;
    if read == 0 {
        return Ok(None);
    }
    if bytes.len() <= MAX_LINE || bytes.ends_with(b"\n") {
        return Ok(Some(true));
    }
    bytes.clear();
    if !drain {
        return Ok(Some(false));
    }
    // Too long: drop the rest of the line without keeping it.
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                break;
            }
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    }
    Ok(Some(false))
}

/// Parses a log from `reader` (uncompressed text; [`read`] handles gzip, and says what the format
/// is), naming the workload `name`, stopping at the first bad line.
///
/// ```
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            0,1,allocate,0x7f0000000000,1024,0\n\
///            0,2,free,0x7f0000000000,1024,0\n";
/// let trace = mrstack::replay::rmm_log::parse(log.as_bytes(), "example").unwrap();
/// assert_eq!(trace.workload.allocations(), 1);
/// assert_eq!(trace.workload.peak_live(), 1024);
/// ```
pub fn parse(reader: impl BufRead, name: impl Into<String>) -> Result<Trace, TraceError> {
    parse_with(reader, name, OnError::Stop)
}

/// One line of a log, parsed.
enum Line {
    Allocate {
        pointer: u64,
        size: usize,
        thread: u64,
        stream: u64,
    },
    Free {
        pointer: u64,
        size: usize,
        thread: u64,
    },
    /// `allocate failure`.
    Failure,
    /// A zero-size request at the null pointer.
    Empty,
}

impl Columns {
    fn parse(&self, text: &str) -> Result<Line, TraceErrorKind> {
        let fields: Vec<&str> = text.trim().split(',').map(str::trim).collect();
        if fields.len() != self.count {
            return Err(TraceErrorKind::FieldCount {
                expected: self.count,
                found: fields.len(),
            });
        }
        let allocate = match fields[self.action] {
            ALLOCATE => true,
            FREE => false,
            ALLOCATE_FAILURE => return Ok(Line::Failure),
            other => return Err(TraceErrorKind::UnknownAction(other.to_owned())),
        };
        let pointer = number(POINTER, fields[self.pointer])?;
        let size = usize::try_from(number(SIZE, fields[self.size])?).map_err(|_| {
            TraceErrorKind::BadNumber {
                column: SIZE,
                value: fields[self.size].to_owned(),
            }
        })?;
        if pointer == 0 && size == 0 {
            return Ok(Line::Empty);
        }
        let optional = |column, i: Option<usize>| i.map_or(Ok(0), |i| number(column, fields[i]));
        let thread = optional(THREAD, self.thread)?;
        Ok(if allocate {
            Line::Allocate {
                pointer,
                size,
                thread,
                stream: optional(STREAM, self.stream)?,
            }
        } else {
            Line::Free {
                pointer,
                size,
                thread,
            }
        })
    }
}

/// [`parse`], doing `on_error` with bad lines.
pub fn parse_with(
    reader: impl BufRead,
    name: impl Into<String>,
    on_error: OnError,
) -> Result<Trace, TraceError> {
    parse_inner(reader, name.into(), on_error, TraceErrorKind::Read)
}

/// [`parse_with`], with `read_error` saying what a failed read is (a plain read, a gzip stream).
fn parse_inner(
    reader: impl BufRead,
    name: String,
    on_error: OnError,
    read_error: fn(io::Error) -> TraceErrorKind,
) -> Result<Trace, TraceError> {
    parse_limited(reader, name, on_error, read_error, MAX_OPS)
}

/// [`parse_inner`] with at most `max_ops` ops (a smaller limit for the tests).
fn parse_limited(
    mut reader: impl BufRead,
    name: String,
    on_error: OnError,
    read_error: fn(io::Error) -> TraceErrorKind,
    max_ops: usize,
) -> Result<Trace, TraceError> {
    let at = |line, kind| TraceError {
        path: None,
        line,
        kind,
        skippable: true,
    };
    let fatal = |line, kind| TraceError {
        path: None,
        line,
        kind,
        skippable: false,
    };
    let mut bytes = Vec::new();
    let mut n = 0usize;
    // The next non-blank line, read as bytes so that text that is not UTF-8 is a bad line rather
    // than a read error; None at the end.
    let mut next_line =
        |n: &mut usize| -> Result<Option<Result<String, TraceErrorKind>>, TraceError> {
            loop {
                *n += 1;
                let read = read_line(&mut reader, &mut bytes, on_error == OnError::Skip)
                    .map_err(|e| at(*n, read_error(e)))?;
                match read {
                    None => return Ok(None),
                    Some(false) => return Ok(Some(Err(TraceErrorKind::LineTooLong))),
                    Some(true) => {}
                }
                match std::str::from_utf8(&bytes) {
                    Ok(text) if text.trim().is_empty() => continue,
                    Ok(text) => return Ok(Some(Ok(text.to_owned()))),
                    Err(_) => return Ok(Some(Err(TraceErrorKind::NotUtf8))),
                }
            }
        };

    let header = match next_line(&mut n) {
        Ok(None) => return Err(fatal(n.max(1), TraceErrorKind::Empty)),
        Ok(Some(header)) => header.map_err(|k| fatal(n, k))?,
        Err(e) => {
            return Err(TraceError {
                skippable: false,
                ..e
            })
        }
    };
    let columns = Columns::from_header(header.trim().trim_start_matches('\u{feff}'))
        .map_err(|k| fatal(n, k))?;

    let mut threads = Vec::new();
    let (mut thread_ids, mut stream_ids) = (Numbering::default(), Numbering::default());
    let (mut failures, mut skipped_empty) = (0, 0);
    let (mut skipped_lines, mut skipped) = (0, Vec::new());
    let mut skip = |error: TraceError| -> Result<(), TraceError> {
        match on_error {
            OnError::Stop => Err(error),
            OnError::Skip => {
                skipped_lines += 1;
                if skipped.len() < MAX_SKIPPED_KEPT {
                    skipped.push(SkippedLine {
                        line: error.line,
                        reason: error.kind.to_string(),
                    });
                }
                Ok(())
            }
        }
    };
    let mut ops = Vec::new();
    // Live allocations by pointer: (id, size).
    let mut live: HashMap<u64, (usize, usize)> = HashMap::new();
    // Allocations left out (too large, overflowing), by pointer: the line, so that their free is
    // left out with them.
    let mut left_out: HashMap<u64, usize> = HashMap::new();
    let (mut allocations, mut live_bytes) = (0usize, 0usize);
    loop {
        let text = match next_line(&mut n) {
            Ok(None) => break,
            Ok(Some(text)) => text,
            // Nothing after a read error can be trusted: the log ends here.
            Err(e) => {
                skip(e)?;
                break;
            }
        };
        let parsed = text.and_then(|t| columns.parse(&t));
        let (thread, op) = match parsed {
            Err(kind) => {
                skip(at(n, kind))?;
                continue;
            }
            Ok(Line::Failure) => {
                failures += 1;
                continue;
            }
            Ok(Line::Empty) => {
                skipped_empty += 1;
                continue;
            }
            Ok(Line::Allocate {
                pointer,
                size,
                thread,
                stream,
            }) => {
                if live.contains_key(&pointer) {
                    skip(at(n, TraceErrorKind::PointerLive(pointer)))?;
                    continue;
                }
                let bad = if size > MAX_SIZE {
                    Some(TraceErrorKind::SizeTooLarge(size))
                } else if live_bytes.checked_add(size).is_none() {
                    Some(TraceErrorKind::LiveOverflow {
                        live: live_bytes,
                        size,
                    })
                } else {
                    None
                };
                if let Some(kind) = bad {
                    skip(at(n, kind))?;
                    left_out.insert(pointer, n);
                    continue;
                }
                left_out.remove(&pointer);
                let id = allocations;
                live.insert(pointer, (id, size));
                allocations += 1;
                live_bytes += size;
                let stream = stream_ids.of(stream);
                if stream >= MAX_STREAMS {
                    return Err(fatal(n, TraceErrorKind::TooManyStreams));
                }
                (thread, Op::Alloc { id, size, stream })
            }
            Ok(Line::Free {
                pointer,
                size,
                thread,
            }) => match live.get(&pointer) {
                None => {
                    let kind = match left_out.remove(&pointer) {
                        Some(line) => TraceErrorKind::FreeOfSkipped { pointer, line },
                        None => TraceErrorKind::UnknownPointer(pointer),
                    };
                    skip(at(n, kind))?;
                    continue;
                }
                Some(&(_, allocated)) if allocated != size => {
                    let kind = TraceErrorKind::SizeMismatch {
                        pointer,
                        allocated,
                        freed: size,
                    };
                    skip(at(n, kind))?;
                    continue;
                }
                Some(&(id, allocated)) => {
                    live.remove(&pointer);
                    live_bytes -= allocated;
                    (thread, Op::Free { id })
                }
            },
        };
        if ops.len() == max_ops {
            return Err(fatal(n, TraceErrorKind::TooManyOps));
        }
        if ops.try_reserve(1).is_err() || threads.try_reserve(1).is_err() {
            return Err(fatal(n, TraceErrorKind::OutOfMemory(ops.len())));
        }
        ops.push(op);
        threads.push(thread_ids.of(thread));
    }
    let (mut thread_ids, mut stream_ids) = (thread_ids.values, stream_ids.values);
    if thread_ids.is_empty() {
        thread_ids.push(0);
    }
    if stream_ids.is_empty() {
        stream_ids.push(0);
    }
    let workload = Workload::new(name, ops)
        .and_then(|w| w.with_threads(threads))
        .map_err(|e| fatal(0, TraceErrorKind::Workload(e)))?;
    Ok(Trace {
        workload,
        thread_ids,
        stream_ids,
        failures,
        skipped_empty,
        skipped_lines,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_past_the_op_limit_is_an_error_not_an_allocation_failure() {
        let log = format!(
            "Action,Pointer,Size\n{}",
            "allocate,1,256\nfree,1,256\n".repeat(6)
        );
        let parse = |max| {
            parse_limited(
                log.as_bytes(),
                "t".into(),
                OnError::Skip,
                TraceErrorKind::Read,
                max,
            )
        };
        assert_eq!(parse(12).unwrap().workload.ops().len(), 12);
        let e = parse(11).unwrap_err();
        assert!(matches!(e.kind, TraceErrorKind::TooManyOps), "{e:?}");
        assert_eq!((e.line, e.skippable), (13, false));
    }

    #[test]
    fn a_log_past_the_stream_limit_is_an_error() {
        let mut log = String::from("Action,Pointer,Size,Stream\n");
        for i in 0..=MAX_STREAMS {
            log += &format!("allocate,{},256,{}\nfree,{},256,{}\n", i + 1, i, i + 1, i);
        }
        let e = parse(log.as_bytes(), "t").unwrap_err();
        assert!(matches!(e.kind, TraceErrorKind::TooManyStreams), "{e:?}");
        assert_eq!(e.line, 2 * MAX_STREAMS + 2);
        assert!(
            e.to_string().contains("more than 4096 distinct streams"),
            "{e}"
        );
    }

    #[test]
    fn stop_mode_stops_at_a_long_line_without_reading_it_to_its_end() {
        // A line too long is refused as soon as it passes the bound, not read (or decompressed)
        // to its end first. Here the line never ends: reading it to its end would never return.
        let endless = "Action,Pointer,Size\n".as_bytes().chain(io::repeat(b'x'));
        let e = parse(io::BufReader::new(endless), "t").unwrap_err();
        assert!(matches!(e.kind, TraceErrorKind::LineTooLong), "{e:?}");
        assert_eq!(e.line, 2);
    }

    #[test]
    fn the_header_names_the_columns() {
        assert_eq!(
            HEADER,
            [THREAD, TIME, ACTION, POINTER, SIZE, STREAM].join(",")
        );
    }
}
