//! `ImportedPool`: the import side of an exportable [`CudaAsync`](crate::leaf::CudaAsync) pool: another
//! process's pool, and the allocations of it that process shares.

use crate::resource::{AllocError, AllocErrorKind};
use cudarc::driver::{result, sys, CudaContext};
use std::sync::Arc;

/// What names one allocation of an exported pool to the processes that imported the pool: the
/// 64 opaque bytes of `cuMemPoolExportPointer`
/// ([`CudaAsync::export_pointer`](crate::leaf::CudaAsync::export_pointer)), to send as bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcPointer([u8; 64]);

impl IpcPointer {
    /// The bytes to send.
    pub fn to_bytes(&self) -> [u8; 64] {
        self.0
    }

    /// The pointer another process sent. Any bytes are accepted here: the driver checks them
    /// when they are imported ([`ImportedPool::import`]).
    pub fn from_bytes(bytes: [u8; 64]) -> Self {
        IpcPointer(bytes)
    }
}

impl std::fmt::Debug for IpcPointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IpcPointer(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…)")
    }
}

/// Another process's memory pool, imported from the file descriptor its
/// [`CudaAsync::export_pool`](crate::leaf::CudaAsync::export_pool) made (PyTorch's and RMM's IPC
/// handles): the allocations that process shares ([`import`](Self::import)) are then mapped here.
///
/// It allocates nothing (the driver allows no allocation from an imported pool), so it is not a
/// `MemoryResource`. Dropping it destroys this process's import of the pool, not the pool. Two
/// imports of one pool may get one handle from the driver: the last of them to drop destroys it,
/// and an allocation is imported once in the process, whichever import asks. A pool this process
/// exported itself (an exportable [`CudaAsync`](crate::leaf::CudaAsync)) is refused, where the driver
/// hands back its handle: that import's drop would destroy the pool under the `CudaAsync`.
///
/// # Devices
///
/// Import with a context of the device the pool is on (as this process numbers it);
/// [`grant_access`](Self::grant_access) then opens it to other devices of this process. Access
/// is per process: what the exporter granted is not inherited.
///
/// # Cost and streams
///
/// An import is a driver call that maps the allocation (microseconds); copies in and out are
/// synchronous (`cuMemcpy`), on no stream of this process: the exporter orders its own work and
/// says when the memory is ready, through whatever channel the two processes share.
///
/// # Examples
///
/// ```no_run
/// use mrstack::leaf::{ImportedPool, IpcPointer};
///
/// /// Reads an allocation another process shares: `fd` is its pool's descriptor and `bytes` what
/// /// its `export_pointer` gave, both sent here (a Unix socket, an inherited descriptor).
/// #[cfg(unix)]
/// fn read_shared(
///     fd: std::os::fd::OwnedFd,
///     bytes: [u8; 64],
/// ) -> Result<Vec<u8>, mrstack::resource::AllocError> {
///     let ctx = mrstack::cuda_context(0)?;
///     let pool = ImportedPool::from_fd(&ctx, fd)?;
///     let mem = pool.import(&IpcPointer::from_bytes(bytes))?;
///     let mut host = vec![0u8; mem.len()];
///     mem.copy_to_host(0, &mut host)?;
///     Ok(host)
/// }
/// ```
#[derive(Debug)]
pub struct ImportedPool {
    ctx: Arc<CudaContext>,
    /// One hold on an entry of [`KNOWN`] as [`Known::Imported`].
    pool: sys::CUmemoryPool,
}

/// What this process holds of a driver pool handle.
#[derive(Debug)]
enum Known {
    /// An exportable [`CudaAsync`](crate::leaf::CudaAsync) of this process made it: an import that
    /// returns it is refused and destroys nothing.
    Own,
    /// Imported, by this many [`ImportedPool`]s (the driver may give several imports of one pool
    /// one handle): the last to drop destroys it.
    Imported(usize),
}

