//! `Aligned<A, U>`: every allocation aligned to at least `A` bytes, and the type says so.

use crate::resource::{
    align_up, check_request, forward_upstream, AllocError, AllocErrorKind, Layer, MemoryResource,
    Result,
};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use typenum::{Max, Maximum, NonZero, PowerOfTwo, Unsigned};

/// `U` with every allocation aligned to at least `A` bytes.
///
/// `A` is a typenum power of two, and the type says so: `Alignment = Maximum<A, U::Alignment>`, so
/// a container of a `T` aligned to 4096 compiles on `Aligned<U4096, Cuda>` and not on `Cuda`. Each
/// request goes to the upstream with the larger alignment. An upstream that refuses it with
/// [`AllocErrorKind::Unsupported`] (the CUDA leaves refuse anything above 256) is served by
/// over-allocation instead: `size + alignment - U::Alignment` bytes, the pointer rounded up inside
/// them, the original pointer remembered in a side table until the block is freed
/// ([`over_allocated`](Self::over_allocated) counts those blocks).
///
/// # Cost
///
/// None when the upstream honours the alignment (a deallocation reads one atomic counter when the
/// request was over-aligned, that is above the upstream's guarantee). An over-allocated block
/// costs the refused upstream call, a second upstream call for the padded size, a mutex and a
/// hash-map entry on allocation, and a mutex, a hash-map removal and an atomic subtraction on
/// deallocation; it holds up to `alignment - U::Alignment` bytes more than asked. The alignment
/// itself costs no bytes: the side table and its counter are the only state, the same for every
/// `A`.
///
/// # Streams
///
/// The stream of each call goes to the upstream unchanged (an over-allocated block is freed on
/// the stream its deallocation names); `synchronize` and `order_after` are forwarded to the
/// upstream. It keeps no stream alive.
///
/// # Upstream
///
/// Requires nothing of its upstream and keeps its other properties; the alignment it guarantees
/// is the larger of `A` and the upstream's.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::adaptor::Aligned;
/// use typenum::U4096;
///
/// let mr = resource_stack![System::new(), Aligned<U4096>];
/// assert_eq!(mrstack::property::alignment_of::<Aligned<U4096, System>>(), 4096);
/// let p = mr.allocate(100, 1, StreamRef::DEFAULT).unwrap();
/// assert_eq!(p.as_ptr() as usize % 4096, 0);
/// # unsafe { mr.deallocate(p, 100, 1, StreamRef::DEFAULT) };
/// ```
#[derive(Debug)]
pub struct Aligned<A, U> {
    upstream: U,
    /// Over-allocated blocks: aligned address → how far past the upstream's address it lies.
    fallback: Mutex<HashMap<usize, usize>>,
    /// The number of entries in `fallback`, read without the lock: while it is zero a
    /// deallocation skips the table.
    fallback_live: AtomicUsize,
    _alignment: PhantomData<fn() -> A>,
}

