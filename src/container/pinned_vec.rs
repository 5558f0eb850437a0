//! `PinnedVec<T, R>`: values in memory that both the host and kernels may dereference (pinned or
//! managed). Requires `R: Accessible<HostAccessible> + Accessible<DeviceAccessible>`.
//!
//! It derefs to `[T]` on the host for reading; host writes go through [`PinnedVec::as_cells`]
//! (a `&[Cell<T>]`), [`PinnedVec::copy_from_slice`] and [`PinnedVec::fill`].
//!
//! # Host access waits for the device
//!
//! Once the memory has been handed to the device (a kernel argument, a copy, a
//! [`DeviceVec::copy_to_async`](super::DeviceVec::copy_to_async) into it, on any stream), the
//! next host access waits first: `Deref` (`&v[..]`, `v[i]`, `v.iter()`) for every device write of
//! it queued so far, a host write (`as_cells`, `copy_from_slice`, `fill`) for every device use.
//! The vector's stream waits for the last write recorded on its cudarc write event (and, for a
//! host write, for the reads recorded per stream), wherever they were queued, and the host waits
//! for the vector's stream; a use on a stream that events do not order (see the container module)
//! was waited for on the host when it was queued. So the host never reads values a
//! kernel is still writing, nor overwrites values a copy is still reading. Until device work is
//! queued on it again, host access does not wait; `len()` and `is_empty()` never do. `Deref`
//! cannot return an error: a failed wait is kept in the context (`CudaContext::check_err`), the
//! host waits for the whole context instead (a stream capturing a graph refuses a wait for it),
//! and where that fails too, `Deref` panics rather than hand out values device work may still be
//! writing. [`synchronize`](PinnedVec::synchronize) is the same wait with its error.
//!
//! Why no `&mut [T]`: cudarc copies into any `&mut [T]` with `cuMemcpyDtoHAsync`, assuming
//! pageable memory, for which the driver finishes the copy before returning. Into pinned memory
//! the copy is truly asynchronous, and nothing would tell the vector: a host read could see values
//! still being written, and a drop could hand the block to another owner while the DMA still
//! writes. A `&mut T` would allow the same through `std::slice::from_mut`. So no safe path yields
//! a mutable reference into the memory: cudarc's copies into the vector go through its
//! `HostSlice`/`DevicePtrMut` implementations, which the vector tracks.
//!
//! Shared `&[T]` views may be given to cudarc as copy sources: the device then reads the memory
//! asynchronously, which cannot change it. Every `Deref` counts as such a use, so the next host
//! write (which needs `&mut self`) first waits for the vector's stream. A copy queued on another
//! stream from a plain `&[T]` reads whatever the memory holds when it runs (the device gets
//! unspecified values, the host's memory is never affected): keep the vector, unchanged, until
//! that stream has run, or copy through the vector itself (`stream.memcpy_htod(&v, …)`), which
//! orders the copy.
//!
//! Copies through the vector on a stream that is capturing a CUDA graph panic before anything is
//! queued: a captured copy runs at each launch of the graph, which may come after the vector is
//! gone and which no host access waits for. Copy before or after the capture.

use super::{cudarc_interop, AlignmentFits, RawBuf};
use crate::property::{Accessible, DeviceAccessible, HostAccessible};
use crate::resource::{AllocError, MemoryResource};
use cudarc::driver::{CudaStream, DeviceRepr, HostSlice, SyncOnDrop, ValidAsZeroBits};
use std::cell::Cell;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `len` values of `T` in host+device memory from `R`, derefs to `[T]`.
///
/// ```no_run
/// # fn main() -> Result<(), mrstack::resource::AllocError> {
/// use mrstack::prelude::*;
/// let ctx = mrstack::cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let mut v = PinnedVec::from_slice(&[1u32, 2, 3], Pinned::new(&ctx)?, &stream)?;
/// v.as_cells()?[0].set(10); // host writes, through cells
/// assert_eq!(v[0], 10); // host reads, through Deref
/// let on_device = DeviceVec::from_slice(&v, Cuda::new(&ctx)?, &stream)?;
/// assert_eq!(on_device.to_vec()?, [10, 2, 3]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
// Only `R: MemoryResource` here; the constructors ask for the properties (one error per misuse).
pub struct PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource,
{
    pub(super) buf: RawBuf<T, R>,
    /// Set when device work that may write the memory was queued (only through `&mut self`, so
    /// never while a host read is under way); cleared once the stream was waited for.
    device_may_write: AtomicBool,
    /// Set when device work that reads the memory was queued (through `&self`); cleared only by
    /// a host write's wait, which holds `&mut self`, so no setter races the clearing.
    device_may_read: AtomicBool,
}

