//! The one trait: [`MemoryResource`], with [`Layer`] for adaptors and [`AllocError`].

mod error;
mod forward;
mod request;

pub use error::{AllocError, AllocErrorKind};
pub(crate) use forward::{forward_upstream, no_stream_work, properties, streams_through};
pub use request::{align_up, check_request, dangling};

use crate::stream::StreamRef;
use std::ptr::NonNull;
use std::sync::Arc;
use typenum::{Bit, NonZero, Unsigned};

/// `Result` with mrstack's error by default: what every resource operation returns.
pub type Result<T, E = AllocError> = std::result::Result<T, E>;

/// A source of memory: a leaf that calls a driver (`Cuda`, `Pinned`, `System` …) or an adaptor
/// that wraps another resource (`Pool<Cuda>`, `Statistics<…>`).
///
/// Properties are types, so that the compiler can check where memory may go:
/// `Host`/`Device`/`Migratable` are typenum bits (`B1` = yes) and `Alignment` is the alignment every
/// pointer meets whatever was asked. Containers bound on them through
/// [`Accessible`](crate::property::Accessible).
///
/// # Requests
///
/// * `align` must be a power of two; a larger `align` than `Self::Alignment` is honoured or refused
///   with [`AllocErrorKind::Unsupported`], never ignored.
/// * `size == 0` returns a dangling pointer aligned to `max(align, Self::Alignment)` without
///   touching the upstream, as Rust's allocators do; deallocating it is a no-op.
/// * A size that would overflow once aligned returns [`AllocErrorKind::InvalidArgument`].
///
/// [`check_request`] does all three checks; call it first in your own resource.
///
/// # Stream order
///
/// Memory allocated on stream `S` may be used by work on `S` at once. Memory deallocated on `S`
/// may be handed out again to `S` at once; handing it to another stream is the resource's job
/// (events or synchronization), not the caller's. A [`StreamRef`] borrows its stream for the
/// call; a resource that keeps a stream past the call keeps it alive
/// ([`StreamRef::to_handle`]), so that it can still order later work after it.
///
/// # Safety
///
/// An implementation promises:
///
/// * **Memory:** `allocate` returns memory of at least `size` bytes, aligned to
///   `max(align, Self::Alignment)`, that does not overlap any other live allocation, and that
///   is accessible as `Host`/`Device`/`Migratable` say (these bits are the only way a resource
///   gets a property: [`Accessible`](crate::property::Accessible) is sealed and derived from them),
///   valid until it is passed to `deallocate` with the same `size` and `align`.
/// * **Streams:** the memory is usable by work queued on the `stream` it was allocated for from
///   the moment `allocate` returns. Memory deallocated on stream `S` is handed out again to work
///   on another stream only once that work is ordered after the work queued on `S` before the
///   deallocation (an event, `order_after` on the upstream, or a synchronization), even if `S`
///   has since been dropped by its owner. `synchronize(s)` returns `Ok` only once the work queued
///   on `s` (and, for an adaptor, the work its upstream queued for it) is done, and
///   `order_after(s, a)` returns `Ok` only once work queued on `s` afterwards cannot start
///   before the work queued on `a` so far is done. An adaptor forwards both to its upstream
///   (there is no default to forget); a resource with no streams (host memory, `Simulated`) has
///   nothing to order and returns `Ok(())`.
/// * **Stream handles:** a resource passes the driver only streams that are alive: those it was
///   given for the call, or those it keeps alive itself (a [`StreamHandle`](crate::stream::StreamHandle)).
///
/// # Calling back into the resource above
///
/// The suballocators let their locks go around their upstream's `allocate` (a
/// [`Retry`](crate::adaptor::Retry) callback may free into them or trim them), but call the
/// upstream's `deallocate`, `order_after` and `synchronize` with their locks held. A resource of
/// yours must not call, from those three, into a resource stacked above it: such a call waits
/// for a lock its own thread holds, for ever. Nothing unsound follows, but the thread hangs.
///
/// # Writing your own resource
///
/// ```
/// use mrstack::prelude::*;
/// // `Result<T>` is `Result<T, AllocError>`.
/// use mrstack::resource::{check_request, AllocError, Result};
/// use std::ptr::NonNull;
/// use typenum::{B0, B1, U16};
///
/// /// Host memory from `std::alloc`, counting what it gives.
/// struct Counted(std::sync::atomic::AtomicUsize);
///
/// // SAFETY: memory comes from std::alloc with a layout of `size` bytes and `max(align, 16)`,
/// // and goes back with the same layout.
/// unsafe impl MemoryResource for Counted {
///     type Host = B1;
///     type Device = B0;
///     type Migratable = B0;
///     type Pageable = B0;
///     type Alignment = U16;
///
///     fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>> {
///         if let Some(empty) = check_request::<Self>(size, align, "Counted")? {
///             return Ok(empty);
///         }
///         let layout = std::alloc::Layout::from_size_align(size, align.max(16)).unwrap();
///         // SAFETY: size is not zero (check_request returned early for zero).
///         let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })
///             .ok_or(AllocError::out_of_memory(size, align, "Counted"))?;
///         self.0.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
///         Ok(ptr)
///     }
///
///     unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, _: StreamRef) {
///         if size == 0 {
///             return;
///         }
///         let layout = std::alloc::Layout::from_size_align(size, align.max(16)).unwrap();
///         // SAFETY: the caller passes back a pointer from `allocate` with its size and align.
///         unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
///     }
///
///     // Host memory from std::alloc: no stream-ordered work to wait for or order.
///     fn synchronize(&self, _: StreamRef) -> Result<()> {
///         Ok(())
///     }
///     fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<()> {
///         Ok(())
///     }
/// }
///
/// let r = Counted(Default::default());
/// let p = r.allocate_sync(100, 8).unwrap();
/// assert_eq!(p.as_ptr() as usize % 16, 0);
/// unsafe { r.deallocate_sync(p, 100, 8) };
/// ```
// Most often met as a leaf constructor's `Result` given to `resource_stack!` or a container
// without `?`: the note names that case, since the trait's name alone does not.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a memory resource",
    label = "not a `MemoryResource`",
    note = "a leaf constructor that returns a `Result` (`Cuda::new(&ctx)`) needs `?`: `Cuda::new(&ctx)?`",
    note = "memory resources are mrstack's leaves (Cuda, Pinned, System, Simulated, …), the adaptors over them, `&R` and `Arc<R>` of one, and your types with an `unsafe impl MemoryResource`"
)]
pub unsafe trait MemoryResource {
    /// `B1` when the CPU may dereference the memory.
    type Host: Bit;
    /// `B1` when kernels may dereference the memory.
    type Device: Bit;
    /// `B1` when the memory is managed memory the driver migrates (it can be prefetched).
    type Migratable: Bit;
    /// `B1` when the memory is pageable host memory that the CUDA driver knows neither as pinned
    /// (page-locked, registered) nor as managed: what [`HostAllocator`](crate::container::HostAllocator)
    /// needs ([`Pageable`](crate::property::Pageable) says why). `B1` implies `Host = B1`.
    type Pageable: Bit;
    /// The alignment every returned pointer meets (a typenum unsigned: `U256` for CUDA memory).
    /// A power of two, like every alignment; the zero-size pointer rules rely on it.
    type Alignment: Unsigned + NonZero;

