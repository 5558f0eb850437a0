//! `Callback`: a resource made of user functions and a context value, for foreign allocators.

use crate::property::PropertySet;
use crate::resource::{check_request, AllocError, AllocErrorKind, MemoryResource, Result};
use crate::stream::StreamRef;
use std::marker::PhantomData;
use std::ptr::NonNull;
use typenum::{NonZero, PowerOfTwo, Unsigned, U1};

/// Allocates `size` (> 0) bytes aligned to `align` for use on the stream.
pub type AllocateFn<Ctx> = fn(&Ctx, usize, usize, StreamRef) -> Result<NonNull<u8>, AllocError>;
/// Gives back a pointer from the [`AllocateFn`] with its size and alignment, after the work on the
/// stream. Called only with such pointers, once each.
pub type DeallocateFn<Ctx> = unsafe fn(&Ctx, NonNull<u8>, usize, usize, StreamRef);
/// Waits for the work queued on the stream.
pub type SynchronizeFn<Ctx> = fn(&Ctx, StreamRef) -> Result<(), AllocError>;
/// Makes work queued on the first stream from now on wait for the work queued on the second.
pub type OrderAfterFn<Ctx> = fn(&Ctx, StreamRef, StreamRef) -> Result<(), AllocError>;

/// A resource made of user functions over a context value `Ctx`, giving memory with properties
/// `P` aligned to at least `A` bytes.
///
/// This is how NVCV's custom allocators, PyTorch's pluggable allocator and TensorRT's
/// `IGpuAllocator` take a foreign allocator. The user states the memory's properties at the type
/// level (`P`, a [`PropertySet`]) and its alignment (`A`, a typenum unsigned), and promises them in
/// the `unsafe` constructor [`new`](Self::new). Requests of size zero never reach the functions.
///
/// # Cost
///
/// One call through a function pointer per operation, plus a check that the pointer returned
/// meets the alignment asked (a misaligned pointer is given back and reported, never handed out).
/// No lock or atomic of its own.
///
/// # Streams
///
/// The stream of each call is passed to the functions as given. `synchronize` and `order_after`
/// default to what is right for any memory, if slow: `synchronize` waits for the stream through
/// the driver (nothing to wait for without one, nor for the default stream of a thread with no
/// current context) and `order_after` waits for `after` on the host. A stream-ordered allocator
/// should supply its own ([`with_synchronize`](Self::with_synchronize),
/// [`with_order_after`](Self::with_order_after)). It keeps no stream alive.
///
/// # Upstream
///
/// None: a leaf. It calls the user's functions, and gives the properties `P` and the alignment `A`
/// that the caller of [`new`](Self::new) promised. The default `synchronize` calls the CUDA driver
/// (a stream or context synchronize) when the driver library is present; no driver is needed
/// otherwise.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::leaf::Callback;
/// use std::alloc::{alloc, dealloc, Layout};
/// use std::ptr::NonNull;
/// use typenum::U16;
///
/// // A foreign host allocator: here std::alloc, with the alignment floored at 16.
/// fn layout(size: usize, align: usize) -> Layout {
///     Layout::from_size_align(size, align.max(16)).unwrap()
/// }
/// fn my_alloc(_: &(), size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>, AllocError> {
///     // SAFETY: size > 0 (Callback never passes 0).
///     NonNull::new(unsafe { alloc(layout(size, align)) })
///         .ok_or(AllocError::out_of_memory(size, align, "std::alloc"))
/// }
/// unsafe fn my_free(_: &(), ptr: NonNull<u8>, size: usize, align: usize, _: StreamRef) {
///     // SAFETY: Callback passes back a pointer from `my_alloc`, with the same layout.
///     unsafe { dealloc(ptr.as_ptr(), layout(size, align)) }
/// }
///
/// // SAFETY: the functions give host memory of `size` bytes aligned to max(align, 16), valid
/// // until freed with the same layout; they do no stream-ordered work.
/// let mr = unsafe { Callback::<(), HostAccessible, U16>::new((), my_alloc, my_free) }
///     .with_name("std::alloc");
/// let v = mr.allocate_sync(100, 64).unwrap();
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// // SAFETY: v came from mr with this size and alignment.
/// unsafe { mr.deallocate_sync(v, 100, 64) };
/// ```
pub struct Callback<Ctx, P: PropertySet, A: Unsigned + NonZero + PowerOfTwo = U1> {
    ctx: Ctx,
    allocate: AllocateFn<Ctx>,
    deallocate: DeallocateFn<Ctx>,
    synchronize: SynchronizeFn<Ctx>,
    order_after: OrderAfterFn<Ctx>,
    name: &'static str,
    _props: PhantomData<fn() -> (P, A)>,
}

