//! `HostAllocator<R>`: any host-accessible resource as an [`allocator_api2`] allocator, so that
//! `allocator_api2::vec::Vec<T, HostAllocator<&Pinned>>` (or `Box`, or hashbrown's maps) keep
//! their values in pinned memory, a pool over it, or any stack that gives `HostAccessible` memory.
//!
//! Cost: the resource's own, plus a `synchronize` of the allocator's stream after each non-empty
//! allocation, so the host may write at once even into a block that a suballocator reclaimed from
//! stream-ordered work (a no-op for `System`, a stream synchronize for CUDA-backed stacks). On the
//! default stream that waits for the default stream's queued work too: give the allocator a stream
//! of its own ([`HostAllocator::on_stream`]) where kernels run on the default stream meanwhile.
//! Requires `R: Accessible<HostAccessible>` (a compile error otherwise).
//!
//! The collections know nothing of streams: before a `Vec` grows, shrinks or drops, no device work
//! (an async copy out of its pinned memory, a kernel reading it) may still use the old buffer.
//! `PinnedVec` does that bookkeeping for fixed-length device-shared buffers; use this adapter for
//! host-side buffers (staging, growable host data) in pinned or pooled memory.

use crate::property::{Accessible, HostAccessible};
use crate::resource::{dangling, MemoryResource};
use crate::stream::StreamRef;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

/// An [`Allocator`] over a host-accessible resource, allocating on one stream.
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::container::HostAllocator;
/// use allocator_api2::vec::Vec;
///
/// let system = System::new(); // or Pinned::new(&ctx)?, or a pool over it
/// let mut v: Vec<u64, _> = Vec::new_in(HostAllocator::new(&system));
/// v.extend(0..1000);
/// assert_eq!(v.iter().sum::<u64>(), 499_500);
/// ```
#[derive(Debug)]
pub struct HostAllocator<R> {
    resource: R,
    stream: StreamRef,
}

impl<R: MemoryResource + Accessible<HostAccessible>> HostAllocator<R> {
    /// Allocates from `resource` on the default stream.
    pub fn new(resource: R) -> Self {
        Self::on_stream(resource, StreamRef::DEFAULT)
    }

    /// Allocates from `resource` on `stream`, and frees there.
    pub fn on_stream(resource: R, stream: StreamRef) -> Self {
        HostAllocator { resource, stream }
    }
}

impl<R> HostAllocator<R> {
    /// The resource the memory comes from.
    pub fn resource(&self) -> &R {
        &self.resource
    }

    /// The stream allocations are ordered on.
    pub fn stream(&self) -> StreamRef {
        self.stream
    }
}

// SAFETY: non-empty blocks come from `R::allocate` with the layout's size and alignment (so they
// are host-accessible by the bound, aligned, and disjoint) and go back to it with the same; the
// resource lives inside the allocator, so blocks stay valid while it (or a clone: the Clone impls
// below exist only where clones share one resource) lives. Empty blocks are dangling, aligned, and
// never passed to the resource.
unsafe impl<R: MemoryResource + Accessible<HostAccessible>> Allocator for HostAllocator<R> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let size = layout.size();
        if size == 0 {
            return Ok(NonNull::slice_from_raw_parts(dangling(layout.align()), 0));
        }
        let ptr = self
            .resource
            .allocate(size, layout.align(), self.stream)
            .map_err(|_| AllocError)?;
        if self.resource.synchronize(self.stream).is_err() {
            // SAFETY: just allocated with this size and alignment, unused.
            unsafe {
                self.resource
                    .deallocate(ptr, size, layout.align(), self.stream)
            };
            return Err(AllocError);
        }
        Ok(NonNull::slice_from_raw_parts(ptr, size))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        // SAFETY: the caller passes a block from `allocate` with its layout, which came from the
        // resource with that size and alignment.
        unsafe {
            self.resource
                .deallocate(ptr, layout.size(), layout.align(), self.stream)
        }
    }
}

// Clones share the resource, as `Allocator` requires of clones (a clone may free what the
// original allocated): so Clone exists only where cloning `R` gives a handle on the same resource.
impl<R: ?Sized> Clone for HostAllocator<&R> {
    fn clone(&self) -> Self {
        HostAllocator {
            resource: self.resource,
            stream: self.stream,
        }
    }
}

impl<R: ?Sized> Clone for HostAllocator<Arc<R>> {
    fn clone(&self) -> Self {
        HostAllocator {
            resource: self.resource.clone(),
            stream: self.stream,
        }
    }
}

impl<P: crate::erased::PropertySet> Clone for HostAllocator<crate::erased::AnyResource<P>> {
    fn clone(&self) -> Self {
        HostAllocator {
            resource: self.resource.clone(),
            stream: self.stream,
        }
    }
}

// The leaves whose clones are handles on the same driver or allocator.
macro_rules! leaf_clone {
    ($($leaf:ty),+) => {$(
        impl Clone for HostAllocator<$leaf> {
            fn clone(&self) -> Self {
                HostAllocator { resource: self.resource.clone(), stream: self.stream }
            }
        }
    )+};
}

leaf_clone!(crate::System, crate::Pinned, crate::Managed);

static_assertions::assert_impl_all!(HostAllocator<crate::System>: Allocator, Send, Sync, Clone);
static_assertions::assert_impl_all!(HostAllocator<&'static crate::Pinned>: Allocator, Clone);
static_assertions::assert_not_impl_any!(HostAllocator<crate::Cuda>: Allocator);
static_assertions::assert_not_impl_any!(HostAllocator<crate::Simulated>: Allocator, Clone);
static_assertions::assert_eq_size!(HostAllocator<&'static crate::Pinned>, [usize; 2]);
