//! The `mrstack` binary: `replay`'s output (table and JSON), its answers on hand-made traces, bad
//! traces, and its exit status (0 success, 1 trace or replay error, 2 usage error).
//!
//! Runs the binary cargo built for this test (or `$MRSTACK_BIN`), on Simulated unless a test says
//! otherwise, with few passes and a coarse capacity search so that the suite stays fast in debug
//! builds.

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

/// The binary cargo built for these tests, or `$MRSTACK_BIN` where set (a machine that gets the
/// test binaries without the build tree, as the GPU machine does).
fn binary() -> PathBuf {
    std::env::var_os("MRSTACK_BIN")
        .map_or_else(|| env!("CARGO_BIN_EXE_mrstack").into(), PathBuf::from)
}

#[path = "../../tests/support/traces.rs"]
mod traces;

/// The ResNet-50 training trace, a fixture of this repository (where `traces::resnet50_path`
/// says), checked to be there.
fn resnet50_path() -> PathBuf {
    let path = traces::resnet50_path();
    assert!(
        path.exists(),
        "no trace at {} (data/traces/ of the repository, or $MRSTACK_TRACES)",
        path.display()
    );
    path
}

/// Runs `mrstack ARGS`.
fn mrstack(args: &[&str]) -> Output {
    let bin = binary();
    Command::new(&bin).args(args).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {}: {e} (set MRSTACK_BIN to the mrstack binary)",
            bin.display()
        )
    })
}

