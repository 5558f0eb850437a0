//! `Retry<U, F>`: allocations that fail for want of memory retried while a callback says so.

use crate::resource::{check_request, forward_upstream, AllocError, Layer, MemoryResource, Result};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::ptr::NonNull;

/// Retries failed allocations of `U` while `on_failure(&error, attempt)` returns true.
///
/// When an allocation fails for want of memory, it calls `F` — which may free a cache, trim a
/// pool, collect garbage — and tries again while `F` says so: RMM's
/// `failure_callback_resource_adaptor`, PyTorch's OOM observers. `F` gets the error and the
/// attempt number (1 after the first failure) and returns whether to try again. Only failures that
/// freeing memory could cure go to `F` ([`AllocError::is_out_of_memory`]: out of memory, a limit
/// reached); others return at once. Deallocations go straight to the upstream.
///
/// `F` may call back into the resources above it — free blocks through them, trim them
/// (`Pool::release`, `Tlsf::release`, `ThreadHeaps::release`): every suballocator of this crate
/// lets its lock go around its upstream's `allocate`. (An upstream's `deallocate`,
/// `synchronize` and `order_after` are called under those locks: a resource of your own whose
/// `deallocate` calls into the resource above it deadlocks.)
///
/// # Cost
///
/// None on success (a zero-sized `F` adds no bytes): one upstream call, no lock or atomic. Each
/// failure that goes to `F` costs one call of `F` and, when it says so, another upstream call.
///
/// # Streams
///
/// Every attempt goes to the upstream on the stream of the call; `synchronize` and
/// `order_after` are forwarded to the upstream. It keeps no stream alive.
///
/// # Upstream
///
/// Requires nothing of its upstream and keeps its properties and alignment.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::adaptor::{Limiting, Retry};
/// use std::sync::atomic::{AtomicUsize, Ordering};
///
/// let calls = AtomicUsize::new(0);
/// let mr = Retry::new(Limiting::new(Simulated::new(1 << 30), 1000), |_: &AllocError, attempt| {
///     calls.fetch_add(1, Ordering::Relaxed);
///     attempt < 3 // give up after three tries
/// });
/// assert!(mr.allocate(2000, 256, StreamRef::DEFAULT).is_err());
/// assert_eq!(calls.load(Ordering::Relaxed), 3);
/// ```
#[derive(Debug, Clone)]
pub struct Retry<U, F> {
    upstream: U,
    on_failure: F,
}

impl<U, F> Retry<U, F>
where
    U: MemoryResource,
    F: Fn(&AllocError, usize) -> bool,
{
    const NAME: &'static str = "Retry";

    /// Wraps `upstream`, calling `on_failure(&error, attempt)` after each failed attempt.
    pub fn new(upstream: U, on_failure: F) -> Self {
        Retry {
            upstream,
            on_failure,
        }
    }
}

impl<U, F> Retry<U, F> {
    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Unwraps the adaptor.
    pub fn into_inner(self) -> U {
        self.upstream
    }
}

// SAFETY: every allocation is the upstream's, returned unchanged.
unsafe impl<U, F> MemoryResource for Retry<U, F>
where
    U: MemoryResource,
    F: Fn(&AllocError, usize) -> bool,
{
    forward_upstream!(U, upstream);

    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let mut attempt = 0;
        loop {
            match self.upstream.allocate(size, align, stream) {
                Ok(ptr) => return Ok(ptr),
                Err(e) if e.is_out_of_memory() => {
                    attempt += 1;
                    if !(self.on_failure)(&e, attempt) {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    forward_upstream!(deallocate to upstream);

    // `retry` has no text form: its callback is code.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "retry").finish()
    }

    forward_upstream!(layer over upstream);
}

has_upstream!(impl<U, F> for Retry<U, F>);

/// The callback type [`RetryConfig`] holds: boxed, so that a capturing closure fits the
/// `..Default::default()` that `resource_stack!` adds.
pub type RetryCallback = Box<dyn Fn(&AllocError, usize) -> bool + Send + Sync>;

/// `resource_stack!` configuration of [`Retry`]:
/// `Retry { on_failure: Box::new(|err, attempt| { cache.clear(); attempt < 3 }) }`.
///
/// The default callback never retries (the adaptor then only forwards). Build a `Retry` directly
/// with [`Retry::new`] to keep an unboxed `F`.
pub struct RetryConfig {
    /// Called with the error and the attempt number (1 after the first failure); returns whether
    /// to try again.
    pub on_failure: RetryCallback,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            on_failure: Box::new(|_, _| false),
        }
    }
}

impl std::fmt::Debug for RetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryConfig").finish_non_exhaustive()
    }
}

impl<U: MemoryResource> Layer<U> for RetryConfig {
    type Resource = Retry<U, RetryCallback>;
    fn layer(self, upstream: U) -> Retry<U, RetryCallback> {
        Retry::new(upstream, self.on_failure)
    }
}

/// A zero-sized callback, for the size assertion below.
fn never(_: &AllocError, _: usize) -> bool {
    false
}

static_assertions::assert_impl_all!(Retry<crate::leaf::System, RetryCallback>: Send, Sync, crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_impl_all!(Retry<crate::leaf::Cuda, RetryCallback>: Send, Sync, crate::property::Accessible<crate::property::DeviceAccessible>);
// A stateless callback (a function item, a closure capturing nothing) adds no bytes.
const _: () = {
    let r = Retry {
        upstream: crate::leaf::System,
        on_failure: never,
    };
    assert!(std::mem::size_of_val(&r) == std::mem::size_of::<crate::leaf::System>());
};
