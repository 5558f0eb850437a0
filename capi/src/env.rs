//! The per-device stacks that clients without a stack handle use (PyTorch, CuPy with a null
//! `param`), built lazily from the environment:
//!
//! * `MRSTACK_STACK`: the text config (default [`DEFAULT_STACK`]); CUDA leaves that name no
//!   device are built on the device asked for;
//! * `MRSTACK_LOG=path`: record every request in RMM's log format (device 0 to `path`, device
//!   `n` to `path.n`), to replay with `mrstack replay`;
//! * `MRSTACK_REPORT=path`: write the statistics of every stack built so far as JSON at exit (and
//!   whenever `mrstack_report` is called);
//! * `MRSTACK_ALLOW_HOST_MEMORY`: a boolean (`1`, `true`, `yes`, `on` or `0`, `false`, `no`,
//!   `off`, in any case; unset or empty is false); true lets `MRSTACK_STACK` give memory kernels
//!   cannot use, for tests of a client's calls where there is no GPU.

use crate::api::{register, text};
use crate::error::guard;
use crate::stack::{json_string, MrstackStack};
use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex, OnceLock};

/// The stack the per-device entry points use when `MRSTACK_STACK` is not set: `PagedHeaps` over
/// the device's pages, which maps physical memory only under live blocks and gives freed pages
/// back without waiting, with a heap per stream and per thread.
pub const DEFAULT_STACK: &str = "paged";

/// The most devices the per-device stacks cover.
const MAX_DEVICES: usize = 64;

struct EnvStack {
    stack: Arc<MrstackStack>,
    handle: *mut MrstackStack,
}

// SAFETY: `handle` is a number used only as a key of the handle table, never dereferenced.
unsafe impl Send for EnvStack {}
// SAFETY: as above.
unsafe impl Sync for EnvStack {}

static STACKS: [OnceLock<Result<EnvStack, String>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];

/// Devices whose stack was built, in order, for the report.
static BUILT: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The stack of `device`, built on first use.
pub(crate) fn env_stack(device: c_int) -> Result<Arc<MrstackStack>, String> {
    env_entry(device).map(|e| e.stack.clone())
}

fn env_entry(device: c_int) -> Result<&'static EnvStack, String> {
    let d = usize::try_from(device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .ok_or_else(|| format!("device {device} is outside 0..{MAX_DEVICES}"))?;
    STACKS[d]
        .get_or_init(|| {
            let config = env_text("MRSTACK_STACK")?.unwrap_or_else(|| DEFAULT_STACK.to_string());
            let log = env_text("MRSTACK_LOG")?.map(|p| if d == 0 { p } else { format!("{p}.{d}") });
            let stack = Arc::new(
                MrstackStack::build(&config, d, log.as_deref()).map_err(|e| {
                    match e.strip_prefix("log: ") {
                        Some(log) => format!("MRSTACK_LOG: {log}"),
                        None => format!("MRSTACK_STACK: {e}"),
                    }
                })?,
            );
            let handle = register(stack.clone());
            let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
            // At exit the logs are flushed (the stacks are never dropped, and a log's last
            // lines wait in its buffer) and the report written.
            if log.is_some() || std::env::var_os("MRSTACK_REPORT").is_some() {
                flush_logs_at_exit();
            }
            built.push(d);
            Ok(EnvStack { stack, handle })
        })
        .as_ref()
        .map_err(|e| format!("the stack of device {d}: {e}"))
        .and_then(|e| {
            // PyTorch and CuPy hand this memory to kernels: a stack that gives none kernels may
            // use is served only where the environment says that no kernel will run.
            if !e.stack.properties().device && !env_flag("MRSTACK_ALLOW_HOST_MEMORY")? {
                return Err(format!(
                    "the stack of device {d}: MRSTACK_STACK gives memory kernels cannot use, and \
                     the clients of the per-device stacks (PyTorch, CuPy) hand it to kernels \
                     (MRSTACK_ALLOW_HOST_MEMORY=1 allows it, for tests where there is no GPU)"
                ));
            }
            Ok(e)
        })
}

/// The value of environment variable `name`, `None` when it is not set; an error naming it when
/// it is not UTF-8 (rather than the default it would otherwise fall back to, silently).
fn env_text(name: &str) -> Result<Option<String>, String> {
    match std::env::var_os(name) {
        None => Ok(None),
        Some(v) => v
            .into_string()
            .map(Some)
            .map_err(|_| format!("{name} is not UTF-8")),
    }
}

/// Environment variable `name` as a boolean: `1`, `true`, `yes`, `on` or `0`, `false`, `no`,
/// `off`, in any case, around any spaces; not set, or set to nothing, is false. Any other value is
/// an error naming the variable and the value, never read as either.
fn env_flag(name: &str) -> Result<bool, String> {
    env_text(name)?.map_or(Ok(false), |v| flag(name, &v))
}

/// `value` of variable `name` as [`env_flag`] reads it.
fn flag(name: &str, value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Ok(false),
        "1" | "true" | "yes" | "on" => Ok(true),
        _ => Err(format!(
            "{name} is `{value}`, not a boolean (1, true, yes, on or 0, false, no, off)"
        )),
    }
}