    /// Allocates `size` bytes aligned to `max(align, Self::Alignment)` for use on `stream`.
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>>;

    /// Gives back memory after the work on `stream` that uses it.
    ///
    /// # Safety
    ///
    /// `ptr` came from `allocate` on this resource with the same `size` and `align`, and was not
    /// deallocated since.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef);

    /// Waits until the work queued on `stream` is done. Host-only and simulated resources have no
    /// work to wait for and return `Ok(())`; CUDA resources synchronize the stream in their
    /// context; adaptors forward to their upstream. Required, so that no adaptor forgets it.
    fn synchronize(&self, stream: StreamRef) -> Result<()>;

    /// Makes work queued on `stream` from now on wait for the work queued on `after` so far, without
    /// blocking the host: how a suballocator hands a block freed on one stream to another (RMM does
    /// the same with an event). CUDA resources record an event on `after` and make `stream` wait on
    /// it; resources without streams have nothing to order and return `Ok(())`; adaptors forward.
    /// Required, so that no adaptor forgets it.
    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()>;

    /// A short name for errors and logs (`"Cuda"`, `"Pool"`).
    fn name(&self) -> &'static str {
        "MemoryResource"
    }

    /// Writes this resource and the stack below it as text, leaf first, in the syntax of text
    /// configurations (`simulated(capacity=1 GiB) > pool(max=8 GiB) > statistics`); see
    /// [`stack`](crate::stack). The default writes [`name`](Self::name) alone: an adaptor
    /// overrides it to write its upstream's description first
    /// ([`ItemWriter::over`](crate::stack::ItemWriter::over)). Never on an allocation's path.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }

    /// The stack as text, for `{}` and `to_string()`: what [`describe_to`](Self::describe_to)
    /// writes.
    fn describe(&self) -> crate::stack::Description<'_, Self>
    where
        Self: Sized,
    {
        crate::stack::Description(self)
    }

    /// The layer below this one, for [`AnyLayer::find`](crate::stack::AnyLayer::find) to walk a
    /// stack at run time. The default, `None`, suits a leaf; an adaptor returns its upstream
    /// (`Some(&self.upstream)`).
    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        None
    }

    /// Allocates on the default stream and waits for it, so the memory may be used by any stream.
    fn allocate_sync(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        let ptr = self.allocate(size, align, StreamRef::DEFAULT)?;
        // Given back when the wait fails, and when it panics (a second panic of the upstream's
        // while that one unwinds would abort: it is kept in).
        let give_back = Undo(|| {
            // SAFETY: allocated just above with this size and alignment, on the default stream,
            // and handed to no one (the guard is forgotten once it is the caller's).
            let free = || unsafe { self.deallocate(ptr, size, align, StreamRef::DEFAULT) };
            if std::thread::panicking() {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(free));
            } else {
                free();
            }
        });
        self.synchronize(StreamRef::DEFAULT)?;
        std::mem::forget(give_back);
        Ok(ptr)
    }

    /// Waits for the default stream, then deallocates on it.
    ///
    /// # Safety
    ///
    /// As for [`deallocate`](Self::deallocate); no work on another stream may still use `ptr`.
    unsafe fn deallocate_sync(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        // A failed synchronize leaves nothing better to do than give the memory back: the error
        // stays recorded in the CUDA context for the next call that can return it.
        let _ = self.synchronize(StreamRef::DEFAULT);
        // SAFETY: forwarded from the caller.
        unsafe { self.deallocate(ptr, size, align, StreamRef::DEFAULT) }
    }
}

