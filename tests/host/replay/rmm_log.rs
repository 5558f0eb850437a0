//! RMM logs read into workloads: good lines, bad lines named where they are (or left out with
//! `OnError::Skip`), files plain and gzip-compressed, and the bounds on what a line may take.

use super::{alloc, free, HEADER};
use crate::support::files::{gzip, TempFile};
use mrstack::prelude::*;
use mrstack::replay::rmm_log::{self, TraceErrorKind};
use mrstack::replay::{self, min_capacity, Op};
use std::path::PathBuf;
use std::sync::Arc;

/// The ResNet-50 training trace of the repository (`data/traces/resnet50_train.csv.gz`); a missing
/// file fails the test that asks for it.
fn resnet_trace() -> PathBuf {
    let path = crate::support::traces::resnet50_path();
    assert!(
        path.exists(),
        "no trace at {} (data/traces/ of the repository, or $MRSTACK_TRACES)",
        path.display()
    );
    path
}

// ---------------------------------------------------------------- parsing

#[test]
fn parses_good_lines() {
    let log = "Thread,Time,Action,Pointer,Size,Stream\r\n\
               7,10:00:00:000001,allocate,0x1000,100,0\r\n\
               \n\
               7,10:00:00:000002,allocate,0x2000,200,0x5\n\
               9,10:00:00:000003,allocate failure,0x0,1000000,0\n\
               9,10:00:00:000004,free,0x1000,100,0\n\
               7,10:00:00:000005,allocate,4096,50,0\n\
               7,10:00:00:000006,allocate,0x0,0,0\n\
               7,10:00:00:000007,free,0x0,0,0\n\
               7,10:00:00:000008,free,0x2000,200,5\n";
    let t = rmm_log::parse(log.as_bytes(), "good").unwrap();
    assert_eq!(
        t.workload.ops(),
        [
            alloc(0, 100),
            Op::Alloc {
                id: 1,
                size: 200,
                stream: 1
            },
            free(0),
            alloc(2, 50),
            free(1),
        ]
    );
    assert_eq!(t.workload.name(), "good");
    assert_eq!(t.workload.peak_live(), 300);
    assert_eq!(t.workload.stream_count(), 2);
    assert_eq!(t.workload.unfreed(), 1);
    assert_eq!(t.stream_ids, [0, 5]);
    assert_eq!(t.thread_ids, [7, 9]);
    assert_eq!(t.workload.op_threads(), Some(&[0, 0, 1, 0, 0][..]));
    assert_eq!(t.workload.thread_count(), 2);
    assert_eq!((t.failures, t.skipped_empty), (1, 2));
}

#[test]
fn columns_are_found_by_name_and_thread_and_stream_are_optional() {
    let log = "Size , Pointer,Action\n64,0xa0,allocate\n64,0xa0,free\n64,0xa0,allocate\n";
    let t = rmm_log::parse(log.as_bytes(), "reordered").unwrap();
    assert_eq!(t.workload.ops(), [alloc(0, 64), free(0), alloc(1, 64)]);
    assert_eq!(t.stream_ids, [0]);
    assert_eq!(t.thread_ids, [0]);
}

/// Parses `body` after the standard header and returns the error's line and message.
fn parse_error(body: &str) -> (usize, String, TraceErrorKind) {
    let log = format!("{HEADER}{body}");
    let e = rmm_log::parse(log.as_bytes(), "bad").unwrap_err();
    let msg = e.to_string();
    (e.line, msg, e.kind)
}

/// Parses `line` after the standard header and one good allocation, checks that the error is on
/// that line (line 3), and returns its message and kind.
#[track_caller]
fn second_line_error(line: &str) -> (String, TraceErrorKind) {
    let (at, msg, kind) = parse_error(&format!("0,1,allocate,0x100,64,0\n{line}"));
    assert_eq!(at, 3);
    (msg, kind)
}

