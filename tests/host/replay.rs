//! Workloads, RMM log parsing, the replayers and the minimum-capacity search, over `Simulated`.

use crate::support::files::{gzip, TempFile};
use mrstack::prelude::*;
use mrstack::replay::rmm_log::{self, TraceErrorKind};
use mrstack::replay::{
    self, measure, min_capacity, random, simulated_streams, stack, Op, RandomConfig, ReplayError,
    Replayer, Workload, WorkloadError,
};
use mrstack::resource::{check_request, AllocErrorKind};
use mrstack::stack::AnyLayer;
use mrstack::stream::StreamHandle;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

fn alloc(id: usize, size: usize) -> Op {
    Op::Alloc {
        id,
        size,
        stream: 0,
    }
}

fn free(id: usize) -> Op {
    Op::Free { id }
}

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

#[test]
fn malformed_lines_are_errors_naming_the_line() {
    let ok = "0,1,allocate,0x100,64,0\n";

    let (line, msg, kind) = parse_error(&format!("{ok}0,2,allocate,0x200,64\n"));
    assert_eq!(line, 3);
    assert!(matches!(
        kind,
        TraceErrorKind::FieldCount {
            expected: 6,
            found: 5
        }
    ));
    assert!(msg.contains("line 3") && msg.contains("5 fields"), "{msg}");

    let (line, msg, kind) = parse_error(&format!("{ok}0,2,allocate,0x200,lots,0\n"));
    assert_eq!(line, 3);
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber { column: "Size", .. }
    ));
    assert!(msg.contains("Size `lots` is not a number"), "{msg}");

    let (line, _, kind) = parse_error(&format!("{ok}0,2,allocate,0xZZ,8,0\n"));
    assert_eq!(line, 3);
    assert!(matches!(
        kind,
        TraceErrorKind::BadNumber {
            column: "Pointer",
            ..
        }
    ));

    let (line, msg, kind) = parse_error(&format!("{ok}0,2,reallocate,0x200,8,0\n"));
    assert_eq!(line, 3);
    assert!(matches!(kind, TraceErrorKind::UnknownAction(ref a) if a == "reallocate"));
    assert!(msg.contains("unknown action `reallocate`"), "{msg}");

    let (line, _, kind) = parse_error(&format!("{ok}0,2,allocate,0x100,8,0\n"));
    assert_eq!(line, 3);
    assert!(matches!(kind, TraceErrorKind::PointerLive(0x100)));

    let (line, _, kind) = parse_error(&format!("{ok}0,2,free,0x100,65,0\n"));
    assert_eq!(line, 3);
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

// ---------------------------------------------------------------- workloads

#[test]
fn workload_checks_its_ops() {
    assert_eq!(
        Workload::new("w", vec![alloc(1, 8)]).unwrap_err(),
        WorkloadError::IdOutOfOrder {
            op: 0,
            id: 1,
            expected: 0
        }
    );
    assert_eq!(
        Workload::new("w", vec![alloc(0, 8), free(1)]).unwrap_err(),
        WorkloadError::UnknownId { op: 1, id: 1 }
    );
    assert_eq!(
        Workload::new("w", vec![alloc(0, 8), free(0), free(0)]).unwrap_err(),
        WorkloadError::DoubleFree { op: 2, id: 0 }
    );
    let w = Workload::new("w", vec![alloc(0, 8), alloc(1, 4), free(0), alloc(2, 16)]).unwrap();
    assert_eq!((w.peak_live(), w.allocations(), w.unfreed()), (20, 3, 2));
}

