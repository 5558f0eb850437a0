//! `DeviceVec<T, R>`: a fixed-length array of `T` in device-accessible memory, like
//! `rmm::device_uvector`. Requires `R: Accessible<DeviceAccessible>`; host access to the elements
//! (`as_host_slice`) exists only when `R` is host-accessible too (managed, pinned).

use super::{copy_error, cudarc_interop, length_mismatch, AlignmentFits, RawBuf};
use crate::property::{Accessible, DeviceAccessible, HostAccessible};
use crate::resource::{AllocError, MemoryResource};
use cudarc::driver::{result, sys, CudaStream, DeviceRepr, DriverError, ValidAsZeroBits};
use std::sync::Arc;

/// `len` values of `T` in memory from `R`, ordered on one stream, freed on it when dropped.
///
/// ```no_run
/// # fn main() -> Result<(), mrstack::AllocError> {
/// use mrstack::prelude::*;
/// let ctx = mrstack::cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let pool = Cuda::new(&ctx)?;
/// let v = DeviceVec::from_slice(&[1.0f32, 2.0, 3.0], &pool, &stream)?;
/// assert_eq!(v.to_vec()?, [1.0, 2.0, 3.0]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DeviceVec<T: DeviceRepr, R: MemoryResource + Accessible<DeviceAccessible>> {
    pub(super) buf: RawBuf<T, R>,
}

impl<T: DeviceRepr, R: MemoryResource + Accessible<DeviceAccessible>> DeviceVec<T, R> {
    /// Room for `len` values, not initialized.
    ///
    /// # Safety
    ///
    /// The values are uninitialized: write every one (by a kernel or a copy) before reading it.
    pub unsafe fn uninit(
        len: usize,
        resource: R,
        stream: &Arc<CudaStream>,
    ) -> Result<Self, AllocError> {
        let () = AlignmentFits::<T, R>::CHECK;
        Ok(DeviceVec {
            buf: RawBuf::allocate(len, resource, stream)?,
        })
    }

    /// `len` values whose bytes are all zero (a `memset` queued on `stream`).
    pub fn zeroed(len: usize, resource: R, stream: &Arc<CudaStream>) -> Result<Self, AllocError>
    where
        T: ValidAsZeroBits,
    {
        let () = AlignmentFits::<T, R>::CHECK;
        // SAFETY: every byte is set by the memset below before the vector is handed out.
        let v = unsafe { Self::uninit(len, resource, stream) }?;
        let bytes = v.buf.bytes();
        if bytes > 0 {
            let err = copy_error(v.buf.resource().name(), bytes);
            stream.context().bind_to_thread().map_err(err)?;
            // SAFETY: the destination is `bytes` bytes of device-accessible memory of this buffer.
            unsafe { result::memset_d8_async(*v.buf.address(), 0, bytes, stream.cu_stream()) }
                .map_err(copy_error(v.buf.resource().name(), bytes))?;
        }
        Ok(v)
    }

    /// A copy of `host`, queued on `stream`.
    pub fn from_slice(
        host: &[T],
        resource: R,
        stream: &Arc<CudaStream>,
    ) -> Result<Self, AllocError> {
        let () = AlignmentFits::<T, R>::CHECK;
        // SAFETY: every value is written by the copy below before the vector is handed out.
        let mut v = unsafe { Self::uninit(host.len(), resource, stream) }?;
        v.copy_from(host)?;
        Ok(v)
    }

    /// Copies `host` in (same length) on the vector's stream and waits for the copy, so `host`
    /// may be changed or freed as soon as this returns, pinned or managed memory included (the
    /// driver stages only pageable memory; from pinned memory the copy is fully asynchronous).
    pub fn copy_from(&mut self, host: &[T]) -> Result<(), AllocError> {
        let address = *self.buf.address();
        self.blocking_copy(host.len(), |stream| {
            // SAFETY: the destination holds `host.len()` values (checked by blocking_copy); the
            // source is a live host slice, borrowed until blocking_copy has waited for the copy.
            unsafe { result::memcpy_htod_async(address, host, stream) }
        })
    }

