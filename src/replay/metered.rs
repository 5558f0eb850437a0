//! [`Metered`]: the bytes a stack takes from an upstream that keeps no count of its own.

use crate::resource::{check_request, forward_upstream, MemoryResource, Result};
use crate::stream::StreamRef;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes a stack takes from its upstream: what a replay reports as the stack's upstream
/// peak where the upstream keeps no count of its own (`Cuda`; `Simulated` has
/// [`peak`](crate::Simulated::peak)). Two relaxed atomic operations per call that reaches it,
/// which for a suballocator is only when it grows or shrinks; the `Statistics` adaptor counts more.
///
/// Share it behind an `Arc` to read it after the stack that holds it is built:
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::replay::Metered;
/// use std::sync::Arc;
///
/// let meter = Arc::new(Metered::new(Simulated::new(1 << 20)));
/// let mr = resource_stack![meter.clone()];
/// let p = mr.allocate(1000, 256, StreamRef::DEFAULT)?;
/// // SAFETY: p came from mr with this size and alignment.
/// unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
/// assert_eq!((meter.in_use(), meter.peak()), (0, 1000));
/// # Ok::<(), AllocError>(())
/// ```
#[derive(Debug)]
pub struct Metered<U> {
    upstream: U,
    in_use: AtomicUsize,
    peak: AtomicUsize,
}

impl<U> Metered<U> {
    const NAME: &'static str = "Metered";

    /// Counts what goes through to `upstream`.
    pub fn new(upstream: U) -> Self {
        Metered {
            upstream,
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Bytes allocated through this resource and not freed yet.
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// The most bytes allocated through this resource at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }
}

// SAFETY: every allocation is the upstream's, returned unchanged; counting touches no memory.
unsafe impl<U: MemoryResource> MemoryResource for Metered<U> {
    forward_upstream!(U, upstream);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let ptr = self.upstream.allocate(size, align, stream)?;
        // The counter's updates form one sequence, so the largest value any allocation leaves in
        // it is the exact peak.
        let now = self.in_use.fetch_add(size, Ordering::Relaxed) + size;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.upstream.deallocate(ptr, size, align, stream) };
        self.in_use.fetch_sub(size, Ordering::Relaxed);
    }

    fn name(&self) -> &'static str {
        Self::NAME
    }
}

static_assertions::assert_impl_all!(Metered<crate::Simulated>: Send, Sync);
static_assertions::assert_impl_all!(
    Metered<crate::Cuda>: Send, Sync, crate::Accessible<crate::DeviceAccessible>
);
