//! Views of a container's values: [`DeviceView`] (`&[T]`-like) and [`DeviceViewMut`]
//! (`&mut [T]`-like), what [`DeviceVec::slice`](crate::container::DeviceVec::slice) and
//! [`DeviceVec::slice_mut`](crate::container::DeviceVec::slice_mut) hand out.
//!
//! They wrap cudarc's `CudaView`/`CudaViewMut` and order their uses as the container orders its
//! own: cudarc's views would rely on its events alone, which its contexts skip in some cases (a
//! stream of another `CudaContext` object, a context whose streams were all dropped), and would
//! keep only the last of several reading streams.

use super::{before_kernel_read, before_kernel_write, order_read_of, order_write_of, Readers};
use crate::resource::{AllocError, AllocErrorKind};
use cudarc::driver::{
    sys, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs,
    PushKernelArg, SyncOnDrop,
};
use std::ops::{Bound, Range, RangeBounds};
use std::sync::Arc;

/// A shared view of some of a container's values: cudarc's copies (`memcpy_dtod`, `clone_dtoh`
/// …) take it as a source and kernels as a `&` argument, on any stream, ordered like the
/// container.
#[derive(Debug)]
pub struct DeviceView<'a, T> {
    view: CudaView<'a, T>,
    readers: &'a Readers,
}

/// A mutable view of some of a container's values: cudarc's copies (`memcpy_htod`,
/// `memset_zeros` …) take it as a destination and kernels as a `&mut` argument, on any stream,
/// ordered like the container.
///
/// There is at most one at a time per container, and no `split_at_mut`: the container's writes
/// are recorded in one event (cudarc's), which stays right only while each write is ordered after
/// the one before. Two mutable views of disjoint ranges, written on two streams at once (two
/// threads, or a guard held across the other's copy), would each record the event over the other,
/// and the drop would wait for one write only.
#[derive(Debug)]
pub struct DeviceViewMut<'a, T> {
    view: CudaViewMut<'a, T>,
    readers: &'a Readers,
}

impl<'a, T> DeviceView<'a, T> {
    pub(crate) fn new(view: CudaView<'a, T>, readers: &'a Readers) -> Self {
        DeviceView { view, readers }
    }

    /// The number of values in the view.
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// True when the view holds no values.
    pub fn is_empty(&self) -> bool {
        self.view.is_empty()
    }

    /// A view of `range` of this view's values; `Err` for a range outside it.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'a, T>, AllocError> {
        let r = view_range(range, self.len())?;
        let view = self
            .view
            .try_slice(r)
            .ok_or_else(|| out_of_range(self.len(), "DeviceView"))?;
        Ok(DeviceView::new(view, self.readers))
    }
}

impl<'a, T> DeviceViewMut<'a, T> {
    pub(crate) fn new(view: CudaViewMut<'a, T>, readers: &'a Readers) -> Self {
        DeviceViewMut { view, readers }
    }

    /// The number of values in the view.
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// True when the view holds no values.
    pub fn is_empty(&self) -> bool {
        self.view.is_empty()
    }

    /// A shared view of the same values, for as long as this one is borrowed.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView::new(self.view.as_view(), self.readers)
    }

    /// A mutable view of `range` of this view's values; `Err` for a range outside it.
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<DeviceViewMut<'_, T>, AllocError> {
        let len = self.len();
        let r = view_range(range, len)?;
        let view = self
            .view
            .try_slice_mut(r)
            .ok_or_else(|| out_of_range(len, "DeviceView"))?;
        Ok(DeviceViewMut::new(view, self.readers))
    }
}

impl<T> DeviceSlice<T> for DeviceView<'_, T> {
    fn len(&self) -> usize {
        self.view.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.view.stream()
    }
}

impl<T> DeviceSlice<T> for DeviceViewMut<'_, T> {
    fn len(&self) -> usize {
        self.view.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.view.stream()
    }
}

impl<T> DevicePtr<T> for DeviceView<'_, T> {
    fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        order_read_of(&self.view, self.readers, stream, super::ReadBy::Cudarc)
    }
}

impl<T> DevicePtr<T> for DeviceViewMut<'_, T> {
    fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        order_read_of(&self.view, self.readers, stream, super::ReadBy::Cudarc)
    }
}

impl<T> DevicePtrMut<T> for DeviceViewMut<'_, T> {
    fn device_ptr_mut<'b>(
        &'b mut self,
        stream: &'b CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        order_write_of(&mut self.view, self.readers, stream)
    }
}

// SAFETY: cudarc's own implementation for `&CudaView`, on the wrapped view, which lives as long
// as the borrow 'b, itself outliving the builder 'a.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b DeviceView<'c, T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b DeviceView<'c, T>) -> &mut Self {
        before_kernel_read(arg.view.stream(), arg.readers);
        self.arg(&arg.view)
    }
}

// SAFETY: cudarc's own implementation for `&mut CudaViewMut`, after the container's stream waited
// for the reads recorded outside cudarc's events (see the container module).
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut DeviceViewMut<'c, T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b mut DeviceViewMut<'c, T>) -> &mut Self {
        before_kernel_write(&mut arg.view, arg.readers);
        self.arg(&mut arg.view)
    }
}

/// `range` as `start..end` within `0..len`, without overflow (cudarc's own range arithmetic adds
/// one to an inclusive bound, which overflows at `usize::MAX`); `None` outside.
pub(crate) fn checked_range(range: impl RangeBounds<usize>, len: usize) -> Option<Range<usize>> {
    let start = match range.start_bound() {
        Bound::Included(&n) => Some(n),
        Bound::Excluded(&n) => n.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&n) => n.checked_add(1),
        Bound::Excluded(&n) => Some(n),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(start), Some(end)) if start <= end && end <= len => Some(start..end),
        _ => None,
    }
}

/// The error for a view range outside a container (or view) of `len` values from `resource`.
pub(crate) fn out_of_range(len: usize, resource: &'static str) -> AllocError {
    AllocError::new(
        AllocErrorKind::InvalidArgument("view range is outside the container's values"),
        len,
        0,
        resource,
    )
}

/// `range` of a view of `len` values as cudarc's range, or the error.
fn view_range(range: impl RangeBounds<usize>, len: usize) -> Result<Range<usize>, AllocError> {
    checked_range(range, len).ok_or_else(|| out_of_range(len, "DeviceView"))
}

#[cfg(test)]
mod tests {
    use super::checked_range;
    use std::ops::Bound;

    #[test]
    fn ranges_never_overflow_and_stay_inside() {
        assert_eq!(checked_range(.., 10), Some(0..10));
        assert_eq!(checked_range(2..=4, 10), Some(2..5));
        assert_eq!(checked_range(10.., 10), Some(10..10));
        assert_eq!(checked_range(..=usize::MAX, 10), None);
        assert_eq!(checked_range(..=usize::MAX, usize::MAX), None);
        let past_max = (Bound::Excluded(usize::MAX), Bound::Unbounded);
        assert_eq!(checked_range(past_max, usize::MAX), None);
        assert_eq!(
            checked_range((Bound::Included(5), Bound::Excluded(4)), 10),
            None
        );
        assert_eq!(checked_range(0..11, 10), None);
        assert_eq!(checked_range(11.., 10), None);
    }
}
