//! Typed containers over a resource: [`DeviceBox`], [`DeviceVec`], [`PinnedVec`].
//!
//! Each holds its resource (by value, or as `&R` / `Arc<R>`: a container holding `&'a Pool<Cuda>`
//! cannot outlive the pool) and the `Arc<CudaStream>` it was made on. Memory is ordered on that
//! stream: it is allocated for it, filled on it, and freed on it when the container drops.
//!
//! They implement cudarc's `DeviceSlice`, `DevicePtr`, `DevicePtrMut` and `PushKernelArg`, so
//! `stream.memcpy_htod(&host, &mut v)`, `stream.memcpy_dtov(&v)` and
//! `stream.launch_builder(&f).arg(&mut v)` take them unchanged, on any stream: each container
//! carries a cudarc `CudaSlice` of its memory, whose read and write events order a use on another
//! stream after the writes before it (a write after the reads too), exactly as for cudarc's own
//! slices, kernel arguments included; the container's drop makes its stream wait for those uses
//! before the memory goes back to its resource. `DeviceVec::slice`/`slice_mut` hand out cudarc's
//! views of it, and `copy_from_async`/`copy_to_async` stage through a `PinnedVec` without
//! blocking, the `PinnedVec` recording the copy for its next host access.

mod device_box;
mod device_vec;
mod host_allocator;
mod pinned_vec;

pub use device_box::DeviceBox;
pub use device_vec::DeviceVec;
pub use host_allocator::HostAllocator;
pub use pinned_vec::PinnedVec;

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
/// The memory is also held as cudarc's own `CudaSlice`, made with `upgrade_device_ptr`: its read
/// and write events are what cudarc's copies, views and kernel launches use to order a use on any
/// stream after the writes before it (and writes after the reads and writes before them). It is
/// never dropped as a `CudaSlice`, which would free the memory through the driver: `Drop` leaks
/// it, which makes the container's stream wait for those events, and then frees the memory
/// through `R` on that stream.
pub(crate) struct RawBuf<T, R: MemoryResource> {
    slice: ManuallyDrop<CudaSlice<T>>,
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
        let align = std::mem::align_of::<T>();
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(AllocError::new(
                AllocErrorKind::InvalidArgument("len * size_of::<T>() overflows usize"),
                len,
                align,
                resource.name(),
            ))?;
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
        // cudarc unwraps the creation of the slice's two events: a failure there (the driver
        // out of resources) becomes this error, and the block goes back.
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: `ptr` is a live allocation of `bytes` = `len * size_of::<T>()` bytes that
            // this buffer owns until `Drop`, which takes the slice back with `leak` (so cudarc
            // never frees it); the values are not read through the slice before a container has
            // written them (every constructor initializes them, or is `unsafe`).
            unsafe { stream.upgrade_device_ptr::<T>(ptr.as_ptr() as sys::CUdeviceptr, len) }
        }));
        let Ok(slice) = made else {
            // SAFETY: just allocated from `resource` with these arguments, handed to no one.
            unsafe { resource.deallocate(ptr, bytes, align, StreamRef::from(stream)) };
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "the CUDA driver could not create the container's read/write events",
                ),
                bytes,
                align,
                resource.name(),
            ));
        };
        Ok(RawBuf {
            slice: ManuallyDrop::new(slice),
            ptr: ptr.cast(),
            len,
            resource,
        })
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

    /// The memory as cudarc's slice, for its views and its ordered uses.
    pub(crate) fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The memory as cudarc's slice, for its mutable views and its ordered uses.
    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        self.slice.stream()
    }

    pub(crate) fn resource(&self) -> &R {
        &self.resource
    }

    /// Orders a read on `stream` of the memory and returns the guard that records it, for
    /// cudarc's `DevicePtr` and `HostSlice`: through the slice's events, as cudarc does, or by
    /// [`join_untracked`](Self::join_untracked) where they are off.
    pub(crate) fn order_read<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        match self.join_untracked(stream) {
            Some(guard) => (self.address(), guard),
            None => self.slice.device_ptr(stream),
        }
    }

    /// As [`order_read`](Self::order_read), for a write (`DevicePtrMut`, a copy into the memory).
    pub(crate) fn order_write<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        match self.join_untracked(stream) {
            Some(guard) => (self.address(), guard),
            None => self.slice.device_ptr_mut(stream),
        }
    }

    /// Where the slice's context keeps no events for several streams (it has made no stream of
    /// its own) and `stream` is another stream (of another `CudaContext` object, which did):
    /// `stream` waits for the work queued on the container's stream, and the returned guard
    /// synchronizes `stream` once the use is queued, so that a later free cannot overtake it.
    /// `None` where the events order the use.
    fn join_untracked<'a>(&self, stream: &'a CudaStream) -> Option<SyncOnDrop<'a>> {
        let own = self.slice.stream();
        if own.context().is_managing_stream_synchronization()
            || crate::stream::id_of(stream) == crate::stream::id_of(own)
        {
            return None;
        }
        stream.context().record_err(stream.join(own));
        Some(SyncOnDrop::sync_stream(stream))
    }

    /// Waits until no device work writes the memory, on any stream: the container's stream
    /// first waits for the last write (the slice's write event; writes on other streams were
    /// ordered after each other), then the host waits for the container's stream. What host
    /// reads of host-accessible memory need.
    pub(crate) fn wait_for_writes(&self) -> Result<(), AllocError> {
        {
            let (_, _read) = self.slice.device_ptr(self.stream());
        }
        self.resource.synchronize(StreamRef::from(self.stream()))
    }

    /// Waits until no device work uses the memory at all (the last read and the last write):
    /// what host writes into host-accessible memory need.
    pub(crate) fn wait_for_uses(&mut self) -> Result<(), AllocError> {
        let stream = self.stream().clone();
        {
            let (_, _write) = self.slice.device_ptr_mut(&stream);
        }
        self.resource.synchronize(StreamRef::from(&stream))
    }
}

