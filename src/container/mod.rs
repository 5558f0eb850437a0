//! Typed containers over a resource: [`DeviceBox`], [`DeviceVec`], [`PinnedVec`].
//!
//! Each holds its resource (by value, or as `&R` / `Arc<R>`: a container holding `&'a Pool<Cuda>`
//! cannot outlive the pool) and the `Arc<CudaStream>` it was made on. Memory is ordered on that
//! stream: it is allocated for it, filled on it, and freed on it when the container drops.
//!
//! They implement cudarc's `DeviceSlice`, `DevicePtr`, `DevicePtrMut` and `PushKernelArg`, so
//! `stream.memcpy_htod(&host, &mut v)`, `stream.memcpy_dtov(&v)` and
//! `stream.launch_builder(&f).arg(&mut v)` take them unchanged, on any stream. Each container
//! carries a cudarc `CudaSlice` of its memory, whose write event orders a use on another stream
//! after the writes before it, and a table of events, one per read on another stream, which
//! orders a write (and the drop, and a host write) after every read, on however many streams. A
//! write on another stream has an event of its own, which the next use orders the container's
//! stream after before recording cudarc's write event there.
//! Events are used only where cudarc keeps them for the whole life of the container: the
//! container's stream is one its context made (`new_stream`, `fork`) and the other stream belongs
//! to the same `CudaContext` object. Anywhere else (the container on the default stream, a stream
//! of another `CudaContext` object or device) a use on another stream first waits for the
//! container's stream and the recorded uses, and is waited for on the host once queued, so that no
//! free, host read or host write can overtake it. `DeviceVec::slice`/`slice_mut` hand out views
//! ([`DeviceView`], [`DeviceViewMut`]) ordered the same way, and
//! `copy_from_async`/`copy_to_async` stage through a `PinnedVec`, the `PinnedVec` recording the
//! copy for its next host access.
//!
//! Kernel arguments (`launch` is `unsafe`) are cudarc's own: cudarc does not tell the argument
//! which stream launches, so they are ordered by cudarc's events, which hold in the same cases
//! (the container on a stream its context made, the kernel on a stream of the same `CudaContext`
//! object); a `&mut` argument is first ordered after every recorded read. A container on the
//! default stream that was a kernel argument while its context kept events waits for the whole
//! context (drop, host access) once that context stops keeping them (its last stream dropped).
//! cudarc keeps a kernel's reads in one read event, so of `&` kernel arguments on several streams
//! only the last is waited for. Elsewhere (a kernel on another `CudaContext` object's stream, or on
//! another device), and for kernels that read on several streams, launch on the container's stream
//! or order the streams yourself.

mod device_box;
mod device_vec;
mod host_allocator;
mod interop;
mod pinned_vec;
mod raw;
mod readers;
mod view;

pub use device_box::DeviceBox;
pub use device_vec::DeviceVec;
pub use host_allocator::HostAllocator;
pub use pinned_vec::PinnedVec;
pub use view::{DeviceView, DeviceViewMut};

pub(crate) use interop::cudarc_interop;
pub(crate) use raw::{
    copy_error, length_mismatch, queue_copy, wait_for_context_instead, zero, AlignmentFits, RawBuf,
};
pub(crate) use readers::{
    before_kernel_read, before_kernel_write, order_read_of, order_write_of, ReadBy, Readers,
};
