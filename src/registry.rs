//! The per-device current resource, as RMM's `set_per_device_resource` /
//! `get_current_device_resource`: one slot per CUDA device, each holding an
//! [`AnyResource<DeviceAccessible>`](AnyResource), by default a [`Cuda`] resource for that device,
//! created on first use.
//!
//! Cost: a get is a read lock and an `Arc` clone (tens of nanoseconds); set and reset take the
//! slot's write lock. Slots are independent, so threads on different devices never contend.
//! Device ids are checked against [`device_count`]: an id out of range, or no
//! driver at all, is an `Err`, never a panic.
//!
//! Containers take the resource of their stream's device through `*_in_current` constructors
//! ([`DeviceVec::zeroed_in_current`], [`DeviceBox::new_in_current`]), so memory for work on device
//! `d` comes from device `d`'s slot. A resource set for device `d` must allocate on device `d`:
//! the slot cannot check that for a resource of any type.
//!
//! [`DeviceRegistry`] is the mechanism, usable with any property set (a test can fill one with
//! `Simulated` stacks); the free functions use the process-wide one for CUDA devices.

use crate::container::{DeviceBox, DeviceVec};
use crate::erased::{AnyResource, PropertySet};
use crate::leaf::driver::{device_count, driver_available};
use crate::leaf::Cuda;
use crate::property::DeviceAccessible;
use crate::resource::{AllocError, AllocErrorKind};
use cudarc::driver::{CudaStream, DeviceRepr, ValidAsZeroBits};
use std::sync::{Arc, OnceLock, RwLock};

/// The most devices a [`DeviceRegistry`] has slots for: far more than any machine has GPUs (CUDA
/// numbers them with an `i32`, and a node holds tens), few enough that the slots cost little.
pub const MAX_DEVICES: usize = 1 << 16;

/// The resource type the per-device slots hold.
pub type DeviceResource = AnyResource<DeviceAccessible>;

type MakeDefault<P> = dyn Fn(usize) -> Result<AnyResource<P>, AllocError> + Send + Sync;

/// One slot per device, each holding the current resource of that device, thread-safe.
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::erased::AnyResource;
/// use mrstack::registry::DeviceRegistry;
///
/// // Two fake devices whose default resource is a simulated 1 GiB.
/// let reg = DeviceRegistry::<()>::new(2, |_| Ok(AnyResource::new(Simulated::new(1 << 30))))?;
/// let default = reg.get(1).unwrap();
/// let previous = reg.set(1, AnyResource::new(Simulated::new(1 << 20))).unwrap();
/// assert!(previous.unwrap().ptr_eq(&default));
/// assert!(reg.get(2).is_err()); // no device 2
/// # Ok::<(), mrstack::resource::AllocError>(())
/// ```
pub struct DeviceRegistry<P: PropertySet> {
    slots: Box<[RwLock<Option<AnyResource<P>>>]>,
    make_default: Box<MakeDefault<P>>,
}

