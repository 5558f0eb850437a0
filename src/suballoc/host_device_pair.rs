//! `HostDevicePair`: one allocator with a pool of pinned host memory and a pool of device memory,
//! each with its own initial and maximum size (Holoscan's `RMMAllocator`).

use super::pool::{Pool, PoolConfig};
use crate::leaf::{Cuda, Pinned};
use crate::property::{Accessible, DeviceAccessible, HostAccessible};
use crate::resource::{AllocError, MemoryResource, Result};
use crate::stream::StreamRef;
use cudarc::driver::CudaContext;
use std::ptr::NonNull;
use std::sync::Arc;

/// The sizes of a [`HostDevicePair`]'s two pools (Holoscan's `RMMAllocator` parameters
/// `host_memory_initial_size`, `host_memory_max_size`, `device_memory_initial_size`,
/// `device_memory_max_size`). Defaults: nothing up front, no cap.
#[derive(Debug, Clone, Default)]
pub struct HostDevicePairConfig {
    /// The host pool: pinned memory, reachable from host and device.
    pub host: PoolConfig,
    /// The device pool.
    pub device: PoolConfig,
}

/// Which memory a request of [`HostDevicePair::allocate`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// Pinned host memory (host- and device-accessible).
    Host,
    /// Device memory.
    Device,
}

/// One allocator serving host-pinned and device requests from two pools, as Holoscan's
/// `RMMAllocator`: a [`Pool`] over [`Pinned`] and a [`Pool`] over [`Cuda`] (or any two upstreams,
/// [`from_parts`](Self::from_parts)), each with its own initial and maximum size.
///
/// A container asks for the memory it needs through the typed side, and gets that side's
/// properties in its type: `PinnedVec::zeroed(n, pair.host(), &stream)` is pinned
/// (host + device), `DeviceVec::zeroed(n, pair.device(), &stream)` device memory, and a
/// `DeviceVec` over `pair.host()` is host-readable too. Code that chooses at run time (a C
/// caller, a framework's storage-type flag) calls [`allocate`](Self::allocate) with a
/// [`Storage`] and frees with the same one.
///
/// # Cost
///
/// Each side costs what its pool costs; choosing the side is a branch.
///
/// # Streams
///
/// Each pool's: free blocks are reused on their stream, and handed to another after
/// `order_after`.
///
/// # Upstream
///
/// The pinned and device leaves of one context ([`new`](Self::new)), or any host-and-device and
/// device resources ([`from_parts`](Self::from_parts)). Both pools give their memory back when
/// the pair drops.
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
/// use mrstack::suballoc::{HostDevicePair, HostDevicePairConfig, PoolConfig};
///
/// # fn main() -> Result<(), AllocError> {
/// let ctx = mrstack::cuda_context(0)?;
/// let pair = HostDevicePair::new(&ctx, HostDevicePairConfig {
///     host: PoolConfig { initial: 64 << 20, max: 256 << 20 },
///     device: PoolConfig { initial: 1 << 30, max: 8 << 30 },
/// })?;
/// let stream = ctx.new_stream().expect("a stream");
/// let staging = PinnedVec::<f32, _>::zeroed(1 << 20, pair.host(), &stream)?;
/// let mut data = DeviceVec::<f32, _>::zeroed(1 << 20, pair.device(), &stream)?;
/// data.copy_from_async(&staging)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct HostDevicePair<H: MemoryResource, D: MemoryResource> {
    host: Pool<H>,
    device: Pool<D>,
}

impl HostDevicePair<Pinned, Cuda> {
    /// A pool of pinned memory and a pool of device memory of `ctx`, sized by `config` (each
    /// pool's `initial` taken at once, where it fits its `max`).
    pub fn new(ctx: &Arc<CudaContext>, config: HostDevicePairConfig) -> Result<Self> {
        Ok(Self::from_parts(Pinned::new(ctx)?, Cuda::new(ctx)?, config))
    }
}

impl<H, D> HostDevicePair<H, D>
where
    H: MemoryResource + Accessible<(HostAccessible, DeviceAccessible)>,
    D: MemoryResource + Accessible<DeviceAccessible>,
{
    /// The two pools over `host` and `device`.
    pub fn from_parts(host: H, device: D, config: HostDevicePairConfig) -> Self {
        HostDevicePair {
            host: Pool::new(host, config.host),
            device: Pool::new(device, config.device),
        }
    }

    /// The host side: pinned memory, for `PinnedVec` and host-readable `DeviceVec`s.
    pub fn host(&self) -> &Pool<H> {
        &self.host
    }

    /// The device side, for `DeviceVec` and `DeviceBox`.
    pub fn device(&self) -> &Pool<D> {
        &self.device
    }

    /// Allocates `size` bytes of the memory `storage` names, for use on `stream`: the choice at
    /// run time. The pointer is device-accessible either way, and host-accessible for
    /// [`Storage::Host`].
    pub fn allocate(
        &self,
        storage: Storage,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        match storage {
            Storage::Host => self.host.allocate(size, align, stream),
            Storage::Device => self.device.allocate(size, align, stream),
        }
    }

    /// Gives back what [`allocate`](Self::allocate) gave.
    ///
    /// # Safety
    ///
    /// `ptr` came from `allocate` on this pair with the same `storage`, `size` and `align`, and
    /// was not deallocated since; the work on `stream` is the last to use it.
    pub unsafe fn deallocate(
        &self,
        storage: Storage,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) {
        // SAFETY: the caller's promise: the pointer is that side's, with these arguments.
        unsafe {
            match storage {
                Storage::Host => self.host.deallocate(ptr, size, align, stream),
                Storage::Device => self.device.deallocate(ptr, size, align, stream),
            }
        }
    }
}

static_assertions::assert_impl_all!(HostDevicePair<Pinned, Cuda>: Send, Sync);
static_assertions::assert_impl_all!(
    Pool<Pinned>: Accessible<(HostAccessible, DeviceAccessible)>
);
static_assertions::assert_not_impl_any!(Pool<Cuda>: Accessible<HostAccessible>);