#[test]
fn malformed_lines_are_errors_naming_the_line() {
    let (msg, kind) = second_line_error("0,2,allocate,0x200,64\n");
    assert!(matches!(
        kind,
        TraceErrorKind::FieldCount {
            expected: 6,
            found: 5
        }
    ));
    assert!(msg.contains("line 3") && msg.contains("5 fields"), "{msg}");

    let (msg, kind) = second_line_error("0,2,allocate,0x200,lots,0\n");
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber { column: "Size", .. }
    ));
    assert!(msg.contains("Size `lots` is not a number"), "{msg}");

    let (_, kind) = second_line_error("0,2,allocate,0xZZ,8,0\n");
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber {
            column: "Pointer",
            ..
        }
    ));

    let (msg, kind) = second_line_error("0,2,reallocate,0x200,8,0\n");
    assert!(matches!(kind, TraceErrorKind::UnknownAction(ref a) if a == "reallocate"));
    assert!(msg.contains("unknown action `reallocate`"), "{msg}");

    let (_, kind) = second_line_error("0,2,allocate,0x100,8,0\n");
    assert!(matches!(kind, TraceErrorKind::PointerLive(0x100)));

    let (_, kind) = second_line_error("0,2,free,0x100,65,0\n");
    assert!(matches!(
        kind,
        TraceErrorKind::SizeMismatch {
            pointer: 0x100,
            allocated: 64,
            freed: 65
        }
    ));

    let e = rmm_log::parse("".as_bytes(), "empty").unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::Empty), "{e}");

    let e = rmm_log::parse("Thread,Time,Action,Size,Stream\n".as_bytes(), "h").unwrap_err();
    assert_eq!(e.line, 1);
    assert!(matches!(e.kind, TraceErrorKind::MissingColumn("Pointer")));
    assert!(e.to_string().contains("no `Pointer` column"), "{e}");
}

#[test]
fn free_of_unknown_pointer_is_an_error() {
    let (line, msg, kind) =
        parse_error("0,1,allocate,0x100,64,0\n0,2,free,0x100,64,0\n0,3,free,0x100,64,0\n");
    assert_eq!(line, 4);
    assert!(matches!(kind, TraceErrorKind::UnknownPointer(0x100)));
    assert!(msg.contains("line 4: free of 0x100"), "{msg}");
}

/// A log of `n` allocate/free pairs with varied sizes, as RMM writes it.
fn log_of(n: usize) -> String {
    let mut s = String::from(HEADER);
    for i in 0..n {
        let ptr = 0x7f00_0000_0000u64 + (i as u64) * 0x1000;
        s += &format!("0,{i},allocate,{ptr:#x},{},0\n", 256 + i % 1000);
        s += &format!("0,{i},free,{ptr:#x},{},0\n", 256 + i % 1000);
    }
    s
}

#[test]
fn reads_plain_and_gzip_files_alike() {
    let text = log_of(50);
    let plain = TempFile::new("mrstack", "plain.csv", text.as_bytes());
    // No .gz in the name: gzip is told by the content.
    let gz = TempFile::new("mrstack", "compressed.csv", &gzip(text.as_bytes()));
    let a = rmm_log::read(plain.path()).unwrap();
    let b = rmm_log::read(gz.path()).unwrap();
    assert_eq!(a.workload.ops(), b.workload.ops());
    assert_eq!(a.workload.allocations(), 50);
    let stem = gz
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .strip_suffix(".csv");
    assert_eq!(Some(b.workload.name()), stem);
}

#[test]
fn truncated_gzip_is_an_error() {
    let packed = gzip(log_of(3000).as_bytes());
    for keep in [packed.len() / 2, packed.len() - 4] {
        let f = TempFile::new(
            "mrstack",
            &format!("truncated-{keep}.csv.gz"),
            &packed[..keep],
        );
        let e = rmm_log::read(f.path()).unwrap_err();
        assert!(matches!(e.kind, TraceErrorKind::Gzip(_)), "{e}");
        assert!(e.line > 0 && e.skippable);
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("line {}", e.line)) && msg.contains("truncated"),
            "{msg}"
        );
        assert!(msg.starts_with(&f.path().display().to_string()), "{msg}");
    }
}

#[test]
fn missing_file_is_an_error() {
    let e = rmm_log::read("/nonexistent/mrstack/trace.csv").unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::Open(_)));
    assert!(e.to_string().contains("cannot open"), "{e}");
    assert!(!e.skippable);
}

#[test]
fn a_directory_is_named_as_one() {
    let dir = std::env::temp_dir();
    let e = rmm_log::read(&dir).unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::IsDirectory), "{e}");
    assert_eq!(
        e.to_string(),
        format!("{}: is a directory, not a log file", dir.display())
    );
    assert!(!e.skippable);
    // Through a reader that is a directory (opened without the check): the same.
    let e = rmm_log::read_from(std::fs::File::open(&dir).unwrap(), "d", Default::default())
        .unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::IsDirectory), "{e}");
}