impl<P: PropertySet> DeviceRegistry<P> {
    /// A registry of `devices` empty slots; the first get of an empty slot stores
    /// `make_default(device)`. The slots (a lock each) are made up front, so that a get never
    /// takes a lock shared by every device: `InvalidArgument` past [`MAX_DEVICES`], out of
    /// memory where the host cannot hold them.
    pub fn new(
        devices: usize,
        make_default: impl Fn(usize) -> Result<AnyResource<P>, AllocError> + Send + Sync + 'static,
    ) -> Result<Self, AllocError> {
        if devices > MAX_DEVICES {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "more devices than a registry holds (mrstack::registry::MAX_DEVICES)",
                ),
                devices,
                0,
                "DeviceRegistry",
            ));
        }
        let mut slots = Vec::new();
        slots.try_reserve_exact(devices).map_err(|_| {
            AllocError::out_of_memory(
                devices.saturating_mul(std::mem::size_of::<RwLock<Option<AnyResource<P>>>>()),
                std::mem::align_of::<RwLock<Option<AnyResource<P>>>>(),
                "DeviceRegistry",
            )
        })?;
        slots.extend((0..devices).map(|_| RwLock::new(None)));
        Ok(DeviceRegistry {
            slots: slots.into_boxed_slice(),
            make_default: Box::new(make_default),
        })
    }

    /// The number of devices (slots).
    pub fn devices(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, device: usize) -> Result<&RwLock<Option<AnyResource<P>>>, AllocError> {
        self.slots.get(device).ok_or(AllocError::new(
            AllocErrorKind::InvalidArgument(
                "device id out of range: ids run from 0 to the device count (mrstack::device_count()) minus one",
            ),
            0,
            0,
            "DeviceRegistry",
        ))
    }

    /// The current resource of `device`, creating the default on first use.
    pub fn get(&self, device: usize) -> Result<AnyResource<P>, AllocError> {
        let slot = self.slot(device)?;
        if let Some(r) = read(slot).as_ref() {
            return Ok(r.clone());
        }
        // Made outside the lock: a slow default (a driver pool) must not block other slots'
        // readers, nor deadlock a default that looks at the registry. Two racing first gets may
        // both make one; the first stored wins and the other is dropped unused.
        let made = (self.make_default)(device)?;
        let mut stored = write(slot);
        if let Some(r) = stored.as_ref() {
            let r = r.clone();
            // The lock goes before the unused default does: its drop may run code of the
            // caller's (a closure a layer holds) that gets from this registry.
            drop(stored);
            drop(made);
            return Ok(r);
        }
        Ok(stored.insert(made).clone())
    }

    /// Makes `resource` the current resource of `device`; returns the previous one (`None` when
    /// the slot held none yet). Memory allocated from the previous resource stays valid: handles
    /// (containers, clones) keep it alive.
    pub fn set(
        &self,
        device: usize,
        resource: AnyResource<P>,
    ) -> Result<Option<AnyResource<P>>, AllocError> {
        Ok(write(self.slot(device)?).replace(resource))
    }

    /// Empties the slot of `device`, so that the next get makes a new default; returns what it
    /// held.
    pub fn reset(&self, device: usize) -> Result<Option<AnyResource<P>>, AllocError> {
        Ok(write(self.slot(device)?).take())
    }
}

impl<P: PropertySet> std::fmt::Debug for DeviceRegistry<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRegistry")
            .field("devices", &self.slots.len())
            .finish_non_exhaustive()
    }
}

// A panic elsewhere cannot leave an Option half-written, so a poisoned lock is still good.
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

/// The process-wide registry of CUDA devices, or why there is none.
fn global() -> Result<&'static DeviceRegistry<DeviceAccessible>, AllocError> {
    if !driver_available() {
        return Err(AllocError::new(
            AllocErrorKind::NoDriver,
            0,
            0,
            "DeviceRegistry",
        ));
    }
    static GLOBAL: OnceLock<DeviceRegistry<DeviceAccessible>> = OnceLock::new();
    if let Some(global) = GLOBAL.get() {
        return Ok(global);
    }
    // Made outside `get_or_init`, which takes no fallible maker: a registry that loses a race
    // to another thread's is dropped empty.
    let made = DeviceRegistry::new(device_count(), |device| {
        Ok(AnyResource::new(Cuda::on_device(device)?))
    })?;
    Ok(GLOBAL.get_or_init(|| made))
}

/// The current resource of CUDA device `device` (a [`Cuda`] resource unless set otherwise).
pub fn per_device_resource(device: usize) -> Result<DeviceResource, AllocError> {
    global()?.get(device)
}

/// Makes `resource` the current resource of CUDA device `device`, returning the previous one.
/// `resource` must allocate on that device.
pub fn set_per_device_resource(
    device: usize,
    resource: DeviceResource,
) -> Result<Option<DeviceResource>, AllocError> {
    global()?.set(device, resource)
}

