//! `PinnedVec<T, R>`: values in memory that both the host and kernels may dereference (pinned or
//! managed). Requires `R: Accessible<(HostAccessible, DeviceAccessible)>`.
//!
//! It derefs to `[T]` on the host. Once the memory has been handed to the device (a kernel
//! argument, a copy), the next host access first waits for the vector's stream, so the host never
//! reads values a kernel is still writing, nor overwrites values a copy is still reading.

use super::{cudarc_interop, AlignmentFits, RawBuf};
use crate::property::{Accessible, DeviceAccessible, HostAccessible};
use crate::resource::{AllocError, MemoryResource};
use cudarc::driver::{CudaStream, DeviceRepr, HostSlice, SyncOnDrop, ValidAsZeroBits};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `len` values of `T` in host+device memory from `R`, derefs to `[T]`.
///
/// ```no_run
/// # fn main() -> Result<(), mrstack::AllocError> {
/// use mrstack::prelude::*;
/// let ctx = mrstack::cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let mut v = PinnedVec::from_slice(&[1u32, 2, 3], Pinned::new(&ctx)?, &stream)?;
/// v[0] = 10; // plain host writes
/// let on_device = DeviceVec::from_slice(&v, Cuda::new(&ctx)?, &stream)?;
/// assert_eq!(on_device.to_vec()?, [10, 2, 3]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource + Accessible<(HostAccessible, DeviceAccessible)>,
{
    buf: RawBuf<T, R>,
    /// Set when the device may be using the memory; cleared by the next wait on the stream.
    in_use_by_device: AtomicBool,
}

impl<T, R> PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource + Accessible<(HostAccessible, DeviceAccessible)>,
{
    fn with_len(len: usize, resource: R, stream: &Arc<CudaStream>) -> Result<Self, AllocError> {
        let () = AlignmentFits::<T, R>::CHECK;
        let buf = RawBuf::allocate(len, resource, stream)?;
        // A suballocator may hand out a block that work queued on the stream still uses (freed on
        // this stream, or ordered after another one): the host writes next, so wait first.
        if buf.bytes() > 0 {
            buf.synchronize()?;
        }
        Ok(PinnedVec {
            buf,
            in_use_by_device: AtomicBool::new(false),
        })
    }

    /// A copy of `values`.
    pub fn from_slice(
        values: &[T],
        resource: R,
        stream: &Arc<CudaStream>,
    ) -> Result<Self, AllocError>
    where
        T: Clone,
    {
        let () = AlignmentFits::<T, R>::CHECK;
        let v = Self::with_len(values.len(), resource, stream)?;
        for (i, x) in values.iter().enumerate() {
            // SAFETY: the memory is host-accessible, holds `len` slots, and slot i is written once.
            unsafe { v.buf.ptr().as_ptr().add(i).write(x.clone()) };
        }
        Ok(v)
    }

    /// `len` values whose bytes are all zero.
    pub fn zeroed(len: usize, resource: R, stream: &Arc<CudaStream>) -> Result<Self, AllocError>
    where
        T: ValidAsZeroBits,
    {
        let () = AlignmentFits::<T, R>::CHECK;
        let v = Self::with_len(len, resource, stream)?;
        // SAFETY: the memory is host-accessible and `len` values long; all-zero is a valid T.
        unsafe { v.buf.ptr().as_ptr().write_bytes(0, len) };
        Ok(v)
    }

    /// The stream the vector's memory is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.buf.stream()
    }

    /// The resource the memory came from.
    pub fn resource(&self) -> &R {
        self.buf.resource()
    }

    /// The device address of the first value (the host address, under unified addressing).
    pub fn device_address(&self) -> u64 {
        *self.buf.address()
    }

    /// Waits for the vector's stream if the device may be using the memory.
    pub fn synchronize(&self) -> Result<(), AllocError> {
        // Clear the flag only after the wait: a reader on another thread that sees it clear must
        // find the device work finished, not merely waited for by someone else.
        if self.in_use_by_device.load(Ordering::Acquire) {
            self.buf.synchronize()?;
            self.in_use_by_device.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// For `Deref`, which cannot return an error: the error stays recorded in the CUDA context
    /// (`CudaContext::check_err`), where cudarc keeps the errors of calls that cannot return one.
    fn wait_for_device(&self) {
        if let Err(e) = self.synchronize() {
            super::record_in_context(self.buf.stream(), e);
        }
    }

    fn touched(&self) {
        self.in_use_by_device.store(true, Ordering::Release);
    }
}

impl<T, R> Deref for PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource + Accessible<(HostAccessible, DeviceAccessible)>,
{
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.wait_for_device();
        // SAFETY: host-accessible memory (type bound) holding `len` initialized values, with no
        // device work on the stream left to change them.
        unsafe { std::slice::from_raw_parts(self.buf.ptr().as_ptr(), self.buf.len()) }
    }
}

impl<T, R> DerefMut for PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource + Accessible<(HostAccessible, DeviceAccessible)>,
{
    fn deref_mut(&mut self) -> &mut [T] {
        self.wait_for_device();
        // SAFETY: as for `deref`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.buf.ptr().as_ptr(), self.buf.len()) }
    }
}

impl<T, R> HostSlice<T> for PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource + Accessible<(HostAccessible, DeviceAccessible)>,
{
    fn len(&self) -> usize {
        self.buf.len()
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [T], SyncOnDrop<'a>) {
        let slice = &**self;
        self.touched();
        (slice, self.buf.order_use(stream))
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [T], SyncOnDrop<'a>) {
        self.wait_for_device();
        self.touched();
        // SAFETY: as for `deref_mut`; the device side is ordered by the caller's copy on `stream`.
        let slice =
            unsafe { std::slice::from_raw_parts_mut(self.buf.ptr().as_ptr(), self.buf.len()) };
        (slice, self.buf.order_use(stream))
    }
}

cudarc_interop!(PinnedVec, buf where R: MemoryResource + Accessible<(HostAccessible, DeviceAccessible)>);

static_assertions::assert_impl_all!(PinnedVec<u8, crate::Pinned>: Send, Sync);