#[test]
fn only_line_errors_are_skippable() {
    let e = rmm_log::parse("".as_bytes(), "empty").unwrap_err();
    assert!(!e.skippable);
    let e = rmm_log::parse("Thread,Size\n".as_bytes(), "h").unwrap_err();
    assert!(!e.skippable);
    let e = rmm_log::parse(&b"\xff\xfe\n"[..], "binary header").unwrap_err();
    assert!(
        matches!(e.kind, TraceErrorKind::NotUtf8) && !e.skippable,
        "{e}"
    );
    let (_, _, kind) = parse_error("0,1,free,0x100,64,0\n");
    assert!(matches!(kind, TraceErrorKind::UnknownPointer(0x100)));
    let e = rmm_log::parse(format!("{HEADER}0,1,free,0x100,64,0\n").as_bytes(), "x").unwrap_err();
    assert!(e.skippable);
}

#[test]
fn a_size_no_resource_can_serve_is_named_at_its_line() {
    let max = rmm_log::MAX_SIZE;
    assert_eq!(max, (isize::MAX as usize) - 255);
    // The largest servable size parses; one byte more is refused at its line, before any replay.
    let ok = format!("0,1,allocate,0x100,{max},0\n0,2,free,0x100,{max},0\n");
    assert!(rmm_log::parse(format!("{HEADER}{ok}").as_bytes(), "max").is_ok());
    let big = max + 1;
    let body =
        format!("0,1,allocate,0x100,64,0\n0,2,allocate,0x200,{big},0\n0,3,free,0x200,{big},0\n");
    let (line, msg, kind) = parse_error(&body);
    assert_eq!(line, 3);
    assert!(matches!(kind, TraceErrorKind::SizeTooLarge(s) if s == big));
    assert!(
        msg.starts_with("line 3: allocation of") && msg.contains("more than any resource"),
        "{msg}"
    );
    // Left out with --on-error skip, its free goes with it, saying why.
    let t = rmm_log::parse_with(
        format!("{HEADER}{body}").as_bytes(),
        "s",
        rmm_log::OnError::Skip,
    )
    .unwrap();
    assert_eq!(t.workload.ops(), [alloc(0, 64)]);
    assert_eq!(t.skipped_lines, 2);
    assert_eq!(
        t.skipped[1].to_string(),
        "line 4: free of 0x200, whose allocation (line 3) was left out"
    );
}

#[test]
fn overflowing_live_bytes_are_named_at_their_line() {
    let half = 1usize << 62;
    let body = format!(
        "0,1,allocate,0x100,{half},0\n0,2,allocate,0x200,{half},0\n0,3,allocate,0x300,{half},0\n\
         0,4,allocate,0x400,{half},0\n"
    );
    let (line, msg, kind) = parse_error(&body);
    assert_eq!(line, 5);
    assert!(matches!(kind, TraceErrorKind::LiveOverflow { size, .. } if size == half));
    assert!(
        msg.contains("line 5") && msg.contains("overflow usize"),
        "{msg}"
    );
    // Freeing makes room again: the same sizes one after the other are fine.
    let ok = format!("0,1,allocate,0x100,{half},0\n0,2,free,0x100,{half},0\n").repeat(5);
    let t = rmm_log::parse(format!("{HEADER}{ok}").as_bytes(), "ok").unwrap();
    assert_eq!(t.workload.peak_live(), half);
}

#[test]
fn a_line_without_an_end_takes_no_memory_of_its_size() {
    // 1 MiB of junk with no newline, then a good line: the junk is one bad line.
    let mut bytes = HEADER.as_bytes().to_vec();
    bytes.extend(std::iter::repeat_n(b'7', 1 << 20));
    bytes.extend_from_slice(b"\n0,1,allocate,0x100,64,0\n");
    let e = rmm_log::parse(&bytes[..], "long").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(matches!(e.kind, TraceErrorKind::LineTooLong), "{e}");
    let t = rmm_log::parse_with(&bytes[..], "long", rmm_log::OnError::Skip).unwrap();
    assert_eq!(
        (t.skipped_lines, t.workload.ops()),
        (1, &[alloc(0, 64)][..])
    );
    assert_eq!(t.skipped[0].line, 2);
    // A line of exactly the limit is read.
    let mut line = format!("0,1,allocate,0x100,64,0{}", " ".repeat(rmm_log::MAX_LINE));
    line.truncate(rmm_log::MAX_LINE - 1);
    let t = rmm_log::parse(format!("{HEADER}{line}\n").as_bytes(), "edge").unwrap();
    assert_eq!(t.workload.allocations(), 1);
}