#[test]
fn random_workload_invariants() {
    let w = random(&RandomConfig::default());
    assert_eq!(w.name(), "random");
    let allocs = w
        .ops()
        .iter()
        .filter(|o| matches!(o, Op::Alloc { .. }))
        .count();
    assert_eq!(allocs, 10_000);
    assert_eq!(w.allocations(), 10_000);
    assert_eq!(w.ops().len(), 20_000, "every allocation freed exactly once");
    // Workload::new checks that each free names a live allocation, once, and recomputes the peak.
    let checked = Workload::new("again", w.ops().to_vec()).unwrap();
    assert_eq!(checked.unfreed(), 0);
    assert_eq!(checked.peak_live(), w.peak_live());

    let mut sizes = vec![0usize; 10_000];
    let (mut live, mut peak) = (0usize, 0usize);
    for op in w.ops() {
        match *op {
            Op::Alloc { id, size, stream } => {
                assert!((1..=1 << 20).contains(&size));
                assert_eq!(stream, 0);
                sizes[id] = size;
                live += size;
                peak = peak.max(live);
                assert!(live <= 8 << 30);
            }
            Op::Free { id } => live -= sizes[id],
        }
    }
    assert_eq!((live, peak), (0, w.peak_live()));

    assert_eq!(random(&RandomConfig::default()), w, "deterministic");
    let other = random(&RandomConfig {
        seed: 1,
        ..Default::default()
    });
    assert_ne!(other.ops(), w.ops());
}

#[test]
fn random_workload_respects_the_live_cap() {
    let w = random(&RandomConfig {
        allocations: 2000,
        max_size: 1000,
        alloc_percent: 90,
        max_live: 50_000,
        seed: 3,
    });
    assert_eq!(w.allocations(), 2000);
    assert!(w.peak_live() <= 50_000);
    // At 90% the cap binds: the peak comes within one block of it.
    assert!(w.peak_live() > 49_000, "{}", w.peak_live());
}

// ---------------------------------------------------------------- replay

#[test]
fn replay_returns_everything_and_reports_failures() {
    let w = Workload::new(
        "w",
        vec![
            alloc(0, 100),
            alloc(1, 200),
            free(0),
            alloc(2, 50),
            alloc(3, 1000),
        ],
    )
    .unwrap();
    let sim = Simulated::new(1 << 20);
    let mut r = Replayer::new(&sim, &w, w.default_streams()).unwrap();
    r.pass().unwrap();
    r.pass().unwrap();
    // Blocks the workload leaves live are freed after each pass.
    assert_eq!((sim.in_use(), sim.live(), sim.peak()), (0, 0, 1250));
    assert_eq!(sim.allocation_count(), 8);

    let small = Simulated::new(1000);
    let mut r = Replayer::new(&small, &w, w.default_streams()).unwrap();
    match r.pass() {
        Err(ReplayError::Alloc {
            op: 4,
            size: 1000,
            error,
        }) => {
            assert!(error.is_out_of_memory())
        }
        other => panic!("expected op 4 to fail, got {other:?}"),
    }
    assert_eq!(small.in_use(), 0, "a failed pass frees what it holds");

    let two = Workload::new(
        "two",
        vec![Op::Alloc {
            id: 0,
            size: 8,
            stream: 1,
        }],
    )
    .unwrap();
    assert!(matches!(
        Replayer::new(&sim, &two, vec![StreamHandle::DEFAULT]),
        Err(ReplayError::Streams {
            needed: 2,
            given: 1
        })
    ));
    // SAFETY: the streams go to Simulated only.
    let mut r = Replayer::new(&sim, &two, simulated_streams(2)).unwrap();
    r.pass().unwrap();
}

#[test]
fn measure_runs_warm_up_and_the_passes_asked() {
    let w = random(&RandomConfig {
        allocations: 500,
        ..Default::default()
    });
    let sim = Simulated::new(8 << 30);
    let mut r = Replayer::new(&sim, &w, w.default_streams()).unwrap();
    let t = measure(&mut r, 5).unwrap();
    assert_eq!((t.passes.len(), t.ops), (5, 1000));
    assert!(t.passes.contains(&t.ns_per_op));
    assert_eq!(sim.allocation_count(), 6 * 500);
    assert_eq!(sim.in_use(), 0);
}

