//! Containers and streams: using one container on several streams, views, staging without
//! blocking, growing without a copy, and several GPUs.
//!
//! # Containers on several streams
//!
//! [`DeviceVec`](crate::container::DeviceVec), [`DeviceBox`](crate::container::DeviceBox) and
//! [`PinnedVec`](crate::container::PinnedVec) may be used on several streams. Each carries a cudarc
//! `CudaSlice` whose write event orders every cudarc copy, view and kernel argument on another
//! stream after the writes queued before it, and an event per read on another stream, which every
//! write, the container's drop and a host write wait for (cudarc's one read event keeps only the
//! last reader; [soundness](super::soundness) says why each read has its own).
//!
//! Events are relied on only where cudarc keeps them for the container's whole life: the
//! container is on a stream its context made (`ctx.new_stream()`) and the other stream belongs to
//! the same `CudaContext` object. Anywhere else (a container on the default stream, a stream of
//! another `CudaContext` object or device, or a context whose streams were all dropped since) a
//! copy on another stream also waits for the container's stream and is waited for on the host
//! once queued. So a copy may take `&mut v` on any stream. Kernel arguments (`launch` is `unsafe`)
//! are ordered by cudarc's events alone, as cudarc does not tell an argument which stream launches
//! it: launch on the container's stream, or on a stream of the same context object with the
//! container on a stream that context made. Containers refuse cudarc's per-thread stream (one
//! handle, a different stream on each thread).
//!
//! * **Views**: `v.slice(2..10)?` and `v.slice_mut(..n)?` are `DeviceView` / `DeviceViewMut`,
//!   which every cudarc copy and launch takes, ordered like the container (`Err` for a range
//!   outside it).
//! * **Staging without blocking**: `v.copy_from_async(&pinned)?` and `v.copy_to_async(&mut pinned)?`
//!   queue the copy on `v`'s stream and return (where events hold, as above; elsewhere they wait).
//!   The `PinnedVec` records the copy: its next host access waits for it. `copy_from` / `copy_to`
//!   with a plain slice wait for the copy instead.
//! * **`PinnedVec` waits for the device on the host**: `Deref` (`&v[..]`, `v[0]`, `v.iter()`)
//!   first waits for every device write of it queued so far (on any stream), and a host write
//!   (`as_cells`, `copy_from_slice`, `fill`) for every device use. The wait happens only after
//!   device work was queued on it; `len()` never waits. It hands out `&[T]` for reading and cells
//!   for writing, never `&mut [T]`.
//! * **Growing**: `v.grow_zeroed(n)?` moves a `DeviceVec` into a new allocation of `n` values
//!   (copied on its stream, the new values zero, the old memory freed after the copy), over any
//!   resource. Over a resource that can extend an allocation where it lies
//!   ([`GrowInPlace`](crate::resource::GrowInPlace): `VirtualMemory`, which maps pages after the block, and
//!   `Tlsf`, which takes the free block after it), `v.grow_zeroed_in_place(n)?` grows it with no
//!   copy and the same device address, or returns `false` when the bytes after it are not free on
//!   its stream (TensorRT's `reallocate`, PyTorch's expandable segments). Both come after every
//!   use of the vector so far, on any stream.
//!
//! ```no_run
//! use mrstack::prelude::*;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let ctx = mrstack::cuda_context(0)?;
//!     let (a, b) = (ctx.new_stream()?, ctx.new_stream()?); // streams of one context object
//!     let device = resource_stack![Cuda::new(&ctx)?, Tlsf { initial: 64 MiB }];
//!     let host = resource_stack![Pinned::new(&ctx)?];
//!
//!     let staged = PinnedVec::from_slice(&[1u32, 2, 3, 4], &host, &a)?;
//!     let mut v = DeviceVec::<u32, _>::zeroed(4, &device, &a)?;
//!     v.copy_from_async(&staged)?; // queued on `a`; `staged`'s next host access waits for it
//!
//!     let mut out = vec![0u32; 2];
//!     b.memcpy_dtoh(&v.slice(1..3)?, &mut out)?; // on `b`, after the copy on `a`
//!     assert_eq!(out, [2, 3]);
//!
//!     if !v.grow_zeroed_in_place(1024)? {
//!         v.grow_zeroed(1024)?; // the bytes after it were taken: move it, with a copy
//!     }
//!     assert_eq!(v.to_vec()?[..5], [1, 2, 3, 4, 0]);
//!     Ok(())
//! }
//! ```
//!
//! Growth in place is a property of the resource ([`GrowInPlace`](crate::resource::GrowInPlace)), usable
//! without a container, here over host memory:
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::resource::GrowInPlace;
//!
//! # fn main() -> Result<(), AllocError> {
//! let mr = resource_stack![System::new(), Tlsf { initial: 1 MiB }];
//! let s = StreamRef::DEFAULT;
//! let p = mr.allocate(4096, 256, s)?;
//! // SAFETY: p is a live allocation of 4096 bytes from mr, freed below on the same stream.
//! let grown = unsafe { mr.grow_in_place(p, 4096, 256, 64 * 1024, s)? };
//! assert!(grown); // the rest of the chunk is free after it
//! let size = if grown { 64 * 1024 } else { 4096 };
//! // SAFETY: p came from mr with this alignment; `size` is a size it has had.
//! unsafe { mr.deallocate(p, size, 256, s) };
//! # Ok(()) }
//! ```
//!
//! # Several GPUs
//!
//! A resource's calls (`allocate`, `deallocate`, `synchronize`, `order_after`, and the leaves'
//! constructors over a context you pass) push their own context and pop it after, so a stack of
//! device 1 allocates on device 1 whatever context the thread is on, and leaves that one current.
//! Opening a context ([`cuda_context`](crate::cuda_context), `on_device`, text configs) and the
//! containers' cudarc calls bind the context they use, as cudarc does.
//!
//! * [`enable_peer_access(&ctx, &peer)`](crate::enable_peer_access) (explicit, one direction,
//!   idempotent), `CudaAsync::grant_access(&peer)` and `VirtualMemory::grant_access(&peer)` let
//!   another device use the memory; types do not change (`DeviceAccessible` is the memory's own
//!   device).
//! * Across processes, an `ImportedPool` is opened with a context of the device its pool is on
//!   (another device's is refused: device numbers can differ between processes), and
//!   `ImportedPool::grant_access(&peer)` opens it to the importer's other devices, since an
//!   importer's access is its own, not the exporter's (`is_accessible_from` says which devices
//!   have it).
//! * `DeviceVec::copy_from_device(&other_device_vec)` copies across devices
//!   (`cuMemcpyPeerAsync`: direct where peer access is on, staged by the driver otherwise),
//!   ordered after the writes on the other device.
//! * RMM's log format has no device column, so a log is per device: give each device's stack a
//!   `Logging` of its own; each log replays on its own.
//!
//! `tests/gpu/multi_gpu.rs` checks these on two GPUs: each device's stacks allocate there and
//! leave the thread's context alone; copies between devices, staged and direct, wait for the
//! writes, and the block's next owner waits for them; kernels on device 0 read device 1's `Cuda`,
//! `CudaAsync` and `VirtualMemory` memory once access is granted; the registry under threads on
//! both devices; an imported pool read on the other device; logs of two devices replayed per
//! device. They pass on two H200s of one host, also under compute-sanitizer's memcheck. On one GPU
//! they skip with a line saying so.