/// Runs its closure when dropped, unless forgotten: undoes a step (a claim, a reservation, a
/// block taken) on every way out of the call that follows it, an error returned with `?` or a
/// panic unwinding, and is `mem::forget`-ten once the step is to stay.
pub(crate) struct Undo<F: FnMut()>(pub(crate) F);

impl<F: FnMut()> Drop for Undo<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// A borrowed resource is the same resource: every call, `synchronize` and `order_after`
/// included, goes to `R` unchanged, with `R`'s properties and alignment; it costs one pointer
/// indirection. How a stack shares a leaf it does not own (`resource_stack![&sim, Pool]`).
// SAFETY: forwards every call to `R`, whose promises hold for the same memory.
unsafe impl<R: MemoryResource + ?Sized> MemoryResource for &R {
    forward_upstream!(everything to *self as R);
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).describe_to(f)
    }
}

/// A shared resource is the same resource: every call, `synchronize` and `order_after` included,
/// goes to `R` unchanged, with `R`'s properties and alignment; it costs one pointer indirection
/// (cloning the `Arc` is one atomic increment, and clones share one resource).
// SAFETY: forwards every call to `R`, whose promises hold for the same memory.
unsafe impl<R: MemoryResource + ?Sized> MemoryResource for Arc<R> {
    forward_upstream!(everything to *self as R);
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).describe_to(f)
    }
}

