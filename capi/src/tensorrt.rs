//! TensorRT's door: C functions with `nvinfer1::IGpuAsyncAllocator`'s semantics, which the
//! header-only adapter `include/mrstack_tensorrt.hpp` calls from its `allocateAsync` and
//! `deallocateAsync`: size 0 gives null, alignment 0 means any, every call is thread-safe, and a
//! free needs no size (the stack knows it).

use crate::api::{lookup, stream};
use crate::error::guard;
use crate::stack::{Expect, MrstackStack};
use std::ffi::c_void;

/// `allocateAsync`: `size` bytes aligned to `alignment` (0: the stack's own), ordered on
/// `stream`. `flags` (TensorRT's `AllocatorFlags`) asks for resizable memory at bit 0, which
/// this allocator does not give: such a request is served like any other, and `reallocate`
/// (which TensorRT calls only then) is not offered. Null for size 0 or on error.
///
/// # Safety
///
/// `stream` is null or a live stream of the stack's CUDA context, which stays live until the
/// stack is destroyed (as for `mrstack_allocate`).
#[no_mangle]
pub unsafe extern "C" fn mrstack_trt_allocate(
    stack: *mut MrstackStack,
    size: u64,
    alignment: u64,
    flags: u32,
    stream: *mut c_void,
) -> *mut c_void {
    let _ = flags;
    guard(std::ptr::null_mut(), || {
        let size = usize::try_from(size).map_err(|_| format!("size {size} too large"))?;
        let align =
            usize::try_from(alignment).map_err(|_| format!("alignment {alignment} too large"))?;
        // SAFETY: forwarded from the caller.
        lookup(stack)?.allocate(size, align, unsafe { self::stream(stream) })
    })
}

/// `deallocateAsync`: frees `memory` on `stream`. True when it was a live block of the stack
/// (false, with the reason in `mrstack_last_error`, otherwise; nothing is freed then).
///
/// # Safety
///
/// As for `mrstack_trt_allocate`.
#[no_mangle]
pub unsafe extern "C" fn mrstack_trt_deallocate(
    stack: *mut MrstackStack,
    memory: *mut c_void,
    stream: *mut c_void,
) -> bool {
    guard(false, || {
        // SAFETY: forwarded from the caller.
        lookup(stack)?.deallocate(memory, Expect::NOTHING, unsafe { self::stream(stream) })?;
        Ok(true)
    })
}
