//! The thread-local last error, and the guard that keeps panics on the Rust side.

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

/// Runs `f`; on `Err` records it and returns `fail`, and a panic inside (a bug of this library)
/// is caught here, recorded, and returns `fail` too: no panic unwinds into C.
pub(crate) fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, String>) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(msg)) => {
            set(msg);
            fail
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            set(format!("internal error (please report): {what}"));
            fail
        }
    }
}

/// Why the last call on this thread that failed did: a NUL-terminated UTF-8 string owned by the
/// library, valid until the next failing call on this thread. Empty when no call failed yet.
#[no_mangle]
pub extern "C" fn mrstack_last_error() -> *const c_char {
    LAST.try_with(|last| last.borrow().as_ptr())
        .unwrap_or(c"thread is exiting".as_ptr())
}
