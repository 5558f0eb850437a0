//! Builds `tests/c/host_test.c` with the system C compiler against the header and the shared
//! library, runs it, and checks its report and log from Rust: the C API as a C program sees it.

use std::path::PathBuf;
use std::process::Command;

/// The folder cargo put this package's libraries in for this test: its `deps/`, beside the test
/// binary (`cargo test` builds `libmrstack_c.so` there; only `cargo build` copies it up).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

/// Compiles `source` with `compiler` (and `flags`) against the header and the shared library
/// into `exe`; panics with the compiler's output on failure.
fn compile(compiler: &str, flags: &[&str], source: &str, exe: &std::path::Path) {
    let dir = env!("CARGO_MANIFEST_DIR");
    let libs = lib_dir();
    assert!(
        libs.join("libmrstack_c.so").exists(),
        "no libmrstack_c.so in {}",
        libs.display()
    );
    let mut command = Command::new(compiler);
    command
        .args(flags)
        .args(["-Wall", "-Wextra", "-Werror", "-o"])
        .arg(exe)
        .arg(format!("{dir}/tests/c/{source}"))
        .arg(format!("-I{dir}/include"))
        .arg(format!("-I{dir}/tests/c/trt_standin"))
        .arg(format!("-L{}", libs.display()))
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .args(["-lmrstack_c", "-lpthread"]);
    built(command, source);
}