impl<T, R: MemoryResource> Drop for RawBuf<T, R> {
    fn drop(&mut self) {
        // SAFETY: the slice is taken once, here, and not used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        let stream = slice.stream().clone();
        // The container's stream waits for every use that cudarc recorded on the slice's events
        // (on any stream); the memory is not freed by cudarc.
        let _ = slice.leak();
        // Host-accessible memory (pinned, managed) is freed by host calls that are not ordered on
        // the stream: wait for the kernels and copies that may still touch it.
        if <R::Host as typenum::Bit>::BOOL && self.bytes() > 0 {
            if let Err(e) = self.resource.synchronize(StreamRef::from(&stream)) {
                record_in_context(&stream, e);
            }
        }
        // SAFETY: ptr came from `allocate` on this resource with these bytes and T's alignment,
        // ordered on this stream, and is freed once.
        unsafe {
            self.resource.deallocate(
                self.ptr.cast(),
                self.bytes(),
                std::mem::align_of::<T>(),
                StreamRef::from(&stream),
            )
        }
    }
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

/// Implements cudarc's `DeviceSlice`, `DevicePtr`, `DevicePtrMut` and `PushKernelArg` (for `&` and
/// `&mut`) for a container whose `RawBuf<T, R>` is at the given field path, with `touched(&self)`
/// (device work that reads the memory is queued) and `touched_mut(&mut self)` (work that may
/// write it). Every one goes through the buffer's `CudaSlice`, so a use on any stream is ordered
/// by its events exactly as for cudarc's own slices, kernel arguments included. A `&` kernel
/// argument is read-only to the kernel, as for cudarc's own `&CudaSlice`. A macro because these
/// are foreign traits on three distinct types: no single generic impl covers them.
macro_rules! cudarc_interop {
    ($container:ident, $($buf:ident).+ where R: $($bound:tt)+) => {
        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DeviceSlice<T>
            for $container<T, R>
        {
            fn len(&self) -> usize {
                self.$($buf).+.len()
            }
            fn stream(&self) -> &std::sync::Arc<cudarc::driver::CudaStream> {
                self.$($buf).+.stream()
            }
        }

        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DevicePtr<T>
            for $container<T, R>
        {
            fn device_ptr<'a>(
                &'a self,
                stream: &'a cudarc::driver::CudaStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, cudarc::driver::SyncOnDrop<'a>) {
                self.touched();
                self.$($buf).+.order_read(stream)
            }
        }

        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DevicePtrMut<T>
            for $container<T, R>
        {
            fn device_ptr_mut<'a>(
                &'a mut self,
                stream: &'a cudarc::driver::CudaStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, cudarc::driver::SyncOnDrop<'a>) {
                self.touched_mut();
                self.$($buf).+.order_write(stream)
            }
        }

        // SAFETY: cudarc's own implementation for `&CudaSlice`, on the container's slice, which
        // lives as long as the borrow 'b of the container, itself outliving the builder 'a.
        unsafe impl<'a, 'b: 'a, T: cudarc::driver::DeviceRepr, R: $($bound)+>
            cudarc::driver::PushKernelArg<&'b $container<T, R>> for cudarc::driver::LaunchArgs<'a>
        {
            fn arg(&mut self, arg: &'b $container<T, R>) -> &mut Self {
                arg.touched();
                self.arg(arg.$($buf).+.slice())
            }
        }

        // SAFETY: as for `&`; the `&mut` borrow makes the kernel the only writer while it is held.
        unsafe impl<'a, 'b: 'a, T: cudarc::driver::DeviceRepr, R: $($bound)+>
            cudarc::driver::PushKernelArg<&'b mut $container<T, R>>
            for cudarc::driver::LaunchArgs<'a>
        {
            fn arg(&mut self, arg: &'b mut $container<T, R>) -> &mut Self {
                arg.touched_mut();
                self.arg(arg.$($buf).+.slice_mut())
            }
        }
    };
}
pub(crate) use cudarc_interop;

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
