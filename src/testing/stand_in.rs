//! `DeviceStandIn`: device-accessible by its type, for host-only unit tests of code that needs
//! `Accessible<DeviceAccessible>`; its addresses lie in a range of this process that nothing can
//! ever read or write.

use crate::resource::{
    align_up, check_request, no_stream_work, properties, AllocError, AllocErrorKind,
    MemoryResource, Result,
};
use crate::stream::StreamRef;
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, OnceLock};
use typenum::{B0, B1, U256};

const NAME: &str = "DeviceStandIn";
/// Every range starts at a multiple of this and spans a multiple of it, as CUDA memory does.
const GRANULE: usize = 256;

/// A stand-in for device memory in host-only tests: `DeviceAccessible` by its type (and neither
/// host-accessible nor managed), so that code generic over
/// `R: MemoryResource + Accessible<DeviceAccessible>` can be unit-tested on a machine without a
/// GPU; its memory is never dereferenced, on the host or on a device.
///
/// Each allocation is an address range inside one region of this process's address space that
/// the first allocation reserves with no access at all (`mmap(PROT_NONE)`, up to 1 TiB of
/// addresses and no memory) and that is never given back. Addresses are real and unique: no two
/// live allocations of any stand-ins in the process overlap, no other allocation of the process
/// (host or device) can lie in the region, and freed ranges are reused. Accounting is exact, as
/// [`Simulated`](crate::leaf::Simulated)'s: [`in_use`](Self::in_use), [`peak`](Self::peak),
/// [`live`](Self::live), a [`capacity`](Self::capacity); `deallocate` panics on a pointer that is
/// not live or a size that differs from the allocation's.
///
/// # Safety: why claiming `DeviceAccessible` is sound
///
/// The claim lets safe code hand these addresses to anything that takes device memory: a
/// container, a suballocator, an erased stack, a library's own kernel launches. None of them can
/// reach memory through it:
///
/// * **The host** dereferences only `HostAccessible` memory through safe code (`as_host_slice`,
///   `PinnedVec`, `HostAllocator`, the conformance battery): the stand-in is not, so none of
///   these compile over it. Unsafe code that dereferences it anyway faults; it can read nothing
///   and corrupt nothing.
/// * **A device** reaches host addresses only on HMM or ATS platforms, through the CPU's page
///   tables, which give this region no access: a kernel, a copy or a memset on these addresses
///   fails with a driver error (an illegal address) wherever it runs. Without HMM/ATS no device
///   maps host addresses at all, and under unified addressing no device allocation can lie at an
///   address the host has reserved. A driver that served such a copy on the host would fault on
///   the region as unsafe host code does: a crash, never a read or a write of memory.
/// * **Timing does not matter.** Because no access can succeed while the region is reserved, and
///   it stays reserved for the life of the process, a free that does not wait for device work
///   (the stand-in waits for none, and a container over it does not synchronize on drop: the
///   memory is not host-accessible) cannot let late work reach memory that something else owns.
///
/// A stand-in backed by real host memory (the system allocator) would not be sound: on an HMM
/// machine a memset or a kernel queued on a container over it really writes the block, and the
/// block goes back to the global allocator when the container drops, possibly before that work
/// has run; with a block freed on the default stream there is not even a context to wait for.
/// No memory at all, as `Simulated` hands out, is not enough either: its addresses are made up,
/// and one may be a live host allocation that such a device write would reach.
///
/// # Streams
///
/// It serves the default stream and simulated streams, which are all that host-only tests have.
/// A stream that names real CUDA work (a cudarc stream, a raw or per-thread handle) is refused
/// with [`AllocErrorKind::Unsupported`], so that a container over it fails at once with an error
/// that says why, rather than at its first copy. (A suballocator over it may still hand one of
/// its blocks to a real stream, a pool's first chunk taken on the default stream say; that work
/// fails as above, and is as sound.) `deallocate` takes any stream; `synchronize` and
/// `order_after` return `Ok(())`: no work can use the memory, so there is none to wait for. It
/// keeps no stream alive.
///
/// # Cost
///
/// A mutex and a hash map per stand-in, and a first-fit search under one process-wide mutex over
/// the free ranges of the region: a test resource, not a fast one. The region costs address space
/// only (no memory, no swap); the first allocation reserves it, halving from 1 TiB down to 1 GiB
/// if the process may not reserve that much.
///
/// # Upstream
///
/// None: a leaf. It needs no driver and no GPU. Every range is aligned to `max(align, 256)`, any
/// power of two honoured. Unix only (it reserves with `mmap`); elsewhere every non-empty
/// allocation is refused with [`AllocErrorKind::Unsupported`].
///
/// # Examples
///
/// A library function generic over device memory, unit-tested on the host: it carves one
/// workspace per batch and, when one cannot be had, gives back those it took.
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::testing::DeviceStandIn;
/// use std::ptr::NonNull;
///
/// /// One device workspace of `bytes` per batch, or an error with nothing left allocated.
/// fn workspaces<R: MemoryResource + Accessible<DeviceAccessible>>(
///     mr: &R,
///     batches: &[usize],
/// ) -> Result<Vec<(NonNull<u8>, usize)>, AllocError> {
///     let mut taken = Vec::new();
///     for &bytes in batches {
///         match mr.allocate(bytes, 256, StreamRef::DEFAULT) {
///             Ok(p) => taken.push((p, bytes)),
///             Err(e) => {
///                 for (p, n) in taken {
///                     // SAFETY: p came from mr with this size and alignment, unused.
///                     unsafe { mr.deallocate(p, n, 256, StreamRef::DEFAULT) };
///                 }
///                 return Err(e);
///             }
///         }
///     }
///     Ok(taken)
/// }
///
/// let device = DeviceStandIn::with_capacity(1 << 20);
/// let ws = workspaces(&device, &[1000, 4096]).unwrap();
/// assert_eq!((device.live(), device.in_use()), (2, 5096));
/// assert_eq!(ws[1].0.as_ptr() as usize % 256, 0);
/// # for (p, n) in ws { unsafe { device.deallocate(p, n, 256, StreamRef::DEFAULT) } }
/// // The third batch does not fit: the first two are given back.
/// let err = workspaces(&device, &[512 << 10, 256 << 10, 512 << 10]).unwrap_err();
/// assert!(err.is_out_of_memory());
/// assert_eq!((device.live(), device.in_use(), device.peak()), (0, 0, 768 << 10));
/// ```
///
/// It is device memory to the compiler, and nothing else:
///
/// ```compile_fail,E0277
/// use mrstack::prelude::*;
/// use mrstack::testing::DeviceStandIn;
/// fn host_bytes<R: Accessible<HostAccessible>>(_: &R) {}
/// host_bytes(&DeviceStandIn::new()); // error: does not give HostAccessible memory
/// ```
#[derive(Debug)]
pub struct DeviceStandIn {
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    in_use: usize,
    peak: usize,
    allocations: usize,
    /// Live allocations: address → (requested size, the range's length in the region).
    live: HashMap<usize, (usize, usize)>,
}

