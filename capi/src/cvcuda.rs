//! CV-CUDA's door: an `NVCVResourceAllocator` per resource type (CV-CUDA 0.3 and later; before,
//! `NVCVCustomAllocator`), with `mrstack_cvcuda_alloc` / `mrstack_cvcuda_free` as its
//! `res.mem.fnAlloc` / `fnFree` and a stack handle as its `ctx`. CV-CUDA passes no stream: blocks
//! are ordered on the legacy default stream. Check the stack first
//! with `mrstack_cvcuda_check`: a host or host-pinned allocator needs a stack whose memory the
//! CPU may touch, a device one a stack kernels may touch, and a stack that does not fit is
//! refused there, at creation, not at the first allocation.

use crate::api::{lookup, property_bits, MRSTACK_DEVICE, MRSTACK_HOST};
use crate::error::{guard, guard_void};
use crate::stack::Expect;
use mrstack::stream::StreamRef;
use std::ffi::{c_int, c_void};

/// NVCV's `NVCV_RESOURCE_MEM_HOST`: pageable or any host memory.
pub const MRSTACK_CVCUDA_HOST: c_int = 0;
/// NVCV's `NVCV_RESOURCE_MEM_CUDA`: device memory.
pub const MRSTACK_CVCUDA_DEVICE: c_int = 1;
/// NVCV's `NVCV_RESOURCE_MEM_HOST_PINNED`: host memory the device may access.
pub const MRSTACK_CVCUDA_HOST_PINNED: c_int = 2;

/// 0 when stack `ctx` can serve NVCV resource type `resource_type` (one of the
/// `MRSTACK_CVCUDA_*` values, which are NVCV's `NVCVResourceType` values); -1 with the reason in
/// `mrstack_last_error` otherwise.
#[no_mangle]
pub extern "C" fn mrstack_cvcuda_check(ctx: *mut c_void, resource_type: c_int) -> c_int {
    guard(-1, || {
        let p = lookup(ctx.cast())?.properties();
        let (need, name) = match resource_type {
            MRSTACK_CVCUDA_HOST => (MRSTACK_HOST, "host"),
            MRSTACK_CVCUDA_DEVICE => (MRSTACK_DEVICE, "device (cuda)"),
            MRSTACK_CVCUDA_HOST_PINNED => (MRSTACK_HOST | MRSTACK_DEVICE, "host-pinned"),
            other => return Err(format!("unknown NVCV resource type {other}")),
        };
        let has = property_bits(p);
        if has & need == need {
            Ok(0)
        } else {
            Err(format!(
                "this stack gives {p} memory: it cannot serve NVCV's {name} allocations"
            ))
        }
    })
}

/// NVCV's allocation function: `size` bytes at `align` from stack `ctx`. Null on error.
#[no_mangle]
pub extern "C" fn mrstack_cvcuda_alloc(ctx: *mut c_void, size: i64, align: i32) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let size = usize::try_from(size).map_err(|_| format!("size {size} < 0"))?;
        let align = usize::try_from(align).map_err(|_| format!("alignment {align} < 0"))?;
        lookup(ctx.cast())?.allocate(size, align, StreamRef::DEFAULT)
    })
}

/// NVCV's free function: frees a block of stack `ctx` with the size and alignment it was
/// allocated with. A failure (a mismatch, a foreign pointer, a negative size or alignment, a
/// handle that names no live stack) is reported on standard error and in `mrstack_last_error`,
/// naming its cause; nothing is freed then.
#[no_mangle]
pub extern "C" fn mrstack_cvcuda_free(ctx: *mut c_void, ptr: *mut c_void, size: i64, align: i32) {
    guard_void("mrstack_cvcuda_free", || {
        let expect = Expect {
            size: Some(usize::try_from(size).map_err(|_| format!("size {size} < 0"))?),
            align: Some(usize::try_from(align).map_err(|_| format!("alignment {align} < 0"))?),
        };
        lookup(ctx.cast())?.deallocate(ptr, expect, StreamRef::DEFAULT)
    });
}