impl<A, U> Aligned<A, U>
where
    A: Unsigned + PowerOfTwo + Max<U::Alignment>,
    U: MemoryResource,
    Maximum<A, U::Alignment>: Unsigned + NonZero,
{
    const NAME: &'static str = "Aligned";

    /// Aligns every allocation from `upstream` to at least `A` bytes.
    pub fn new(upstream: U) -> Self {
        Aligned {
            upstream,
            fallback: Mutex::new(HashMap::new()),
            fallback_live: AtomicUsize::new(0),
            _alignment: PhantomData,
        }
    }

    /// The alignment a request gets.
    #[inline]
    fn effective(align: usize) -> usize {
        align.max(A::USIZE)
    }

    /// Whether the upstream's own guarantee already covers `align`: then nothing can have been
    /// over-allocated, and both directions forward unchanged.
    #[inline]
    fn covered(align: usize) -> bool {
        Self::effective(align) <= <U::Alignment as Unsigned>::USIZE
    }

    /// The upstream request that holds `size` bytes aligned to `align` whatever address it
    /// returns: its guarantee is the upstream's alignment, so at most `align - U::Alignment`
    /// bytes go to rounding up.
    fn padded(size: usize, align: usize) -> Option<usize> {
        size.checked_add(align - <U::Alignment as Unsigned>::USIZE)
    }

    fn over_allocate(
        &self,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        let too_big = AllocError::new(
            AllocErrorKind::InvalidArgument("size overflows once padded for the alignment"),
            size,
            align,
            Self::NAME,
        );
        let padded = Self::padded(size, align).ok_or(too_big)?;
        let base_align = <U::Alignment as Unsigned>::USIZE;
        let raw = self.upstream.allocate(padded, base_align, stream)?;
        let start = raw.as_ptr() as usize;
        let Some(aligned) = align_up(start, align) else {
            // SAFETY: raw was just allocated with these arguments and is not handed out.
            unsafe { self.upstream.deallocate(raw, padded, base_align, stream) };
            return Err(too_big);
        };
        let offset = aligned - start;
        self.lock().insert(aligned, offset);
        self.fallback_live.fetch_add(1, Relaxed);
        // `offset <= align - base_align`, so the block lies inside `raw`, whose provenance it keeps.
        Ok(raw.map_addr(|a| a.saturating_add(offset)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, usize>> {
        // Updates under the lock are single map operations: a poisoned lock holds a sound map.
        self.fallback.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<A, U> Aligned<A, U> {
    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Blocks served by over-allocation and not yet freed.
    pub fn over_allocated(&self) -> usize {
        self.fallback_live.load(Relaxed)
    }
}

// SAFETY: a pointer the upstream returns for `max(align, A)` meets that alignment (the upstream's
// promise); an over-allocated block is `size` bytes inside a live upstream block of
// `size + align - U::Alignment` bytes that starts at most `align - U::Alignment` bytes before it.
// Each block goes back to the upstream once, with the arguments it was allocated with.
unsafe impl<A, U> MemoryResource for Aligned<A, U>
where
    A: Unsigned + PowerOfTwo + Max<U::Alignment>,
    U: MemoryResource,
    Maximum<A, U::Alignment>: Unsigned + NonZero,
{
    forward_upstream!(U, upstream, Alignment = Maximum<A, U::Alignment>);

    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let align = Self::effective(align);
        match self.upstream.allocate(size, align, stream) {
            Err(AllocError {
                kind: AllocErrorKind::Unsupported(_),
                ..
            }) if !Self::covered(align) => self.over_allocate(size, align, stream),
            other => other,
        }
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        let align = Self::effective(align);
        if !Self::covered(align) && self.fallback_live.load(Relaxed) > 0 {
            let offset = self.lock().remove(&(ptr.as_ptr() as usize));
            if let Some(offset) = offset {
                self.fallback_live.fetch_sub(1, Relaxed);
                // Both succeeded when the block was allocated with the same size and alignment.
                let padded = size + (align - <U::Alignment as Unsigned>::USIZE);
                if let Some(raw) = NonNull::new(ptr.as_ptr().wrapping_sub(offset)) {
                    // SAFETY: `raw` is the upstream block this pointer was carved from, allocated
                    // with `padded` bytes and the upstream's alignment; it was in the table, so it
                    // is freed once.
                    unsafe {
                        self.upstream.deallocate(
                            raw,
                            padded,
                            <U::Alignment as Unsigned>::USIZE,
                            stream,
                        )
                    };
                }
                return;
            }
        }
        // SAFETY: the caller's pointer came from the upstream with this size and `align`.
        unsafe { self.upstream.deallocate(ptr, size, align, stream) }
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "aligned")
            .number("alignment", A::USIZE)
            .finish()
    }

    forward_upstream!(layer over upstream);
}

has_upstream!(impl<A, U> for Aligned<A, U>);

/// `resource_stack!` configuration of [`Aligned`]: `Aligned<U4096>` (the alignment is a type).
pub struct AlignedConfig<A> {
    _alignment: PhantomData<fn() -> A>,
}

impl<A> Default for AlignedConfig<A> {
    fn default() -> Self {
        AlignedConfig {
            _alignment: PhantomData,
        }
    }
}

impl<A> Clone for AlignedConfig<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for AlignedConfig<A> {}

impl<A> std::fmt::Debug for AlignedConfig<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedConfig<{}>", std::any::type_name::<A>())
    }
}

impl<A, U> Layer<U> for AlignedConfig<A>
where
    A: Unsigned + PowerOfTwo + Max<U::Alignment>,
    U: MemoryResource,
    Maximum<A, U::Alignment>: Unsigned + NonZero,
{
    type Resource = Aligned<A, U>;
    fn layer(self, upstream: U) -> Aligned<A, U> {
        Aligned::new(upstream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use typenum::{U1024, U16, U256, U4096, U64};

    #[test]
    fn alignment_is_the_maximum() {
        use crate::property::alignment_of;
        assert_eq!(alignment_of::<Aligned<U4096, crate::leaf::System>>(), 4096);
        assert_eq!(alignment_of::<Aligned<U64, crate::leaf::Cuda>>(), 256);
        assert_eq!(
            alignment_of::<Aligned<U1024, crate::leaf::Simulated>>(),
            1024
        );
        assert_eq!(
            alignment_of::<Aligned<U16, Aligned<U256, crate::leaf::System>>>(),
            256
        );
    }
}

static_assertions::assert_impl_all!(
    Aligned<typenum::U4096, crate::leaf::System>: Send,
    Sync,
    crate::property::Accessible<crate::property::HostAccessible>
);
static_assertions::assert_impl_all!(
    Aligned<typenum::U4096, crate::leaf::Managed>: Send,
    Sync,
    crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>,
    crate::property::Accessible<crate::property::Migratable>
);
static_assertions::assert_not_impl_any!(Aligned<typenum::U4096, crate::leaf::Cuda>: crate::property::Accessible<crate::property::HostAccessible>);
// The alignment costs no bytes (the config is a zero-sized type); the side table for upstreams
// that refuse large alignments is the only state, the same for every upstream.
static_assertions::assert_eq_size!(AlignedConfig<typenum::U4096>, ());
static_assertions::const_assert_eq!(
    std::mem::size_of::<Aligned<typenum::U4096, crate::leaf::System>>(),
    std::mem::size_of::<Aligned<typenum::U16, crate::leaf::System>>()
);
static_assertions::const_assert_eq!(
    std::mem::size_of::<Aligned<typenum::U4096, crate::leaf::Cuda>>(),
    std::mem::size_of::<crate::leaf::Cuda>()
        + std::mem::size_of::<(Mutex<HashMap<usize, usize>>, AtomicUsize)>()
);