impl<Ctx, P: PropertySet, A: Unsigned + NonZero + PowerOfTwo> Callback<Ctx, P, A> {
    /// A resource calling `allocate` and `deallocate` with `ctx`.
    ///
    /// # Safety
    ///
    /// For every call this resource makes (`size > 0`, `align` a power of two):
    /// * `allocate` returns memory of at least `size` bytes, not overlapping any other live
    ///   allocation, that `P`'s properties describe (host-accessible if `P` includes
    ///   `HostAccessible`, and so on; pageable host memory, neither pinned nor managed, if `P` is
    ///   [`Pageable`](crate::property::Pageable)), usable by work on the stream it was asked for at once, and
    ///   valid until passed to `deallocate`. It returns `Err` rather than ignore an alignment it
    ///   cannot meet; a pointer not aligned to `max(align, A)` is caught, freed and reported.
    /// * `deallocate` frees such a pointer, given with the size and alignment it was asked with,
    ///   once the work queued on the stream it is given has used it.
    /// * The default `synchronize` (the driver's stream synchronize) and `order_after` (the host
    ///   waits for `after`) then order the memory correctly. They take a thread with no current
    ///   CUDA context (or a process with no driver) to have nothing queued on the default stream:
    ///   if your allocator or its users queue default-stream work that a thread without a
    ///   current context could be asked to wait for, supply your own with
    ///   [`with_synchronize`](Self::with_synchronize) / [`with_order_after`](Self::with_order_after)
    ///   if the allocator keeps work of its own on other streams.
    /// * If `Ctx` is `Send`/`Sync`, the functions may be called from any thread, concurrently.
    pub unsafe fn new(ctx: Ctx, allocate: AllocateFn<Ctx>, deallocate: DeallocateFn<Ctx>) -> Self {
        Callback {
            ctx,
            allocate,
            deallocate,
            synchronize: default_synchronize::<Ctx>,
            order_after: default_order_after::<Ctx>,
            name: "Callback",
            _props: PhantomData,
        }
    }

    /// Replaces the function that waits for a stream.
    ///
    /// # Safety
    ///
    /// `synchronize` returns `Ok` only once all work queued on the stream so far is done (host
    /// reads of the memory and frees rely on it).
    pub unsafe fn with_synchronize(mut self, synchronize: SynchronizeFn<Ctx>) -> Self {
        self.synchronize = synchronize;
        self
    }

    /// Replaces the function that orders one stream after another.
    ///
    /// # Safety
    ///
    /// `order_after(ctx, stream, after)` returns `Ok` only if work queued on `stream` afterwards
    /// cannot start before the work queued on `after` so far is done.
    pub unsafe fn with_order_after(mut self, order_after: OrderAfterFn<Ctx>) -> Self {
        self.order_after = order_after;
        self
    }

