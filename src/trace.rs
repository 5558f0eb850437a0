//! Parsing RMM allocation logs into [`Workload`]s: the CSV that RMM's
//! `logging_resource_adaptor` (and this crate's `Logging`) writes, plain or gzip-compressed.
//!
//! The first line is a header naming the columns, `Thread,Time,Action,Pointer,Size,Stream`;
//! columns are found by name, so their order may differ, and `Thread`, `Time` and `Stream` may be
//! missing (one thread, the default stream). `Action` is `allocate`, `free` or `allocate failure`
//! (a failed request: skipped, as RMM's replay does). `Pointer` is hexadecimal with `0x` or
//! decimal; so are `Stream` and `Thread`; `Time` is not read. Each free is paired with the live
//! allocation at its pointer, must free the size that was allocated, and is replayed on the
//! allocation's stream. Zero-size requests at the
//! null pointer carry no memory and are skipped. Allocations never freed are kept: a replay frees
//! them after its timed part.
//!
//! Parsing builds the whole op list first, so it costs nothing in a measurement. Every problem is a
//! [`TraceError`] naming the line: a malformed line, a free of a pointer not allocated, a file that
//! ends inside its gzip stream. Nothing here panics on bad input.
//!
//! ```
//! let log = "Thread,Time,Action,Pointer,Size,Stream\n\
//!            0,1,allocate,0x7f0000000000,1024,0\n\
//!            0,2,free,0x7f0000000000,1024,0\n";
//! let trace = mrstack::trace::parse(log.as_bytes(), "example").unwrap();
//! assert_eq!(trace.workload.allocations(), 1);
//! assert_eq!(trace.workload.peak_live(), 1024);
//! ```

use crate::workload::{Op, Workload, WorkloadError};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

/// A parsed log: the workload, and what the replay of a many-threaded log needs besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The ops, ids numbering allocations in log order; stream `i` is `stream_ids[i]`.
    pub workload: Workload,
    /// For each op, the index in `thread_ids` of the thread that ran it.
    pub threads: Vec<usize>,
    /// The `Thread` values of the log, in order of first appearance.
    pub thread_ids: Vec<u64>,
    /// The `Stream` values of the log, in order of first appearance (stream index `i` of an op
    /// is `stream_ids[i]`; 0 is the default stream).
    pub stream_ids: Vec<u64>,
    /// `allocate failure` lines skipped.
    pub failures: usize,
    /// Zero-size requests at the null pointer skipped.
    pub skipped_empty: usize,
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
}