// ---------------------------------------------------------------- capacity search

/// A test stack that never reuses memory: freed blocks stay taken from the upstream until it is
/// dropped. Its minimum capacity is the sum of all allocations.
struct NoReuse<U: MemoryResource> {
    upstream: U,
    freed: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: every block comes from the upstream and goes back to it, once, on drop.
unsafe impl<U: MemoryResource> MemoryResource for NoReuse<U> {
    type Host = U::Host;
    type Device = U::Device;
    type Managed = U::Managed;
    type Pageable = U::Pageable;
    type Alignment = U::Alignment;

    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = check_request::<Self>(size, align, "NoReuse")? {
            return Ok(p);
        }
        self.upstream.allocate(size, align, s)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _: usize, _: StreamRef) {
        if size > 0 {
            self.freed
                .lock()
                .unwrap()
                .push((ptr.as_ptr() as usize, size));
        }
    }

    fn synchronize(&self, s: StreamRef) -> Result<(), AllocError> {
        self.upstream.synchronize(s)
    }
    fn order_after(&self, s: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.upstream.order_after(s, after)
    }
}

impl<U: MemoryResource> Drop for NoReuse<U> {
    fn drop(&mut self) {
        for &(addr, size) in self.freed.get_mut().unwrap().iter() {
            let ptr = NonNull::new(addr as *mut u8).unwrap();
            // SAFETY: each entry is a block from the upstream with this size, freed here once.
            unsafe {
                self.upstream
                    .deallocate(ptr, size, replay::ALIGN, StreamRef::DEFAULT)
            };
        }
    }
}

#[test]
fn capacity_search_finds_the_known_answer() {
    // Peak live 300 (blocks 0 and 1); 350 bytes allocated in all.
    let w = Workload::new(
        "tiny",
        vec![
            alloc(0, 100),
            alloc(1, 200),
            free(0),
            alloc(2, 50),
            free(1),
            free(2),
        ],
    )
    .unwrap();
    assert_eq!(w.peak_live(), 300);

    let raw = &replay::stacks::<Arc<Simulated>>()[0];
    assert_eq!(raw.name(), "upstream");
    let cap = min_capacity(raw.as_ref(), &w, 0.001).unwrap();
    assert_eq!(
        (cap.capacity, cap.peak_live, cap.ratio, cap.upstream_peak),
        (300, 300, 1.0, 300)
    );
    assert_eq!(cap.probes, 1);

    let no_reuse = stack("no-reuse", |upstream: Arc<Simulated>, _| {
        Ok(NoReuse {
            upstream,
            freed: Mutex::new(Vec::new()),
        })
    });
    let cap = min_capacity(no_reuse.as_ref(), &w, 0.0).unwrap();
    assert_eq!((cap.capacity, cap.upstream_peak), (350, 350));
    assert!((cap.ratio - 350.0 / 300.0).abs() < 1e-12);

    // At 10% precision the answer may be up to 10% high, never low.
    let coarse = min_capacity(no_reuse.as_ref(), &w, 0.1).unwrap();
    assert!((350..=385).contains(&coarse.capacity), "{coarse:?}");
    assert!(coarse.probes < cap.probes);
}

#[test]
fn capacity_search_reports_stacks_that_never_fit_or_fail_otherwise() {
    let w = Workload::new("w", vec![alloc(0, 100), free(0)]).unwrap();
    let never = stack("never", |_: Arc<Simulated>, cap| {
        Err::<Simulated, _>(AllocError::out_of_memory(cap, 1, "never"))
    });
    match min_capacity(never.as_ref(), &w, 0.001) {
        Err(ReplayError::NeverCompletes { capacity, last }) => {
            assert_eq!(
                capacity,
                (100 * replay::MAX_CAPACITY_FACTOR).max(replay::MIN_CAPACITY_LIMIT)
            );
            assert!(last.is_out_of_memory());
        }
        other => panic!("expected NeverCompletes, got {other:?}"),
    }

    let broken = stack("broken", |_: Arc<Simulated>, _| {
        Err::<Simulated, _>(AllocError::new(
            AllocErrorKind::Unsupported("test"),
            0,
            0,
            "broken",
        ))
    });
    let e = min_capacity(broken.as_ref(), &w, 0.001).unwrap_err();
    assert!(matches!(e, ReplayError::Build(_)), "{e}");
}

