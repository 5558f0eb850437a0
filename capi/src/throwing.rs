//! Entry points for C++ clients that take a null return as memory (PyTorch makes a tensor at
//! address 0, CuPy a pointer to 0): on failure they throw a C++ exception instead, which those
//! clients turn into a Python exception. A C caller must use the plain entry points: an
//! exception cannot cross C.

use crate::cupy::mrstack_cupy_malloc;
use crate::error::{mrstack_last_error, mrstack_last_error_kind, MRSTACK_ERROR_OUT_OF_MEMORY};
use crate::torch::mrstack_torch_malloc;
use std::ffi::{c_char, c_int, c_void};

// src/throwing.cpp's, which only this library calls: not part of its API, so not in its header.
#[allow(unused_doc_comments)]
/// cbindgen:ignore
extern "C-unwind" {
    fn mrstack_throw_runtime_error(what: *const c_char) -> !;
    fn mrstack_throw_torch_out_of_memory(what: *const c_char) -> !;
    fn mrstack_throw_bad_alloc() -> !;
}

/// PyTorch's `alloc_fn`: as `mrstack_torch_malloc`, but a failure for a non-zero size throws a
/// C++ exception naming the cause: `c10::OutOfMemoryError` when the stack had no memory and
/// PyTorch's libraries are loaded (`torch.OutOfMemoryError` in Python), `std::runtime_error`
/// otherwise (a `RuntimeError`, of which `torch.OutOfMemoryError` is a subclass).
///
/// # Safety
///
/// As for `mrstack_torch_malloc`; and the caller is C++ code that catches the exception.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrstack_torch_malloc_or_throw(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: forwarded from the caller.
    let p = unsafe { mrstack_torch_malloc(size, device, stream) };
    if p.is_null() && size != 0 {
        // SAFETY: the message is the library's NUL-terminated last error; the caller catches.
        unsafe {
            if mrstack_last_error_kind() == MRSTACK_ERROR_OUT_OF_MEMORY {
                mrstack_throw_torch_out_of_memory(mrstack_last_error())
            }
            mrstack_throw_runtime_error(mrstack_last_error())
        }
    }
    p
}

/// CuPy's `malloc`: as `mrstack_cupy_malloc`, but a failure for a non-zero size throws
/// `std::bad_alloc` (a `MemoryError` in Python, like CuPy's own out-of-memory error).
///
/// # Safety
///
/// The caller is C++ code that catches the exception (CuPy declares its allocator `except +`).
#[no_mangle]
pub unsafe extern "C-unwind" fn mrstack_cupy_malloc_or_throw(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    let p = mrstack_cupy_malloc(param, size, device);
    if p.is_null() && size != 0 {
        // SAFETY: the caller catches the exception.
        unsafe { mrstack_throw_bad_alloc() }
    }
    p
}