/// A resource that can grow a live allocation without moving it: what lets
/// [`DeviceVec::grow_zeroed_in_place`](crate::container::DeviceVec::grow_zeroed_in_place) extend a vector
/// with no copy (TensorRT's `reallocate` on a `kRESIZABLE` allocator, PyTorch's expandable
/// segments).
///
/// [`VirtualMemory`](crate::leaf::VirtualMemory) grows into the free virtual range after a block and
/// maps the pages it needs; [`Tlsf`](crate::suballoc::Tlsf) into the free block after it, within
/// its chunk. Both only into free bytes on the request's stream, so the new bytes need no ordering
/// after other streams as long as the allocation is later freed on that stream (or after it): a
/// `DeviceVec` grows and frees on its own stream.
///
/// # Safety
///
/// When [`grow_in_place`](Self::grow_in_place) returns `Ok(true)` for a live allocation of this
/// resource, the allocation's first `new_size` bytes are memory with the resource's properties,
/// still at `ptr`, that no other allocation overlaps, usable by work on `stream` at once, and the
/// allocation may be deallocated with any size it has had. On `Ok(false)` or `Err`, the
/// allocation is as it was.
pub unsafe trait GrowInPlace: MemoryResource {
    /// Grows the live allocation at `ptr` (of `size` bytes, asked for with `align`) to
    /// `new_size` bytes without moving it, if the resource can; returns whether it did. `Err` only
    /// for a failure of the memory below (a page that could not be mapped); no room after the
    /// block is `Ok(false)`, and so is a `size` the resource does not find the allocation at, and
    /// any `new_size` below `size` (this only grows, even where both sizes round to one block).
    ///
    /// # Safety
    ///
    /// - `ptr` came from `allocate` on this resource with `align` and was not deallocated, and
    ///   the caller owns it: `size` is a size it has had (asked for at `allocate`, or the
    ///   `new_size` of an earlier growth that returned `Ok(true)`).
    /// - Once grown, the allocation is deallocated on `stream`, or on a stream ordered after the
    ///   work queued on `stream` until then: the new bytes were free on `stream`, and work queued
    ///   on it before may still use them.
    unsafe fn grow_in_place(
        &self,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        new_size: usize,
        stream: StreamRef,
    ) -> Result<bool>;
}

// SAFETY: forwards to `R`, whose promise holds for the same allocation.
unsafe impl<R: GrowInPlace + ?Sized> GrowInPlace for &R {
    forward_upstream!(grow_in_place to *self);
}

// SAFETY: forwards to `R`, whose promise holds for the same allocation.
unsafe impl<R: GrowInPlace + ?Sized> GrowInPlace for Arc<R> {
    forward_upstream!(grow_in_place to *self);
}

/// A configuration that wraps an upstream resource into an adaptor: what `resource_stack!`
/// folds each line through.
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::resource::{AllocError, Layer, Result};
/// use std::ptr::NonNull;
///
/// /// An adaptor that counts allocations.
/// struct Counting<U> { upstream: U, count: std::sync::atomic::AtomicUsize }
///
/// // SAFETY: every call (allocate, deallocate, synchronize, order_after) goes to `upstream`,
/// // unchanged.
/// unsafe impl<U: MemoryResource> MemoryResource for Counting<U> {
///     type Host = U::Host;
///     type Device = U::Device;
///     type Migratable = U::Migratable;
///     type Pageable = U::Pageable;
///     type Alignment = U::Alignment;
///     fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>> {
///         self.count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.upstream.allocate(size, align, s)
///     }
///     unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
///         // SAFETY: forwarded from the caller.
///         unsafe { self.upstream.deallocate(p, size, align, s) }
///     }
///     // Stream ordering is part of the contract: forward what this adaptor does not change.
///     fn synchronize(&self, s: StreamRef) -> Result<()> {
///         self.upstream.synchronize(s)
///     }
///     fn order_after(&self, s: StreamRef, after: StreamRef) -> Result<()> {
///         self.upstream.order_after(s, after)
///     }
/// }
///
/// /// Its configuration. In `resource_stack!` a bare capitalized name means a configuration of
/// /// this crate (`mrstack::adaptor::NameConfig`), so write your own as an expression:
/// /// `resource_stack![System::new(), (Count)]`.
/// struct Count;
/// impl<U: MemoryResource> Layer<U> for Count {
///     type Resource = Counting<U>;
///     fn layer(self, upstream: U) -> Counting<U> {
///         Counting { upstream, count: Default::default() }
///     }
/// }
///
/// let r = mrstack::resource_stack![System::new(), (Count)];
/// let p = r.allocate_sync(64, 8).unwrap();
/// unsafe { r.deallocate_sync(p, 64, 8) };
/// assert_eq!(r.count.into_inner(), 1);
/// ```
pub trait Layer<U> {
    /// The adaptor built over `U`.
    type Resource: MemoryResource;
    /// Wraps `upstream`.
    fn layer(self, upstream: U) -> Self::Resource;
}