#[test]
fn raw_upstream_needs_exactly_the_peak_of_the_random_workload() {
    let w = random(&RandomConfig::default());
    let raw = &replay::stacks::<Arc<Simulated>>()[0];
    let cap = min_capacity(raw.as_ref(), &w, 0.001).unwrap();
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

// ---------------------------------------------------------------- threads

#[test]
fn workload_threads_are_one_per_op() {
    let w = Workload::new("w", vec![alloc(0, 8), free(0)]).unwrap();
    assert_eq!((w.thread_count(), w.op_threads()), (1, None));
    assert_eq!(
        w.clone().with_threads(vec![0]).unwrap_err(),
        WorkloadError::ThreadCount { ops: 2, threads: 1 }
    );
    let one = w.clone().with_threads(vec![0, 0]).unwrap();
    assert_eq!((one.thread_count(), one.op_threads()), (1, None));
    let two = w.with_threads(vec![1, 0]).unwrap();
    assert_eq!(two.thread_count(), 2);
    assert_eq!(two.op_threads(), Some(&[1, 0][..]));
}

/// A log of `threads` threads making `n` allocations, each freed by a thread picked by a simple
/// generator (often another one), a few steps after it was made, with some left live at the end.
fn threaded_log(threads: u64, n: usize) -> String {
    let mut s = String::from(HEADER);
    let mut live: Vec<(u64, usize)> = Vec::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..n {
        let thread = next() % threads;
        let ptr = 0x7f00_0000_0000u64 + (i as u64) * 0x10_0000;
        let size = 256 + (next() % 4096) as usize;
        s += &format!("{thread},{i},allocate,{ptr:#x},{size},0\n");
        live.push((ptr, size));
        if live.len() > 8 {
            let (ptr, size) = live.swap_remove((next() % live.len() as u64) as usize);
            let thread = next() % threads;
            s += &format!("{thread},{i},free,{ptr:#x},{size},0\n");
        }
    }
    s
}

#[test]
fn threaded_replay_runs_each_thread_and_waits_for_cross_thread_frees() {
    let t = rmm_log::parse(threaded_log(4, 2000).as_bytes(), "threads").unwrap();
    let w = &t.workload;
    assert_eq!(w.thread_count(), 4);
    assert_eq!(w.unfreed(), 8);
    let sim = Simulated::new(1 << 30);
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    for _ in 0..3 {
        // Simulated panics on a free of a pointer not live: a free that ran before its
        // allocation, or twice, would fail the test here.
        r.pass().unwrap();
        assert_eq!((sim.in_use(), sim.live()), (0, 0));
    }
    assert_eq!(sim.allocation_count(), 3 * 2000);
    // Threads interleave: the peak can differ from the log's, never exceed what all blocks take.
    assert!(sim.peak() > 0);

    let mut r = replay::stacks::<Arc<Simulated>>()[0]
        .threaded_replayer(Arc::new(Simulated::new(1 << 30)), 0, w, w.default_streams())
        .unwrap();
    let timing = measure(r.as_mut(), 2).unwrap();
    assert_eq!(timing.ops, w.ops().len());
}

#[test]
fn threaded_replay_failure_stops_every_thread_and_frees_everything() {
    // Thread 1 frees what thread 0 allocates. Blocks 1 (900 bytes) and 2 (100, never freed) never
    // fit together in 950 bytes, so op 2 or op 3 fails, whichever comes second; when op 2 fails,
    // thread 1 waits for block 1 to free it, and that wait must end with the failure, not hang.
    let log = format!(
        "{HEADER}0,1,allocate,0x100,600,0\n1,2,free,0x100,600,0\n0,3,allocate,0x200,900,0\n\
         1,4,allocate,0x300,100,0\n1,5,free,0x200,900,0\n"
    );
    let t = rmm_log::parse(log.as_bytes(), "fails").unwrap();
    let w = &t.workload;
    assert_eq!(w.thread_count(), 2);
    let sim = Simulated::new(950);
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    for _ in 0..20 {
        match r.pass() {
            Err(ReplayError::Alloc { op, error, .. }) => {
                assert!(op == 2 || op == 3, "op {op}");
                assert!(error.is_out_of_memory());
            }
            other => panic!("expected op 2 or 3 to fail, got {other:?}"),
        }
        assert_eq!((sim.in_use(), sim.live()), (0, 0));
    }

    let tiny = Simulated::new(500);
    let mut r = replay::ThreadedReplayer::new(&tiny, w, w.default_streams()).unwrap();
    match r.pass() {
        Err(ReplayError::Alloc {
            op: 0, size: 600, ..
        }) => {}
        other => panic!("expected op 0 to fail, got {other:?}"),
    }
    assert_eq!(tiny.in_use(), 0);
}

/// `threads` threads one after the other in the log, each allocating `blocks` blocks of 4 KiB
/// and then freeing them: little live at once in log order, much with the threads at once.
fn sequential_threads_log(threads: usize, blocks: usize) -> String {
    let mut s = String::from(HEADER);
    for t in 0..threads {
        for b in 0..blocks {
            s += &format!(
                "{t},0,allocate,{:#x},4096,0\n",
                (t * blocks + b + 1) * 0x1000
            );
        }
        for b in 0..blocks {
            s += &format!("{t},0,free,{:#x},4096,0\n", (t * blocks + b + 1) * 0x1000);
        }
    }
    s
}

#[test]
fn threaded_peak_bounds_what_threads_hold_at_once() {
    let t = rmm_log::parse(sequential_threads_log(64, 8).as_bytes(), "seq").unwrap();
    let w = &t.workload;
    assert_eq!(w.thread_count(), 64);
    assert_eq!(
        (w.peak_live(), w.threaded_peak()),
        (8 * 4096, 64 * 8 * 4096)
    );
    // However the threads interleave, they never hold more than the bound: a replay through an
    // upstream of exactly that much never runs out, run after run.
    let sim = Simulated::new(w.threaded_peak());
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    for _ in 0..20 {
        r.pass().unwrap();
        assert!(sim.peak() <= w.threaded_peak());
    }
    // A thread that frees what another allocates lets the other run ahead: the bound counts the
    // allocating thread's bytes in full.
    let handed = "0,1,allocate,0x100,100,0\n1,2,free,0x100,100,0\n0,3,allocate,0x200,100,0\n\
                  1,4,free,0x200,100,0\n";
    let t = rmm_log::parse(format!("{HEADER}{handed}").as_bytes(), "handed").unwrap();
    assert_eq!(
        (t.workload.peak_live(), t.workload.threaded_peak()),
        (100, 200)
    );
    let one = Workload::new("one", vec![alloc(0, 8), free(0)]).unwrap();
    assert_eq!(one.threaded_peak(), one.peak_live());
}

#[test]
fn a_log_of_many_more_threads_than_the_replay_runs_completes() {
    // 100,000 threads, each allocating one block that the next thread frees: OS threads share
    // log threads beyond MAX_REPLAY_THREADS, and frees across them still find their blocks.
    let threads = 100_000usize;
    let mut s = String::from(HEADER);
    for t in 0..threads {
        s += &format!("{t},0,allocate,{:#x},256,0\n", (t + 1) * 0x100);
        if t > 0 {
            s += &format!("{t},0,free,{:#x},256,0\n", t * 0x100);
        }
    }
    let t = rmm_log::parse(s.as_bytes(), "many").unwrap();
    let w = &t.workload;
    assert_eq!(w.thread_count(), threads);
    assert!(replay::MAX_REPLAY_THREADS < threads);
    let sim = Simulated::new(usize::MAX);
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    r.pass().unwrap();
    assert_eq!((sim.in_use(), sim.allocation_count()), (0, threads));
}

/// Threads taking the whole upstream in turn: the meter's peak is at most what the upstream ever
/// handed out at once. A free is counted out before the upstream has the bytes back, or another
/// thread could count them first and the peak read three times the capacity.
#[test]
fn metered_peak_never_exceeds_what_the_upstream_handed_out() {
    const CAP: usize = 1 << 20;
    let sim = Simulated::new(CAP);
    let meter = replay::Metered::new(&sim);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..20_000 {
                    if let Ok(p) = meter.allocate(CAP, 256, StreamRef::DEFAULT) {
                        // SAFETY: p came from meter with this size and alignment.
                        unsafe { meter.deallocate(p, CAP, 256, StreamRef::DEFAULT) };
                    }
                }
            });
        }
    });
    assert_eq!(meter.in_use(), 0);
    assert_eq!((meter.peak(), sim.peak()), (CAP, CAP));
}

