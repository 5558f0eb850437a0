//! The thread-local last error, and the guards that keep panics on the Rust side.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, CString};
use std::fmt::Display;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    /// What the last error was: one of the `MRSTACK_ERROR_*` values.
    static KIND: Cell<c_int> = const { Cell::new(MRSTACK_ERROR_NONE) };
    /// The kind the call in progress names for its error, if it fails with one.
    static PENDING: Cell<c_int> = const { Cell::new(MRSTACK_ERROR_OTHER) };
}

/// No call on this thread failed yet.
pub const MRSTACK_ERROR_NONE: c_int = 0;
/// The last error is the text of a stack config's: its syntax, an unknown name, a bad or
/// missing field, fields that contradict each other, a leaf whose memory the stack cannot give.
/// The message names the column.
pub const MRSTACK_ERROR_CONFIG: c_int = 1;
/// The last error is any other: a resource that could not be built (no driver, no such device,
/// an initial reservation refused), an allocation that failed for another reason than memory, a
/// bad handle or pointer.
pub const MRSTACK_ERROR_OTHER: c_int = 2;
/// The last error is an allocation the stack had no memory for (its device, or a limit of the
/// stack, is full): the caller may free memory and try again.
pub const MRSTACK_ERROR_OUT_OF_MEMORY: c_int = 3;

/// Names the kind of the error the call in progress is about to return.
pub(crate) fn set_kind(kind: c_int) {
    let _ = PENDING.try_with(|p| p.set(kind));
}

/// Records `msg` as this thread's last error.
pub(crate) fn set(msg: impl Display) {
    // An interior NUL would cut the C string: replace it, never fail.
    let text = msg.to_string().replace('\0', " ");
    let c = CString::new(text).unwrap_or_default();
    let _ = LAST.try_with(|last| *last.borrow_mut() = c);
    let kind = PENDING
        .try_with(|p| p.replace(MRSTACK_ERROR_OTHER))
        .unwrap_or(MRSTACK_ERROR_OTHER);
    let _ = KIND.try_with(|k| k.set(kind));
}

/// Runs `f` with a panic inside (a bug of this library) turned into an `Err` that says so: no
/// panic unwinds into C.
fn caught<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_string());
        Err(format!("internal error (please report): {what}"))
    })
}

/// Runs `f`; on `Err`, or a panic inside, records it and returns `fail`.
pub(crate) fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, String>) -> T {
    set_kind(MRSTACK_ERROR_OTHER);
    caught(f).unwrap_or_else(|msg| {
        set(msg);
        fail
    })
}

/// Runs `f` for the entry point `what`, which returns nothing (a client's `free`): its `Err`, or
/// a panic inside, is put on standard error as `mrstack: what: cause` besides being recorded as
/// the last error, since the client cannot hear of it.
pub(crate) fn guard_void(what: &str, f: impl FnOnce() -> Result<(), String>) {
    set_kind(MRSTACK_ERROR_OTHER);
    if let Err(e) = caught(f) {
        // Not `eprintln!`, which panics when standard error cannot be written (a full disk, a
        // closed pipe), and a panic here would unwind into C.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "mrstack: {what}: {e}");
        set(e);
    }
}

/// Why the last call on this thread that failed did: a NUL-terminated UTF-8 string owned by the
/// library, valid until the next failing call on this thread. Empty when no call failed yet.
#[no_mangle]
pub extern "C" fn mrstack_last_error() -> *const c_char {
    LAST.try_with(|last| last.borrow().as_ptr())
        .unwrap_or(c"thread is exiting".as_ptr())
}

/// What the error `mrstack_last_error` describes is: `MRSTACK_ERROR_CONFIG` for the text of a
/// stack config (the message names the column), `MRSTACK_ERROR_OUT_OF_MEMORY` for an allocation
/// the stack had no memory for, `MRSTACK_ERROR_OTHER` for any other,
/// `MRSTACK_ERROR_NONE` when no call on this thread failed yet.
#[no_mangle]
pub extern "C" fn mrstack_last_error_kind() -> c_int {
    KIND.try_with(Cell::get).unwrap_or(MRSTACK_ERROR_OTHER)
}