/// Returns device `device` to its default ([`Cuda`], made on next use), returning what it held.
pub fn reset_per_device_resource(device: usize) -> Result<Option<DeviceResource>, AllocError> {
    global()?.reset(device)
}

/// The ordinal of the device whose context is current on this thread; device 0 when none is
/// (what the CUDA runtime's `cudaGetDevice` answers then).
pub fn current_device() -> Result<usize, AllocError> {
    let err = |e| AllocError::cuda(e, 0, 0, "current_device");
    global()?;
    cudarc::driver::result::init().map_err(err)?;
    if cudarc::driver::result::ctx::get_current()
        .map_err(err)?
        .is_none()
    {
        return Ok(0);
    }
    let mut dev: cudarc::driver::sys::CUdevice = 0;
    // SAFETY: a context is current on this thread (checked above); cuCtxGetDevice writes its
    // device handle into `dev`.
    unsafe { cudarc::driver::sys::cuCtxGetDevice(&mut dev) }
        .result()
        .map_err(err)?;
    (0..device_count())
        .find(|&i| cudarc::driver::result::device::get(i as i32).is_ok_and(|d| d == dev))
        .ok_or(AllocError::new(
            AllocErrorKind::InvalidArgument("the current context's device is not a visible device"),
            0,
            0,
            "current_device",
        ))
}

/// The current resource of the device whose context is current on this thread
/// (RMM's `get_current_device_resource`).
pub fn current_device_resource() -> Result<DeviceResource, AllocError> {
    per_device_resource(current_device()?)
}

/// Sets the current resource of the device whose context is current on this thread, returning
/// the previous one (RMM's `set_current_device_resource`).
pub fn set_current_device_resource(
    resource: DeviceResource,
) -> Result<Option<DeviceResource>, AllocError> {
    set_per_device_resource(current_device()?, resource)
}

/// Returns the current device to its default resource, returning what it held.
pub fn reset_current_device_resource() -> Result<Option<DeviceResource>, AllocError> {
    reset_per_device_resource(current_device()?)
}

impl<T: DeviceRepr> DeviceVec<T, DeviceResource> {
    /// `len` zeroed values from the current resource of `stream`'s device.
    pub fn zeroed_in_current(len: usize, stream: &Arc<CudaStream>) -> Result<Self, AllocError>
    where
        T: ValidAsZeroBits,
    {
        Self::zeroed(
            len,
            per_device_resource(stream.context().ordinal())?,
            stream,
        )
    }

    /// A copy of `host` in memory from the current resource of `stream`'s device.
    pub fn from_slice_in_current(host: &[T], stream: &Arc<CudaStream>) -> Result<Self, AllocError> {
        Self::from_slice(
            host,
            per_device_resource(stream.context().ordinal())?,
            stream,
        )
    }

    /// Room for `len` values from the current resource of `stream`'s device, not initialized.
    ///
    /// # Safety
    ///
    /// As for [`DeviceVec::uninit`]: write every value before reading it.
    pub unsafe fn uninit_in_current(
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<Self, AllocError> {
        let resource = per_device_resource(stream.context().ordinal())?;
        // SAFETY: forwarded from the caller.
        unsafe { Self::uninit(len, resource, stream) }
    }
}

impl<T: DeviceRepr> DeviceBox<T, DeviceResource> {
    /// `value` in memory from the current resource of `stream`'s device.
    pub fn new_in_current(value: T, stream: &Arc<CudaStream>) -> Result<Self, AllocError> {
        Self::new(
            value,
            per_device_resource(stream.context().ordinal())?,
            stream,
        )
    }
}

static_assertions::assert_impl_all!(DeviceRegistry<DeviceAccessible>: Send, Sync);
static_assertions::assert_impl_all!(DeviceRegistry<()>: Send, Sync);
