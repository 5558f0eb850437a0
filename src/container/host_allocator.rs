//! `HostAllocator<R>`: a host-only resource as an [`allocator_api2`] allocator, so that
//! `allocator_api2::vec::Vec<T, HostAllocator<&Pool<System>>>` (or `Box`, or hashbrown's maps)
//! keep their values in a pool, or any stack that gives pageable host memory
//! ([`Pageable`](crate::property::Pageable)).
//!
//! Not pinned or managed memory: a plain collection hands out `&mut [T]`, which cudarc copies
//! into asynchronously when the memory is pinned (it assumes Rust slices are pageable), so a
//! `Vec` dropped after such a copy would free memory a DMA still writes. That does not compile;
//! [`PinnedVec`](crate::container::PinnedVec) is the container for memory the device shares.
//!
//! Cost: the resource's own, plus a `synchronize` of the allocator's stream after each non-empty
//! allocation, so the host may write at once even into a block that a suballocator reclaimed from
//! stream-ordered work (a no-op for `System`, a stream synchronize for CUDA-backed stacks). On the
//! default stream that waits for the default stream's queued work too: give the allocator a stream
//! of its own ([`HostAllocator::on_stream`]) where kernels run on the default stream meanwhile.
//! Requires `R: Accessible<Pageable>` (a compile error otherwise): `System`, and every adaptor
//! and suballocator over it (`Pool`, `Tlsf`, `ThreadHeaps`, `ThreadCache`, …), carry it.

use crate::property::{Accessible, Pageable};
use crate::resource::{dangling, MemoryResource};
use crate::stream::{StreamHandle, StreamRef};
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
/// let system = System::new(); // or a pool over it
/// let mut v: Vec<u64, _> = Vec::new_in(HostAllocator::new(&system));
/// v.extend(0..1000);
/// assert_eq!(v.iter().sum::<u64>(), 499_500);
/// ```
#[derive(Debug)]
pub struct HostAllocator<R> {
    resource: R,
    stream: StreamHandle,
}

impl<R: MemoryResource + Accessible<Pageable>> HostAllocator<R> {
    /// Allocates from `resource` on the default stream.
    pub fn new(resource: R) -> Self {
        Self::on_stream(resource, StreamRef::DEFAULT)
    }

    /// Allocates from `resource` on `stream`, and frees there; the allocator keeps the stream
    /// alive.
    pub fn on_stream(resource: R, stream: StreamRef<'_>) -> Self {
        HostAllocator {
            resource,
            stream: stream.to_handle(),
        }
    }
}

impl<R> HostAllocator<R> {
    /// The resource the memory comes from.
    pub fn resource(&self) -> &R {
        &self.resource
    }

    /// The stream allocations are ordered on.
    pub fn stream(&self) -> StreamRef<'_> {
        self.stream.as_ref()
    }
}

// SAFETY: non-empty blocks come from `R::allocate` with the layout's size and alignment (so they
// are pageable host memory by the `Accessible<Pageable>` bound, which no DMA can target behind the
// collection's back, aligned, and disjoint) and go back to it with the same; the
// resource lives inside the allocator, so blocks stay valid while it (or a clone: the Clone impls
// below exist only where clones share one resource) lives. Empty blocks are dangling, aligned, and
// never passed to the resource.
unsafe impl<R: MemoryResource + Accessible<Pageable>> Allocator for HostAllocator<R> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let size = layout.size();
        if size == 0 {
            return Ok(NonNull::slice_from_raw_parts(dangling(layout.align()), 0));
        }
        let ptr = self
            .resource
            .allocate(size, layout.align(), self.stream.as_ref())
            .map_err(|_| AllocError)?;
        if self.resource.synchronize(self.stream.as_ref()).is_err() {
            // SAFETY: just allocated with this size and alignment, unused.
            unsafe {
                self.resource
                    .deallocate(ptr, size, layout.align(), self.stream.as_ref())
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
                .deallocate(ptr, layout.size(), layout.align(), self.stream.as_ref())
        }
    }
}

// Clones share the resource, as `Allocator` requires of clones (a clone may free what the
// original allocated): so Clone exists only where cloning `R` gives a handle on the same resource.
impl<R: ?Sized> Clone for HostAllocator<&R> {
    fn clone(&self) -> Self {
        HostAllocator {
            resource: self.resource,
            stream: self.stream.clone(),
        }
    }
}

impl<R: ?Sized> Clone for HostAllocator<Arc<R>> {
    fn clone(&self) -> Self {
        HostAllocator {
            resource: self.resource.clone(),
            stream: self.stream.clone(),
        }
    }
}

impl<P: crate::property::PropertySet> Clone for HostAllocator<crate::erased::AnyResource<P>> {
    fn clone(&self) -> Self {
        HostAllocator {
            resource: self.resource.clone(),
            stream: self.stream.clone(),
        }
    }
}

// The leaves whose clones are handles on the same driver or allocator.
macro_rules! leaf_clone {
    ($($leaf:ty),+) => {$(
        impl Clone for HostAllocator<$leaf> {
            fn clone(&self) -> Self {
                HostAllocator { resource: self.resource.clone(), stream: self.stream.clone() }
            }
        }
    )+};
}

leaf_clone!(crate::leaf::System);

static_assertions::assert_impl_all!(HostAllocator<crate::leaf::System>: Allocator, Send, Sync, Clone);
static_assertions::assert_impl_all!(HostAllocator<&'static crate::leaf::System>: Allocator, Clone);
static_assertions::assert_not_impl_any!(HostAllocator<crate::leaf::Pinned>: Allocator);
static_assertions::assert_not_impl_any!(HostAllocator<crate::leaf::Managed>: Allocator);
static_assertions::assert_not_impl_any!(HostAllocator<crate::leaf::Cuda>: Allocator);
static_assertions::assert_not_impl_any!(HostAllocator<crate::leaf::Simulated>: Allocator, Clone);
static_assertions::assert_eq_size!(HostAllocator<&'static crate::leaf::System>, [usize; 3]);