    /// Names the resource in errors and logs (default `"Callback"`).
    pub fn with_name(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// The context value the functions receive.
    pub fn context(&self) -> &Ctx {
        &self.ctx
    }
}

fn default_synchronize<Ctx>(_: &Ctx, stream: StreamRef) -> Result<(), AllocError> {
    if stream.is_simulated() || !super::driver_available() {
        // No work is queued on a simulated stream, nor anywhere without a driver.
        return Ok(());
    }
    if let Some(ctx) = stream.context() {
        // A cudarc stream knows its context.
        return super::driver_synchronize(ctx, stream, "Callback");
    }
    // The default stream or a raw one: in the current context. A thread with no current context
    // (or a process that never initialized the driver) has queued nothing on its default stream.
    let current = matches!(cudarc::driver::result::ctx::get_current(), Ok(Some(_)));
    if stream.is_default() && !current {
        return Ok(());
    }
    let err = |e| AllocError::cuda(e, 0, 0, "Callback");
    if !stream.usable_here() && current {
        // Another thread's per-thread stream: no handle names it here; wait for the context.
        return cudarc::driver::result::ctx::synchronize().map_err(err);
    }
    // SAFETY: `stream` is null, a special handle valid on this thread, or a live stream (made by
    // `from_raw`, whose caller promised it live); synchronizing only reads it.
    unsafe { cudarc::driver::result::stream::synchronize(stream.as_raw()) }.map_err(err)
}

fn default_order_after<Ctx>(
    ctx: &Ctx,
    stream: StreamRef,
    after: StreamRef,
) -> Result<(), AllocError> {
    if stream == after {
        return Ok(());
    }
    // Waiting on the host for `after` orders everything queued later on `stream` after it.
    default_synchronize(ctx, after)
}

impl<Ctx: std::fmt::Debug, P: PropertySet, A: Unsigned + NonZero + PowerOfTwo> std::fmt::Debug
    for Callback<Ctx, P, A>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callback")
            .field("name", &self.name)
            .field("ctx", &self.ctx)
            .field("properties", &crate::property::Properties::of_set::<P>())
            .field("alignment", &A::USIZE)
            .finish()
    }
}

// SAFETY: the constructor's caller promised that the functions give memory with P's properties,
// valid until deallocated; alignment to max(align, A) is checked here before a pointer is handed
// out.
unsafe impl<Ctx, P: PropertySet, A: Unsigned + NonZero + PowerOfTwo> MemoryResource
    for Callback<Ctx, P, A>
{
    type Host = P::Host;
    type Device = P::Device;
    type Migratable = P::Migratable;
    type Pageable = P::Pageable;
    type Alignment = A;

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, self.name)? {
            return Ok(empty);
        }
        let ptr = (self.allocate)(&self.ctx, size, align, stream)?;
        if ptr.as_ptr() as usize % align.max(A::USIZE) != 0 {
            // SAFETY: the pointer just came from `allocate` with this size and align.
            unsafe { (self.deallocate)(&self.ctx, ptr, size, align, stream) };
            return Err(AllocError::new(
                AllocErrorKind::Unsupported(
                    "the callback returned a pointer below the alignment asked or promised",
                ),
                size,
                align,
                self.name,
            ));
        }
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // SAFETY: the caller passes a pointer from `allocate` (hence from the user's function)
        // with its size and align, as the function requires.
        unsafe { (self.deallocate)(&self.ctx, ptr, size, align, stream) }
    }

    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        (self.synchronize)(&self.ctx, stream)
    }

    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
        (self.order_after)(&self.ctx, stream, after)
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

static_assertions::assert_impl_all!(
    Callback<(), crate::property::DeviceAccessible, typenum::U256>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
static_assertions::assert_not_impl_any!(
    Callback<(), crate::property::DeviceAccessible>: crate::property::Accessible<crate::property::HostAccessible>
);
static_assertions::assert_impl_all!(
    Callback<(), (crate::property::HostAccessible, crate::property::DeviceAccessible)>: crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>
);
static_assertions::assert_not_impl_any!(Callback<std::cell::Cell<u8>, ()>: Sync);
static_assertions::assert_eq_size!(Callback<(), ()>, [usize; 6]);
