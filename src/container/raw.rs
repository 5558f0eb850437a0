//! [`RawBuf`], the memory the three containers share: its allocation as a cudarc `CudaSlice`,
//! growth, copies and memsets, the free at drop (leaked where device work may still use it), and
//! the errors a container's copies return; [`AlignmentFits`], the compile-time check that the
//! resource guarantees the alignment of the element type.

use super::readers::{before_kernel_write, order_read_of, order_write_of, ReadBy, Readers};
use crate::resource::{AllocError, AllocErrorKind, MemoryResource};
use crate::stream::StreamRef;
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

/// The compile-time check that `R` guarantees the alignment of `T`, which every container
/// constructor makes: without it an over-aligned `T` on, say, `Cuda` (256 bytes) would be refused
/// at run time with `Unsupported`. Stable Rust cannot compare `align_of::<T>()` with a type-level
/// number in a bound, so this is a constant evaluated per `(T, R)`: `cargo build` reports it (as
/// "evaluation of `AlignmentFits::<T, R>::CHECK` failed"), `cargo check` does not.
pub(crate) struct AlignmentFits<T, R>(PhantomData<(T, R)>);

impl<T, R: MemoryResource> AlignmentFits<T, R> {
    pub(crate) const CHECK: () = assert!(
        std::mem::align_of::<T>() <= crate::property::alignment_of::<R>(),
        "DeviceBox/DeviceVec/PinnedVec<T, R>: T is aligned to more bytes than R guarantees \
         (R::Alignment): wrap R in Aligned<A, R> with A >= align_of::<T>(), \
         e.g. resource_stack![Cuda::new(&ctx)?, Aligned<U512>]; `AlignmentFits::<T, R>` below names T and R"
    );
}

/// `len` values of `T` allocated from `R`, ordered on `stream`: the part the three containers share.
/// It does not initialize or drop the values (containers hold `Copy`-like `DeviceRepr` data).
///
/// The memory is also held as cudarc's own `CudaSlice`, made with `upgrade_device_ptr`: its
/// write event is what cudarc's copies and kernel launches use to order a use on any stream after
/// the writes before it, its read event what a kernel's reads are recorded in. Reads through the
/// container's own paths (copies, views, `HostSlice`) are recorded in [`Readers`] instead, one
/// event per stream: cudarc's one read event keeps only the last reader. The slice is never
/// dropped as a `CudaSlice`, which would free the memory through the driver: `Drop` waits for the
/// readers, leaks the slice (which makes the container's stream wait for its events), and then
/// frees the memory through `R` on that stream.
pub(crate) struct RawBuf<T, R: MemoryResource> {
    slice: ManuallyDrop<CudaSlice<T>>,
    readers: Readers,
    ptr: NonNull<T>,
    len: usize,
    resource: R,
}

impl<T, R: MemoryResource> RawBuf<T, R> {
    /// Allocates room for `len` values; `Err` on overflow of `len * size_of::<T>()`.
    pub(crate) fn allocate(
        len: usize,
        resource: R,
        stream: &Arc<CudaStream>,
    ) -> Result<Self, AllocError> {
        let (ptr, slice, events) = allocate_slice::<T, R>(len, &resource, stream)?;
        Ok(RawBuf {
            readers: Readers::new(stream.context().is_event_tracking(), events),
            slice,
            ptr,
            len,
            resource,
        })
    }

