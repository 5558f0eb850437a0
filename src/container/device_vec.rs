//! `DeviceVec<T, R>`: an array of `T` in device-accessible memory, like `rmm::device_uvector`,
//! that grows on request (in place where the resource can). Requires
//! `R: Accessible<DeviceAccessible>`; host access to the elements (`as_host_slice`) exists only
//! when `R` is host-accessible too (managed, pinned).

use super::view::{checked_range, out_of_range};
use super::{
    copy_error, cudarc_interop, length_mismatch, queue_copy, zero, AlignmentFits, DeviceView,
    DeviceViewMut, PinnedVec, RawBuf,
};
use crate::property::{Accessible, DeviceAccessible, HostAccessible};
use crate::resource::{AllocError, AllocErrorKind, GrowInPlace, MemoryResource};
use cudarc::driver::{result, sys, CudaStream, DeviceRepr, DriverError, ValidAsZeroBits};
use std::ops::RangeBounds;
use std::sync::Arc;

/// `len` values of `T` in memory from `R`, ordered on one stream, freed on it when dropped.
///
/// A use on another stream (a cudarc copy of the vector or of a view, [`slice`](Self::slice),
/// [`slice_mut`](Self::slice_mut)) first waits for the writes queued before it (a write for the
/// reads too, on every stream that read), and the vector's drop and host accesses wait for it.
/// Through events, without blocking, where cudarc keeps them for the vector's whole life: the
/// vector is on a stream its context made (`ctx.new_stream()`) and the other stream belongs to
/// the same `CudaContext` object. Elsewhere (the vector on the default stream, a stream of another
/// `CudaContext` object or device) the use also waits for the vector's stream, and the host waits
/// for it once it is queued. Kernel arguments (`launch` is `unsafe`) are ordered by cudarc's
/// events alone, which hold in the first case: elsewhere launch on the vector's stream.
///
/// ```no_run
/// # fn main() -> Result<(), mrstack::resource::AllocError> {
/// use mrstack::prelude::*;
/// let ctx = mrstack::cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let pool = Cuda::new(&ctx)?;
/// let v = DeviceVec::from_slice(&[1.0f32, 2.0, 3.0], &pool, &stream)?;
/// assert_eq!(v.to_vec()?, [1.0, 2.0, 3.0]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
// The struct asks only `R: MemoryResource`: the constructors ask for `DeviceAccessible`, so that a
// resource without it is one error at the call, not one more per mention of the type.
pub struct DeviceVec<T: DeviceRepr, R: MemoryResource> {
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
        let mut v = unsafe { Self::uninit(len, resource, stream) }?;
        v.zero_from(0)?;
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

    /// Grows the vector to `new_len` values, the new ones zero, without moving it: the resource
    /// extends the allocation in place ([`GrowInPlace`]: [`VirtualMemory`](crate::leaf::VirtualMemory)
    /// maps pages after it, [`Tlsf`](crate::suballoc::Tlsf) takes the free block after it), so
    /// nothing is copied and [`device_address`](Self::device_address) stays. `Ok(false)`, the
    /// vector unchanged, where the bytes after it are not free on the vector's stream (always for
    /// an empty vector, which has no allocation to grow): then [`grow_zeroed`](Self::grow_zeroed)
    /// moves it. The growth and the `memset` of the new values are queued on the vector's stream
    /// after every use of the vector so far, and the new values are zero before the vector is
    /// longer: on `Err` it keeps its length.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use mrstack::prelude::*;
    /// use mrstack::leaf::VirtualMemory;
    /// use mrstack::leaf::DevicePages;
    /// let ctx = mrstack::cuda_context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let vm = VirtualMemory::new(DevicePages::new(&ctx)?, Default::default())?;
    /// let mut v = DeviceVec::from_slice(&[1u32, 2, 3], &vm, &stream)?;
    /// if !v.grow_zeroed_in_place(1 << 20)? {
    ///     v.grow_zeroed(1 << 20)?; // no room after it: moved, with a copy
    /// }
    /// assert_eq!(v.to_vec()?[..4], [1, 2, 3, 0]);
    /// # Ok(()) }
    /// ```
    ///
    /// `Err` for a `new_len` below the length (naming it), or where the driver fails.
    pub fn grow_zeroed_in_place(&mut self, new_len: usize) -> Result<bool, AllocError>
    where
        R: GrowInPlace,
        T: ValidAsZeroBits,
    {
        self.grow_check(new_len)?;
        if new_len == self.len() {
            return Ok(true);
        }
        self.buf.grow_zeroed_in_place(new_len)
    }

    /// Grows the vector to `new_len` values, the new ones zero, moving it: a new allocation from
    /// the same resource, the values copied on the vector's stream after every use of the vector
    /// so far, and the old memory given back after the copy. Works over any resource;
    /// [`grow_zeroed_in_place`](Self::grow_zeroed_in_place) avoids the copy where the resource
    /// can grow in place. `Err` for a `new_len` below the length (naming it), or where memory or
    /// the driver fails; the vector is then as it was.
    pub fn grow_zeroed(&mut self, new_len: usize) -> Result<(), AllocError>
    where
        T: ValidAsZeroBits,
    {
        self.grow_check(new_len)?;
        if new_len == self.len() {
            return Ok(());
        }
        self.buf.reallocate_zeroed(new_len)
    }

