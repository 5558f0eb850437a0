//! `Prefetch<U>`: each allocation of managed memory prefetched to a device on its stream.

use crate::property::{Accessible, Migratable};
use crate::resource::{check_request, forward_upstream, AllocError, Layer, MemoryResource, Result};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use cudarc::driver::{result, sys, CudaContext};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

/// Prefetches every allocation of `U` to one device.
///
/// Each allocation is prefetched to the device on the allocation's stream
/// (`cuMemPrefetchAsync`), as RMM's `prefetch_resource_adaptor`, so that the first kernel touching
/// managed memory does not stall on page faults. The device is a configuration value (default 0;
/// [`with_context`](Self::with_context) takes a context's); its primary context is opened on the
/// first allocation. A prefetch the driver refuses fails the allocation (the block goes back to
/// the upstream) with the driver's error.
///
/// # Cost
///
/// One asynchronous driver call per allocation (queued on the stream; the migration itself runs on
/// the device), after making the context current; none per deallocation. No lock or atomic of its
/// own beyond the once-initialized context.
///
/// # Streams
///
/// The prefetch is queued on the allocation's stream. On a stream it cannot queue on — a
/// simulated stream, another thread's per-thread stream, a stream of another context — it skips
/// the prefetch, and the pages migrate on first touch. Deallocations, `synchronize` and
/// `order_after` are forwarded to the upstream unchanged. It keeps no stream alive.
///
/// # Upstream
///
/// Requires an upstream whose memory is [`Migratable`] (managed: [`Managed`](crate::leaf::Managed), or an
/// adaptor stack over it); over anything else — `Cuda`, `Pinned`, `System` — it does not compile,
/// since the driver would refuse the prefetch at run time. It keeps the upstream's properties and
/// alignment. It calls the CUDA driver, so it needs one: without it the first allocation fails
/// with [`AllocErrorKind::NoDriver`](crate::resource::AllocErrorKind::NoDriver).
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
/// # fn main() -> Result<(), AllocError> {
/// let ctx = mrstack::cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let mr = resource_stack![Managed::new(&ctx)?, Prefetch { device: 0 }];
/// let v = DeviceVec::<f32, _>::zeroed(1 << 20, &mr, &stream)?; // already on device 0
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Prefetch<U> {
    upstream: U,
    device: usize,
    context: OnceLock<Arc<CudaContext>>,
}

impl<U: MemoryResource + Accessible<Migratable>> Prefetch<U> {
    const NAME: &'static str = "Prefetch";

    /// Prefetches what `upstream` allocates to device `device` (its primary context is opened
    /// on the first allocation).
    pub fn new(upstream: U, device: usize) -> Self {
        Prefetch {
            upstream,
            device,
            context: OnceLock::new(),
        }
    }

    /// Prefetches what `upstream` allocates to `ctx`'s device.
    pub fn with_context(upstream: U, ctx: &Arc<CudaContext>) -> Self {
        Prefetch {
            upstream,
            device: ctx.ordinal(),
            context: OnceLock::from(ctx.clone()),
        }
    }

    fn context(&self) -> Result<&Arc<CudaContext>, AllocError> {
        if let Some(ctx) = self.context.get() {
            return Ok(ctx);
        }
        let opened = crate::cuda_context(self.device)?;
        // Another thread may have opened it meanwhile: both are the same primary context.
        Ok(self.context.get_or_init(|| opened))
    }

    fn prefetch(
        &self,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<(), AllocError> {
        let err = |e| AllocError::cuda(e, size, align, Self::NAME);
        let ctx = self.context()?;
        // No stream to queue the prefetch on (simulated, another thread's per-thread stream,
        // another context's): skip it; the pages migrate on first touch.
        let Ok(handle) = crate::leaf::stream_in(ctx, stream, size, align, Self::NAME) else {
            return Ok(());
        };
        let _current = crate::leaf::make_current(ctx).map_err(err)?;
        let location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.device as i32,
        };
        // SAFETY: `ptr..ptr + size` is managed memory (the upstream is Migratable) just allocated
        // and live; `handle` is null, a special handle valid on this thread, or a live stream of
        // this context (`stream_in` checked it; a StreamRef borrows its stream for the call). A
        // prefetch only moves pages, it does not change their contents.
        unsafe {
            result::mem_prefetch_async(ptr.as_ptr() as sys::CUdeviceptr, size, location, handle)
        }
        .map_err(err)
    }
}

impl<U> Prefetch<U> {
    /// The device allocations are prefetched to.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }
}

// SAFETY: every allocation is the upstream's, returned unchanged; the prefetch moves its pages
// without changing what they hold.
unsafe impl<U: MemoryResource + Accessible<Migratable>> MemoryResource for Prefetch<U> {
    forward_upstream!(U, upstream);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let ptr = self.upstream.allocate(size, align, stream)?;
        if let Err(e) = self.prefetch(ptr, size, align, stream) {
            // SAFETY: ptr was just allocated with these arguments and is not handed out.
            unsafe { self.upstream.deallocate(ptr, size, align, stream) };
            return Err(e);
        }
        Ok(ptr)
    }

    forward_upstream!(deallocate to upstream);

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "prefetch")
            .number("device", self.device)
            .finish()
    }

    forward_upstream!(layer over upstream);
}

has_upstream!(impl<U> for Prefetch<U>);

/// `resource_stack!` configuration of [`Prefetch`]: `Prefetch { device: 1 }` (default device 0).
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefetchConfig {
    /// The ordinal of the device to prefetch to.
    pub device: usize,
}

impl<U: MemoryResource + Accessible<Migratable>> Layer<U> for PrefetchConfig {
    type Resource = Prefetch<U>;
    fn layer(self, upstream: U) -> Prefetch<U> {
        Prefetch::new(upstream, self.device)
    }
}

static_assertions::assert_impl_all!(
    Prefetch<crate::leaf::Managed>: Send,
    Sync,
    crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>,
    Accessible<Migratable>
);
static_assertions::assert_impl_all!(Prefetch<crate::adaptor::Statistics<crate::leaf::Managed>>: Send, Sync, Accessible<Migratable>);