/// A meter changes nothing a text says: a metered stack describes itself as the stack below,
/// the text builds again, and `find` reaches through it.
#[test]
fn a_metered_stack_describes_and_finds_what_is_below() {
    let mr = resource_stack![
        replay::Metered::new(Simulated::new(1 << 30)),
        Pool { max: 64 MiB }
    ];
    let text = mr.describe().to_string();
    assert_eq!(text, "simulated(capacity=1 GiB) > pool(max=64 MiB)");
    let built = mrstack::config::build::<()>(&text).unwrap();
    assert_eq!(built.describe().to_string(), text);
    assert_eq!(mr.find::<Simulated>().map(|s| s.capacity()), Some(1 << 30));
}

#[test]
fn metered_counts_what_reaches_its_upstream_from_many_threads() {
    let meter = replay::Metered::new(Simulated::new(1 << 30));
    std::thread::scope(|s| {
        for t in 0..4 {
            let meter = &meter;
            s.spawn(move || {
                for i in 0..200 {
                    let size = 256 * (1 + (i + t) % 7);
                    let p = meter.allocate(size, 256, StreamRef::DEFAULT).unwrap();
                    // SAFETY: p came from meter with this size and alignment.
                    unsafe { meter.deallocate(p, size, 256, StreamRef::DEFAULT) };
                }
            });
        }
    });
    assert_eq!(meter.in_use(), 0);
    // At least the largest block; at most one block per thread, each at most 7 × 256 bytes.
    assert!(
        (7 * 256..=4 * 7 * 256).contains(&meter.peak()),
        "{}",
        meter.peak()
    );
    assert_eq!(meter.allocate(0, 8, StreamRef::DEFAULT).map(|_| ()), Ok(()));
    assert!(meter.allocate(8, 3, StreamRef::DEFAULT).is_err());
    assert_eq!(meter.upstream().allocation_count(), 800);
}