    /// Moves the values into a new allocation of `len` values (at least the old length) from the
    /// same resource, copied on the buffer's stream after every write of the old memory; the
    /// values past the old length are zero bytes. The new memory is in place, filled, before the
    /// old goes back (after the copy). On `Err` the buffer is as it was.
    pub(crate) fn reallocate_zeroed(&mut self, len: usize) -> Result<(), AllocError> {
        let stream = self.stream().clone();
        let old = self.bytes();
        let name = self.resource.name();
        let bytes = len_bytes::<T>(len, name)?;
        let (ptr, mut slice, events) = allocate_slice::<T, R>(len, &self.resource, &stream)?;
        let filled = {
            let (from, read) = self.order_read(&stream, ReadBy::Crate);
            let (to, written) = slice.device_ptr_mut(&stream);
            let copied = match old {
                0 => Ok(()),
                // SAFETY: `old` bytes of this buffer's live memory into the new allocation of at
                // least as many, both ordered on `stream` (the read after the last write, the new
                // memory after its allocation), which the guards record.
                _ => unsafe { queue_copy(&stream, name, old, to, from) },
            };
            // SAFETY: the new allocation's bytes past `old`, ordered on `stream` after the copy.
            let zeroed =
                copied.and_then(|()| unsafe { zero(&stream, to + old as u64, bytes - old, name) });
            drop((written, read));
            zeroed
        };
        if let Err(e) = filled {
            let _ = ManuallyDrop::into_inner(slice).leak();
            // A host-accessible block is freed by host calls the stream does not order: the
            // copy queued into it may still run (leaked if no wait succeeds).
            if !host_free_may_follow::<R>(&self.resource, &stream, bytes) {
                return Err(e);
            }
            // SAFETY: just allocated from this resource with these arguments, never handed
            // out; what was queued on it is queued before this free on the same stream, and for
            // host-accessible memory, which host calls free, it has run (waited for above).
            unsafe {
                self.resource.deallocate(
                    ptr.cast(),
                    bytes,
                    std::mem::align_of::<T>(),
                    StreamRef::from(&stream),
                )
            };
            return Err(e);
        }
        // The new memory is the buffer's before the old is freed: a panic in the resource's
        // free leaves a whole buffer behind.
        let old_slice = std::mem::replace(&mut self.slice, slice);
        let old_ptr = std::mem::replace(&mut self.ptr, ptr);
        let old_readers = std::mem::replace(
            &mut self.readers,
            Readers::new(stream.context().is_event_tracking(), events),
        );
        self.len = len;
        free_memory::<T, R>(
            &self.resource,
            ManuallyDrop::into_inner(old_slice),
            old_ptr,
            old,
            &old_readers,
        );
        Ok(())
    }

    /// Grows the allocation in place to `len` values (at least the old length), if the resource
    /// can, the values past the old length zero bytes: `Ok(false)`, the buffer as it was, where
    /// it cannot. The growth and the zeroing are queued on the buffer's stream after every use of
    /// the memory so far; the new slice's write event records them. On `Err` the buffer keeps
    /// its old length (its allocation may be larger, which a `GrowInPlace` resource allows).
    pub(crate) fn grow_zeroed_in_place(&mut self, len: usize) -> Result<bool, AllocError>
    where
        R: crate::resource::GrowInPlace,
    {
        let stream = self.stream().clone();
        let align = std::mem::align_of::<T>();
        let name = self.resource.name();
        let (old, bytes) = (self.bytes(), len_bytes::<T>(len, name)?);
        // The growth comes after every use of the memory so far: the recorded reads and cudarc's
        // events (the guard is forgotten: the write event is recorded below, after the zeroing).
        let managed = self.managed();
        self.readers.wait_all(&stream);
        std::mem::forget(self.slice.device_ptr_mut(&stream));
        // SAFETY: `ptr` is this buffer's live allocation from `resource`, of `old` bytes with
        // `T`'s alignment (or grown to that by an earlier call), only this buffer uses it, and it
        // is freed on `stream`, as the growth is asked on.
        let grown = unsafe {
            self.resource.grow_in_place(
                self.ptr.cast(),
                old,
                align,
                bytes,
                StreamRef::from(&stream),
            )
        }?;
        if !grown {
            return Ok(false);
        }
        // Zeroed before any slice covers the new bytes: on failure no one can read them.
        // SAFETY: the grown allocation's bytes past `old`, ordered on `stream`.
        unsafe { zero(&stream, self.address() + old as u64, bytes - old, name) }?;
        let Ok(slice) = new_slice::<T>(self.ptr, len, &stream) else {
            return Err(no_events(bytes, align, name));
        };
        let old_slice = std::mem::replace(&mut self.slice, slice);
        self.len = len;
        // Its memory is the new slice's prefix, whose uses the stream waited for above.
        let _ = ManuallyDrop::into_inner(old_slice).leak();
        self.readers.settle(&stream, managed);
        let events = record_write_point(&mut self.slice, &stream);
        self.readers.set_cudarc_events(events);
        Ok(true)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    pub(crate) fn ptr(&self) -> NonNull<T> {
        self.ptr
    }

    /// The pointer as a `CUdeviceptr` (under unified addressing, the same number for host memory).
    pub(crate) fn address(&self) -> sys::CUdeviceptr {
        self.ptr.as_ptr() as sys::CUdeviceptr
    }

    /// The memory as cudarc's slice, for kernel arguments, and the readers, for views.
    pub(crate) fn parts(&self) -> (&CudaSlice<T>, &Readers) {
        (&self.slice, &self.readers)
    }

    /// The memory as cudarc's slice, mutably, and the readers, for mutable views.
    pub(crate) fn parts_mut(&mut self) -> (&mut CudaSlice<T>, &Readers) {
        (&mut self.slice, &self.readers)
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        self.slice.stream()
    }

    pub(crate) fn resource(&self) -> &R {
        &self.resource
    }

    /// Orders a use on `stream` that may write the memory (see [`order_write_of`]), for
    /// cudarc's `DevicePtrMut` and `HostSlice` and the containers' copies.
    pub(crate) fn order_write<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        order_write_of(&mut *self.slice, &self.readers, stream)
    }