/// The pool handles of this process that imports must know of, and the addresses imported.
#[derive(Debug)]
struct Registry {
    pools: Vec<(usize, Known)>,
    /// Every allocation imported and not freed, through any pool or handle: its address, and the
    /// pool handle and bytes it was imported with. A second import of one allocation is refused
    /// (before the driver is asked, where the same pool and bytes name it), so that no two
    /// `ImportedMemory` free one mapping.
    live: Vec<(sys::CUdeviceptr, usize, [u8; 64])>,
}

/// Imports of pools, and destroys of imported and exportable pools, run under this lock, so that
/// the driver never hands out a handle while it is being destroyed, and a handle is destroyed by
/// its last holder only.
static KNOWN: std::sync::Mutex<Registry> = std::sync::Mutex::new(Registry {
    pools: Vec::new(),
    live: Vec::new(),
});

fn known() -> std::sync::MutexGuard<'static, Registry> {
    // Every update below is one push, retain or count change: the lists behind a poisoned lock
    // are consistent.
    KNOWN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn key(pool: sys::CUmemoryPool) -> usize {
    pool as usize
}

/// Records `pool`, just made exportable by a `CudaAsync` of this process.
pub(crate) fn own_exportable(pool: sys::CUmemoryPool) {
    known().pools.push((key(pool), Known::Own));
}

/// Destroys `pool`, an exportable pool this process made (recorded by [`own_exportable`]), under
/// the lock that imports take.
///
/// # Safety
///
/// `pool` is the caller's own live pool, destroyed once, here; `ctx` is its context, current.
pub(crate) unsafe fn destroy_own(ctx: &CudaContext, pool: sys::CUmemoryPool) {
    let mut known = known();
    known.pools.retain(|(k, _)| *k != key(pool));
    // SAFETY: the caller's pool, destroyed once (the caller's contract); no import can hand its
    // handle out meanwhile (the lock is held).
    ctx.record_err(unsafe { result::mem_pool::destroy(pool) });
}

// SAFETY: a CUmemoryPool handle may be used from any thread; the driver synchronizes it.
unsafe impl Send for ImportedPool {}
// SAFETY: as above: every use is a driver call taking the handle by value.
unsafe impl Sync for ImportedPool {}

const NAME: &str = "ImportedPool";