/// Panics on a request of 999 bytes: a stand-in for a resource that catches a broken contract.
struct PanicsOn999(Simulated);

// SAFETY: every call goes to the Simulated inside, unchanged, or panics before reaching it.
unsafe impl MemoryResource for PanicsOn999 {
    type Host = <Simulated as MemoryResource>::Host;
    type Device = <Simulated as MemoryResource>::Device;
    type Managed = <Simulated as MemoryResource>::Managed;
    type Pageable = <Simulated as MemoryResource>::Pageable;
    type Alignment = <Simulated as MemoryResource>::Alignment;

    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        assert_ne!(size, 999, "PanicsOn999 was asked for 999 bytes");
        self.0.allocate(size, align, s)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.deallocate(ptr, size, align, s) }
    }

    fn synchronize(&self, s: StreamRef) -> Result<(), AllocError> {
        self.0.synchronize(s)
    }
    fn order_after(&self, s: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.0.order_after(s, after)
    }
}

#[test]
fn a_panic_in_one_replay_thread_reaches_the_caller_without_a_hang() {
    // Thread 1 waits to free what thread 0 never makes: thread 0 panics first.
    let log =
        format!("{HEADER}1,1,allocate,0x100,8,0\n0,2,allocate,0x200,999,0\n1,3,free,0x200,999,0\n");
    let t = rmm_log::parse(log.as_bytes(), "panics").unwrap();
    let resource = PanicsOn999(Simulated::new(1 << 20));
    let w = &t.workload;
    let mut r = replay::ThreadedReplayer::new(&resource, w, w.default_streams()).unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.pass()));
    let panic = outcome.unwrap_err();
    let msg = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or("");
    assert!(msg.contains("999 bytes"), "{msg}");
}