impl DeviceStandIn {
    /// A stand-in that allocates until the region is full.
    pub fn new() -> Self {
        Self::with_capacity(usize::MAX)
    }

    /// A stand-in that lets at most `capacity` bytes be allocated at once, so that tests can
    /// reach out-of-memory paths.
    pub fn with_capacity(capacity: usize) -> Self {
        DeviceStandIn {
            capacity,
            state: Mutex::new(State::default()),
        }
    }

    crate::leaf::usage_accessors!();

    /// The region every stand-in's addresses lie in, `(start, length)`, once reserved: for tests
    /// that check where the addresses are.
    pub fn region() -> Option<(usize, usize)> {
        Region::get().map(|r| (r.start, r.len))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under the lock is a few plain stores and one map operation: a poisoned
        // lock still guards consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for DeviceStandIn {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for DeviceStandIn {
    fn drop(&mut self) {
        // Ranges still live go back to the region for other stand-ins: they were never
        // accessible, so whatever still holds their addresses can reach nothing through them.
        if let Some(region) = Region::get() {
            let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
            for (&addr, &(_, len)) in &state.live {
                region.give_back(addr, len);
            }
        }
    }
}

/// True for the streams host-only tests have: the default stream and simulated streams. Every
/// other names a stream on which real CUDA work may be queued.
fn served(stream: StreamRef) -> bool {
    stream.is_simulated() || (stream.is_default() && stream.context().is_none())
}

// SAFETY: claims device access for memory no device and no host code can access; that claim is
// sound because nothing can reach memory through these addresses (the type's docs argue it): each
// lies in a region reserved with no access for the life of the process (never unmapped), which
// therefore holds no other allocation, host or device. What the trait promises besides holds:
// ranges are disjoint while live (one process-wide map of free ranges, each range handed out once
// until given back), aligned to max(align, 256), of at least `size` bytes; no stream-ordered work
// exists to wait for or to order.
unsafe impl MemoryResource for DeviceStandIn {
    properties! { Host = B0, Device = B1, Migratable = B0, Pageable = B0, Alignment = U256 }

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, NAME)? {
            return Ok(empty);
        }
        if !served(stream) {
            return Err(AllocError::new(
                AllocErrorKind::Unsupported(
                    "DeviceStandIn is no device memory: it serves the default and simulated streams of host-only tests, not a CUDA stream",
                ),
                size,
                align,
                NAME,
            ));
        }
        let oom = AllocError::out_of_memory(size, align, NAME);
        let mut s = self.lock();
        if size > self.capacity - s.in_use {
            return Err(oom);
        }
        let region = Region::reserve().ok_or(AllocError::new(
            AllocErrorKind::Unsupported(
                "DeviceStandIn could not reserve its address region (it needs mmap: Unix only)",
            ),
            size,
            align,
            NAME,
        ))?;
        // check_request bounded `size` by isize::MAX less the alignment.
        let len = align_up(size, GRANULE).ok_or(oom)?;
        let addr = region.take(len, align.max(GRANULE)).ok_or(oom)?;
        s.in_use += size;
        s.peak = s.peak.max(s.in_use);
        s.allocations += 1;
        s.live.insert(addr, (size, len));
        // The address inherits the provenance of the region's mapping, exposed when reserved; it
        // is never dereferenced.
        NonNull::new(std::ptr::with_exposed_provenance_mut(addr)).ok_or(oom)
    }

    /// # Panics
    ///
    /// On a pointer that is not live here or a size that differs from the allocation's: the
    /// caller broke `deallocate`'s contract, and a test resource says so loudly.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _: usize, _: StreamRef) {
        if size == 0 {
            return;
        }
        let addr = ptr.as_ptr() as usize;
        let mut s = self.lock();
        match s.live.remove(&addr) {
            Some((n, len)) if n == size => {
                s.in_use -= size;
                if let Some(region) = Region::get() {
                    region.give_back(addr, len);
                }
            }
            Some(entry) => {
                s.live.insert(addr, entry);
                drop(s);
                panic!(
                    "{NAME}: {addr:#x} was allocated with {} bytes, freed with {size}",
                    entry.0
                )
            }
            None => {
                drop(s);
                panic!("{NAME}: {addr:#x} is not a live allocation (double free?)")
            }
        }
    }

    // No work can use the memory: nothing to wait for or to order.
    no_stream_work!(name = NAME);
}

