//! The thread-local last error, and the guards that keep panics on the Rust side.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::fmt::Display;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error.
pub(crate) fn set(msg: impl Display) {
    // An interior NUL would cut the C string: replace it, never fail.
    let text = msg.to_string().replace('\0', " ");
    let c = CString::new(text).unwrap_or_default();
    let _ = LAST.try_with(|last| *last.borrow_mut() = c);
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
    caught(f).unwrap_or_else(|msg| {
        set(msg);
        fail
    })
}

/// Runs `f` for the entry point `what`, which returns nothing (a client's `free`): its `Err`, or
/// a panic inside, is put on standard error as `mrstack: what: cause` besides being recorded as
/// the last error, since the client cannot hear of it.
pub(crate) fn guard_void(what: &str, f: impl FnOnce() -> Result<(), String>) {
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