#[test]
fn threads_share_one_stack_and_failures_come_back() {
    use mrstack::replay::{measure_threads, Op, Workload};
    let w = |size| {
        Workload::new(
            "two",
            vec![
                Op::Alloc {
                    id: 0,
                    size,
                    stream: 0,
                },
                Op::Alloc {
                    id: 1,
                    size,
                    stream: 0,
                },
                Op::Free { id: 0 },
                Op::Free { id: 1 },
            ],
        )
        .unwrap()
    };
    let sim = mrstack::leaf::Simulated::new(1 << 20);
    let ns = measure_threads(&sim, &[w(1000), w(2000), w(3000)], 3).unwrap();
    assert!(ns.is_finite() && ns > 0.0);
    assert_eq!((sim.in_use(), sim.allocation_count()), (0, 3 * 2 * 4));
    // One thread's workload does not fit: its error comes back, and no thread is left waiting.
    let e = measure_threads(&sim, &[w(1000), w(1 << 20)], 1).unwrap_err();
    assert!(e.to_string().contains("out of memory"), "{e}");
    assert_eq!(sim.in_use(), 0);
}

// ---------------------------------------------------------------- former paths

#[test]
fn former_paths_name_the_same_items() {
    let ops = vec![alloc(0, 64), free(0)];
    let w: Workload = mrstack::replay::Workload::new("former", ops).unwrap();
    let raw = &mrstack::replay::stacks::<Arc<Simulated>>()[0];
    assert_eq!(
        replay::min_capacity(raw.as_ref(), &w, 0.01)
            .unwrap()
            .capacity,
        64
    );
    let log = format!("{HEADER}0,1,allocate,0x1000,64,0\n");
    let t: rmm_log::Trace = mrstack::replay::rmm_log::parse(log.as_bytes(), "former").unwrap();
    assert_eq!(t.workload.allocations(), 1);
    assert_eq!(mrstack::replay::rmm_log::HEADER, rmm_log::HEADER);
}

#[test]
fn a_log_of_many_streams_replays_in_time_linear_in_its_ops() {
    // 50,000 streams, each allocating and freeing one block: the replay's per-stream work (its
    // synchronization of every stream after a pass) must not compare every stream with every
    // other one (2.5·10⁹ comparisons would make this test hang, not fail).
    let n = 50_000;
    let mut ops = Vec::with_capacity(2 * n);
    for id in 0..n {
        ops.push(Op::Alloc {
            id,
            size: 256,
            stream: id,
        });
        ops.push(Op::Free { id });
    }
    let w = Workload::new("streams", ops).unwrap();
    assert_eq!(w.stream_count(), n);
    let sim = Simulated::new(1 << 30);
    let mut r = Replayer::new(&sim, &w, mrstack::replay::simulated_streams(n)).unwrap();
    r.pass().unwrap();
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
    assert_eq!(sim.peak(), 256);
}
