//! The parser: a log's lines become a workload's ops, each free paired with its allocation.

use super::lines::{read_line, Columns, Line};
use super::{
    OnError, SkippedLine, Trace, TraceError, TraceErrorKind, MAX_OPS, MAX_SIZE, MAX_SKIPPED_KEPT,
    MAX_STREAMS,
};
use crate::replay::{Op, Workload};
use std::collections::HashMap;
use std::io::{self, BufRead};

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

/// [`parse_with`], with `read_error` saying what a failed read is (a plain read, a gzip stream).
pub(super) fn parse_inner(
    reader: impl BufRead,
    name: String,
    on_error: OnError,
    read_error: fn(io::Error) -> TraceErrorKind,
) -> Result<Trace, TraceError> {
    parse_limited(reader, name, on_error, read_error, MAX_OPS)
}

/// [`parse_inner`] with at most `max_ops` ops (a smaller limit for the tests).
pub(super) fn parse_limited(
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