/// What is wrong in a log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// The file could not be opened.
    #[error("cannot open: {0}")]
    Open(#[source] io::Error),
    /// Reading failed: a truncated or corrupt gzip stream, bytes that are not UTF-8, a disk error.
    #[error("cannot read (a gzip file that is truncated or corrupt?): {0}")]
    Read(#[source] io::Error),
    /// The log has no header line.
    #[error("empty log: expected the header Thread,Time,Action,Pointer,Size,Stream")]
    Empty,
    /// The header lacks a column the parser needs.
    #[error("the header has no `{0}` column: expected Thread,Time,Action,Pointer,Size,Stream")]
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
    #[error("unknown action `{0}`: expected allocate, free or allocate failure")]
    UnknownAction(String),
    /// A free of a pointer that no earlier line allocated (or that was freed already).
    #[error("free of {0:#x}, which is not a live allocation (never allocated, or freed twice)")]
    UnknownPointer(u64),
    /// An allocation at a pointer that is still live.
    #[error("allocate at {0:#x}, which is still live (a free missing from the log?)")]
    PointerLive(u64),
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

/// The ResNet-50 training trace this project measures with (an RMM log of a real run on an H100):
/// `$MRSTACK_TRACES/resnet50_train.csv.gz` where that variable is set (a GPU machine that gets the
/// file beside the test binaries), else `shared/traces/` beside the repository.
pub fn resnet50_path() -> PathBuf {
    let dir = std::env::var_os("MRSTACK_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces"));
    dir.join("resnet50_train.csv.gz")
}

/// Reads the log at `path`, gzip-compressed or not (told by its first bytes, not its name); the
/// workload is named after the file, less `.csv` and `.gz` (`resnet50_train`).
pub fn read(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let at = |line, kind| TraceError {
        path: Some(path.to_owned()),
        line,
        kind,
    };
    let file = File::open(path).map_err(|e| at(0, TraceErrorKind::Open(e)))?;
    let mut reader = BufReader::new(file);
    let gzip = reader
        .fill_buf()
        .map_err(|e| at(1, TraceErrorKind::Read(e)))?
        .starts_with(&[0x1f, 0x8b]);
    let file_name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let name = file_name.strip_suffix(".gz").unwrap_or(&file_name);
    let name = name.strip_suffix(".csv").unwrap_or(name).to_owned();
    let parsed = if gzip {
        parse(
            BufReader::new(flate2::bufread::MultiGzDecoder::new(reader)),
            name,
        )
    } else {
        parse(reader, name)
    };
    parsed.map_err(|e| TraceError {
        path: Some(path.to_owned()),
        ..e
    })
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
            thread: find("Thread"),
            action: need("Action")?,
            pointer: need("Pointer")?,
            size: need("Size")?,
            stream: find("Stream"),
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

/// The index of `value` in `seen`, appending it when new.
fn index_of(seen: &mut Vec<u64>, value: u64) -> usize {
    seen.iter().position(|&v| v == value).unwrap_or_else(|| {
        seen.push(value);
        seen.len() - 1
    })
}

/// Parses a log from `reader` (uncompressed text; [`read`] handles gzip), naming the workload
/// `name`.
pub fn parse(mut reader: impl BufRead, name: impl Into<String>) -> Result<Trace, TraceError> {
    let mut line = String::new();
    let mut number_of_line = 0usize;
    let at = |line, kind| TraceError {
        path: None,
        line,
        kind,
    };
    // The next non-blank line, without its line ending; None at the end.
    let mut next_line = |line: &mut String, n: &mut usize| -> Result<bool, TraceError> {
        loop {
            line.clear();
            *n += 1;
            let read = reader
                .read_line(line)
                .map_err(|e| at(*n, TraceErrorKind::Read(e)))?;
            if read == 0 {
                return Ok(false);
            }
            if !line.trim().is_empty() {
                return Ok(true);
            }
        }
    };

    if !next_line(&mut line, &mut number_of_line)? {
        return Err(at(number_of_line.max(1), TraceErrorKind::Empty));
    }
    let columns = Columns::from_header(line.trim().trim_start_matches('\u{feff}'))
        .map_err(|k| at(number_of_line, k))?;

    let (mut threads, mut thread_ids, mut stream_ids) = (Vec::new(), Vec::new(), Vec::new());
    let (mut failures, mut skipped_empty) = (0, 0);
    let mut ops = Vec::new();
    // Live allocations by pointer: (id, size).
    let mut live: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut allocations = 0usize;
    while next_line(&mut line, &mut number_of_line)? {
        let n = number_of_line;
        let fields: Vec<&str> = line.trim().split(',').map(str::trim).collect();
        if fields.len() != columns.count {
            return Err(at(
                n,
                TraceErrorKind::FieldCount {
                    expected: columns.count,
                    found: fields.len(),
                },
            ));
        }
        let allocate = match fields[columns.action] {
            "allocate" => true,
            "free" => false,
            "allocate failure" => {
                failures += 1;
                continue;
            }
            other => return Err(at(n, TraceErrorKind::UnknownAction(other.to_owned()))),
        };
        let field = |column, i| number(column, fields[i]).map_err(|k| at(n, k));
        let pointer = field("Pointer", columns.pointer)?;
        let size = usize::try_from(field("Size", columns.size)?).map_err(|_| {
            at(
                n,
                TraceErrorKind::BadNumber {
                    column: "Size",
                    value: fields[columns.size].to_owned(),
                },
            )
        })?;
        if pointer == 0 && size == 0 {
            skipped_empty += 1;
            continue;
        }
        let thread = match columns.thread {
            Some(i) => field("Thread", i)?,
            None => 0,
        };
        let stream = match columns.stream {
            Some(i) => field("Stream", i)?,
            None => 0,
        };
        let thread = index_of(&mut thread_ids, thread);
        if allocate {
            let id = allocations;
            if live.insert(pointer, (id, size)).is_some() {
                return Err(at(n, TraceErrorKind::PointerLive(pointer)));
            }
            let stream = index_of(&mut stream_ids, stream);
            ops.push(Op::Alloc { id, size, stream });
            allocations += 1;
        } else {
            match live.remove(&pointer) {
                None => return Err(at(n, TraceErrorKind::UnknownPointer(pointer))),
                Some((_, allocated)) if allocated != size => {
                    return Err(at(
                        n,
                        TraceErrorKind::SizeMismatch {
                            pointer,
                            allocated,
                            freed: size,
                        },
                    ))
                }
                Some((id, _)) => ops.push(Op::Free { id }),
            }
        }
        threads.push(thread);
    }
    let workload = Workload::new(name, ops).map_err(|e| at(0, TraceErrorKind::Workload(e)))?;
    Ok(Trace {
        workload,
        threads,
        thread_ids,
        stream_ids,
        failures,
        skipped_empty,
    })
}
