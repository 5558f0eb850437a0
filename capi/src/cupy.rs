//! CuPy's door: `cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner)` with
//! `mrstack_cupy_malloc` / `mrstack_cupy_free`. `param` is a stack handle, or null for the
//! device's stack from the environment. CuPy passes no stream: blocks are ordered on the legacy
//! default stream, which CuPy's (blocking) streams synchronize with.

use crate::api::lookup;
use crate::env::env_stack;
use crate::error::{guard, guard_void};
use crate::stack::{Expect, MrstackStack};
use mrstack::stream::StreamRef;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// CuPy's arrays assume `cudaMalloc`'s alignment.
const ALIGN: usize = 256;

fn stack_of(param: *mut c_void, device: c_int) -> Result<Arc<MrstackStack>, String> {
    if param.is_null() {
        env_stack(device)
    } else {
        lookup(param.cast())
    }
}

/// CuPy's `malloc`: `size` bytes from the stack `param` names (null: `device`'s). Null on error.
#[no_mangle]
pub extern "C" fn mrstack_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        stack_of(param, device)?.allocate(size, ALIGN, StreamRef::DEFAULT)
    })
}

/// CuPy's `free`: no size; the stack knows it. A failure (a pointer the stack did not hand out,
/// a handle that names no live stack, no stack for `device`) is reported on standard error and in
/// `mrstack_last_error`, naming its cause; nothing is freed then.
#[no_mangle]
pub extern "C" fn mrstack_cupy_free(param: *mut c_void, ptr: *mut c_void, device: c_int) {
    guard_void("mrstack_cupy_free", || {
        stack_of(param, device)?.deallocate(ptr, Expect::NOTHING, StreamRef::DEFAULT)
    });
}