    /// Copies the values out into `host` (same length), waiting for the vector's stream.
    pub fn copy_to(&self, host: &mut [T]) -> Result<(), AllocError> {
        let address = *self.buf.address();
        self.blocking_copy(host.len(), |stream| {
            // SAFETY: the source holds `host.len()` values (checked by blocking_copy); the
            // destination is a live host slice, borrowed until blocking_copy has waited for it.
            unsafe { result::memcpy_dtoh_async(host, address, stream) }
        })
    }

    /// Runs `copy` of `host_len` values on the vector's stream with its context current, and
    /// waits for it; `Err` if the lengths differ, nothing for an empty vector.
    fn blocking_copy(
        &self,
        host_len: usize,
        copy: impl FnOnce(sys::CUstream) -> Result<(), DriverError>,
    ) -> Result<(), AllocError> {
        let name = self.buf.resource().name();
        if host_len != self.len() {
            return Err(length_mismatch(host_len, name));
        }
        if host_len == 0 || self.buf.bytes() == 0 {
            return Ok(());
        }
        let stream = self.buf.stream();
        let err = || copy_error(name, self.buf.bytes());
        stream.context().bind_to_thread().map_err(err())?;
        copy(stream.cu_stream()).map_err(err())?;
        stream.synchronize().map_err(err())
    }

    /// The values, copied to a new host `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>, AllocError>
    where
        T: Default + Clone,
    {
        let mut host = vec![T::default(); self.len()];
        self.copy_to(&mut host)?;
        Ok(host)
    }

    /// The values, read in place on the host after waiting for the vector's stream. Compiles only
    /// when `R` is host-accessible (managed or pinned memory).
    pub fn as_host_slice(&self) -> Result<&[T], AllocError>
    where
        R: Accessible<HostAccessible>,
    {
        self.buf.synchronize()?;
        // SAFETY: the memory is host-accessible (bound above), holds `len` initialized values, and
        // no queued work on the vector's stream is left to change it.
        Ok(unsafe { std::slice::from_raw_parts(self.buf.ptr().as_ptr(), self.len()) })
    }

    /// The values as cells, for writes in place on the host (`v.as_host_cells()?[i].set(x)`),
    /// after waiting for the vector's stream. Compiles only when `R` is host-accessible.
    ///
    /// Cells rather than `&mut [T]`: cudarc copies into a `&mut [T]` asynchronously when the
    /// memory is pinned or managed (it assumes Rust slices are pageable), so a mutable slice of
    /// this memory could be written by a DMA the vector never hears of (see `PinnedVec`).
    pub fn as_host_cells(&mut self) -> Result<&[std::cell::Cell<T>], AllocError>
    where
        R: Accessible<HostAccessible>,
    {
        self.buf.synchronize()?;
        // SAFETY: as for `as_host_slice`; `&mut self` makes this the only access while the cells
        // are borrowed, and Cell<T> has T's layout.
        let slice = unsafe { std::slice::from_raw_parts_mut(self.buf.ptr().as_ptr(), self.len()) };
        Ok(std::cell::Cell::from_mut(slice).as_slice_of_cells())
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when the vector holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stream the vector's memory is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.buf.stream()
    }

    /// The resource the memory came from.
    pub fn resource(&self) -> &R {
        self.buf.resource()
    }

    /// Waits for the work queued on the vector's stream.
    pub fn synchronize(&self) -> Result<(), AllocError> {
        self.buf.synchronize()
    }

    /// The device address of the first value.
    pub fn device_address(&self) -> u64 {
        *self.buf.address()
    }

    fn touched(&self) {}

    fn touched_mut(&mut self) {}
}

cudarc_interop!(DeviceVec, buf where R: MemoryResource + Accessible<DeviceAccessible>);

static_assertions::assert_impl_all!(DeviceVec<f32, crate::Cuda>: Send, Sync);