    /// An error if `new_len` is below the vector's length.
    fn grow_check(&self, new_len: usize) -> Result<(), AllocError> {
        if new_len < self.len() {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "a DeviceVec grows only: the new length is below its length",
                ),
                new_len,
                std::mem::align_of::<T>(),
                self.buf.resource().name(),
            ));
        }
        Ok(())
    }

    /// Zeroes the bytes from `from` to the end, on the vector's stream, recorded as a write.
    fn zero_from(&mut self, from: usize) -> Result<(), AllocError>
    where
        T: ValidAsZeroBits,
    {
        let bytes = self.buf.bytes() - from;
        if bytes == 0 {
            return Ok(());
        }
        let stream = self.buf.stream().clone();
        let name = self.buf.resource().name();
        let (address, written) = self.buf.order_write(&stream);
        // SAFETY: `from..from + bytes` lies in this buffer's device-accessible memory, ordered on
        // `stream` after its earlier uses.
        unsafe { zero(&stream, address + from as u64, bytes, name) }?;
        drop(written);
        Ok(())
    }

    /// Copies `host` in (same length) on the vector's stream and waits for the copy, so `host`
    /// may be changed or freed as soon as this returns, pinned or managed memory included (the
    /// driver stages only pageable memory; from pinned memory the copy is fully asynchronous).
    /// The copy waits for the reads and writes of the vector queued on other streams.
    pub fn copy_from(&mut self, host: &[T]) -> Result<(), AllocError> {
        self.check_len(host.len())?;
        if self.buf.bytes() == 0 {
            return Ok(());
        }
        let stream = self.buf.stream().clone();
        let name = self.buf.resource().name();
        let (address, written) = self.buf.order_write(&stream);
        copy_and_wait(&stream, name, std::mem::size_of_val(host), |s| {
            // SAFETY: the destination holds `host.len()` values (checked above); the source is a
            // live host slice, borrowed until copy_and_wait has waited for the copy.
            unsafe { result::memcpy_htod_async(address, host, s) }
        })?;
        drop(written);
        Ok(())
    }

    /// Copies the values out into `host` (same length), waiting for the copy (after the writes of
    /// the vector queued on any stream).
    pub fn copy_to(&self, host: &mut [T]) -> Result<(), AllocError> {
        self.check_len(host.len())?;
        if self.buf.bytes() == 0 {
            return Ok(());
        }
        let stream = self.buf.stream();
        // Waited for below before anything else can be queued: no record needed.
        let address = self.buf.read_now();
        let bytes = std::mem::size_of_val(host);
        copy_and_wait(stream, self.buf.resource().name(), bytes, |s| {
            // SAFETY: the source holds `host.len()` values (checked above); the destination is a
            // live host slice, borrowed until copy_and_wait has waited for it.
            unsafe { result::memcpy_dtoh_async(host, address, s) }
        })
    }

    /// Copies `src` in, queued on the vector's stream, without waiting: the copy is ordered
    /// after the device writes of `src` and the uses of the vector queued before it (on any
    /// stream), and `src` records it, so a host write into `src` (which needs `&mut`) first waits
    /// for it. Host-to-device staging that overlaps with the host's work (where events order the
    /// two streams, see [`DeviceVec`]; elsewhere the host waits for the copy).
    pub fn copy_from_async<S>(&mut self, src: &PinnedVec<T, S>) -> Result<(), AllocError>
    where
        S: MemoryResource + Accessible<HostAccessible> + Accessible<DeviceAccessible>,
    {
        self.check_len(src.buf.len())?;
        if self.buf.bytes() == 0 {
            return Ok(());
        }
        let stream = self.buf.stream().clone();
        let name = self.buf.resource().name();
        let bytes = self.buf.bytes();
        src.touched();
        let (from, read) = src.buf.order_read(&stream, super::ReadBy::Crate);
        let (to, written) = self.buf.order_write(&stream);
        // SAFETY: `bytes` bytes of the two vectors' live memory (same length, checked),
        // ordered on `stream` after their earlier uses; the guards record the copy.
        unsafe { queue_copy(&stream, name, bytes, to, from) }?;
        // The guards record the copy on the two slices' events, after it was queued.
        drop((written, read));
        Ok(())
    }

    /// Copies `src` in (same length) from a vector on any device, queued on this vector's stream
    /// (`cuMemcpyPeerAsync`): direct over NVLink or PCIe where peer access is enabled
    /// ([`enable_peer_access`](crate::enable_peer_access)), staged by the driver otherwise. The
    /// copy comes after the writes of `src` and the uses of this vector queued before it, on any
    /// stream: where `src` is on a stream of another context (another device), this vector's
    /// stream first waits for `src`'s, and the host waits for the copy once it is queued, as for
    /// any use across contexts.
    pub fn copy_from_device<S>(&mut self, src: &DeviceVec<T, S>) -> Result<(), AllocError>
    where
        S: MemoryResource + Accessible<DeviceAccessible>,
    {
        self.check_len(src.len())?;
        let bytes = self.buf.bytes();
        if bytes == 0 {
            return Ok(());
        }
        let stream = self.buf.stream().clone();
        let name = self.buf.resource().name();
        let err = || copy_error(name, bytes);
        let (dst_ctx, src_ctx) = (stream.context().cu_ctx(), src.stream().context().cu_ctx());
        // Across the guards' drops too (their host waits are cudarc's).
        let _parked = (
            crate::leaf::park_error(stream.context()),
            crate::leaf::park_error(src.stream().context()),
        );
        src.touched();
        let (from, read) = src.buf.order_read(&stream, super::ReadBy::Crate);
        let (to, written) = self.buf.order_write(&stream);
        let copied = crate::leaf::make_current(stream.context())
            .map_err(err())
            .and_then(|_current| {
                // SAFETY: `bytes` bytes of two live device allocations of the same length
                // (checked), found by their addresses (unified addressing); the copy is ordered
                // on `stream` after their earlier uses, and the guards record it.
                unsafe {
                    sys::cuMemcpyPeerAsync(to, dst_ctx, from, src_ctx, bytes, stream.cu_stream())
                }
                .result()
                .map_err(err())
            });
        drop((written, read));
        copied
    }

    /// Copies the values out into `dst`, queued on the vector's stream, without waiting: `dst`
    /// records the copy, so its next host access (`Deref`, `as_cells`) first waits for it.
    /// Device-to-host staging that overlaps with the host's work (where events order the two
    /// streams, see [`DeviceVec`]; elsewhere the host waits for the copy).
    pub fn copy_to_async<S>(&self, dst: &mut PinnedVec<T, S>) -> Result<(), AllocError>
    where
        S: MemoryResource + Accessible<HostAccessible> + Accessible<DeviceAccessible>,
    {
        self.check_len(dst.buf.len())?;
        if self.buf.bytes() == 0 {
            return Ok(());
        }
        let stream = self.buf.stream();
        let bytes = self.buf.bytes();
        dst.touched_mut();
        let (from, read) = self.buf.order_read(stream, super::ReadBy::Crate);
        let (to, written) = dst.buf.order_write(stream);
        // SAFETY: `bytes` bytes of the two vectors' live memory (same length, checked),
        // ordered on `stream` after their earlier uses; the guards record the copy.
        unsafe { queue_copy(stream, self.buf.resource().name(), bytes, to, from) }?;
        drop((written, read));
        Ok(())
    }

    /// `Err` unless `len` is the vector's length.
    fn check_len(&self, len: usize) -> Result<(), AllocError> {
        if len == self.len() {
            Ok(())
        } else {
            Err(length_mismatch(len, self.buf.resource().name()))
        }
    }

    /// A view of `range` of the values: every cudarc copy and kernel launch takes it, ordered on
    /// any stream like the vector itself. `Err` for a range outside the vector (cudarc's own
    /// `slice` panics there, as its range arithmetic does at `usize::MAX`).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>, AllocError> {
        let (len, name) = (self.len(), self.buf.resource().name());
        let r = checked_range(range, len).ok_or_else(|| out_of_range(len, name))?;
        let (slice, readers) = self.buf.parts();
        let view = slice.try_slice(r).ok_or_else(|| out_of_range(len, name))?;
        Ok(DeviceView::new(view, readers))
    }

    /// A mutable view of `range` of the values, ordered like the vector. `Err` for a range
    /// outside the vector.
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<DeviceViewMut<'_, T>, AllocError> {
        let (len, name) = (self.len(), self.buf.resource().name());
        let r = checked_range(range, len).ok_or_else(|| out_of_range(len, name))?;
        let (slice, readers) = self.buf.parts_mut();
        let view = slice
            .try_slice_mut(r)
            .ok_or_else(|| out_of_range(len, name))?;
        Ok(DeviceViewMut::new(view, readers))
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
        self.buf.wait_for_writes()?;
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
        self.buf.wait_for_uses()?;
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

    /// Waits for the work queued on the vector's stream, and for the writes of the values
    /// queued on other streams.
    pub fn synchronize(&self) -> Result<(), AllocError> {
        self.buf.wait_for_writes()
    }

    /// The device address of the first value.
    pub fn device_address(&self) -> u64 {
        self.buf.address()
    }

    fn touched(&self) {}

    fn touched_mut(&mut self) {}
}

cudarc_interop!(DeviceVec, buf where R: MemoryResource + Accessible<DeviceAccessible>);

/// Runs `copy` of `bytes` on `stream` with its context current, and waits for it.
fn copy_and_wait(
    stream: &Arc<CudaStream>,
    name: &'static str,
    bytes: usize,
    copy: impl FnOnce(sys::CUstream) -> Result<(), DriverError>,
) -> Result<(), AllocError> {
    let err = || copy_error(name, bytes);
    let _current = crate::leaf::make_current(stream.context()).map_err(err())?;
    copy(stream.cu_stream()).map_err(err())?;
    stream.synchronize().map_err(err())
}

static_assertions::assert_impl_all!(DeviceVec<f32, crate::leaf::Cuda>: Send, Sync);
