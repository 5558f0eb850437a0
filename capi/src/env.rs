//! The per-device stacks that clients without a stack handle use (PyTorch, CuPy with a null
//! `param`), built lazily from the environment:
//!
//! * `MRSTACK_STACK`: the text config (default [`DEFAULT_STACK`]); CUDA leaves that name no
//!   device are built on the device asked for;
//! * `MRSTACK_LOG=path`: record every request in RMM's log format (device 0 to `path`, device
//!   `n` to `path.n`), to replay with `mrstack replay`;
//! * `MRSTACK_REPORT=path`: write the statistics of every stack built so far as JSON at exit (and
//!   whenever `mrstack_report` is called).

use crate::api::{register, text};
use crate::error::guard;
use crate::stack::{json_string, MrstackStack};
use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex, OnceLock};

/// The stack the per-device entry points use when `MRSTACK_STACK` is not set: a pool over the
/// driver's allocator that grows as training needs, with binning in front for the many small
/// tensors.
pub const DEFAULT_STACK: &str = "cuda > pool > binning";

/// The most devices the per-device stacks cover.
const MAX_DEVICES: usize = 64;

struct EnvStack {
    stack: Arc<MrstackStack>,
    handle: *mut MrstackStack,
}

// SAFETY: `handle` is an address used only as a key of the handle table, never dereferenced.
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
            let config =
                std::env::var("MRSTACK_STACK").unwrap_or_else(|_| DEFAULT_STACK.to_string());
            let log =
                std::env::var("MRSTACK_LOG").ok().map(
                    |p| {
                        if d == 0 {
                            p
                        } else {
                            format!("{p}.{d}")
                        }
                    },
                );
            let stack = Arc::new(MrstackStack::build(&config, d, log.as_deref())?);
            let handle = register(stack.clone());
            let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
            if built.is_empty() && std::env::var_os("MRSTACK_REPORT").is_some() {
                register_exit_report();
            }
            built.push(d);
            Ok(EnvStack { stack, handle })
        })
        .as_ref()
        .map_err(|e| format!("MRSTACK_STACK for device {d}: {e}"))
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
            std::env::var("MRSTACK_REPORT").map_err(|_| "no path, and MRSTACK_REPORT is not set")?
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { text(path, "report path") }?.to_string()
        };
        write_report(&path)?;
        Ok(0)
    })
}

fn write_report(path: &str) -> Result<(), String> {
    let built = BUILT.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for d in built {
        if let Some(Ok(e)) = STACKS[d].get() {
            e.stack.flush_log()?;
        }
    }
    std::fs::write(path, report_json()).map_err(|e| format!("report `{path}`: {e}"))
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
}

extern "C" fn at_exit() {
    // Nothing may unwind out of an exit handler.
    let _ = std::panic::catch_unwind(|| {
        if let Ok(path) = std::env::var("MRSTACK_REPORT") {
            if let Err(e) = write_report(&path) {
                eprintln!("mrstack: MRSTACK_REPORT: {e}");
            }
        }
    });
}

fn register_exit_report() {
    // SAFETY: `at_exit` is a plain function that never unwinds; C's atexit takes such.
    unsafe { atexit(at_exit) };
}
