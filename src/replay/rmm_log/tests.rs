//! The parser's limits and bounds, and the header's columns.

use super::parser::parse_limited;
use super::*;
use std::io::{self, Read};

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
