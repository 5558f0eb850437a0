//! PyTorch's door: `torch.cuda.memory.CUDAPluggableAllocator(path, "mrstack_torch_malloc",
//! "mrstack_torch_free")`, one stack per device built from the environment (see [`crate::env`]).

use crate::api::stream;
use crate::env::env_stack;
use crate::error::{guard, guard_void};
use crate::stack::Expect;
use std::ffi::{c_int, c_void};

/// Every block is aligned to this, as `cudaMalloc`'s are (PyTorch's kernels assume it).
const ALIGN: usize = 256;

/// PyTorch's `alloc_fn`: `size` bytes on `device`, ordered on `stream`. Null on error (PyTorch
/// then reports out of memory; `mrstack_last_error` says why).
///
/// # Safety
///
/// `stream` is null or a live stream of `device`'s primary context (PyTorch's streams are).
#[no_mangle]
pub unsafe extern "C" fn mrstack_torch_malloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let size = usize::try_from(size).map_err(|_| format!("size {size} < 0"))?;
        // SAFETY: forwarded from the caller.
        env_stack(device)?.allocate(size, ALIGN, unsafe { self::stream(stream) })
    })
}

/// PyTorch's `free_fn`: frees a block of `device`'s stack on `stream`. A failure (a pointer the
/// stack did not hand out, a negative size, no stack for `device`) is reported on standard error
/// and in `mrstack_last_error`, naming its cause; nothing is freed then.
///
/// # Safety
///
/// As for `mrstack_torch_malloc`.
#[no_mangle]
pub unsafe extern "C" fn mrstack_torch_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    guard_void("mrstack_torch_free", || {
        let expect = Expect {
            size: Some(usize::try_from(size).map_err(|_| format!("size {size} < 0"))?),
            align: Some(ALIGN),
        };
        // SAFETY: forwarded from the caller.
        env_stack(device)?.deallocate(ptr, expect, unsafe { self::stream(stream) })
    });
}

/// Builds `device`'s stack now rather than at its first use. PyTorch's optional `init_fn`-style
/// hook, for symmetry with clients that call one; a stack that cannot be built is reported on
/// standard error and in `mrstack_last_error`.
#[no_mangle]
pub extern "C" fn mrstack_torch_init(device: c_int) {
    guard_void("mrstack_torch_init", || env_stack(device).map(|_| ()));
}
