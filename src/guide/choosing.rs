//! Which stack to build: where to start, and every resource mrstack has.
//!
//! # Where to start
//!
//! * **`paged`** (`PagedHeaps::for_context(&ctx)?`): the stack to start with, and the C library's
//!   default. Physical pages only under live blocks, a heap per stream and per thread; free pages
//!   stay mapped for the next blocks within the peak of live pages and a 64th, and every heap
//!   gives its own back when memory runs short. PyTorch's GPT training on it held 1.017 ×
//!   `max_memory_allocated` at native speed ([performance](super::performance)). Its pages are
//!   the device's 2 MiB granule: a kernel that streams memory at full bandwidth (a 2 GiB copy)
//!   runs 2–9% slower on them than on `cudaMalloc`'s memory, and as fast on 16 MiB pages
//!   (`paged(page=16MiB)`, [`DevicePages::with_page_size`](crate::leaf::DevicePages::with_page_size)),
//!   which held 1.027 × for the GPT where 2 MiB pages held 1.017 ×. Larger pages also move
//!   memory for the bound for less: a page costs the same to move whatever its size.
//! * **`cuda > pool > binning`** (`resource_stack![Cuda::new(&ctx)?, Pool, Binning]`) where memory
//!   is plentiful: `Binning` serves small requests from per-thread caches and fixed-size bins;
//!   larger ones and the bins' refills come from the `Pool`.
//! * **`vmm`** (`VirtualMemory::new(DevicePages::new(&ctx)?, config)`) where device memory is
//!   tight: it maps physical pages only under live blocks, so it needs the least memory of the
//!   stacks here on every trace measured (within 1.003–1.024 × the peak live bytes, see
//!   [performance](super::performance)); on one thread it is slower than `binning` and `tlsf`,
//!   faster than `pool`.
//! * **`ThreadHeaps`** where many threads allocate and free their own blocks, **`Arena`** where
//!   they free each other's.
//! * For your own workload, record it with `Logging` and let `mrstack replay` choose
//!   ([replay](super::replay)): it prints the stack and its capacity, ready to paste.
//!
//! # Leaves
//!
//! The bottom of a stack ([`leaf`](crate::leaf)):
//!
//! | leaf | memory | properties |
//! |---|---|---|
//! | `Cuda` | `cuMemAlloc` / `cuMemFree` | device |
//! | `CudaAsync` | its own `cuMemPool`, `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` | device, stream-ordered |
//! | `Managed` | `cuMemAllocManaged`; refuses a device without concurrent managed access (the host could not touch the memory while kernels run) | host + device + migratable |
//! | `Pinned` | `cuMemHostAlloc` (portable, device-mapped) | host + device |
//! | `System` | Rust's global allocator | host (pageable) |
//! | `Simulated` | address ranges, no memory, exact accounting; a page model for `VirtualMemory` (2 MiB pages by default, mapped bytes count against the capacity) | none (tests, replay without a GPU) |
//! | `VirtualMemory<P>` (`VirtualMemory::new(DevicePages::new(&ctx)?, config)`, text `vmm(device=0)`) | blocks of a reserved virtual range, physical pages mapped (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`) only under live blocks; free pages stay mapped (up to `cache` bytes, default unbounded) until pressure or `release()`; grows a block in place (`GrowInPlace`); `grant_access(&peer_ctx)` for another GPU | those of its page source: device for `DevicePages`, none for `Simulated` |
//! | `PagedHeaps<P>` (`PagedHeaps::for_context(&ctx)?`, text `paged(device=0)`) | `VirtualMemory` heaps over one page source, one per stream and one per thread: a request goes to its stream's heap, waiting where another thread holds it, or, where more than four threads meet there, to the thread's own; each heap's mapped pages stay within the peak of its live pages and a 64th (`peak_slack`): a block needing new pages beyond it first unmaps free pages whose freeing streams' events are reached, never waiting; every free page goes back when memory runs short (every heap's, before a request fails) or on `release()` | those of its page source |
//! | `CudaAsyncView` (`default_pool(&ctx)`, safe; `unsafe from_handle(&ctx, pool)`; text `cuda_async_view`) | a `cuMemPool` someone else owns: the device's default pool (what `cuMemAllocAsync` uses), or a library's; never destroyed or changed (RMM's `cuda_async_view_memory_resource`) | device, stream-ordered |
//! | `CudaAsyncManaged` (text `cuda_async_managed`) | the device's default managed-memory pool (`cuMemGetDefaultMemPool(…, MANAGED)`, CUDA 13), `cuMemAllocFromPoolAsync` / `cuMemFreeAsync`; refused without concurrent managed access | host + device + migratable, stream-ordered |
//! | `CudaAsync` with `exportable: true` (text `cuda_async(exportable=true)`) | a pool other processes import: `export_pool()` gives a POSIX file descriptor, `unsafe export_pointer(p)` the 64 bytes naming one allocation; `ImportedPool::from_fd` and `import` map it in the other process, with bounded copies in and out | device |
//! | `SamHeadroom` (`SamHeadroom::new(&ctx, headroom)`, text `sam_headroom(headroom=…)`) | system memory (`std::alloc`, whole pages) that the GPU reaches on HMM/ATS platforms, advised to prefer the GPU up to its free memory minus `headroom`, the CPU past it (RMM's `sam_headroom_memory_resource`); refused with the reason where `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS` is 0, as on the H100 hosts this project tests on | host + device + migratable |
//! | `Callback` | a foreign allocator: you provide the functions and a context, and state the properties at the type level | as stated |
//!
//! # Suballocators and adaptors
//!
//! Each wraps the resource above it in `resource_stack!` and keeps that resource's properties,
//! unless the table says otherwise. Suballocators ([`suballoc`](crate::suballoc)) own memory:
//! they take chunks from their upstream, keep free lists per stream, guarantee 256-byte alignment
//! and report their [`Usage`](crate::suballoc::Usage). Adaptors ([`adaptor`](crate::adaptor))
//! hand out their upstream's memory unchanged and watch, cap or reshape requests.
//!
//! | layer | what it does |
//! |---|---|
//! | `Pool { initial, max }` | Coalescing best-fit suballocator, O(log n) per operation, stream-ordered like RMM's pool. It grows from upstream up to `max`. |
//! | `Tlsf { initial, max }` | Coalescing good fit in O(1): two-level segregated fit (32 classes per power of two, bitmaps searched with bit scans), free blocks per stream, the same growth rule as `Pool`. Within a few percent of `Pool`'s footprint, and faster than `Pool` on most traces ([performance](super::performance)). |
//! | `FixedSize { block_size, blocks_to_preallocate }` | Blocks of one size kept on a free list (default: 128 blocks of 1 MiB, grows by 128). |
//! | `Binning { min, max }` | Power-of-two bins from `min` to `max`, each a fixed-size free list, with a cache per thread in front. Larger requests go upstream. |
//! | `Binning` + `with_bin(size, resource)` (text `binning(bins="64 KiB = cuda_async")`) | One bin's requests served by a resource of your choice (RMM's `add_bin`: a `FixedSize` slab, a `CudaAsync` pool) with the upstream's very properties (a resource of other properties is a compile error naming both); the other bins as before. |
//! | `Arena { size }` | A global arena plus per-thread and per-stream arenas that take superblocks from it, so it scales with threads. |
//! | `ThreadHeaps { max }` | A `Tlsf` heap per thread (the first 64 live threads get one each, later ones share one), all taking their chunks from one shared `Tlsf` of at most `max` over the upstream: a thread allocates from its own heap and a free goes back to the heap its block came from, so threads that free what they allocate take no lock another thread takes. Chunks a heap gives up (when the shared pool runs short) go back to the shared pool, where another heap takes them with no upstream call. The heaps together need about the sum of the threads' peaks. The stack for many threads. |
//! | `ThreadCache { bytes, max_block }` | A cache per thread in front of any upstream, for every size up to `max_block` (default 16 MiB): a block a thread frees serves that thread's next request of its size class (8 per power of two, so at most 1/8 larger) on the same stream, with no shared lock. Overflow goes to a shared list per class, then to the upstream; all caches together keep at most `bytes` (default 256 MiB). Over `Tlsf` or `Pool`, for threads that free each other's blocks. |
//! | `Statistics` | Current, peak and total bytes and counts, in per-thread shards (no locked instruction per call). Also `reset_peak()` and nested scopes. |
//! | `Tracking { backtraces }` | Records every live allocation and gives a leak report (on demand and on drop). Double frees and unknown frees are caught and reported instead of being passed on. Its table is striped over 16 locks. |
//! | `Logging { to }` | One CSV line per event in RMM's format (`Thread,Time,Action,Pointer,Size,Stream`), ready for `mrstack replay`. A writer thread of its own does the formatting; no line is lost, and each thread's lines stay in order. |
//! | `Limiting { limit }` | A byte cap, reserved per thread a chunk at a time. Past it you get `Err(LimitExceeded { limit, in_use })`. |
//! | `Aligned<A>` | Larger alignment at the type level: `Alignment = Maximum<A, upstream>`, so containers of over-aligned `T` compile only on a stack that guarantees it. |
//! | `Retry` (`Retry::new(upstream, f)`) | When an allocation fails, it calls `f` (to free a cache, trim a pool) and tries again while `f` says so. `f` may call into the resources above it (free through them, `release` them): the suballocators let their locks go while their upstream allocates, and a thread that finds no room while another grows waits for that growth. |
//! | `Prefetch { device }` | Prefetches each allocation to the device on its stream. It compiles only over managed (`Migratable`) memory. |
//! | `GraphPools` | Allocations made while their stream captures a CUDA graph come from a pool private to that capture, kept until the graph is dropped (PyTorch's graph pools): replays never see their memory handed out, and a free during the capture hands nothing to work outside it. `mr.capture(&stream, mode, reserve, \|\| …)` returns a `CapturedGraph` that borrows the resource and gives the memory back when dropped. Outside captures every call is the upstream's. |
//! | `HostDevicePair` (`HostDevicePair::new(&ctx, HostDevicePairConfig { host, device })`) | A pool of pinned memory and a pool of device memory, each with its own initial and maximum size (Holoscan's `RMMAllocator`). `pair.host()` and `pair.device()` are typed, so a `PinnedVec` over the device side does not compile; `pair.allocate(Storage::Host \| Storage::Device, …)` chooses at run time. Not a text config: it is two stacks. |
//!
//! Rules that hold for every resource: alignment must be a power of two (otherwise you get
//! `Err(InvalidArgument)`), and a size that overflows once aligned is also
//! `Err(InvalidArgument)`. Size 0 returns a dangling pointer with the requested alignment and makes
//! no upstream call. Nothing panics on a failed allocation.
//!
//! ```
//! use mrstack::prelude::*;
//!
//! # fn main() -> Result<(), AllocError> {
//! let gpu = Simulated::new(1 << 30);
//! let mr = resource_stack![&gpu, Pool { initial: 64 MiB }, Binning, Statistics];
//! let p = mr.allocate(1000, 256, StreamRef::DEFAULT)?;
//! assert_eq!(p.as_ptr() as usize % 256, 0);
//! // SAFETY: p came from mr with this size and alignment.
//! unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
//!
//! assert!(mr.allocate(8, 3, StreamRef::DEFAULT).is_err()); // not a power of two
//! assert!(mr.allocate(usize::MAX, 1, StreamRef::DEFAULT).is_err()); // overflows once aligned
//! let empty = mr.allocate(0, 64, StreamRef::DEFAULT)?; // no upstream call
//! assert_eq!(empty.as_ptr() as usize % 64, 0);
//! // SAFETY: as above.
//! unsafe { mr.deallocate(empty, 0, 64, StreamRef::DEFAULT) };
//! # Ok(()) }
//! ```
//!
//! # Many layers in one stack
//!
//! ```no_run
//! use mrstack::prelude::*;
//! use mrstack::{adaptor::{Statistics, Tracking}, stack::Reach};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let ctx = mrstack::cuda_context(0)?;
//!     let stream = ctx.default_stream();
//!     let mr = resource_stack![
//!         Cuda::new(&ctx)?,
//!         Pool { initial: 1 GiB, max: 8 GiB },
//!         Binning { min: 256 B, max: 1 MiB },
//!         Limiting { limit: 6 GiB },
//!         Tracking,
//!         Statistics,
//!         Logging { to: Box::new(std::fs::File::create("alloc.csv")?) },
//!     ];  // : Logging<Statistics<Tracking<Limiting<Binning<Pool<Cuda>>>>>>
//!     println!("{}", mr.describe()); // cuda(device=0) > pool(initial=1 GiB, max=8 GiB) > … > logging
//!     let v = DeviceVec::<f32, _>::zeroed(1 << 20, &mr, &stream)?;
//!     println!("peak {} bytes", mr.reach::<Statistics<_>, _>().stats().bytes.peak);
//!     drop(v);
//!     let tracking: &Tracking<_> = mr.reach();
//!     assert_eq!(tracking.outstanding_count(), 0); // nothing leaked
//!     Ok(())
//! }
//! ```
//!
//! # A library function over any resource
//!
//! Bound the resource type by the properties you need; `&R`, `Arc<R>` and adaptors over `R` then
//! have them too, so the function can hand `&R` (or `Statistics<&R>`) to a container. Write one
//! bound per property (`Accessible<HostAccessible> + Accessible<DeviceAccessible>` for a
//! `PinnedVec`):
//!
//! ```no_run
//! use mrstack::cudarc::driver::CudaStream;
//! use mrstack::prelude::*;
//! use std::sync::Arc;
//!
//! /// `data` in memory from `mr`, for kernels on `stream`.
//! pub fn upload<'a, R>(
//!     mr: &'a R,
//!     data: &[f32],
//!     stream: &Arc<CudaStream>,
//! ) -> Result<DeviceVec<f32, &'a R>, AllocError>
//! where
//!     R: MemoryResource + Accessible<DeviceAccessible>,
//! {
//!     DeviceVec::from_slice(data, mr, stream)
//! }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let ctx = mrstack::cuda_context(0)?;
//!     let stream = ctx.default_stream();
//!     let pool = resource_stack![Cuda::new(&ctx)?, Pool { initial: 64 MiB }];
//!     let v = upload(&pool, &[1.0, 2.0, 3.0], &stream)?;
//!     assert_eq!(v.to_vec()?, [1.0, 2.0, 3.0]);
//!     Ok(())
//! }
//! ```
//!
//! A function over host memory takes `R: Accessible<Pageable>` and runs over `System`:
//!
//! ```
//! use mrstack::prelude::*;
//!
//! fn scratch<R: MemoryResource + Accessible<Pageable>>(mr: &R) -> Result<(), AllocError> {
//!     let p = mr.allocate(4096, 64, StreamRef::DEFAULT)?;
//!     // SAFETY: pageable host memory of 4096 bytes, just allocated.
//!     unsafe { p.as_ptr().write_bytes(0, 4096) };
//!     // SAFETY: p came from mr with this size and alignment.
//!     unsafe { mr.deallocate(p, 4096, 64, StreamRef::DEFAULT) };
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), AllocError> {
//! scratch(&System::new())?;
//! scratch(&resource_stack![System::new(), Tlsf { initial: 1 MiB }, Statistics])?;
//! # Ok(()) }
//! ```
