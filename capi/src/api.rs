//! The generic C API: create a stack from a text config, allocate and free with size, alignment
//! and stream, describe it, read its statistics, destroy it.

use crate::error::guard;
use crate::stack::{Expect, MrstackStack};
use mrstack::cudarc::driver::sys::CUstream;
use mrstack::stream::StreamRef;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

/// Every stack handed to C and not destroyed, by the handle C holds. Calls look their handle
/// up here instead of dereferencing it: a destroyed, forged or null handle is an error, and a
/// stack destroyed while another thread still uses it lives until that call returns.
static HANDLES: LazyLock<RwLock<HashMap<usize, Arc<MrstackStack>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// The next handle: a number never handed out before, not an address, so that a destroyed
/// stack's handle cannot name the next stack made at the same address (a stale destroy must not
/// free another owner's stack). Steps of 16 from 16: never null, aligned as a pointer would be.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(16);

/// Registers `stack` and returns its handle.
pub(crate) fn register(stack: Arc<MrstackStack>) -> *mut MrstackStack {
    let handle = NEXT_HANDLE.fetch_add(16, Ordering::Relaxed);
    HANDLES
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(handle, stack);
    // A number C keeps and gives back; never dereferenced.
    std::ptr::without_provenance_mut(handle)
}

/// Every stack not destroyed, in the order they were made.
pub(crate) fn live_stacks() -> Vec<Arc<MrstackStack>> {
    let handles = HANDLES.read().unwrap_or_else(|p| p.into_inner());
    let mut live: Vec<(usize, Arc<MrstackStack>)> =
        handles.iter().map(|(&h, s)| (h, s.clone())).collect();
    live.sort_unstable_by_key(|&(h, _)| h);
    live.into_iter().map(|(_, s)| s).collect()
}

/// The stack `handle` names.
pub(crate) fn lookup(handle: *const MrstackStack) -> Result<Arc<MrstackStack>, String> {
    if handle.is_null() {
        return Err("null stack handle".into());
    }
    HANDLES
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(handle as usize))
        .cloned()
        .ok_or_else(|| format!("{handle:p} is not a live stack (destroyed, or never created)"))
}

/// A C string argument as UTF-8.
///
/// # Safety
///
/// `s` is null or points to a NUL-terminated string that lives for the call.
pub(crate) unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, String> {
    if s.is_null() {
        return Err(format!("{what} is null"));
    }
    // SAFETY: non-null and NUL-terminated, by the caller's promise.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| format!("{what} is not UTF-8"))
}

/// A raw stream handle as a `StreamRef`.
///
/// # Safety
///
/// As [`StreamRef::from_raw`]: null, a special handle, or a live stream of the stack's context
/// that stays live while the stack may order work after it.
pub(crate) unsafe fn stream<'a>(s: *mut c_void) -> StreamRef<'a> {
    // SAFETY: forwarded from the caller.
    unsafe { StreamRef::from_raw(s as CUstream) }
}

/// Copies `text` into `buf` (at most `cap` bytes, NUL included) like `snprintf`; returns the
/// length of the whole text.
///
/// # Safety
///
/// `buf` is null (with any `cap`) or valid for `cap` bytes of writes.
pub(crate) unsafe fn write_text(text: &str, buf: *mut c_char, cap: usize) -> usize {
    if !buf.is_null() && cap > 0 {
        let n = text.len().min(cap - 1);
        // SAFETY: `buf` holds `cap` > n bytes (caller's promise); source and destination are
        // distinct (ours is a Rust string).
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// Builds the stack a text config describes (`"cuda > pool(initial=1GiB) > binning"`), CUDA
/// leaves on device 0 unless the text names one. Null on error (see `mrstack_last_error`).
///
/// # Safety
///
/// `config` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mrstack_create(config: *const c_char) -> *mut MrstackStack {
    // SAFETY: forwarded from the caller; a null log path.
    unsafe { mrstack_create_ex(config, 0, std::ptr::null()) }
}

/// As `mrstack_create`, with CUDA leaves that name no device on `device`, and, when `log_path`
/// is not null, every request recorded to that file in RMM's log format (for `mrstack replay`).
///
/// # Safety
///
/// `config` and `log_path` are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn mrstack_create_ex(
    config: *const c_char,
    device: c_int,
    log_path: *const c_char,
) -> *mut MrstackStack {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded from the caller.
        let config = unsafe { text(config, "config") }?;
        let log = if log_path.is_null() {
            None
        } else {
            // SAFETY: forwarded from the caller.
            Some(unsafe { text(log_path, "log path") }?)
        };
        let device = usize::try_from(device).map_err(|_| format!("device {device} < 0"))?;
        let stack = MrstackStack::build(config, device, log)?;
        if log.is_some() {
            // A stack never destroyed is never dropped: its log's last lines are written at exit.
            crate::env::flush_logs_at_exit();
        }
        Ok(register(Arc::new(stack)))
    })
}

/// Destroys a stack: blocks still live go back to it (on the default stream: first synchronize
/// the streams whose work may still use them), it gives back what it took, and its log is
/// written out. 0; -1 for a handle that names no live stack, or when the stack's log could not
/// be written whole (the stack is destroyed all the same; `mrstack_last_error` names the file).
#[no_mangle]
pub extern "C" fn mrstack_destroy(stack: *mut MrstackStack) -> c_int {
    guard(-1, || {
        if crate::env::is_device_stack(stack) {
            // Its handle would stop working while the clients' calls go on using the stack.
            return Err(format!(
                "{stack:p} is a per-device stack (mrstack_device_stack), which lives as long as the process"
            ));
        }
        let removed = HANDLES
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(stack as usize));
        match removed {
            Some(stack) => stack.close().map(|()| 0),
            None => Err(format!(
                "{stack:p} is not a live stack (destroyed, or never created)"
            )),
        }
    })
}