/// Runs the compiler `command` for `source`; panics with its output on failure.
fn built(mut command: Command, source: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running the compiler for {source}: {e}"));
    assert!(
        out.status.success(),
        "compiling {source} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The TensorRT adapter, compiled with the system C++ compiler against a stand-in of TensorRT's
/// interface, allocates and frees through `IGpuAllocator` as TensorRT would.
#[test]
fn the_tensorrt_adapter_compiles_and_serves_through_the_interface() {
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trt_test");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    compile(&cxx, &["-std=c++17"], "trt_test.cpp", &exe);
    all_pass(Command::new(&exe));
}

/// Runs a test program with the library just built first in the library path; asserts that it
/// ended with every check passed.
fn all_pass(mut program: Command) {
    let run = program
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .unwrap_or_else(|e| panic!("running {program:?}: {e}"));
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && out.contains(" passed, 0 failed"),
        "{out}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// PyTorch's entry point throws `c10::OutOfMemoryError` for an allocation the stack has no
/// memory for once a `libc10.so` is loaded (here a stand-in of its classes, loaded privately as
/// PyTorch loads its own), `std::runtime_error` before that and for any other failure.
#[test]
fn torch_out_of_memory_is_thrown_as_c10s_out_of_memory_error() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let standin = tmp.join("c10_standin").join("libc10.so");
    std::fs::create_dir_all(standin.parent().unwrap()).unwrap();
    let mut command = Command::new(&cxx);
    command
        .args([
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg("-Wl,-soname,libc10.so")
        .arg("-o")
        .arg(&standin)
        .arg(format!("{dir}/tests/c/c10_standin/c10.cpp"));
    built(command, "c10_standin/c10.cpp");
    let exe = tmp.join("throw_test");
    compile(&cxx, &["-std=c++17"], "throw_test.cpp", &exe);
    let mut program = Command::new(&exe);
    program.arg(&standin);
    all_pass(program);
}

/// Compiles `host_test.c` as `name` and runs it with `args`, the library just built first in the
/// library path, no `MRSTACK_*` variable from outside; checks that every check passed, and
/// returns what it wrote to standard error.
fn run_host_test(name: &str, args: &[&std::ffi::OsStr]) -> String {
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    compile(&cc, &["-std=c11", "-D_DEFAULT_SOURCE"], "host_test.c", &exe);
    let run = Command::new(&exe)
        .args(args)
        .env_remove("MRSTACK_STACK")
        .env_remove("MRSTACK_LOG")
        .env_remove("MRSTACK_REPORT")
        .env_remove("MRSTACK_ALLOW_HOST_MEMORY")
        // cargo puts target/<profile> first here, where an older copy of the library may be
        // (only `cargo build` refreshes it): the one beside this test is the one just built.
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .expect("run host_test");
    let out = String::from_utf8_lossy(&run.stdout);
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    println!("{out}");
    assert!(
        run.status.success() && out.contains(" passed, 0 failed"),
        "host_test failed:\n{out}\n{err}"
    );
    err
}

#[test]
fn a_c_program_drives_the_generic_api_and_every_client_door() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (report, log) = (tmp.join("report.json"), tmp.join("torch.csv"));
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_file(&log);
    run_host_test("host_test", &[report.as_os_str(), log.as_os_str()]);

    // The report, written by mrstack_report and again at exit: nothing left live.
    let report = std::fs::read_to_string(&report).expect("MRSTACK_REPORT was written");
    assert!(report.contains("\"device\":0"), "{report}");
    assert!(
        report.contains("\"live_blocks\":0,\"live_bytes\":0"),
        "{report}"
    );
    assert!(
        report.contains("\"allocations\":100,\"deallocations\":100"),
        "{report}"
    );

    // The log is RMM's format, which `mrstack replay` reads: 200 operations (100 allocations of
    // 512·(i+1) bytes and their frees, the failed requests not among them).
    let trace = mrstack::replay::rmm_log::read(&log).expect("the log parses");
    let w = &trace.workload;
    assert_eq!(
        (w.ops().len(), w.allocations()),
        (200, 100),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(w.peak_live(), (1..=100).map(|i| 512 * i).sum::<usize>());
}

/// With `MRSTACK_LOG` and no `MRSTACK_REPORT`, the log is whole once the program exits: the
/// per-device stacks are never dropped, so an exit hook flushes it.
#[test]
fn a_log_without_a_report_is_flushed_at_exit() {
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("log_only.csv");
    let _ = std::fs::remove_file(&log);
    run_host_test(
        "host_test_log_only",
        &["--log-only".as_ref(), log.as_os_str()],
    );
    let trace = mrstack::replay::rmm_log::read(&log).expect("the log parses");
    assert_eq!(
        (trace.workload.ops().len(), trace.workload.allocations()),
        (20, 10)
    );
}

/// A stack `mrstack_create_ex` made with a log and never destroyed is never dropped either: its
/// log is whole once the program exits all the same.
#[test]
fn the_log_of_a_stack_never_destroyed_is_whole_at_exit() {
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kept_log.csv");
    let _ = std::fs::remove_file(&log);
    run_host_test(
        "host_test_kept_log",
        &["--kept-log".as_ref(), log.as_os_str()],
    );
    let trace = mrstack::replay::rmm_log::read(&log).expect("the log parses");
    assert_eq!(
        (trace.workload.ops().len(), trace.workload.allocations()),
        (14, 7),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// The clients' frees return nothing, so a failure is reported on standard error and in the
/// last error (host_test checks that one): each line names the entry point and the cause, never a
/// placeholder.
#[test]
fn the_void_frees_report_the_cause() {
    let err = run_host_test("host_test_void_frees", &["--void-frees".as_ref()]);
    for line in [
        "mrstack: mrstack_cvcuda_free: size -1 < 0",
        "mrstack: mrstack_cvcuda_free: alignment -8 < 0",
        "mrstack: mrstack_torch_free: size -5 < 0",
        "mrstack: mrstack_cupy_free: ",
    ] {
        assert!(
            err.lines().any(|l| l.starts_with(line)),
            "no `{line}` in:\n{err}"
        );
    }
    let no_stack = |call: &str| {
        err.lines()
            .any(|l| l.starts_with(&format!("mrstack: {call}: ")) && l.contains("no_such_leaf"))
    };
    for call in [
        "mrstack_torch_free",
        "mrstack_cupy_free",
        "mrstack_torch_init",
    ] {
        assert!(
            no_stack(call),
            "{call}: no line names the stack's cause in:\n{err}"
        );
    }
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("not a live stack"))
            .count(),
        2,
        "{err}"
    );
    assert!(!err.contains("internal error"), "{err}");
}

/// A log that cannot be written is not lost silently: its first failed write goes to standard
/// error once, as it happens, and `mrstack_destroy` returns the failure naming the file
/// (host_test checks both); a log that can be written is whole after the destroy, the frees of
/// the blocks left live in it.
#[test]
fn a_log_that_cannot_be_written_is_reported() {
    assert!(
        std::path::Path::new("/dev/full").exists(),
        "this test writes a log to /dev/full, which this system lacks"
    );
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (captured, log) = (
        tmp.join("full_log_stderr.txt"),
        tmp.join("full_log_good.csv"),
    );
    let _ = std::fs::remove_file(&log);
    run_host_test(
        "host_test_full_log",
        &["--full-log".as_ref(), captured.as_os_str(), log.as_os_str()],
    );
    let err = std::fs::read_to_string(&captured).expect("host_test's standard error");
    let reports: Vec<&str> = err.lines().filter(|l| l.contains("/dev/full")).collect();
    assert!(
        reports.len() == 1
            && reports[0].starts_with("mrstack: log `/dev/full`")
            && reports[0].contains("No space left on device"),
        "{err}"
    );
    let trace = mrstack::replay::rmm_log::read(&log).expect("the good log parses");
    assert_eq!(
        (trace.workload.ops().len(), trace.workload.allocations()),
        (20, 10)
    );
}