    /// Orders a use on `stream` that reads the memory (see [`order_read_of`]), for `by`.
    pub(crate) fn order_read<'a>(
        &'a self,
        stream: &'a CudaStream,
        by: ReadBy,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        order_read_of(&*self.slice, &self.readers, stream, by)
    }

    /// For a read on the container's own stream that the host waits for at once (`copy_to`): the
    /// stream waits for the last write; nothing is recorded, as the read is over before anything
    /// else can be queued after it.
    pub(crate) fn read_now(&self) -> sys::CUdeviceptr {
        let _parked = crate::leaf::park_error(self.stream().context());
        self.readers.after_last_write(self.stream());
        let (ptr, cudarc_read) = self.slice.device_ptr(self.stream());
        std::mem::forget(cudarc_read);
        ptr
    }

    /// Before a `&mut` kernel argument (see [`before_kernel_write`]).
    pub(crate) fn before_kernel_write(&mut self) {
        before_kernel_write(&mut *self.slice, &self.readers)
    }

    /// Waits until no device work writes the memory, on any stream: the container's stream
    /// first waits for the last write (the slice's write event; writes on other streams were
    /// ordered after each other, or waited for), then the host waits for the container's
    /// stream. What host reads of host-accessible memory need.
    pub(crate) fn wait_for_writes(&self) -> Result<(), AllocError> {
        let managed = self.managed();
        let _parked = crate::leaf::park_error(self.stream().context());
        self.readers.after_last_write(self.stream());
        // A write on a stream no event records: its guard's host wait can have been skipped.
        self.readers.sync_untracked();
        // A host read is no device read: nothing is recorded.
        std::mem::forget(self.slice.device_ptr(self.stream()));
        self.readers.settle(self.stream(), managed);
        self.resource.synchronize(StreamRef::from(self.stream()))
    }

    /// Whether the context keeps cudarc's events now.
    fn managed(&self) -> bool {
        self.stream().context().is_managing_stream_synchronization()
    }

    /// Waits until no device work uses the memory at all (every read and the last write): what
    /// host writes into host-accessible memory need.
    pub(crate) fn wait_for_uses(&mut self) -> Result<(), AllocError> {
        let stream = self.stream().clone();
        let managed = self.managed();
        self.readers.wait_all(&stream);
        std::mem::forget(self.slice.device_ptr_mut(&stream));
        self.readers.settle(&stream, managed);
        self.resource.synchronize(StreamRef::from(&stream))
    }
}

/// Gives a buffer's memory (`bytes` at `ptr`, under `slice`, read by `readers`) back to
/// `resource` on the slice's stream, after every use of it.
fn free_memory<T, R: MemoryResource>(
    resource: &R,
    slice: CudaSlice<T>,
    ptr: NonNull<T>,
    bytes: usize,
    readers: &Readers,
) {
    let stream = slice.stream().clone();
    // An error someone recorded in the context would make cudarc skip the waits below, and the
    // memory would go back in use.
    let _parked = crate::leaf::park_error(stream.context());
    // The container's stream waits for every recorded read, and for every use that cudarc
    // recorded on the slice's events (on any stream: where events are not kept, uses on other
    // streams were waited for when queued); the memory is not freed by cudarc.
    let managed = stream.context().is_managing_stream_synchronization();
    readers.wait_all(&stream);
    let _ = slice.leak();
    readers.settle(&stream, managed);
    // Host-accessible memory (pinned, managed) is freed by host calls that are not ordered on
    // the stream: wait for the kernels and copies that may still touch it. Where no wait
    // succeeds, the memory is leaked rather than freed under them.
    if !host_free_may_follow::<R>(resource, &stream, bytes) {
        return;
    }
    // SAFETY: the caller passes a buffer's allocation from `resource` with these bytes and T's
    // alignment (or grown in place to them, which a `GrowInPlace` resource frees by any size it
    // had), ordered on this stream, given up by the buffer: freed once.
    unsafe {
        resource.deallocate(
            ptr.cast(),
            bytes,
            std::mem::align_of::<T>(),
            StreamRef::from(&stream),
        )
    }
}

