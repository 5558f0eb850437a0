//! Soundness: the rules every safe function keeps, and the holes still open.
//!
//! Every safe function is meant to be sound for any safe caller, including one who implements the
//! public traits for their own types.
//!
//! # The rules
//!
//! * A property comes only from the bits of an `unsafe impl MemoryResource`.
//!   [`Accessible`](crate::property::Accessible) and [`PropertySet`](crate::property::PropertySet) are sealed, and
//!   run-time `Properties` are derived from the type-level bits.
//! * `synchronize` and `order_after` have no default: an adaptor says what it does with stream
//!   order, usually forwarding it, and cannot forget it.
//! * A [`StreamRef<'a>`](crate::stream::StreamRef) borrows its stream, so safe code cannot hand a resource
//!   a dropped stream. A suballocator keeps alive every stream it keys a free list or a chunk by
//!   (until it is dropped): a block freed on a stream whose owner has dropped it is still ordered
//!   after that stream's work when another stream takes it, and no new stream can get the same
//!   handle meanwhile. Stream identity is not the handle value alone: a context's default stream
//!   carries its context, and cudarc's per-thread stream (one handle, a different stream on each
//!   thread) carries the thread that named it; another thread's per-thread stream is waited for
//!   through its whole context. Containers refuse the per-thread handle. Replays without a GPU use
//!   `StreamRef::simulated(n)`, on which `CudaAsync` refuses to allocate; ordering one after a real
//!   stream waits for it.
//! * No safe path yields a `&mut` into memory that a DMA may write behind Rust's back.
//!   [`HostAllocator<R>`](crate::container::HostAllocator) (an `allocator_api2` allocator) takes only pageable
//!   host memory (`R: Accessible<Pageable>`), never pinned or managed memory: cudarc copies into a
//!   `&mut [T]` of such memory asynchronously, and a `Vec` dropped after that would free memory a
//!   DMA still writes. `PinnedVec` hands out `&[T]` for reading and cells for writing.
//! * A container used on another stream than its own is ordered: through its cudarc events where
//!   cudarc keeps them for the container's whole life (the container's stream made by its context,
//!   the other stream of the same context object), one read event per reading stream; everywhere
//!   else the use waits for the container's stream and the host waits for the use. Its drop makes
//!   its stream wait for every such use before the memory goes back. Kernel launches stay `unsafe`
//!   in cudarc: a kernel argument on another context object's stream cannot be ordered (cudarc
//!   does not tell an argument its launch stream).
//! * A container forgotten with `mem::forget` leaves its block allocated; a suballocator dropped
//!   while a block is still allocated leaks that chunk rather than give back memory that queued
//!   device work may still write. Leaking is safe; freeing under a running copy is not.
//! * Where a suballocator can neither order a stream after another nor wait for it (both calls
//!   fail), it leaks the memory rather than hand it to another stream: a block freed into an
//!   arena, a chunk at a drop. Where an upstream panics in the middle of a call, the arena puts
//!   back the block or superblocks it was ordering, and `Limiting` its reservation, before the
//!   panic goes on.
//!
//! The compiler refuses memory that does not fit:
//!
//! ```compile_fail,E0277
//! use mrstack::prelude::*;
//! # fn f(stream: &std::sync::Arc<cudarc::driver::CudaStream>) {
//! // error: `System` does not give DeviceAccessible memory
//! let v = DeviceVec::<f32, _>::zeroed(10, System::new(), stream);
//! # }
//! ```
//!
//! and a pageable host resource serves `allocator_api2` collections:
//!
//! ```
//! use mrstack::allocator_api2::vec::Vec;
//! use mrstack::prelude::*;
//! use mrstack::container::HostAllocator;
//!
//! let pool = resource_stack![System::new(), Pool { initial: 1 MiB }];
//! let mut v = Vec::new_in(HostAllocator::new(&pool));
//! v.extend([1u64, 2, 3]);
//! assert_eq!(v.iter().sum::<u64>(), 6);
//! ```
//!
//! # Uses on other streams, and guards handed to the caller
//!
//! A guard that `DevicePtr::device_ptr` or `DevicePtrMut::device_ptr_mut` returns hands its event
//! to the caller (`SyncOnDrop::Record`'s fields are public, and `CudaEvent::record` is safe), and
//! cudarc skips a guard's record when an error sits in the event's context
//! (`CudaContext::record_err` is safe, from any thread). So that neither lets a container be freed
//! under a read or a write on another stream:
//!
//! * Each read or write on another stream gets an event made through a `CudaContext` object made
//!   for it alone (same primary context). Only the caller who took that guard out by hand can touch
//!   it, and it orders nothing but that caller's own use of the pointer.
//! * The waits on these events are raw driver calls, which read no error slot.
//! * A container keeps at most 64 read events between exclusive uses (a write, a host access, the
//!   drop). Past that, and where no event can be made, the next exclusive use waits for the use's
//!   context on the host.
//! * A write on another stream is not recorded in cudarc's write event (whose guard the caller
//!   could reach). The container's next use of any kind (a copy, a view, a kernel argument, a host
//!   access, the drop) first makes the container's stream wait for the write's own event, then
//!   records cudarc's write event there, so copies and kernels that wait for cudarc's event still
//!   come after the write.
//! * Reads on the container's own stream record nothing. A write on another stream first waits for
//!   that stream.
//! * Every exclusive use also waits for cudarc's own read and write events by raw calls (cudarc's
//!   waits in `leak` and `device_ptr_mut` read the context's error slot). A host read waits for the
//!   contexts of writes that no event records (a stream of another `CudaContext` object), whose
//!   guard's host wait an error can skip.
//!
//! The GPU tests of `tests/gpu/hostile.rs` (`a_reader_event_re_recorded_elsewhere_…`,
//! `an_error_recorded_before_a_read_guard_drops_…`, `reads_past_the_event_bound_…`,
//! `a_writer_event_re_recorded_elsewhere_…`, `an_error_recorded_before_a_write_guard_drops_…`,
//! `a_host_read_waits_for_a_write_whose_…`) free a block under such uses and check that it did
//! not happen; `a_copy_on_a_third_stream_sees_a_write_on_another` and
//! `a_kernel_on_a_third_stream_sees_…` check that cudarc's own ordering still holds after a write
//! elsewhere.
//!
//! # Copies between contexts
//!
//! cudarc's `memcpy_dtod` between two contexts (two devices, or a non-primary context beside the
//! primary one) asks for the source's pointer on the source's own stream, with the destination's
//! context current, then reads on the destination's stream. A container notices the other context
//! being current and, where it is a primary context (every device's default, as on two GPUs),
//! names it, so its next exclusive use waits for that context's work (GPU tests
//! `hostile::a_copy_into_a_primary_context_…`, on one GPU through a non-primary source, and
//! `multi_gpu::a_copy_to_another_device_…` between two devices).
//!
//! # Graph captures
//!
//! cudarc's `begin_capture` is safe, and a copy queued on a capturing stream runs at each launch of
//! the graph, after the container's borrow has ended. A `PinnedVec` therefore refuses, with a
//! panic before anything is queued, cudarc's copies to or from it on a capturing stream: such a
//! copy could write the vector's host memory after the vector is freed. A host read of a
//! `PinnedVec` whose stream cannot be waited for (a capturing stream refuses
//! `cuStreamSynchronize`) waits for the whole context instead, and panics where that fails too
//! (GPU tests `graphs::copies_of_a_pinned_vector_…` and
//! `graphs::a_pinned_read_while_its_stream_captures_…`). `GraphPools` keeps what a capture
//! allocated until its graph is dropped.
//!
//! # Open holes
//!
//! * **A copy into a non-primary context**: the read is recorded nowhere.
//!   `hostile::a_copy_into_another_context_…` is `#[ignore]`d and fails with `--ignored` on a GPU.
//!   cudarc calls no code of the container after it queues the copy (the source's guard, dropped
//!   after, can only synchronize or record on a stream the container holds), and no handle of that
//!   context can be kept until the next exclusive use (cudarc destroys it with its last `Arc`).
//!   Refusing the read (a null pointer) is no cure: cudarc's library wrappers (NCCL, cuFFT, cuBLAS,
//!   cuDNN) ask for the pointer the same way, on the container's own stream with whatever context
//!   the caller left current, and would launch kernels with it. Copy out of a container on a
//!   stream of its own context, or into a primary context.
//! * **Device memory in graph captures**: a container allocated before a capture and copied into
//!   during it (`memcpy_htod` into a `DeviceVec`) is not kept alive by the graph. Kernel launches
//!   are `unsafe` and left to the caller.
//! * **An error during a launch's record**: a kernel launch (`unsafe`) records cudarc's events
//!   itself, so an error another thread leaves in the context while a launch on another stream
//!   records can skip that record. Launch on the container's stream where threads share a
//!   context.
