//! Workloads, trace parsing, the replay driver and the minimum-capacity search, over `Simulated`.

use mrstack::prelude::*;
use mrstack::resource::check_request;
use mrstack::trace::{self, TraceErrorKind};
use mrstack::workload::{
    self, fake_streams, measure, min_capacity, random, stack, Op, RandomConfig, ReplayError,
    Replayer, Workload, WorkloadError,
};
use std::io::Write;
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

/// A scratch file path unique to this test process and `name`, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!("mrstack-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// The shared ResNet-50 trace, or None (with a message) where `shared/` is not beside the repo.
fn resnet_trace() -> Option<PathBuf> {
    let path = mrstack::trace::resnet50_path();
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipping: no trace at {}", path.display());
        None
    }
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
    let t = trace::parse(log.as_bytes(), "good").unwrap();
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
    assert_eq!(t.threads, [0, 0, 1, 0, 0]);
    assert_eq!((t.failures, t.skipped_empty), (1, 2));
}

#[test]
fn columns_are_found_by_name_and_thread_and_stream_are_optional() {
    let log = "Size , Pointer,Action\n64,0xa0,allocate\n64,0xa0,free\n64,0xa0,allocate\n";
    let t = trace::parse(log.as_bytes(), "reordered").unwrap();
    assert_eq!(t.workload.ops(), [alloc(0, 64), free(0), alloc(1, 64)]);
    assert_eq!(t.stream_ids, [0]);
    assert_eq!(t.thread_ids, [0]);
}

/// Parses `body` after the standard header and returns the error's line and message.
fn parse_error(body: &str) -> (usize, String, TraceErrorKind) {
    let log = format!("{HEADER}{body}");
    let e = trace::parse(log.as_bytes(), "bad").unwrap_err();
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

    let e = trace::parse("".as_bytes(), "empty").unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::Empty), "{e}");

    let e = trace::parse("Thread,Time,Action,Size,Stream\n".as_bytes(), "h").unwrap_err();
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
    let plain = TempFile::new("plain.csv", text.as_bytes());
    // No .gz in the name: gzip is told by the content.
    let gz = TempFile::new("compressed.csv", &gzip(text.as_bytes()));
    let a = trace::read(&plain.0).unwrap();
    let b = trace::read(&gz.0).unwrap();
    assert_eq!(a.workload.ops(), b.workload.ops());
    assert_eq!(a.workload.allocations(), 50);
    let stem =
        gz.0.file_name()
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
        let f = TempFile::new(&format!("truncated-{keep}.csv.gz"), &packed[..keep]);
        let e = trace::read(&f.0).unwrap_err();
        assert!(matches!(e.kind, TraceErrorKind::Read(_)), "{e}");
        assert!(e.line > 0);
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("line {}", e.line)) && msg.contains("truncated"),
            "{msg}"
        );
        assert!(msg.starts_with(&f.0.display().to_string()), "{msg}");
    }
}

#[test]
fn missing_file_is_an_error() {
    let e = trace::read("/nonexistent/mrstack/trace.csv").unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::Open(_)));
    assert!(e.to_string().contains("cannot open"), "{e}");
}

#[test]
fn resnet_trace_parses() {
    let Some(path) = resnet_trace() else { return };
    let t = trace::read(path).unwrap();
    let w = &t.workload;
    assert_eq!(w.name(), "resnet50_train");
    assert_eq!(w.allocations(), 3221);
    assert_eq!(w.ops().len(), 6442);
    assert_eq!(w.unfreed(), 0);
    assert_eq!(w.stream_count(), 1);
    assert!(w.peak_live() > 0);
    let raw = &workload::stacks::<Arc<Simulated>>()[0];
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
        Replayer::new(&sim, &two, vec![StreamRef::DEFAULT]),
        Err(ReplayError::Streams {
            needed: 2,
            given: 1
        })
    ));
    // SAFETY: the streams go to Simulated only.
    let mut r = Replayer::new(&sim, &two, unsafe { fake_streams(2) }).unwrap();
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
}

impl<U: MemoryResource> Drop for NoReuse<U> {
    fn drop(&mut self) {
        for &(addr, size) in self.freed.get_mut().unwrap().iter() {
            let ptr = NonNull::new(addr as *mut u8).unwrap();
            // SAFETY: each entry is a block from the upstream with this size, freed here once.
            unsafe {
                self.upstream
                    .deallocate(ptr, size, workload::ALIGN, StreamRef::DEFAULT)
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

    let raw = &workload::stacks::<Arc<Simulated>>()[0];
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
            assert_eq!(capacity, 100 * workload::MAX_CAPACITY_FACTOR);
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
    let raw = &workload::stacks::<Arc<Simulated>>()[0];
    let cap = min_capacity(raw.as_ref(), &w, 0.001).unwrap();
    assert_eq!((cap.capacity, cap.ratio), (w.peak_live(), 1.0));
}

#[test]
fn threads_share_one_stack_and_failures_come_back() {
    use mrstack::workload::{measure_threads, Op, Workload};
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
    let sim = mrstack::Simulated::new(1 << 20);
    let ns = measure_threads(&sim, &[w(1000), w(2000), w(3000)], 3).unwrap();
    assert!(ns.is_finite() && ns > 0.0);
    assert_eq!((sim.in_use(), sim.allocation_count()), (0, 3 * 2 * 4));
    // One thread's workload does not fit: its error comes back, and no thread is left waiting.
    let e = measure_threads(&sim, &[w(1000), w(1 << 20)], 1).unwrap_err();
    assert!(e.to_string().contains("out of memory"), "{e}");
    assert_eq!(sim.in_use(), 0);
}
