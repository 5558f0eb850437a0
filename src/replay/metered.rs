//! [`Metered`]: the bytes a stack takes from an upstream that keeps no count of its own.

use crate::leaf::PhysicalPages;
use crate::resource::{check_request, forward_upstream, MemoryResource, Result};
use crate::stream::StreamRef;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts the bytes a stack takes from its upstream: what a replay reports as the stack's upstream
/// peak where the upstream keeps no count of its own (`Cuda`; `Simulated` has
/// [`peak`](crate::leaf::Simulated::peak)). Two relaxed atomic operations per call that reaches it,
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
    count: Count,
}

/// Bytes in use and their peak, counted by relaxed atomics: what [`Metered`] keeps of its
/// upstream, and a [`ThreadedReplayer`](super::ThreadedReplayer) of what its threads hold.
#[derive(Debug, Default)]
pub(super) struct Count {
    in_use: AtomicUsize,
    peak: AtomicUsize,
}

impl Count {
    /// Bytes counted in and not out yet.
    pub(super) fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// The most bytes in use at once.
    pub(super) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Counts `size` bytes in, after they were handed out.
    pub(super) fn add(&self, size: usize) {
        // The counter's updates form one sequence, so the largest value any allocation leaves in
        // it is the exact peak: bytes leave it before they go back (`sub`), so bytes handed out
        // again are never counted twice.
        let now = self
            .in_use
            .fetch_add(size, Ordering::Relaxed)
            .saturating_add(size);
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// Counts `size` bytes out, before they go back.
    pub(super) fn sub(&self, size: usize) {
        self.in_use.fetch_sub(size, Ordering::Relaxed);
    }
}

impl<U> Metered<U> {
    const NAME: &'static str = "Metered";

    /// Counts what goes through to `upstream`.
    pub fn new(upstream: U) -> Self {
        Metered {
            upstream,
            count: Count::default(),
        }
    }

    /// Bytes allocated through this resource and not freed yet.
    pub fn in_use(&self) -> usize {
        self.count.in_use()
    }

    /// The most bytes allocated through this resource at once.
    pub fn peak(&self) -> usize {
        self.count.peak()
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
        self.count.add(size);
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // Uncounted first: once the upstream has the bytes, another thread may take and count
        // them, and the peak would count more than the upstream ever handed out.
        self.count.sub(size);
        // SAFETY: forwarded from the caller.
        unsafe { self.upstream.deallocate(ptr, size, align, stream) };
    }

    fn name(&self) -> &'static str {
        Self::NAME
    }

    /// The upstream's description: a meter counts, it changes nothing a text config says, so
    /// the text builds the same stack without it.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.upstream.describe_to(f)
    }

    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        Some(&self.upstream)
    }
}

crate::stack::has_upstream!(impl<U> for Metered<U>);

/// The pages of a virtual-memory stack over a metered upstream, counted by that meter: what
/// [`Paged`](super::Paged) gives for `Arc<Metered<U>>`, so that a replay reads the physical
/// bytes such a stack mapped where it reads what the other stacks took.
#[derive(Debug)]
pub struct MeteredPages<U, P> {
    meter: Arc<Metered<U>>,
    pages: P,
}

impl<U, P: Clone> Clone for MeteredPages<U, P> {
    fn clone(&self) -> Self {
        MeteredPages {
            meter: self.meter.clone(),
            pages: self.pages.clone(),
        }
    }
}

impl<U, P> MeteredPages<U, P> {
    /// `pages`, counted by `meter`.
    pub fn new(meter: Arc<Metered<U>>, pages: P) -> Self {
        MeteredPages { meter, pages }
    }
}

impl<U: Send + Sync, P: PhysicalPages> crate::leaf::pages::sealed::Sealed for MeteredPages<U, P> {}

// SAFETY: every call goes to `P`, whose promises hold for the same ranges; counting touches no
// memory.
unsafe impl<U: Send + Sync, P: PhysicalPages> PhysicalPages for MeteredPages<U, P> {
    type Host = P::Host;
    type Device = P::Device;
    type Migratable = P::Migratable;
    type Page = P::Page;
    type Mark = P::Mark;

    crate::leaf::pages::forward_reservations!(self.pages);
    unsafe fn map(&self, addr: usize, size: usize) -> Result<Self::Page> {
        // SAFETY: forwarded from the caller.
        let page = unsafe { self.pages.map(addr, size) }?;
        self.meter.count.add(size);
        Ok(page)
    }
    unsafe fn enable(&self, addr: usize, size: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.pages.enable(addr, size) }
    }
    unsafe fn unmap(&self, addr: usize, size: usize, page: Self::Page) {
        // Uncounted first, as `Metered::deallocate`.
        self.meter.count.sub(size);
        // SAFETY: forwarded from the caller.
        unsafe { self.pages.unmap(addr, size, page) };
    }
    unsafe fn remap(
        &self,
        from: usize,
        to: usize,
        size: usize,
        page: Self::Page,
    ) -> Result<Self::Page> {
        // SAFETY: forwarded from the caller.
        let moved = unsafe { self.pages.remap(from, to, size, page) };
        // The same memory, moved: counted out only where it went back.
        if moved.is_err() {
            self.meter.count.sub(size);
        }
        moved
    }
    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        self.pages.synchronize(stream)
    }
    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
        self.pages.order_after(stream, after)
    }
    fn mark(&self, stream: StreamRef) -> Result<Option<P::Mark>> {
        self.pages.mark(stream)
    }
    fn reached(&self, mark: &P::Mark) -> Result<bool> {
        self.pages.reached(mark)
    }
    fn wait(&self, mark: &P::Mark) -> Result<()> {
        self.pages.wait(mark)
    }
    fn name(&self) -> &'static str {
        self.pages.name()
    }
    fn describe_fields<'a, 'b>(
        &self,
        item: crate::stack::ItemWriter<'a, 'b>,
    ) -> crate::stack::ItemWriter<'a, 'b> {
        self.pages.describe_fields(item)
    }
}

static_assertions::assert_impl_all!(Metered<crate::leaf::Simulated>: Send, Sync);
static_assertions::assert_impl_all!(
    Metered<crate::leaf::Cuda>: Send, Sync, crate::property::Accessible<crate::property::DeviceAccessible>
);