/// `size` bytes aligned to `align` (a power of two; 0 for the stack's own alignment), ordered on
/// `stream` (a `CUstream`/`cudaStream_t`; null for the default stream). Null when `size` is 0
/// (not an error) or on error (see `mrstack_last_error`).
///
/// # Safety
///
/// `stream` is null or a live stream of the stack's CUDA context, which stays live until the
/// stack is destroyed: the stack keeps blocks and chunks by the streams they were allocated and
/// freed on, and orders later work after those streams.
#[no_mangle]
pub unsafe extern "C" fn mrstack_allocate(
    stack: *mut MrstackStack,
    size: usize,
    align: usize,
    stream: *mut c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded from the caller.
        lookup(stack)?.allocate(size, align, unsafe { self::stream(stream) })
    })
}

/// Frees a block of this stack on `stream`, with the size and alignment it was allocated with
/// (0 for an alignment of 0). 0; -1 when `ptr` is not a live block of the stack, or the size or
/// alignment differ (then nothing is freed). A null `ptr` is nothing to free.
///
/// # Safety
///
/// As for `mrstack_allocate`; and no work uses the block after `stream`'s work queued so far.
#[no_mangle]
pub unsafe extern "C" fn mrstack_deallocate(
    stack: *mut MrstackStack,
    ptr: *mut c_void,
    size: usize,
    align: usize,
    stream: *mut c_void,
) -> c_int {
    guard(-1, || {
        let expect = Expect {
            size: Some(size),
            align: Some(align),
        };
        // SAFETY: forwarded from the caller.
        lookup(stack)?.deallocate(ptr, expect, unsafe { self::stream(stream) })?;
        Ok(0)
    })
}

/// What the stack is, as text, written to `buf` like `snprintf`; returns the text's length
/// (write nothing with a null `buf` to learn it). 0 with the last error set for a bad handle.
///
/// # Safety
///
/// `buf` is null or valid for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn mrstack_describe(
    stack: *const MrstackStack,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: forwarded from the caller.
    unsafe { write_of(stack, buf, cap, MrstackStack::describe) }
}

/// The stack's counts as a JSON object (allocations, deallocations, failed allocations, bad
/// frees, live blocks and bytes, peak live bytes), written like `mrstack_describe`.
///
/// # Safety
///
/// `buf` is null or valid for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn mrstack_statistics_json(
    stack: *const MrstackStack,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: forwarded from the caller.
    unsafe { write_of(stack, buf, cap, MrstackStack::statistics_json) }
}

/// Writes `text(stack)` to `buf` like `snprintf`; 0 with the last error set for a bad handle.
///
/// # Safety
///
/// `buf` is null or valid for `cap` bytes.
unsafe fn write_of(
    stack: *const MrstackStack,
    buf: *mut c_char,
    cap: usize,
    text: fn(&MrstackStack) -> String,
) -> usize {
    guard(0, || {
        let text = text(&*lookup(stack)?);
        // SAFETY: forwarded from the caller.
        Ok(unsafe { write_text(&text, buf, cap) })
    })
}

/// The memory the stack gives: `MRSTACK_HOST` | `MRSTACK_DEVICE` | `MRSTACK_MANAGED` bits;
/// -1 for a bad handle.
#[no_mangle]
pub extern "C" fn mrstack_properties(stack: *const MrstackStack) -> c_int {
    guard(-1, || Ok(property_bits(lookup(stack)?.properties())))
}

/// `MRSTACK_HOST` | `MRSTACK_DEVICE` | `MRSTACK_MANAGED` bits of `p`.
pub(crate) fn property_bits(p: mrstack::property::Properties) -> c_int {
    let bit = |set: bool, b: c_int| if set { b } else { 0 };
    bit(p.host, MRSTACK_HOST) | bit(p.device, MRSTACK_DEVICE) | bit(p.migratable, MRSTACK_MANAGED)
}

/// The CPU may dereference the stack's memory.
pub const MRSTACK_HOST: c_int = 1;
/// Kernels may dereference the stack's memory.
pub const MRSTACK_DEVICE: c_int = 2;
/// The memory is managed (migratable) memory.
pub const MRSTACK_MANAGED: c_int = 4;

/// Checks the text of a stack config without building it: its syntax, and that every item names
/// a leaf or an adaptor the library knows. 0 when it passes; -1 otherwise, with the reason (which
/// names the column) in `mrstack_last_error` and `MRSTACK_ERROR_CONFIG` in
/// `mrstack_last_error_kind`. Fields and what the stack gives are checked when it is built
/// (`mrstack_create`).
///
/// # Safety
///
/// `config` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mrstack_check_config(config: *const c_char) -> c_int {
    use mrstack::config::{ConfigError, ConfigErrorKind, StackBuilder, StackSpec};
    guard(-1, || {
        // SAFETY: forwarded from the caller.
        let text = unsafe { text(config, "config") }?;
        let fail = |e: ConfigError| {
            crate::error::set_kind(crate::error::MRSTACK_ERROR_CONFIG);
            format!("config `{text}`: {e}")
        };
        let spec: StackSpec = text.parse().map_err(fail)?;
        let builder = StackBuilder::<()>::new();
        let names = builder.names();
        if let Some(item) = spec
            .items
            .iter()
            .find(|i| !names.contains(&i.name.as_str()))
        {
            return Err(fail(item.error(ConfigErrorKind::Unknown {
                name: item.name.clone(),
                known: names.join(", "),
            })));
        }
        Ok(0)
    })
}