#[test]
fn resnet_trace_parses() {
    let path = resnet_trace();
    let t = rmm_log::read(path).unwrap();
    let w = &t.workload;
    assert_eq!(w.name(), "resnet50_train");
    assert_eq!(w.allocations(), 3221);
    assert_eq!(w.ops().len(), 6442);
    assert_eq!(w.unfreed(), 0);
    assert_eq!(w.stream_count(), 1);
    assert!(w.peak_live() > 0);
    let raw = &replay::stacks::<Arc<Simulated>>()[0];
    let cap = min_capacity(raw.as_ref(), w, 0.001).unwrap();
    assert_eq!((cap.capacity, cap.ratio), (w.peak_live(), 1.0));
}

// ---------------------------------------------------------------- lenient parsing

#[test]
fn skip_mode_leaves_bad_lines_out_and_counts_them() {
    let mut log = String::from(HEADER);
    log += "0,1,allocate,0x100,64,0\n"; // line 2
    log += "0,2,allocate,0x200,64\n"; // 3: 5 fields
    log += "0,3,free,0x999,8,0\n"; // 4: unknown pointer
    log += "0,4,free,0x100,65,0\n"; // 5: size mismatch
    log += "0,5,allocate,0x100,8,0\n"; // 6: pointer still live
    log += "0,6,reallocate,0x300,8,0\n"; // 7: unknown action
    log += "0,7,allocate,0x300,32,0\n"; // 8
    log += "0,8,free,0x100,64,0\n"; // 9
    let mut bytes = log.into_bytes();
    bytes.extend_from_slice(b"0,9,allocate,0x\xff\xfe,8,0\n"); // 10: not UTF-8
    bytes.extend_from_slice(b"0,10,free,0x300,32,0\n"); // 11

    let e = rmm_log::parse(&bytes[..], "strict").unwrap_err();
    assert_eq!(e.line, 3);

    let t = rmm_log::parse_with(&bytes[..], "lenient", rmm_log::OnError::Skip).unwrap();
    assert_eq!(
        t.workload.ops(),
        [alloc(0, 64), alloc(1, 32), free(0), free(1)]
    );
    assert_eq!(t.skipped_lines, 6);
    let lines: Vec<usize> = t.skipped.iter().map(|s| s.line).collect();
    assert_eq!(lines, [3, 4, 5, 6, 7, 10]);
    assert!(
        t.skipped[1].reason.contains("free of 0x999"),
        "{:?}",
        t.skipped
    );
    assert!(t.skipped[5].reason.contains("not UTF-8"), "{:?}", t.skipped);
    assert_eq!(
        t.skipped[1].to_string(),
        format!("line 4: {}", t.skipped[1].reason)
    );
}

#[test]
fn not_utf8_is_an_error_naming_the_line() {
    let mut bytes = HEADER.as_bytes().to_vec();
    bytes.extend_from_slice(b"0,1,allocate,0x100,64,0\n0,1,\xc3\x28,0x100,64,0\n");
    let e = rmm_log::parse(&bytes[..], "binary").unwrap_err();
    assert_eq!(e.line, 3);
    assert!(matches!(e.kind, TraceErrorKind::NotUtf8), "{e}");
}

#[test]
fn skip_mode_keeps_what_a_truncated_gzip_holds() {
    let packed = gzip(log_of(3000).as_bytes());
    let f = TempFile::new(
        "mrstack",
        "truncated-skip.csv.gz",
        &packed[..packed.len() / 2],
    );
    let t = rmm_log::read_with(f.path(), rmm_log::OnError::Skip).unwrap();
    assert_eq!(t.skipped_lines, 1);
    assert!(t.skipped[0].reason.contains("truncated"), "{:?}", t.skipped);
    let n = t.workload.allocations();
    assert!(n > 100 && n < 3000, "{n} allocations read");
    // The line that broke is where the strict parse stops.
    let strict = rmm_log::read(f.path()).unwrap_err();
    assert_eq!(strict.line, t.skipped[0].line);
}

#[test]
fn a_header_is_needed_even_in_skip_mode() {
    let e = rmm_log::parse_with("".as_bytes(), "empty", rmm_log::OnError::Skip).unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::Empty));
    let e = rmm_log::parse_with("Thread,Time\n1,2\n".as_bytes(), "h", rmm_log::OnError::Skip)
        .unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::MissingColumn("Action")));
}