impl<T, R: MemoryResource> Drop for RawBuf<T, R> {
    fn drop(&mut self) {
        // SAFETY: the buffer is being dropped: its slice is taken once, here.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        free_memory::<T, R>(&self.resource, slice, self.ptr, self.bytes(), &self.readers);
    }
}

/// Queues a copy of `bytes` from `from` to `to` (device or host-and-device memory, one unified
/// address space) on `stream`, with its context current.
///
/// # Safety
///
/// Both ranges are `bytes` bytes of live allocations the caller's containers own (the
/// destination borrowed mutably), the copy is ordered on `stream` after their earlier uses and
/// recorded by the caller, and neither is freed before what it records has passed.
pub(crate) unsafe fn queue_copy(
    stream: &CudaStream,
    name: &'static str,
    bytes: usize,
    to: sys::CUdeviceptr,
    from: sys::CUdeviceptr,
) -> Result<(), AllocError> {
    let err = || copy_error(name, bytes);
    let _current = crate::leaf::make_current(stream.context()).map_err(err())?;
    // SAFETY: the caller's promise.
    unsafe { sys::cuMemcpyAsync(to, from, bytes, stream.cu_stream()) }
        .result()
        .map_err(err())
}

/// Queues zero bytes over `[address, address + bytes)` on `stream`, with its context current.
///
/// # Safety
///
/// The range is device-accessible memory the caller owns, ordered on `stream`.
pub(crate) unsafe fn zero(
    stream: &CudaStream,
    address: sys::CUdeviceptr,
    bytes: usize,
    name: &'static str,
) -> Result<(), AllocError> {
    if bytes == 0 {
        return Ok(());
    }
    let _current = crate::leaf::make_current(stream.context()).map_err(copy_error(name, bytes))?;
    // SAFETY: the caller's promise.
    unsafe { cudarc::driver::result::memset_d8_async(address, 0, bytes, stream.cu_stream()) }
        .map_err(copy_error(name, bytes))
}

/// `len * size_of::<T>()`, or an error naming the resource where it overflows.
fn len_bytes<T>(len: usize, resource: &'static str) -> Result<usize, AllocError> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(AllocError::new(
            AllocErrorKind::InvalidArgument("len * size_of::<T>() overflows usize"),
            len,
            std::mem::align_of::<T>(),
            resource,
        ))
}

fn no_events(bytes: usize, align: usize, resource: &'static str) -> AllocError {
    AllocError::new(
        AllocErrorKind::InvalidArgument(
            "the CUDA driver could not create the container's read/write events",
        ),
        bytes,
        align,
        resource,
    )
}

/// cudarc's slice over `len` values at `ptr`, or `Err` where the driver could not make its two
/// events (cudarc unwraps their creation).
fn new_slice<T>(
    ptr: NonNull<T>,
    len: usize,
    stream: &Arc<CudaStream>,
) -> Result<ManuallyDrop<CudaSlice<T>>, ()> {
    // cudarc makes the events after checking the context's recorded error, which anyone may set.
    let _parked = crate::leaf::park_error(stream.context());
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `ptr` is a live allocation of at least `len` values that the caller's buffer
        // owns, which takes the slice back with `leak` (so cudarc never frees it); the values
        // are not read through the slice before a container has written them (every constructor
        // and growth initializes them, or is `unsafe`).
        ManuallyDrop::new(unsafe {
            stream.upgrade_device_ptr::<T>(ptr.as_ptr() as sys::CUdeviceptr, len)
        })
    }))
    .map_err(|_| ())
}

/// Allocates `len` values from `resource` for `stream`, with cudarc's slice over them whose
/// write event records the allocation on `stream`.
fn allocate_slice<T, R: MemoryResource>(
    len: usize,
    resource: &R,
    stream: &Arc<CudaStream>,
) -> Result<NewSlice<T>, AllocError> {
    let align = std::mem::align_of::<T>();
    let bytes = len_bytes::<T>(len, resource.name())?;
    if crate::stream::is_per_thread(stream) {
        // The container's memory is ordered on one stream; this handle names another stream
        // on every thread the container might be used from.
        return Err(AllocError::new(
            AllocErrorKind::InvalidArgument(
                "cudarc's per-thread stream names a different stream on each thread: give the container a stream of its own (ctx.new_stream())",
            ),
            bytes,
            align,
            resource.name(),
        ));
    }
    let ptr = resource.allocate(bytes, align, StreamRef::from(stream))?;
    let Ok(mut slice) = new_slice::<T>(ptr.cast(), len, stream) else {
        // SAFETY: just allocated from `resource` with these arguments, handed to no one.
        unsafe { resource.deallocate(ptr, bytes, align, StreamRef::from(stream)) };
        return Err(no_events(bytes, align, resource.name()));
    };
    // The block is usable on `stream` from here (a suballocator may hand out a block that
    // work queued on `stream` still uses; a stream-ordered allocation exists only from here
    // on `stream`): the write event records this point, which a use on another stream waits
    // for, as for every later write.
    let events = record_write_point(&mut slice, stream);
    Ok((ptr.cast(), slice, events))
}