impl ImportedPool {
    /// Imports the pool another process exported as `fd`, with a context of the device the pool
    /// is on. A descriptor that is not an exported pool is a CUDA error from the driver; a
    /// context of another device is `InvalidArgument` (an imported pool is open to its own
    /// device only, until [`grant_access`](Self::grant_access)).
    #[cfg(unix)]
    pub fn from_fd(ctx: &Arc<CudaContext>, fd: std::os::fd::OwnedFd) -> Result<Self, AllocError> {
        use std::os::fd::AsRawFd;
        let err = |e| AllocError::cuda(e, 0, 0, NAME);
        let _current = crate::leaf::make_current(ctx).map_err(err)?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut known = known();
        // SAFETY: `pool` is a valid place; for POSIX file descriptors the handle is the int
        // itself, passed as a pointer-sized value. The driver checks what the descriptor is.
        unsafe {
            sys::cuMemPoolImportFromShareableHandle(
                &mut pool,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        }
        .result()
        .map_err(err)?;
        // The driver holds what it needs of the descriptor now; `fd` closes here.
        match known.pools.iter_mut().find(|(k, _)| *k == key(pool)) {
            Some((_, Known::Own)) => {
                // This process's own pool, handed back: destroying it here would destroy the
                // `CudaAsync`'s pool under it.
                return Err(AllocError::new(
                    AllocErrorKind::InvalidArgument(
                        "this process exported this pool: allocate and share through its CudaAsync, not an import",
                    ),
                    0,
                    0,
                    NAME,
                ));
            }
            Some((_, Known::Imported(holders))) => *holders += 1,
            None => known.pools.push((key(pool), Known::Imported(1))),
        }
        drop(known);
        // From here the hold is given back on every path (its drop).
        let this = ImportedPool {
            ctx: ctx.clone(),
            pool,
        };
        if this.access_of(ctx)? != sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "the pool is on another device than this context's: import it with a context of its device (device numbers can differ between processes, by CUDA_VISIBLE_DEVICES), then grant_access to others",
                ),
                0,
                0,
                NAME,
            ));
        }
        Ok(this)
    }

    /// Lets kernels and copies on `peer`'s device read and write the pool's memory in this
    /// process (`cuMemPoolSetAccess`, read-write), the allocations imported now and later: an
    /// importer's access is its own, not the exporter's. Idempotent; the pool's own device
    /// always has access. `Unsupported` where the two devices cannot reach each other.
    pub fn grant_access(&self, peer: &CudaContext) -> Result<(), AllocError> {
        crate::leaf::driver::grant_pool_access(self.pool, &self.ctx, peer, NAME)
    }

    /// Whether kernels and copies on `device`'s device may use the pool's memory here: the pool's
    /// own device, and those [`grant_access`](Self::grant_access) opened it to.
    pub fn is_accessible_from(&self, device: &CudaContext) -> Result<bool, AllocError> {
        Ok(self.access_of(device)? == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    }

    /// The pool's access flags for `device`'s device (`cuMemPoolGetAccess`).
    fn access_of(&self, device: &CudaContext) -> Result<sys::CUmemAccess_flags, AllocError> {
        let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        let err = |e| AllocError::cuda(e, 0, 0, NAME);
        let _current = crate::leaf::make_current(&self.ctx).map_err(err)?;
        let mut location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device.cu_device(),
        };
        // SAFETY: valid places for the answer and the location; the pool is live (held by self).
        unsafe { sys::cuMemPoolGetAccess(&mut flags, self.pool, &mut location) }
            .result()
            .map_err(err)?;
        Ok(flags)
    }

    /// Maps the allocation `ptr` names, which the exporting process shared after its allocation
    /// completed. The memory stays mapped until the [`ImportedMemory`] drops, which frees it
    /// here; the exporter must not free it before every importer is done (the CUDA documentation
    /// leaves what happens then undefined: the exporter's `export_pointer` is `unsafe` for that).
    /// A CUDA error for bytes that name no allocation of this pool; `InvalidArgument` for an
    /// allocation imported already and not dropped.
    pub fn import(&self, ptr: &IpcPointer) -> Result<ImportedMemory<'_>, AllocError> {
        let err = |e| AllocError::cuda(e, 0, 0, NAME);
        let _current = crate::leaf::make_current(&self.ctx).map_err(err)?;
        let mut data = sys::CUmemPoolPtrExportData {
            reserved: ptr.to_bytes(),
        };
        let mut address: sys::CUdeviceptr = 0;
        // Under the lock from the import to the record, as the frees are: no other import of the
        // allocation can come between.
        let mut known = known();
        let again = || {
            AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "this allocation is imported already (one ImportedMemory per allocation)",
                ),
                0,
                0,
                NAME,
            )
        };
        let bytes = ptr.to_bytes();
        if (known.live.iter()).any(|&(_, pool, b)| pool == key(self.pool) && b == bytes) {
            // Refused before the driver maps it once more: whether it counts repeated imports
            // is its own business.
            return Err(again());
        }
        // SAFETY: valid places for both; the driver checks the data against the pool.
        unsafe { sys::cuMemPoolImportPointer(&mut address, self.pool, &mut data) }
            .result()
            .map_err(err)?;
        if known.live.iter().any(|&(a, _, _)| a == address) {
            // The same allocation through other bytes or another handle: the mapping is freed
            // once, by the first `ImportedMemory`.
            return Err(again());
        }
        let mut base: sys::CUdeviceptr = 0;
        let mut len: usize = 0;
        // SAFETY: valid places; `address` was just mapped.
        let range = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut len, address) }.result();
        if let Err(e) = range {
            // SAFETY: just imported here, used by nothing, never recorded.
            self.ctx
                .record_err(unsafe { result::memory_free(address) }.map(drop));
            return Err(err(e));
        }
        known.live.push((address, key(self.pool), bytes));
        drop(known);
        Ok(ImportedMemory {
            pool: self,
            address,
            len: len - (address - base) as usize,
        })
    }
}

