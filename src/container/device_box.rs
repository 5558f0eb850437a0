//! `DeviceBox<T, R>`: one `T` in device-accessible memory. Requires `R: Accessible<DeviceAccessible>`.
//! A `DeviceVec` of length one underneath, with a value-shaped API.

use super::{cudarc_interop, AlignmentFits, DeviceVec};
use crate::property::{Accessible, DeviceAccessible};
use crate::resource::{AllocError, MemoryResource};
use cudarc::driver::{CudaStream, DeviceRepr};
use std::sync::Arc;

/// One value of `T` in memory from `R`, ordered on one stream, freed on it when dropped.
#[derive(Debug)]
pub struct DeviceBox<T: DeviceRepr, R: MemoryResource> {
    inner: DeviceVec<T, R>,
}

impl<T: DeviceRepr, R: MemoryResource + Accessible<DeviceAccessible>> DeviceBox<T, R> {
    /// `value`, copied to memory from `resource` on `stream`.
    pub fn new(value: T, resource: R, stream: &Arc<CudaStream>) -> Result<Self, AllocError> {
        let () = AlignmentFits::<T, R>::CHECK;
        // SAFETY: the value is written by `set` before the box is handed out.
        let inner = unsafe { DeviceVec::uninit(1, resource, stream) }?;
        let mut b = DeviceBox { inner };
        b.set(value)?;
        Ok(b)
    }

    /// Replaces the value: a copy on the box's stream, waited for (as every `copy_from`), so
    /// that `value` need not outlive the call.
    pub fn set(&mut self, value: T) -> Result<(), AllocError> {
        self.inner.copy_from(std::slice::from_ref(&value))
    }

    /// The value, copied back to the host after the box's stream has run.
    pub fn get(&self) -> Result<T, AllocError>
    where
        T: Default,
    {
        let mut value = T::default();
        self.inner.copy_to(std::slice::from_mut(&mut value))?;
        Ok(value)
    }

    /// The stream the box's memory is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.inner.stream()
    }

    /// The resource the memory came from.
    pub fn resource(&self) -> &R {
        self.inner.resource()
    }

    /// The device address of the value.
    pub fn device_address(&self) -> u64 {
        self.inner.device_address()
    }

    fn touched(&self) {}

    fn touched_mut(&mut self) {}
}

cudarc_interop!(DeviceBox, inner.buf where R: MemoryResource + Accessible<DeviceAccessible>);

static_assertions::assert_impl_all!(DeviceBox<u64, &'static crate::leaf::CudaAsync>: Send, Sync);