/// The driver handles of a slice's cudarc read and write events (null where it has none).
pub(super) type CudarcEvents = (sys::CUevent, sys::CUevent);

/// A new allocation's pointer, cudarc's slice over it and the slice's event handles.
type NewSlice<T> = (NonNull<T>, ManuallyDrop<CudaSlice<T>>, CudarcEvents);

/// Records cudarc's write event of `slice` on `stream` (its own) and returns the driver handles
/// of its events, for [`Readers`].
fn record_write_point<T>(slice: &mut CudaSlice<T>, stream: &CudaStream) -> CudarcEvents {
    let handle = |guard: &SyncOnDrop<'_>| match guard {
        SyncOnDrop::Record(Some((event, _))) => event.cu_event(),
        _ => std::ptr::null_mut(),
    };
    let (_, read) = slice.device_ptr(stream);
    let read_event = handle(&read);
    // Not a read: nothing is recorded.
    std::mem::forget(read);
    let (_, written) = slice.device_ptr_mut(stream);
    let write_event = handle(&written);
    drop(written);
    (read_event, write_event)
}

impl<T, R: MemoryResource + std::fmt::Debug> std::fmt::Debug for RawBuf<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("resource", &self.resource)
            .finish()
    }
}

// SAFETY: the buffer owns its allocation like a Box<[T]>; sending it sends the Ts and the resource
// (cudarc's slice is Send and Sync).
unsafe impl<T: Send, R: MemoryResource + Send> Send for RawBuf<T, R> {}
// SAFETY: shared access gives only shared access to the Ts and the resource.
unsafe impl<T: Sync, R: MemoryResource + Sync> Sync for RawBuf<T, R> {}

/// Whether `bytes` of `resource`'s memory ordered on `stream` may be freed now: always for
/// device-only memory (its frees are ordered on the stream); for host-accessible memory, whose
/// frees are host calls, once the host has waited for the stream, or for its whole context where
/// that wait fails. False: device work may still use the memory, which must be leaked.
fn host_free_may_follow<R: MemoryResource>(
    resource: &R,
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> bool {
    if !<R::Host as typenum::Bit>::BOOL || bytes == 0 {
        return true;
    }
    match resource.synchronize(StreamRef::from(stream)) {
        Ok(()) => true,
        Err(e) => wait_for_context_instead(stream, e),
    }
}

/// For a host wait on `stream` that failed with `failed` (recorded in the context, as
/// [`record_in_context`] does): waits for the whole context instead, raw. True when that wait
/// succeeded, so that no device work queued before, on any stream of the context, still runs;
/// false when device work may still use the memory, and the caller must neither hand it to the
/// host nor free it. A stream that is capturing a graph refuses `cuStreamSynchronize` at once.
pub(crate) fn wait_for_context_instead(stream: &CudaStream, failed: AllocError) -> bool {
    record_in_context(stream, failed);
    let ctx = stream.context();
    match crate::leaf::synchronize_context(ctx) {
        Ok(()) => true,
        Err(e) => {
            ctx.record_err::<()>(Err(e));
            false
        }
    }
}

/// Keeps a CUDA error from a call that cannot return one (`Drop`, `Deref`) in the stream's context,
/// where cudarc keeps such errors for `CudaContext::check_err`.
pub(crate) fn record_in_context(stream: &CudaStream, e: AllocError) {
    if let AllocErrorKind::Cuda(code) = e.kind {
        let err: Result<(), _> = Err(cudarc::driver::DriverError(code));
        stream.context().record_err(err);
    }
}

/// The error for a host slice whose length does not match the container's.
pub(crate) fn length_mismatch(got: usize, resource: &'static str) -> AllocError {
    AllocError::new(
        AllocErrorKind::InvalidArgument("host slice length differs from the container's length"),
        got,
        0,
        resource,
    )
}

/// Maps a driver error of a copy or memset to an `AllocError` naming the container's resource.
pub(crate) fn copy_error(
    resource: &'static str,
    bytes: usize,
) -> impl FnOnce(cudarc::driver::DriverError) -> AllocError {
    move |e| AllocError::cuda(e, bytes, 0, resource)
}