/// The process-wide region of no-access addresses, and its free ranges.
struct Region {
    start: usize,
    len: usize,
    /// Free ranges, start → end, disjoint and not adjacent (neighbours are merged).
    free: Mutex<BTreeMap<usize, usize>>,
}

static REGION: OnceLock<Option<Region>> = OnceLock::new();

impl Region {
    fn get() -> Option<&'static Region> {
        REGION.get().and_then(Option::as_ref)
    }

    fn reserve() -> Option<&'static Region> {
        REGION
            .get_or_init(|| {
                reserve_no_access().map(|(start, len)| Region {
                    start,
                    len,
                    free: Mutex::new(BTreeMap::from([(start, start + len)])),
                })
            })
            .as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, usize>> {
        // Each update is a few map operations that complete before the lock is released.
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The start of `len` free bytes aligned to `align`, first fit; `None` when no range holds
    /// them.
    fn take(&self, len: usize, align: usize) -> Option<usize> {
        let mut free = self.lock();
        let (start, end, addr) = free.iter().find_map(|(&start, &end)| {
            let addr = align_up(start, align)?;
            (addr <= end && end - addr >= len).then_some((start, end, addr))
        })?;
        free.remove(&start);
        if addr > start {
            free.insert(start, addr);
        }
        if addr + len < end {
            free.insert(addr + len, end);
        }
        Some(addr)
    }

    /// Makes `addr..addr + len`, taken before, free again, merged with its free neighbours.
    fn give_back(&self, addr: usize, len: usize) {
        let mut free = self.lock();
        let (mut start, mut end) = (addr, addr + len);
        if let Some((&before, &before_end)) = free.range(..start).next_back() {
            if before_end == start {
                free.remove(&before);
                start = before;
            }
        }
        if let Some(after_end) = free.remove(&end) {
            end = after_end;
        }
        free.insert(start, end);
    }
}

/// Reserves the largest region it can, from 1 TiB down to 1 GiB, with no access: no memory, no
/// swap, and every access (host or device) faults. Returns `(start, length)`; never unmapped.
#[cfg(unix)]
fn reserve_no_access() -> Option<(usize, usize)> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const NO_RESERVE: libc::c_int = libc::MAP_NORESERVE;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    const NO_RESERVE: libc::c_int = 0;
    let mut len = 1usize.checked_shl(40).unwrap_or(1 << 30);
    while len >= 1 << 30 {
        // SAFETY: an anonymous private mapping at an address the kernel picks (no MAP_FIXED), so
        // no existing mapping is touched; it is never unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | NO_RESERVE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            // Exposed, so that the addresses handed out carry the mapping's provenance.
            return Some((p.expose_provenance(), len));
        }
        len /= 2;
    }
    None
}

#[cfg(not(unix))]
fn reserve_no_access() -> Option<(usize, usize)> {
    None
}

static_assertions::assert_impl_all!(DeviceStandIn: Send, Sync, crate::property::Accessible<crate::property::DeviceAccessible>);
static_assertions::assert_not_impl_any!(
    DeviceStandIn: crate::property::Accessible<crate::property::HostAccessible>,
    crate::property::Accessible<crate::property::Migratable>,
    crate::property::Accessible<crate::property::Pageable>
);