impl<T, R> PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource + Accessible<HostAccessible> + Accessible<DeviceAccessible>,
{
    fn with_len(len: usize, resource: R, stream: &Arc<CudaStream>) -> Result<Self, AllocError> {
        let () = AlignmentFits::<T, R>::CHECK;
        let mut buf = RawBuf::allocate(len, resource, stream)?;
        // A suballocator may hand out a block that work queued on the stream still uses (freed on
        // this stream, or ordered after another one): the host writes next, so wait first.
        if buf.bytes() > 0 {
            buf.wait_for_uses()?;
        }
        Ok(PinnedVec {
            buf,
            device_may_write: AtomicBool::new(false),
            device_may_read: AtomicBool::new(false),
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
        self.buf.address()
    }

    /// The number of values, without waiting for the device (as `Deref`'s `len()` would).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when the vector holds no values (without waiting for the device).
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }

    /// Waits, if the device may be writing the memory, for every device write of it queued on
    /// any stream (the vector's stream waits for the last one, then the host for the vector's
    /// stream): what a host read needs (`Deref` does it).
    pub fn synchronize(&self) -> Result<(), AllocError> {
        // The flag is set only through `&mut self`, so no thread sets it while this one holds
        // `&self`: clearing it after the wait forgets nothing, and a reader that sees it clear
        // finds the device work finished, not merely waited for by someone else.
        if self.device_may_write.load(Ordering::Acquire) {
            self.buf.wait_for_writes()?;
            self.device_may_write.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Waits for every device use of the memory, reads included: what a host write needs.
    fn wait_for_all(&mut self) -> Result<(), AllocError> {
        if *self.device_may_write.get_mut() || *self.device_may_read.get_mut() {
            self.buf.wait_for_uses()?;
            *self.device_may_write.get_mut() = false;
            *self.device_may_read.get_mut() = false;
        }
        Ok(())
    }

    /// The values as cells, for host writes (`v.as_cells()[i].set(x)`), after waiting for every
    /// device use of the memory. Cells, not `&mut [T]`: see the module docs.
    pub fn as_cells(&mut self) -> Result<&[Cell<T>], AllocError> {
        self.wait_for_all()?;
        // SAFETY: host-accessible memory (type bound) holding `len` initialized values, which no
        // device work uses any more; `&mut self` makes this the only access while the cells are
        // borrowed, and Cell<T> has T's layout.
        let slice =
            unsafe { std::slice::from_raw_parts_mut(self.buf.ptr().as_ptr(), self.buf.len()) };
        Ok(Cell::from_mut(slice).as_slice_of_cells())
    }

    /// Overwrites the values with `values` (same length), after waiting for every device use.
    pub fn copy_from_slice(&mut self, values: &[T]) -> Result<(), AllocError>
    where
        T: Copy,
    {
        if values.len() != self.buf.len() {
            return Err(super::length_mismatch(
                values.len(),
                self.buf.resource().name(),
            ));
        }
        for (cell, &v) in self.as_cells()?.iter().zip(values) {
            cell.set(v);
        }
        Ok(())
    }

    /// Sets every value to `value`, after waiting for every device use.
    pub fn fill(&mut self, value: T) -> Result<(), AllocError>
    where
        T: Copy,
    {
        for cell in self.as_cells()? {
            cell.set(value);
        }
        Ok(())
    }

    /// For `Deref`, which cannot return an error: the error stays recorded in the CUDA context
    /// (`CudaContext::check_err`), where cudarc keeps the errors of calls that cannot return one,
    /// and the host waits for the whole context instead (a stream capturing a graph refuses
    /// `cuStreamSynchronize`). The flag stays set: the next read waits again.
    ///
    /// # Panics
    ///
    /// When that wait fails too: device work may still be writing the values, and no slice of
    /// them may be read. [`synchronize`](Self::synchronize) returns the error instead.
    fn wait_for_device(&self) {
        if let Err(e) = self.synchronize() {
            if !super::wait_for_context_instead(self.buf.stream(), e) {
                panic!(
                    "PinnedVec: a host read could not wait for the device work that may write \
                     the values ({e}); PinnedVec::synchronize returns this error"
                );
            }
        }
    }

    /// Device work that reads the memory may be queued (a `&` kernel argument, a copy from it, a
    /// slice handed out by `Deref`).
    pub(super) fn touched(&self) {
        self.device_may_read.store(true, Ordering::Release);
    }

    /// Device work that may write the memory is being queued (a `&mut` kernel argument, a copy
    /// into it).
    pub(super) fn touched_mut(&mut self) {
        *self.device_may_write.get_mut() = true;
    }
}

impl<T, R> Deref for PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource + Accessible<HostAccessible> + Accessible<DeviceAccessible>,
{
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.wait_for_device();
        // The slice may be given to cudarc as the source of a copy on the vector's stream (read
        // asynchronously from pinned memory): the next host write waits for that stream.
        self.touched();
        // SAFETY: host-accessible memory (type bound) holding `len` initialized values, with no
        // device work on the stream left to change them.
        unsafe { std::slice::from_raw_parts(self.buf.ptr().as_ptr(), self.buf.len()) }
    }
}

impl<T, R> HostSlice<T> for PinnedVec<T, R>
where
    T: DeviceRepr,
    R: MemoryResource + Accessible<HostAccessible> + Accessible<DeviceAccessible>,
{
    fn len(&self) -> usize {
        self.buf.len()
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [T], SyncOnDrop<'a>) {
        refuse_capture(stream);
        let slice = &**self;
        self.touched();
        // `stream` waits for the device writes of the memory; the guard records the copy that
        // cudarc queues next as a read, which the next host write and the drop wait for.
        let (_, read) = self.buf.order_read(stream, super::ReadBy::Crate);
        (slice, read)
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [T], SyncOnDrop<'a>) {
        refuse_capture(stream);
        // The copy cudarc queues next writes the memory: the host must not read it before the
        // vector's stream has run (the flag), nor may device work still read or write it.
        if let Err(e) = self.wait_for_all() {
            // As in `Deref`: the whole context instead, and no slice while device work may
            // still use the memory.
            if !super::wait_for_context_instead(self.buf.stream(), e) {
                panic!(
                    "PinnedVec: a copy into the vector could not wait for the device work that \
                     may use it ({e})"
                );
            }
        }
        self.touched_mut();
        // SAFETY: host-accessible memory holding `len` values, which no device work uses any
        // more (waited for above); `&mut self` makes this the only access; cudarc hands the slice
        // only to the copy it queues on `stream`, which the guard below records as a write, and
        // the flag makes the next host access wait for that write.
        let slice =
            unsafe { std::slice::from_raw_parts_mut(self.buf.ptr().as_ptr(), self.buf.len()) };
        let (_, written) = self.buf.order_write(stream);
        (slice, written)
    }
}

/// Panics when `stream` is capturing a graph: cudarc's copies are the only users of `HostSlice`,
/// and a captured copy runs when the graph is launched, which may be after the vector is gone
/// (its host memory freed) and which no host read of the vector waits for. (cudarc's own pinned
/// slices have the same hole; a kernel launch in a capture, which may take the vector too, is
/// the caller's `unsafe`.) A status the driver cannot give is no capture: the copy itself then
/// fails with the same error.
fn refuse_capture(stream: &CudaStream) {
    use cudarc::driver::sys::CUstreamCaptureStatus as Status;
    let status = crate::leaf::make_current(stream.context()).and_then(|_current| {
        // SAFETY: a live stream of the context made current above.
        unsafe { cudarc::driver::result::stream::is_capturing(stream.cu_stream()) }
    });
    if let Ok(
        Status::CU_STREAM_CAPTURE_STATUS_ACTIVE | Status::CU_STREAM_CAPTURE_STATUS_INVALIDATED,
    ) = status
    {
        panic!(
            "PinnedVec: a copy to or from the vector on a stream that is capturing a graph would \
             run when the graph is launched, after the vector may be gone; copy outside the \
             capture"
        );
    }
}

cudarc_interop!(PinnedVec, buf where R: MemoryResource + Accessible<HostAccessible> + Accessible<DeviceAccessible>);

static_assertions::assert_impl_all!(PinnedVec<u8, crate::leaf::Pinned>: Send, Sync);
