//! `System`: host memory from Rust's global allocator, at any power-of-two alignment.

use crate::resource::{
    check_request, no_stream_work, properties, AllocError, AllocErrorKind, MemoryResource, Result,
};
use crate::stream::StreamRef;
use std::alloc::Layout;
use std::ptr::NonNull;
use typenum::{B0, B1, U16};

/// Host memory from `std::alloc`.
///
/// Each allocation is one `std::alloc::alloc` (Rust's global allocator) with the alignment asked,
/// at least 16 bytes; any power-of-two alignment is honoured. The memory is host-accessible only:
/// kernels cannot read it, and the containers that hand memory to kernels refuse it at compile
/// time. The natural upstream for host tests that need real bytes.
///
/// # Cost
///
/// One call to the global allocator per operation; no lock or atomic of its own, and no memory
/// beyond what the global allocator keeps (the resource is zero-sized).
///
/// # Streams
///
/// None: host memory has no stream-ordered work. `allocate` and `deallocate` ignore the stream;
/// `synchronize` and `order_after` return `Ok(())` at once. It keeps no stream alive.
///
/// # Upstream
///
/// None: a leaf. It calls `std::alloc` and needs nothing of the machine (no driver, no GPU). It
/// gives host-accessible memory aligned to at least 16 bytes.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// let mr = System::new();
/// let p = mr.allocate_sync(100, 64).unwrap();
/// assert_eq!(p.as_ptr() as usize % 64, 0);
/// // SAFETY: System gives host memory; p holds 100 bytes.
/// unsafe { p.as_ptr().write_bytes(7, 100) };
/// // SAFETY: p came from mr with this size and alignment.
/// unsafe { mr.deallocate_sync(p, 100, 64) };
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct System;

impl System {
    const NAME: &'static str = "System";
    const MIN_ALIGN: usize = 16;

    /// The system allocator.
    pub const fn new() -> Self {
        System
    }

    fn layout(size: usize, align: usize) -> Option<Layout> {
        Layout::from_size_align(size, align.max(Self::MIN_ALIGN)).ok()
    }
}

// SAFETY: std::alloc returns host memory of the layout's size and alignment (at least 16), freed
// with the same layout. It is pageable: mrstack never pins or registers it, and no CUDA call
// allocated it, so the driver knows it neither as pinned nor as managed memory.
unsafe impl MemoryResource for System {
    properties! { Host = B1, Device = B0, Migratable = B0, Pageable = B1, Alignment = U16 }

    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let layout = Self::layout(size, align).ok_or(AllocError::new(
            AllocErrorKind::InvalidArgument("size and alignment do not form a layout"),
            size,
            align,
            Self::NAME,
        ))?;
        // SAFETY: layout has a non-zero size (zero returned above).
        NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or(AllocError::out_of_memory(
            size,
            align,
            Self::NAME,
        ))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, _: StreamRef) {
        if size == 0 {
            return;
        }
        if let Some(layout) = Self::layout(size, align) {
            // SAFETY: the caller passes a pointer from `allocate` with the same size and align,
            // hence the same layout.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) }
        }
    }

    // Host memory: no stream-ordered work to wait for or to order.
    no_stream_work!(name = Self::NAME);

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("system")
    }
}

static_assertions::assert_impl_all!(System: Send, Sync, Copy, crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_not_impl_any!(System: crate::property::Accessible<crate::property::DeviceAccessible>);
static_assertions::assert_eq_size!(System, ());
