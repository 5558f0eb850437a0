//! `Limiting<U>`: a cap on the bytes allocated at once through it.

use crate::resource::{
    check_request, forward_upstream, AllocError, AllocErrorKind, Layer, MemoryResource, Result,
    Undo,
};
use crate::shard::Sharded;
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::ptr::NonNull;

/// At most `limit` bytes allocated through it at once.
///
/// A cap on the bytes allocated at once through it, as RMM's `limiting_resource_adaptor` and
/// PyTorch's `set_per_process_memory_fraction`. A request that would take the total over the cap
/// fails with [`AllocErrorKind::LimitExceeded`] (the cap and the bytes in use) without reaching
/// the upstream. It counts requested sizes, not what the upstream rounds them to. The bytes are
/// reserved before the upstream is asked, so that concurrent requests cannot together pass the cap,
/// and released after the upstream has the memory back.
///
/// # Cost
///
/// No lock-prefixed instruction per call in the common case: each thread reserves bytes from the
/// cap a chunk at a time (1 MiB, or 1/1024 of the cap if less) and counts in a shard of its own
/// (plain loads and stores on its own cache line; the first 64 live threads get one, later ones
/// share an atomic shard); a compare-and-swap on the shared total when a thread's bytes grow past
/// its reservation, an atomic subtraction when they shrink two chunks below it. Memory: 8.3 KiB
/// of shards.
///
/// # Exactness
///
/// The cap is never passed: the shared total of reservations stays at most the cap. One thread
/// alone is refused exactly when its bytes would pass the cap. With several threads, the
/// reservations other threads hold beyond their bytes (at most two chunks each, so at most 1/8
/// of the cap over the 64 thread slots, even with `in_use` at 0) are not available to a request: once a request is refused, threads reserve only what they need and
/// give all slack back at each deallocation until the total falls to half the cap, so what stays
/// unavailable is the slack of threads that have not deallocated since. [`in_use`](Self::in_use)
/// sums the threads' bytes: exact once the calls in flight are done.
///
/// # Streams
///
/// The cap ignores streams: the stream of each call goes to the upstream unchanged, and
/// `synchronize` and `order_after` are forwarded to the upstream. It keeps no stream alive.
///
/// # Upstream
///
/// Requires nothing of its upstream and keeps its properties and alignment.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::resource::AllocErrorKind;
///
/// let mr = resource_stack![Simulated::new(1 << 30), Limiting { limit: 1 MiB }];
/// let a = mr.allocate(768 << 10, 256, StreamRef::DEFAULT).unwrap();
/// let err = mr.allocate(512 << 10, 256, StreamRef::DEFAULT).unwrap_err();
/// assert_eq!(err.kind, AllocErrorKind::LimitExceeded { limit: 1 << 20, in_use: 768 << 10 });
/// # unsafe { mr.deallocate(a, 768 << 10, 256, StreamRef::DEFAULT) };
/// ```
#[derive(Debug)]
pub struct Limiting<U> {
    upstream: U,
    limit: usize,
    /// Bytes in use, by thread.
    in_use: Sharded<1>,
}

impl<U: MemoryResource> Limiting<U> {
    const NAME: &'static str = "Limiting";

    /// Caps what goes to `upstream` at `limit` bytes at once.
    pub fn new(upstream: U, limit: usize) -> Self {
        // Above 2^63 - 1 bytes a cap cannot be reached: counted as 2^63 - 2, which keeps the
        // shards' checked arithmetic (2^63 - 1 means no cap to them).
        let cap = i64::try_from(limit).unwrap_or(i64::MAX).min(i64::MAX - 1);
        // Each of the 64 thread slots holds at most two chunks unused: at most 1/8 of the cap.
        let chunk = (cap / 1024).min(1 << 20);
        Limiting {
            upstream,
            limit,
            in_use: Sharded::new([chunk], [cap]),
        }
    }
}

impl<U> Limiting<U> {
    /// The cap in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes allocated through the adaptor now: the sum of the threads' shards, exact when no
    /// call is in flight on another thread (read while others allocate and free, it may count a
    /// block one thread freed and another took again, and read above the cap, which is never
    /// passed).
    pub fn in_use(&self) -> usize {
        usize::try_from(self.in_use.read(0).current).unwrap_or(usize::MAX)
    }

    /// Bytes that may still be allocated before the cap.
    pub fn available(&self) -> usize {
        self.limit.saturating_sub(self.in_use())
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Unwraps the adaptor.
    pub fn into_inner(self) -> U {
        self.upstream
    }
}

// SAFETY: every allocation is the upstream's, returned unchanged; the adaptor only refuses some.
unsafe impl<U: MemoryResource> MemoryResource for Limiting<U> {
    forward_upstream!(U, upstream);

    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        // Reserve before asking the upstream, so that concurrent requests cannot together pass
        // the cap; give the reservation back if the upstream fails.
        let refused = || {
            AllocError::new(
                AllocErrorKind::LimitExceeded {
                    limit: self.limit,
                    in_use: self.in_use(),
                },
                size,
                align,
                Self::NAME,
            )
        };
        if size > self.limit || size > i64::MAX as usize {
            return Err(refused());
        }
        self.in_use
            .add([size as u64], false)
            .map_err(|_| refused())?;
        // Given back if the upstream fails or panics: a panicking upstream must not shrink the
        // cap for good.
        let reserved = Undo(|| self.in_use.sub([size as u64]));
        let ptr = self.upstream.allocate(size, align, stream)?;
        std::mem::forget(reserved);
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // Released after the upstream has the memory back, so that a request the cap lets through
        // can be served by it; released too if the upstream panics (the caller's block is gone).
        let _release = Undo(|| self.in_use.sub([size as u64]));
        // SAFETY: forwarded from the caller.
        unsafe { self.upstream.deallocate(ptr, size, align, stream) };
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "limiting")
            .size("limit", self.limit)
            .finish()
    }

    forward_upstream!(layer over upstream);
}

has_upstream!(impl<U> for Limiting<U>);

/// `resource_stack!` configuration of [`Limiting`]: `Limiting { limit: 8 GiB }`.
#[derive(Debug, Clone, Copy)]
pub struct LimitingConfig {
    /// The cap in bytes; the default, `usize::MAX`, caps nothing.
    pub limit: usize,
}

impl Default for LimitingConfig {
    fn default() -> Self {
        LimitingConfig { limit: usize::MAX }
    }
}

impl<U: MemoryResource> Layer<U> for LimitingConfig {
    type Resource = Limiting<U>;
    fn layer(self, upstream: U) -> Limiting<U> {
        Limiting::new(upstream, self.limit)
    }
}

crate::property::assert_keeps_properties!(Limiting);
// The cap and the counter, nothing else.
static_assertions::assert_eq_size!(Limiting<crate::leaf::System>, [usize; 2]);