/// `mrstack replay ARGS` on Simulated, one timed pass, a 5% capacity search.
fn replay(args: &[&str]) -> Output {
    let mut all = vec![
        "replay",
        "--upstream",
        "simulated",
        "--passes",
        "1",
        "--precision",
        "0.05",
    ];
    all.extend_from_slice(args);
    mrstack(&all)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the exit status and returns stdout, showing both streams when it differs.
fn expect(o: &Output, code: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Checks that `o` exited with `code` and that its stderr says `says`; returns the stderr for
/// further checks.
#[track_caller]
fn fails_saying(o: &Output, code: i32, says: &str) -> String {
    expect(o, code);
    let err = stderr(o);
    assert!(err.contains(says), "{err}");
    err
}

fn json(o: &Output) -> Value {
    serde_json::from_str(&expect(o, 0)).expect("--json prints JSON")
}

/// Bad traces and bad usage.
#[path = "cli/errors.rs"]
mod errors;
#[path = "../../tests/support/files.rs"]
mod files;
/// Random logs and argument lists.
#[path = "cli/fuzz.rs"]
mod fuzz;
use files::{gzip, TempFile};

/// Peak live 300 bytes (blocks 0 and 1), 350 allocated in all; block 2 is never freed.
const TINY: &str = "0,1,allocate,0x1000,100,0\n\
                    0,2,allocate,0x2000,200,0\n\
                    0,3,free,0x1000,100,0\n\
                    0,4,allocate,0x3000,50,0\n\
                    0,5,free,0x2000,200,0\n";

/// [`TINY`] in a log file called `name`.
fn tiny(name: &str) -> TempFile {
    TempFile::new("mrstack-cli", name, format!("{HEADER}{TINY}").as_bytes())
}

// ---------------------------------------------------------------- output

#[test]
fn replay_without_a_trace_prints_the_table() {
    // No --upstream: the default, which on a machine without a GPU is Simulated.
    let o = mrstack(&[
        "replay",
        "--allocations",
        "300",
        "--passes",
        "1",
        "--precision",
        "0.05",
    ]);
    let out = expect(&o, 0);
    assert!(
        out.starts_with(
            "workload: random (built-in random workload): 600 ops, 300 allocations, 1 thread, 1 stream"
        ),
        "{out}"
    );
    assert!(
        out.contains("median of 1 pass after a warm-up pass"),
        "{out}"
    );
    let header = out.lines().find(|l| l.starts_with("stack ")).unwrap();
    for column in [
        "ns/op",
        "upstream peak",
        "peak live",
        "min capacity",
        "min/live",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let row = out.lines().find(|l| l.starts_with("upstream ")).unwrap();
    assert!(!row.contains("error"), "{out}");
    // Every preset has a row that replayed, ThreadHeaps' among them.
    for name in ["pool", "tlsf", "vmm", "binning", "arena", "heaps"] {
        let row = out
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap();
        assert!(!row.contains("error") && !row.contains(" - "), "{row}");
    }
    if mrstack::cuda_context(0).is_err() {
        assert!(out.contains("upstream: simulated (no GPU found"), "{out}");
        // Over Simulated, ns/op are bookkeeping, and the column says so.
        assert!(header.contains("ns/op*"), "{header}");
        assert!(out.contains(mrstack_cli::SIMULATED_NS_NOTE), "{out}");
    }
    assert!(out.contains(mrstack_cli::UPSTREAM_PEAK_NOTE), "{out}");
    // It ends with the stack to use, in both forms to paste.
    assert!(out.contains("\nrecommended: "), "{out}");
    assert!(
        out.contains("\nresource_stack![\n    PagedHeaps::for_context(&ctx)?,\n]"),
        "{out}"
    );
    assert_eq!(out.lines().last().unwrap(), "paged", "{out}");
}

#[test]
fn json_gives_the_capacity_of_a_tiny_trace() {
    let f = tiny("tiny.csv");
    let v = json(&replay(&[f.text(), "--json", "--stack", "upstream"]));
    let w = &v["workload"];
    assert_eq!(w["ops"], 5);
    assert_eq!(w["allocations"], 3);
    assert_eq!(w["peak_live"], 300);
    assert_eq!(w["unfreed"], 1);
    assert_eq!(v["upstream"], "simulated");
    assert_eq!(v["passes"], 1);
    let stacks = v["stacks"].as_array().unwrap();
    assert_eq!(stacks.len(), 1);
    let s = &stacks[0];
    assert_eq!(s["name"], "upstream");
    // The raw upstream wastes nothing: it completes with exactly the peak, and takes just that.
    assert_eq!(s["min_capacity"], 300);
    assert_eq!(s["min_capacity_ratio"], 1.0);
    assert_eq!(s["upstream_peak"], 300);
    assert_eq!(s["peak_live"], 300);
    assert!(s["ns_per_op"].as_f64().unwrap() > 0.0);
    assert!(s["timing_error"].is_null() && s["capacity_error"].is_null());
}

#[test]
fn every_preset_completes_the_tiny_trace_at_or_above_its_peak() {
    let f = tiny("tiny-all.csv");
    let v = json(&replay(&[f.text(), "--json"]));
    let stacks = v["stacks"].as_array().unwrap();
    assert!(!stacks.is_empty());
    assert_eq!(stacks[0]["name"], "upstream");
    for s in stacks {
        let cap = s["min_capacity"].as_u64().unwrap();
        assert!(cap >= 300, "{s}");
        let ratio = s["min_capacity_ratio"].as_f64().unwrap();
        assert!((ratio - cap as f64 / 300.0).abs() < 1e-9, "{s}");
        assert!(s["upstream_peak"].as_u64().unwrap() >= 300, "{s}");
    }
}

/// Three threads; thread 1 frees what thread 0 allocated and thread 2 what thread 1 allocated.
/// In log order the peak is 700 bytes (blocks 0, 1 and 3 at line 5).
const THREADED: &str = "0,1,allocate,0x1000,100,0\n\
                        1,2,allocate,0x2000,200,0\n\
                        1,3,free,0x1000,100,0\n\
                        2,4,allocate,0x3000,400,0\n\
                        0,5,allocate,0x4000,100,0\n\
                        2,6,free,0x2000,200,0\n\
                        0,7,free,0x3000,400,0\n\
                        1,8,free,0x4000,100,0\n";

#[test]
fn a_many_threaded_log_replays_with_its_threads() {
    let f = TempFile::new(
        "mrstack-cli",
        "threads.csv",
        format!("{HEADER}{THREADED}").as_bytes(),
    );
    let v = json(&replay(&[f.text(), "--json", "--passes", "3"]));
    assert_eq!(v["workload"]["threads"], 3);
    assert_eq!(v["workload"]["peak_live"], 700);
    assert_eq!(v["replayed_with_threads"], true);
    let s = &v["stacks"][0];
    assert_eq!(s["pass_ns_per_op"].as_array().unwrap().len(), 3);
    // The search replays in log order, so its answer does not depend on the interleaving.
    assert_eq!(s["min_capacity"], 700);
    // What the threads held at once in the timed passes: no more than they can.
    let held = s["held_at_once"].as_u64().unwrap();
    assert!(held > 0 && held <= 800, "{s}");

    let out = expect(&replay(&[f.text()]), 0);
    assert!(out.contains("3 threads"), "{out}");
    assert!(out.contains("3 OS threads"), "{out}");
    // With threads, upstream peak depends on how they interleaved: marked and explained.
    let header = out.lines().find(|l| l.starts_with("stack ")).unwrap();
    assert!(header.contains("upstream peak†"), "{header}");
    assert!(header.contains("held at once†"), "{header}");
    assert!(
        out.contains("\n† with threads, upstream peak is what this run's interleaving"),
        "{out}"
    );
    // Paged first for threads. Its threads could hold 800 B at once run apart (700 in log
    // order), but every free is on another thread than its allocation: they hand blocks to each
    // other, which keeps the log's order, so the capacity rests on it and says why.
    assert!(
        out.contains("fixed order for several threads: paged"),
        "{out}"
    );
    let v = json(&replay(&[f.text(), "--json"]));
    let r = &v["recommendation"];
    assert_eq!(r["stack"], "arena", "{v}");
    assert_eq!(v["workload"]["threaded_peak"], 800);
    assert_eq!(v["workload"]["cross_thread_frees"], 4);
    assert!(r["log_order_capacity"].is_null(), "{r}");
    assert!(
        r["why"][4]
            .as_str()
            .is_some_and(|w| w.contains("4 of its frees are on another thread")),
        "{r}"
    );

    let v = json(&replay(&[f.text(), "--json", "--sequential"]));
    assert_eq!(v["replayed_with_threads"], false);
    assert_eq!(v["stacks"][0]["upstream_peak"], 700);
}

#[test]
fn plain_and_gzip_logs_replay_alike() {
    let text = format!("{HEADER}{TINY}");
    let plain = TempFile::new("mrstack-cli", "same.csv", text.as_bytes());
    let packed = TempFile::new("mrstack-cli", "same.csv.gz", &gzip(text.as_bytes()));
    let a = json(&replay(&[plain.text(), "--json", "--stack", "upstream"]));
    let b = json(&replay(&[packed.text(), "--json", "--stack", "upstream"]));
    for key in ["ops", "allocations", "peak_live", "unfreed"] {
        assert_eq!(a["workload"][key], b["workload"][key], "{key}");
    }
    assert!(a["workload"]["name"].as_str().unwrap().ends_with("same"));
    assert_eq!(a["workload"]["name"], b["workload"]["name"]);
    assert_eq!(
        a["stacks"][0]["min_capacity"],
        b["stacks"][0]["min_capacity"]
    );
}

#[test]
fn stacks_are_picked_by_repeated_or_comma_separated_names() {
    let f = tiny("pick.csv");
    // `simulated` names the raw upstream on Simulated; each stack is replayed once.
    let v = json(&replay(&[
        f.text(),
        "--json",
        "--stack",
        "upstream,simulated",
        "-s",
        "upstream",
    ]));
    assert_eq!(v["stacks"].as_array().unwrap().len(), 1);
}

#[test]
fn quiet_leaves_stderr_empty_and_no_capacity_skips_the_search() {
    let f = tiny("quiet.csv");
    let o = replay(&[f.text(), "--quiet", "--no-capacity", "--json"]);
    let v = json(&o);
    assert_eq!(stderr(&o), "");
    let s = &v["stacks"][0];
    assert!(s["min_capacity"].is_null() && s["capacity_error"].is_null());
    assert!(s["ns_per_op"].is_number());
}

#[test]
fn the_resnet_trace_replays() {
    let path = resnet50_path();
    let v = json(&replay(&[
        path.to_str().unwrap(),
        "--json",
        "--stack",
        "upstream",
    ]));
    assert_eq!(v["workload"]["name"], "resnet50_train");
    assert_eq!(v["workload"]["ops"], 6442);
    assert_eq!(v["stacks"][0]["min_capacity_ratio"], 1.0);
}

// ---------------------------------------------------------------- edge cases

#[test]
fn a_header_only_log_has_nothing_to_time() {
    let f = TempFile::new("mrstack-cli", "header-only.csv", HEADER.as_bytes());
    let out = expect(&replay(&[f.text()]), 0);
    assert!(
        out.contains("0 ops") && out.contains("nothing to time"),
        "{out}"
    );
    assert!(!out.contains("ns/op"), "no table: {out}");
    let v = json(&replay(&[f.text(), "--json"]));
    assert_eq!(v["stacks"].as_array().map(Vec::len), Some(0));
    assert!(v["note"].as_str().unwrap().starts_with("nothing to time"));
    // The built-in workload with no allocations: the same.
    let out = expect(&replay(&["--allocations", "0"]), 0);
    assert!(out.contains("nothing to time"), "{out}");
}

#[test]
fn a_directory_is_named_and_skip_is_suggested_only_where_it_helps() {
    let dir = std::env::temp_dir();
    let dir = dir.to_str().unwrap();
    let o = replay(&[dir]);
    let err = fails_saying(&o, 1, "is a directory");
    assert!(
        !err.contains("gzip") && !err.contains("--on-error"),
        "{err}"
    );
    // A header that is not one: skipping lines cannot help either.
    let headless = TempFile::new("mrstack-cli", "no-header.csv", b"a,b\n1,2\n");
    let err = stderr(&replay(&[headless.text()]));
    assert!(
        err.contains("no `Action` column") && !err.contains("--on-error"),
        "{err}"
    );
}

#[test]
fn a_size_no_resource_can_serve_is_reported_once_at_its_line() {
    let big = (isize::MAX as u64) + 1;
    let body =
        format!("0,1,allocate,0x100,64,0\n0,2,allocate,0x200,{big},0\n0,3,free,0x200,{big},0\n");
    let f = TempFile::new(
        "mrstack-cli",
        "too-big.csv",
        format!("{HEADER}{body}").as_bytes(),
    );
    let o = replay(&[f.text()]);
    expect(&o, 1);
    let err = stderr(&o);
    assert_eq!(
        err.matches("more than any resource can serve").count(),
        1,
        "{err}"
    );
    assert!(err.contains("line 3: allocation of"), "{err}");
    assert!(!err.contains("op "), "{err}");
    assert!(err.contains("--on-error skip"), "{err}");
}

#[test]
fn overflowing_live_bytes_name_their_line() {
    let half = 1u64 << 62;
    let body = format!("0,1,allocate,0x100,{half},0\n").repeat(1)
        + &format!("0,2,allocate,0x200,{half},0\n0,3,allocate,0x300,{half},0\n0,4,allocate,0x400,{half},0\n");
    let f = TempFile::new(
        "mrstack-cli",
        "overflow.csv",
        format!("{HEADER}{body}").as_bytes(),
    );
    let o = replay(&[f.text()]);
    expect(&o, 1);
    let err = stderr(&o);
    assert!(
        err.contains("line 5: allocation of") && err.contains("overflow usize"),
        "{err}"
    );
}

#[test]
fn a_huge_allocation_takes_no_host_memory_of_its_size() {
    // One 2^62-byte allocation, through the stacks whose host memory does not grow with their
    // size (the arena's metadata is changed elsewhere).
    let size = 1u64 << 62;
    let body = format!("0,1,allocate,0x100,{size},0\n0,2,free,0x100,{size},0\n");
    let f = TempFile::new(
        "mrstack-cli",
        "huge.csv",
        format!("{HEADER}{body}").as_bytes(),
    );
    let v = json(&replay(&[f.text(), "--stack", "pool,binning", "--json"]));
    for s in v["stacks"].as_array().unwrap() {
        assert_eq!(s["min_capacity"], size, "{s}");
    }
}

/// 64 threads one after the other in the log, each allocating 16 blocks of 64 KiB and then
/// freeing them: 1 MiB live at once in log order, 64 MiB with the threads at once.
fn sixty_four_threads() -> String {
    let mut s = String::from(HEADER);
    for t in 0..64u64 {
        for b in 0..16u64 {
            s += &format!("{t},0,allocate,{:#x},65536,0\n", (t * 16 + b + 1) << 20);
        }
        for b in 0..16u64 {
            s += &format!("{t},0,free,{:#x},65536,0\n", (t * 16 + b + 1) << 20);
        }
    }
    s
}

#[test]
fn a_threaded_replay_is_timed_with_room_for_its_threads() {
    let f = TempFile::new("mrstack-cli", "t64.csv", sixty_four_threads().as_bytes());
    // The same answer every run: every stack completes, each timed with room for what 64
    // threads at once can hold.
    for _ in 0..3 {
        let v = json(&replay(&[f.text(), "--json", "--no-capacity"]));
        let w = &v["workload"];
        assert_eq!(
            (w["peak_live"].as_u64(), w["threaded_peak"].as_u64()),
            (Some(1 << 20), Some(64 << 20))
        );
        assert_eq!(v["base_capacity"], 128u64 << 20);
        for s in v["stacks"].as_array().unwrap() {
            assert!(s["timing_error"].is_null(), "{s}");
            assert!(s["capacity"].as_u64().unwrap() >= 128 << 20, "{s}");
        }
    }
    let out = expect(&replay(&[f.text(), "--no-capacity"]), 0);
    assert!(
        out.contains("peak live 1.00 MiB in log order, up to 64.00 MiB with its threads at once"),
        "{out}"
    );
    // In log order, the log-order peak is what counts.
    let v = json(&replay(&[
        f.text(),
        "--json",
        "--no-capacity",
        "--sequential",
    ]));
    assert_eq!(v["base_capacity"], 2u64 << 20);
}

/// The PyTorch memory snapshot of the repository's fixtures (python/tests/snapshot_fixture.py
/// writes it; src/replay/snapshot/tests.rs says what it holds).
fn small_snapshot() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/snapshots/small.pickle")
}

#[test]
fn a_pytorch_snapshot_replays_like_a_log() {
    let path = small_snapshot();
    let o = replay(&[path.to_str().unwrap(), "--json", "--stack", "upstream,pool"]);
    let v = json(&o);
    let w = &v["workload"];
    assert_eq!(w["name"], "small");
    assert_eq!(w["allocations"], 6);
    assert_eq!(w["streams"], 2);
    assert_eq!(w["peak_live"], 3 << 20);
    assert_eq!(w["unfreed"], 1);
    assert_eq!(w["log_failures"], 1);
    assert!(v["recommendation"].is_object(), "{v}");
    let err = stderr(&o);
    assert!(err.contains("PyTorch memory snapshot, device 0"), "{err}");
    assert!(
        err.contains("1 free of blocks allocated before the recorded history began"),
        "{err}"
    );
    assert!(err.contains("held at most 20971520 bytes"), "{err}");

    // Gzip-compressed, it reads the same.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &std::fs::read(&path).unwrap()).unwrap();
    let f = TempFile::new("mrstack-cli", "small.pickle.gz", &gz.finish().unwrap());
    let v2 = json(&replay(&[f.text(), "--json", "--stack", "upstream,pool"]));
    assert_eq!(v2["workload"]["peak_live"], w["peak_live"]);
}

#[test]
fn a_snapshot_without_history_or_cut_short_exits_1_naming_why() {
    // pickle.dumps({'segments': []}, protocol=4): no device_traces.
    let f = TempFile::new(
        "mrstack-cli",
        "nohistory.pickle",
        b"\x80\x04\x95\x11\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x08segments\x94]\x94s.",
    );
    let o = replay(&[f.text()]);
    let err = fails_saying(&o, 1, "has no allocation history");
    assert!(err.contains("_record_memory_history"), "{err}");
    assert!(!err.contains("--on-error skip"), "{err}");

    let bytes = std::fs::read(small_snapshot()).unwrap();
    let f = TempFile::new("mrstack-cli", "cut.pickle", &bytes[..bytes.len() / 2]);
    let o = replay(&[f.text()]);
    expect(&o, 1);
    let err = stderr(&o);
    assert!(
        err.contains("cut.pickle: byte ") && err.contains("malformed pickle"),
        "{err}"
    );
}