/// Whether `handle` is a per-device stack's, which lives as long as the process.
pub(crate) fn is_device_stack(handle: *mut MrstackStack) -> bool {
    STACKS
        .iter()
        .filter_map(|s| s.get()?.as_ref().ok())
        .any(|e| e.handle == handle)
}

/// The handle of device `device`'s stack (built on first use), for the generic calls
/// (`mrstack_statistics_json`, …). Null on error. Never destroy it.
#[no_mangle]
pub extern "C" fn mrstack_device_stack(device: c_int) -> *mut MrstackStack {
    guard(std::ptr::null_mut(), || env_entry(device).map(|e| e.handle))
}

/// The statistics of every per-device stack built so far, as JSON: `{"stacks": [{"device": 0,
/// …}, …]}`.
fn report_json() -> String {
    let built = BUILT.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let stacks: Vec<String> = built
        .iter()
        .filter_map(|&d| {
            let e = STACKS[d].get()?.as_ref().ok()?;
            let stats = e.stack.statistics_json();
            // `{"device":d,` + the object's fields.
            Some(format!("{{\"device\":{d},{}", &stats[1..]))
        })
        .collect();
    format!(
        "{{\"default_stack\":{},\"stacks\":[{}]}}\n",
        json_string(DEFAULT_STACK),
        stacks.join(",")
    )
}

/// Writes the per-device stacks' statistics as JSON to `path` (null: `MRSTACK_REPORT`), and
/// flushes their logs. 0, or -1 on error.
///
/// # Safety
///
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mrstack_report(path: *const c_char) -> c_int {
    guard(-1, || {
        let path = if path.is_null() {
            env_text("MRSTACK_REPORT")?.ok_or("no path, and MRSTACK_REPORT is not set")?
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { text(path, "report path") }?.to_string()
        };
        write_report(&path)?;
        Ok(0)
    })
}

/// Flushes the logs and writes the report to `path`, which is written even when a log cannot
/// be; the first failure.
fn write_report(path: &str) -> Result<(), String> {
    let logs = flush_logs();
    std::fs::write(path, report_json()).map_err(|e| format!("report `{path}`: {e}"))?;
    logs
}

// The C library's, which this library calls: not part of its API, so not in its header (whose
// declaration would differ from the system's, which C++ marks `noexcept`).
#[allow(unused_doc_comments)]
/// cbindgen:ignore
extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
}

extern "C" fn at_exit() {
    // Nothing may unwind out of an exit handler.
    let _ = std::panic::catch_unwind(|| {
        use std::io::Write;
        // Each log's failure goes to standard error once: its writer's, or the flush's here.
        // Every stack not destroyed: the per-device ones and those `mrstack_create` made.
        for stack in crate::api::live_stacks() {
            stack.flush_log_or_report();
        }
        let report = match env_text("MRSTACK_REPORT") {
            Ok(Some(path)) => std::fs::write(&path, report_json())
                .map_err(|e| format!("MRSTACK_REPORT: report `{path}`: {e}")),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = report {
            let _ = writeln!(std::io::stderr(), "mrstack: {e}");
        }
    });
}

/// Every per-device stack built so far, in the order they were.
fn built_stacks() -> Vec<Arc<MrstackStack>> {
    let built = BUILT.lock().unwrap_or_else(|p| p.into_inner()).clone();
    built
        .into_iter()
        .filter_map(|d| Some(STACKS[d].get()?.as_ref().ok()?.stack.clone()))
        .collect()
}

/// Writes out every per-device stack's buffered log lines; the first failure, after trying
/// every log.
fn flush_logs() -> Result<(), String> {
    built_stacks()
        .iter()
        .map(|stack| stack.flush_log())
        .fold(Ok(()), Result::and)
}

/// Has the process, at its exit, write out the logs of every stack not destroyed (their last
/// lines wait in their buffers, and a stack never destroyed is never dropped) and the report
/// `MRSTACK_REPORT` names. Once per process, however often it is called.
pub(crate) fn flush_logs_at_exit() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    // SAFETY: `at_exit` is a plain function that never unwinds; C's atexit takes such.
    REGISTERED.call_once(|| unsafe {
        atexit(at_exit);
    });
}

#[cfg(test)]
mod tests {
    use super::flag;

    #[test]
    fn a_flag_is_one_of_the_boolean_words_in_any_case() {
        for on in ["1", "true", "TRUE", "Yes", "on", " On "] {
            assert_eq!(flag("V", on), Ok(true), "{on:?}");
        }
        for off in ["", " ", "0", "false", "False", "NO", "off"] {
            assert_eq!(flag("V", off), Ok(false), "{off:?}");
        }
        for bad in ["2", "maybe", "y", "enable", "1.0", "truee"] {
            let e = flag("MRSTACK_X", bad).expect_err(bad);
            assert!(
                e.contains("MRSTACK_X") && e.contains(&format!("`{bad}`")),
                "{e}"
            );
        }
    }
}
