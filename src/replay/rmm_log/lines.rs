//! One line of a log: read within [`MAX_LINE`] bytes, split at its commas, parsed into a
//! [`Line`] by the columns the header names.

use super::{
    TraceErrorKind, ACTION, ALLOCATE, ALLOCATE_FAILURE, FREE, MAX_LINE, POINTER, SIZE, STREAM,
    THREAD,
};
use std::io::{self, BufRead, Read};

/// One line of a log, parsed.
pub(super) enum Line {
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

/// Column positions found in the header.
pub(super) struct Columns {
    count: usize,
    thread: Option<usize>,
    action: usize,
    pointer: usize,
    size: usize,
    stream: Option<usize>,
}

impl Columns {
    /// The columns `header` names; an error where one the parser needs is missing.
    pub(super) fn from_header(header: &str) -> Result<Self, TraceErrorKind> {
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

    /// The line `text` (not blank), by these columns.
    pub(super) fn parse(&self, text: &str) -> Result<Line, TraceErrorKind> {
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

/// Reads the next line into `bytes` (cleared first), at most [`MAX_LINE`] bytes of it: `Ok(None)`
/// at the end, `Ok(Some(false))` for a line that was longer (with `drain`, the rest of it is read
/// and dropped, for a caller that goes on; without, it is left: the caller stops there, and a line
/// of gigabytes is not decompressed to the end first).
pub(super) fn read_line(
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