impl Drop for ImportedPool {
    fn drop(&mut self) {
        let _current = crate::leaf::make_current_or_record(&self.ctx);
        let mut known = known();
        let Some(at) = known.pools.iter().position(|(k, _)| *k == key(self.pool)) else {
            return;
        };
        match &mut known.pools[at].1 {
            Known::Imported(holders) if *holders > 1 => {
                // Another ImportedPool holds the same handle: it destroys it.
                *holders -= 1;
                return;
            }
            Known::Imported(_) => {}
            // A `CudaAsync`'s (never an import's: `from_fd` refuses it): its drop destroys it.
            Known::Own => return,
        }
        known.pools.swap_remove(at);
        // SAFETY: the handle's last holder in this process, so destroyed once, under the lock
        // that imports take (none hands it out meanwhile); every allocation imported through
        // a holder borrowed that holder and was freed before it dropped.
        self.ctx
            .record_err(unsafe { result::mem_pool::destroy(self.pool) });
    }
}

/// Another process's allocation, mapped here by [`ImportedPool::import`]; freed here (not in
/// the exporting process) when dropped.
///
/// Its bytes belong to both processes: the copies here are synchronous driver copies, bounded by
/// the allocation's size as the driver reports it; what the other process does with the bytes
/// meanwhile is theirs to order.
#[derive(Debug)]
pub struct ImportedMemory<'p> {
    pool: &'p ImportedPool,
    address: sys::CUdeviceptr,
    len: usize,
}

impl ImportedMemory<'_> {
    /// The device address of the allocation here (not the exporter's address).
    pub fn device_address(&self) -> u64 {
        self.address
    }

    /// The allocation's size in bytes, as the driver reports it.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty (never: the driver maps no empty allocation).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `host.len()` bytes from `offset` out, waiting for the copy. `Err` where they go
    /// past the allocation's end.
    pub fn copy_to_host(&self, offset: usize, host: &mut [u8]) -> Result<(), AllocError> {
        let at = self.at(offset, host.len())?;
        let n = host.len();
        let err = move |e| AllocError::cuda(e, n, 1, NAME);
        let _current = crate::leaf::make_current(&self.pool.ctx).map_err(err)?;
        // SAFETY: `host.len()` bytes of the mapped allocation (checked) into a live slice; the
        // copy is synchronous.
        unsafe { result::memcpy_dtoh_sync(host, at) }.map_err(err)
    }

    /// Copies `host` in at `offset`, waiting for the copy. `Err` where it goes past the
    /// allocation's end.
    pub fn copy_from_host(&mut self, offset: usize, host: &[u8]) -> Result<(), AllocError> {
        let at = self.at(offset, host.len())?;
        let err = |e| AllocError::cuda(e, host.len(), 1, NAME);
        let _current = crate::leaf::make_current(&self.pool.ctx).map_err(err)?;
        // SAFETY: into `host.len()` bytes of the mapped allocation (checked), from a live slice;
        // the copy is synchronous.
        unsafe { result::memcpy_htod_sync(at, host) }.map_err(err)
    }

    /// The address of `len` bytes at `offset`, or an error where they go past the end.
    fn at(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, AllocError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.address + offset as u64),
            _ => Err(AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "the copy goes past the end of the imported allocation",
                ),
                len,
                1,
                NAME,
            )),
        }
    }
}

impl Drop for ImportedMemory<'_> {
    fn drop(&mut self) {
        let ctx = &self.pool.ctx;
        let _current = crate::leaf::make_current_or_record(ctx);
        // Freed and forgotten under the lock imports take: no import of it comes between.
        let mut known = known();
        // SAFETY: this process's mapping of the allocation, freed once (a second import of it
        // was refused); the copies above were synchronous, so nothing here uses it any more.
        ctx.record_err(unsafe { result::memory_free(self.address) });
        known.live.retain(|&(a, _, _)| a != self.address);
    }
}

static_assertions::assert_impl_all!(ImportedPool: Send, Sync);
static_assertions::assert_impl_all!(IpcPointer: Send, Sync, Copy);
