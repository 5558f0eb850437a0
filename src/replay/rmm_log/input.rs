//! The ways a log is read: from a file, from a reader (plain or gzip-compressed), from text.

use super::parser::parse_inner;
use super::{OnError, Trace, TraceError, TraceErrorKind};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// Reads the log at `path`, gzip-compressed or not (told by its first bytes, not its name),
/// stopping at the first bad line; the workload is named after the file, less `.csv` and `.gz`
/// (`resnet50_train`).
///
/// # The format
///
/// The first line is a header naming the columns, [`HEADER`](super::HEADER):
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
/// A log of many threads keeps each op's thread
/// ([`Workload::op_threads`](crate::replay::Workload::op_threads)), so that a replay can run each
/// thread's ops on a thread of its own.
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
    file_stem(path, &[".csv"])
}

/// The file name of `path` less `.gz`, then less the first of `suffixes` it ends with: the name
/// of the workload a log or a snapshot holds.
pub(in crate::replay) fn file_stem(path: &Path, suffixes: &[&str]) -> String {
    let file_name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let name = file_name.strip_suffix(".gz").unwrap_or(&file_name);
    suffixes
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
        .to_owned()
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

/// [`parse`], doing `on_error` with bad lines.
pub fn parse_with(
    reader: impl BufRead,
    name: impl Into<String>,
    on_error: OnError,
) -> Result<Trace, TraceError> {
    parse_inner(reader, name.into(), on_error, TraceErrorKind::Read)
}
