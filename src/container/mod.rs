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
mod pinned_vec;

pub use device_box::DeviceBox;
pub use device_vec::DeviceVec;
pub use host_allocator::HostAllocator;
pub use pinned_vec::PinnedVec;

mod view;

pub use view::{DeviceView, DeviceViewMut};

use crate::resource::{AllocError, AllocErrorKind, MemoryResource};
use crate::stream::StreamRef;
use cudarc::driver::{sys, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The compile-time check that `R` guarantees the alignment of `T`, which every container
/// constructor makes: without it an over-aligned `T` on, say, `Cuda` (256 bytes) would be refused
/// at run time with `Unsupported`. Stable Rust cannot compare `align_of::<T>()` with a type-level
/// number in a bound, so this is a constant evaluated per `(T, R)`: `cargo build` reports it (as
/// "evaluation of `AlignmentFits::<T, R>::CHECK` failed"), `cargo check` does not.
pub(crate) struct AlignmentFits<T, R>(PhantomData<(T, R)>);

impl<T, R: MemoryResource> AlignmentFits<T, R> {
    pub(crate) const CHECK: () = assert!(
        std::mem::align_of::<T>() <= crate::property::alignment_of::<R>(),
        "DeviceBox/DeviceVec/PinnedVec<T, R>: T is aligned to more bytes than R guarantees \
         (R::Alignment): wrap R in Aligned<A, R> with A >= align_of::<T>(), \
         e.g. resource_stack![Cuda::new(&ctx)?, Aligned<U512>]; `AlignmentFits::<T, R>` below names T and R"
    );
}

/// `len` values of `T` allocated from `R`, ordered on `stream`: the part the three containers share.
/// It does not initialize or drop the values (containers hold `Copy`-like `DeviceRepr` data).
///
/// The memory is also held as cudarc's own `CudaSlice`, made with `upgrade_device_ptr`: its
/// write event is what cudarc's copies and kernel launches use to order a use on any stream after
/// the writes before it, its read event what a kernel's reads are recorded in. Reads through the
/// container's own paths (copies, views, `HostSlice`) are recorded in [`Readers`] instead, one
/// event per stream: cudarc's one read event keeps only the last reader. The slice is never
/// dropped as a `CudaSlice`, which would free the memory through the driver: `Drop` waits for the
/// readers, leaks the slice (which makes the container's stream wait for its events), and then
/// frees the memory through `R` on that stream.
pub(crate) struct RawBuf<T, R: MemoryResource> {
    slice: ManuallyDrop<CudaSlice<T>>,
    readers: Readers,
    ptr: NonNull<T>,
    len: usize,
    resource: R,
}

/// The most read events a container keeps between two exclusive uses of it (a write, a host
/// access, the drop): reads on other streams past them are waited for through their contexts.
const READ_EVENTS: usize = 64;

/// The reads of a container's memory on other streams than its own, each with an event recorded
/// after it, that its writes, host accesses and drop wait for.
///
/// Every read gets an event of its own, made through a `CudaContext` object made for it alone
/// (the stream's primary context, so cudarc records it on the stream; a context object no other
/// code holds, so no error anyone records in a context makes cudarc skip the record). A guard
/// hands its event to whoever called `device_ptr`: only that caller can record it elsewhere, and
/// it orders nothing but that caller's own use of the pointer. The waits are raw driver calls.
///
/// Entries are only added while the container is shared (`&self`), so a `&CudaEvent` handed to a
/// guard stays valid as long as the borrow of the container; they go at an exclusive use, on the
/// container's own stream, once that stream waited for them (no guard can be alive then). Past
/// [`READ_EVENTS`], or where no event can be made, a read names its stream's context instead, and
/// the next exclusive use waits for that context's whole work on the host (raw
/// `cuCtxSynchronize`): memory stays bounded, and a stream dropped since is waited for too.
///
/// A write on another stream gets such an event too, instead of cudarc's write event, which
/// every write shares and whose guard would hand it to the caller; one suffices, as writes are
/// exclusive. The container's next use, of any kind, makes the container's stream wait for it and
/// then records cudarc's write event there (raw), which cudarc's copies, views and kernel
/// arguments wait for.
pub(crate) struct Readers {
    /// Whether the slice was made with cudarc's events (the context tracked them at the time).
    events: bool,
    /// The driver handle of the slice's cudarc write event (null where it has none), which
    /// [`Readers::after_last_write`] records raw: no `&mut` of the slice is needed, and no error
    /// left in a context skips it. It lives as long as the slice, which only `&mut` replaces.
    write_event: AtomicPtr<sys::CUevent_st>,
    /// The same for cudarc's read event (a kernel's `&` argument records it), which
    /// [`Readers::wait_all`] waits for raw: cudarc's own waits (`leak`, `device_ptr_mut`) are
    /// skipped while another thread's error sits in the context.
    read_event: AtomicPtr<sys::CUevent_st>,
    list: Mutex<ReadList>,
    /// Set when a kernel took the memory as an argument while the container's stream was one its
    /// context does not count (the default stream) and the context kept events: the kernel may
    /// run on another stream of the context, recorded only in cudarc's events, which the context
    /// stops keeping (and the drop stops waiting for) once its last stream is dropped.
    kernel_elsewhere: AtomicBool,
}

#[derive(Default)]
struct ReadList {
    /// Boxed: a guard holds `&CudaEvent` while the vector grows.
    #[allow(clippy::vec_box)]
    events: Vec<Box<CudaEvent>>,
    /// The last write on another stream than the container's, recorded in an event of its own
    /// (see [`Readers`]) that the next use of the container, of any kind, orders the container's
    /// stream after ([`Readers::after_last_write`]). Boxed: the write's guard holds `&CudaEvent`.
    last_write: Option<Box<CudaEvent>>,
    /// The contexts of reads that no event records.
    untracked: Vec<Arc<cudarc::driver::CudaContext>>,
}

/// Queues on `stream` a wait for `event`, by a raw driver call, which reads no context's error
/// slot (cudarc's `CudaStream::wait` skips the wait for an error someone left there).
fn queue_wait(stream: &CudaStream, event: &CudaEvent) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: a live event (borrowed).
    unsafe { queue_wait_raw(stream, event.cu_event()) }
}

/// [`queue_wait`] for an event known by its driver handle (cudarc's events of a slice).
///
/// # Safety
///
/// `event` is a live event: not destroyed before this call returns.
unsafe fn queue_wait_raw(
    stream: &CudaStream,
    event: sys::CUevent,
) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: a live stream (borrowed) and, by the caller's promise, a live event; the wait is
    // queued, nothing is freed, and a wait across contexts or devices is allowed.
    unsafe {
        cudarc::driver::result::stream::wait_event(
            stream.cu_stream(),
            event,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
}

/// A new event of `ctx`'s context, made through a context object of its own (see [`Readers`]);
/// `None` for a context that is not its device's primary one, or where the driver says no.
fn private_event(ctx: &Arc<cudarc::driver::CudaContext>) -> Option<CudaEvent> {
    if !ctx.is_primary() {
        return None;
    }
    // Making the object binds its context to the thread: inside this guard, which restores the
    // thread's context after.
    let _current = crate::leaf::make_current(ctx).ok()?;
    let own = cudarc::driver::CudaContext::new(ctx.ordinal()).ok()?;
    if own.cu_ctx() != ctx.cu_ctx() {
        return None;
    }
    own.new_event(None).ok()
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Readers")
            .field("events", &list.events.len())
            .field("untracked", &list.untracked.len())
            .finish()
    }
}

impl Readers {
    fn new(events: bool, (read_event, write_event): CudarcEvents) -> Self {
        Readers {
            events,
            write_event: AtomicPtr::new(write_event),
            read_event: AtomicPtr::new(read_event),
            list: Mutex::new(ReadList::default()),
            kernel_elsewhere: AtomicBool::new(false),
        }
    }

    /// The handles of a new slice's events (see `write_event`), where the slice is replaced.
    fn set_cudarc_events(&mut self, (read_event, write_event): CudarcEvents) {
        *self.read_event.get_mut() = read_event;
        *self.write_event.get_mut() = write_event;
    }

    /// An event for a write on `stream`, another stream than the container's, that its guard
    /// records (see [`ReadList::last_write`]); `None` where none can be made.
    ///
    /// The caller holds the container exclusively for as long as the event is borrowed (the
    /// write's guard borrows the container's slice or its only mutable view mutably), and called
    /// [`Readers::wait_all`] just before, which took the previous write's event.
    fn new_write_event<'a>(&'a self, stream: &CudaStream) -> Option<&'a CudaEvent> {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        let event = Box::new(private_event(stream.context())?);
        let at: *const CudaEvent = &*event;
        list.last_write = Some(event);
        // SAFETY: the event is boxed, and the box goes only at the next use of the container
        // (`after_last_write`), which the caller's exclusive borrow of it keeps out for as long
        // as the reference lives.
        Some(unsafe { &*at })
    }

    /// Orders the container's stream `own` after the last write on another stream, if one was
    /// made since (raw wait on its event), then records cudarc's write event there: every later
    /// use, on any stream, that waits for cudarc's write event (copies, views, kernel arguments)
    /// comes after that write. Called at the start of every use of the container. Where the wait
    /// or the record cannot be queued, the host waits for the write itself.
    fn after_last_write(&self, own: &CudaStream) {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(event) = list.last_write.take() else {
            return;
        };
        let ctx = own.context();
        let handle = self.write_event.load(Ordering::Relaxed);
        let queued = crate::leaf::make_current(ctx).and_then(|_current| {
            queue_wait(own, &event)?;
            if handle.is_null() {
                return Ok(());
            }
            // SAFETY: the slice's write event, alive as long as the slice, which the caller's
            // borrow of the container keeps; `own` is a live stream of the same context.
            unsafe { cudarc::driver::result::event::record(handle, own.cu_stream()) }
        });
        if let Err(e) = queued {
            ctx.record_err::<()>(Err(e));
            // Through its own context object, whose slot holds no one else's error.
            let _ = event.synchronize();
        }
        // Dropping the event binds its context object: inside a guard that restores the thread's.
        let _current = crate::leaf::make_current_or_record(ctx);
        drop(event);
        // (The lock is held to here: a use on another thread waits until this one is queued.)
        drop(list);
    }

    /// Before a kernel argument (see `kernel_elsewhere`).
    fn note_kernel(&self, own: &CudaStream) {
        if !crate::stream::is_counted(own) && own.context().is_managing_stream_synchronization() {
            self.kernel_elsewhere.store(true, Ordering::Relaxed);
        }
    }

    /// After waiting for cudarc's events on `own` (whose context kept them if `managed`, read
    /// before the wait, and still does now): where a kernel may have run on another stream and
    /// the context stopped keeping events in between, the host waits for the whole context.
    fn settle(&self, own: &CudaStream, managed: bool) {
        if self.kernel_elsewhere.load(Ordering::Relaxed)
            && !(managed && own.context().is_managing_stream_synchronization())
        {
            own.context().record_err(own.context().synchronize());
        }
    }

    /// Whether a use on `stream` of memory ordered on `own` can be ordered by events: `stream` is
    /// `own` (or the same null stream), or both belong to one `CudaContext` object, `own` is a
    /// stream it made (so that, while the container holds `own`, the context counts a stream and
    /// keeps cudarc's events: its records in the guards and its waits in the drop all happen) and
    /// the slice has events. Anywhere else cudarc may skip a wait or a record: the caller joins
    /// and synchronizes instead.
    fn tracked(&self, own: &CudaStream, stream: &CudaStream) -> bool {
        if crate::stream::id_of(stream) == crate::stream::id_of(own) {
            return true;
        }
        self.events
            && Arc::ptr_eq(stream.context(), own.context())
            && crate::stream::is_counted(own)
            && own.context().is_managing_stream_synchronization()
    }

    /// A new event for a read on `stream` (see [`Readers`]); `None` past [`READ_EVENTS`] or where
    /// none can be made.
    fn new_event<'a>(&'a self, stream: &CudaStream) -> Option<&'a CudaEvent> {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        if list.events.len() >= READ_EVENTS {
            return None;
        }
        let event = Box::new(private_event(stream.context())?);
        let at: *const CudaEvent = &*event;
        list.events.push(event);
        // SAFETY: the event is boxed, so moving the list's entries does not move it, and entries
        // are removed only at an exclusive use of the container (`wait_all`), which no `&'a self`
        // borrow outlives.
        Some(unsafe { &*at })
    }

    /// A read on a stream of `ctx` that no event records: the next exclusive use waits for the
    /// context's work on the host.
    fn untrack(&self, ctx: &Arc<cudarc::driver::CudaContext>) {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        if !list.untracked.iter().any(|c| c.cu_ctx() == ctx.cu_ctx()) {
            list.untracked.push(ctx.clone());
        }
    }

    /// At an exclusive use (no guard can be alive): makes `stream`, the container's own, wait for
    /// every recorded read (raw waits: no error a context holds skips them), and the host for the
    /// work of every context that unrecorded reads ran in. The events then go, their reads
    /// ordered before the stream's next work.
    fn wait_all(&self, stream: &CudaStream) {
        self.after_last_write(stream);
        let ctx = stream.context();
        // cudarc's events too (a kernel's uses, on any stream of the context), raw: cudarc's own
        // waits for them come after this, and an error another thread leaves meanwhile skips them.
        let cudarc_events = [&self.read_event, &self.write_event]
            .map(|h| h.load(Ordering::Relaxed))
            .into_iter()
            .filter(|h| !h.is_null());
        let current = crate::leaf::make_current(ctx);
        for handle in cudarc_events {
            let waited = match &current {
                // SAFETY: an event of the slice, alive as long as the slice, which the caller's
                // exclusive use of the container keeps.
                Ok(_) => unsafe { queue_wait_raw(stream, handle) },
                Err(e) => Err(*e),
            };
            if let Err(e) = waited {
                ctx.record_err::<()>(Err(e));
                // SAFETY: as above; the host waits for the event instead.
                ctx.record_err(unsafe { cudarc::driver::result::event::synchronize(handle) });
            }
        }
        drop(current);
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        if !list.events.is_empty() {
            // Where a wait cannot be queued, the host waits for the event itself (through its
            // own context object, whose slot holds no one else's error).
            let host_wait = |event: &CudaEvent| event.synchronize().is_ok();
            match crate::leaf::make_current(ctx) {
                Ok(_current) => {
                    let mut all = true;
                    for event in &list.events {
                        if let Err(e) = queue_wait(stream, event) {
                            ctx.record_err::<()>(Err(e));
                            all &= host_wait(event);
                        }
                    }
                    if all {
                        // Dropping an event binds its context object: the guard restores the
                        // thread's context after.
                        list.events.clear();
                    }
                }
                Err(e) => {
                    ctx.record_err::<()>(Err(e));
                    // Kept (their drops bind contexts, and no guard could restore this one).
                    for event in &list.events {
                        host_wait(event);
                    }
                }
            }
        }
        drop(list);
        self.sync_untracked();
    }

    /// The host waits for the work of every context that unrecorded uses ran in (raw
    /// `cuCtxSynchronize`, which reads no error slot); what exclusive uses and host reads need.
    fn sync_untracked(&self) {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        for other in std::mem::take(&mut list.untracked) {
            other.record_err(crate::leaf::synchronize_context(&other));
        }
    }
}

/// Orders a read of `view` (the container's slice or a view of it) on `stream` and returns the
/// guard that records it: `stream` waits for the last write; on the container's own stream
/// nothing is recorded; on another stream, where events hold, the guard records the read in an
/// event of its own (see [`Readers`]); elsewhere `stream` waits for the container's stream, the
/// guard synchronizes it, and the next exclusive use waits for the read's context too.
pub(crate) fn order_read_of<'a, T, V: DevicePtr<T>>(
    view: &'a V,
    readers: &'a Readers,
    stream: &'a CudaStream,
    by: ReadBy,
) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
    // An error someone recorded in a context would make cudarc skip the waits below.
    let _parked = (
        crate::leaf::park_error(stream.context()),
        crate::leaf::park_error(view.stream().context()),
    );
    let own: &'a CudaStream = view.stream();
    // cudarc's `memcpy_dtod` into another context asks for the pointer on the source's own stream
    // with the destination's context current, then reads on a stream of that context: the next
    // exclusive use waits for that context's work, where it is a primary one. Asked first: the
    // waits below bind `own`'s context. (Where it is not a primary context, no handle of it can
    // be kept: that case stays open, see the README. A null pointer would refuse that copy, but
    // cudarc's library wrappers (NCCL, cuFFT, cuBLAS) ask the same way, on the container's own
    // stream with whatever context the caller left current, and would launch with it.)
    let on_own = crate::stream::id_of(stream) == crate::stream::id_of(own);
    let elsewhere = (on_own && by == ReadBy::Cudarc)
        .then(|| primary_context_current_instead_of(own.context()))
        .flatten();
    // `stream` waits for the write event (recorded after a write elsewhere, first); cudarc's read
    // event is not recorded (see `Readers`).
    readers.after_last_write(own);
    let (ptr, cudarc_read) = view.device_ptr(stream);
    std::mem::forget(cudarc_read);
    if on_own {
        if let Some(elsewhere) = elsewhere {
            readers.untrack(&elsewhere);
        }
        // On the container's own stream: what comes after on it comes after the read, and a
        // write on another stream first waits for this stream (`after_own_reads`).
        return (ptr, SyncOnDrop::Record(None));
    }
    // (`tracked` is true for another stream only where `own` is counted: its events hold.)
    if readers.tracked(own, stream) {
        if let Some(event) = readers.new_event(stream) {
            return (ptr, SyncOnDrop::Record(Some((event, stream))));
        }
    }
    stream.context().record_err(stream.join(own));
    // The host waits for the read once queued; should that be skipped (an error someone left in
    // the context), the next exclusive use waits for the whole context.
    readers.untrack(stream.context());
    (ptr, SyncOnDrop::sync_stream(stream))
}

/// Who asks [`order_read_of`] for a pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadBy {
    /// The crate's own code, which queues its copies on the stream it names, in that stream's
    /// context.
    Crate,
    /// cudarc, through `DevicePtr`: its `memcpy_dtod` into another context asks on the source's
    /// own stream with the destination's context current.
    Cudarc,
}

/// The context current on this thread where it is not `own`'s and is its device's primary one;
/// `None` otherwise. The thread's current context is the same after.
fn primary_context_current_instead_of(
    own: &cudarc::driver::CudaContext,
) -> Option<Arc<cudarc::driver::CudaContext>> {
    let current = cudarc::driver::result::ctx::get_current().ok().flatten()?;
    if current == own.cu_ctx() {
        return None;
    }
    let mut device: sys::CUdevice = 0;
    // SAFETY: writes the current context's device into a local.
    unsafe { sys::cuCtxGetDevice(&mut device) }.result().ok()?;
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: writes the primary context's state into locals. Where the device's primary context
    // is inactive, no copy can run in it (cudarc keeps it active while any object of it lives),
    // whether or not it is still the thread's current one: no need to make (and destroy) it.
    unsafe { sys::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) }
        .result()
        .ok()?;
    if active == 0 {
        return None;
    }
    let count = cudarc::driver::result::device::get_count().unwrap_or(0);
    let ordinal = (0..count).find(|&o| cudarc::driver::result::device::get(o) == Ok(device))?;
    let primary = cudarc::driver::CudaContext::new(ordinal as usize)
        .ok()
        .filter(|p| p.cu_ctx() == current);
    // Making the object bound its context to the thread, and dropping it (not the current one)
    // binds it again: the caller's goes back after. SAFETY: that context is current, so alive,
    // until the caller (cudarc, mid-copy) changes it.
    let restored = unsafe { cudarc::driver::result::ctx::set_current(current) };
    primary.filter(|_| restored.is_ok())
}

/// Orders a write of `view` on `stream` and returns the guard that records it: the container's
/// stream waits for every recorded read and the last write elsewhere, `stream` (if another) for
/// the container's stream, and `stream` for cudarc's read and write events. On the container's
/// stream the guard records cudarc's write event; on another, where events hold, an event of the
/// write's own (see [`ReadList::last_write`]), and elsewhere it synchronizes `stream`.
///
/// `view` is the container's slice or its only mutable view, and `readers` the container's:
/// the caller's exclusive borrow of the container lasts as long as the guard.
pub(crate) fn order_write_of<'a, T, V: DevicePtrMut<T>>(
    view: &'a mut V,
    readers: &'a Readers,
    stream: &'a CudaStream,
) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
    // An error someone recorded in a context would make cudarc skip the waits below.
    let own_ctx = view.stream().context().clone();
    let _parked = (
        crate::leaf::park_error(stream.context()),
        crate::leaf::park_error(&own_ctx),
    );
    // The container's own stream waits for every recorded read (the write is exclusive: no guard
    // holds their events, which go), and a write elsewhere waits for the own stream.
    readers.wait_all(view.stream());
    let own_stream = crate::stream::id_of(stream) == crate::stream::id_of(view.stream());
    if !own_stream {
        after_own_reads(view.stream(), stream);
    }
    // (Where events do not hold, `stream` is another stream, ordered after the own one above.)
    let tracked = readers.tracked(view.stream(), stream);
    let (ptr, written) = view.device_ptr_mut(stream);
    if own_stream {
        // What comes after on the container's stream (its drop included) comes after the write.
        return (ptr, written);
    }
    // cudarc's write event is not recorded here: its guard hands the event to the caller, who
    // may record it elsewhere, and an error anyone leaves in the context skips its record. The
    // write's own event is ordered before the container's next use (`after_last_write`), which
    // then records cudarc's write event on the container's stream.
    std::mem::forget(written);
    if tracked {
        if let Some(event) = readers.new_write_event(stream) {
            return (ptr, SyncOnDrop::Record(Some((event, stream))));
        }
    }
    // The host waits for the write once queued; should that be skipped (an error someone left in
    // the context), the next exclusive use waits for the whole context.
    readers.untrack(stream.context());
    (ptr, SyncOnDrop::sync_stream(stream))
}

/// Makes `stream` wait for the work queued so far on `own`, the container's stream, whose reads
/// are not recorded: through an event of a context object of its own (see [`Readers`]), recorded
/// and waited for by raw driver calls; where none can be made, through cudarc's `join`.
fn after_own_reads(own: &CudaStream, stream: &CudaStream) {
    let Some(event) = private_event(own.context()) else {
        stream.context().record_err(stream.join(own));
        return;
    };
    let (own_ctx, ctx) = (own.context(), stream.context());
    let recorded = crate::leaf::make_current(own_ctx).and_then(|_current| {
        // SAFETY: a live event of `own`'s context and a live stream of it (borrowed).
        unsafe { cudarc::driver::result::event::record(event.cu_event(), own.cu_stream()) }
    });
    let waited = recorded.and_then(|()| {
        crate::leaf::make_current(ctx).and_then(|_current| queue_wait(stream, &event))
    });
    if let Err(e) = waited {
        ctx.record_err::<()>(Err(e));
        // No wait was queued: the host waits for `own` instead.
        own_ctx.record_err(crate::leaf::make_current(own_ctx).and_then(|_current| {
            // SAFETY: a live stream (borrowed).
            unsafe { cudarc::driver::result::stream::synchronize(own.cu_stream()) }
        }));
    }
    // The event's drop binds its context object: inside a guard that restores the thread's.
    let _current = crate::leaf::make_current_or_record(own_ctx);
    drop(event);
}

/// Before a `&mut` kernel argument of `view` (launched on a stream cudarc does not tell): the
/// container's stream waits for every recorded read, and the write event records that point, so
/// the kernel, which waits for the write event where cudarc keeps events, comes after them.
pub(crate) fn before_kernel_write<T, V: DevicePtrMut<T>>(view: &mut V, readers: &Readers) {
    let own = view.stream().clone();
    let _parked = crate::leaf::park_error(own.context());
    readers.note_kernel(&own);
    readers.wait_all(&own);
    drop(view.device_ptr_mut(&own));
}

/// Before a `&` kernel argument of memory ordered on `own` (see [`Readers`]'s `kernel_elsewhere`).
pub(crate) fn before_kernel_read(own: &CudaStream, readers: &Readers) {
    let _parked = crate::leaf::park_error(own.context());
    readers.note_kernel(own);
    // The kernel waits for cudarc's write event: recorded after the last write elsewhere.
    readers.after_last_write(own);
}

impl<T, R: MemoryResource> RawBuf<T, R> {
    /// Allocates room for `len` values; `Err` on overflow of `len * size_of::<T>()`.
    pub(crate) fn allocate(
        len: usize,
        resource: R,
        stream: &Arc<CudaStream>,
    ) -> Result<Self, AllocError> {
        let (ptr, slice, events) = allocate_slice::<T, R>(len, &resource, stream)?;
        Ok(RawBuf {
            readers: Readers::new(stream.context().is_event_tracking(), events),
            slice,
            ptr,
            len,
            resource,
        })
    }

    /// Moves the values into a new allocation of `len` values (at least the old length) from the
    /// same resource, copied on the buffer's stream after every write of the old memory; the
    /// values past the old length are zero bytes. The new memory is in place, filled, before the
    /// old goes back (after the copy). On `Err` the buffer is as it was.
    pub(crate) fn reallocate_zeroed(&mut self, len: usize) -> Result<(), AllocError> {
        let stream = self.stream().clone();
        let old = self.bytes();
        let name = self.resource.name();
        let bytes = len_bytes::<T>(len, name)?;
        let (ptr, mut slice, events) = allocate_slice::<T, R>(len, &self.resource, &stream)?;
        let filled = {
            let (from, read) = self.order_read(&stream, ReadBy::Crate);
            let (to, written) = slice.device_ptr_mut(&stream);
            let copied = match old {
                0 => Ok(()),
                // SAFETY: `old` bytes of this buffer's live memory into the new allocation of at
                // least as many, both ordered on `stream` (the read after the last write, the new
                // memory after its allocation), which the guards record.
                _ => unsafe { queue_copy(&stream, name, old, to, from) },
            };
            // SAFETY: the new allocation's bytes past `old`, ordered on `stream` after the copy.
            let zeroed =
                copied.and_then(|()| unsafe { zero(&stream, to + old as u64, bytes - old, name) });
            drop((written, read));
            zeroed
        };
        if let Err(e) = filled {
            let _ = ManuallyDrop::into_inner(slice).leak();
            // A host-accessible block is freed by host calls the stream does not order: the
            // copy queued into it may still run (leaked if no wait succeeds).
            if !host_free_may_follow::<R>(&self.resource, &stream, bytes) {
                return Err(e);
            }
            // SAFETY: just allocated from this resource with these arguments, never handed
            // out; what was queued on it is queued before this free on the same stream, and for
            // host-accessible memory, which host calls free, it has run (waited for above).
            unsafe {
                self.resource.deallocate(
                    ptr.cast(),
                    bytes,
                    std::mem::align_of::<T>(),
                    StreamRef::from(&stream),
                )
            };
            return Err(e);
        }
        // The new memory is the buffer's before the old is freed: a panic in the resource's
        // free leaves a whole buffer behind.
        let old_slice = std::mem::replace(&mut self.slice, slice);
        let old_ptr = std::mem::replace(&mut self.ptr, ptr);
        let old_readers = std::mem::replace(
            &mut self.readers,
            Readers::new(stream.context().is_event_tracking(), events),
        );
        self.len = len;
        free_memory::<T, R>(
            &self.resource,
            ManuallyDrop::into_inner(old_slice),
            old_ptr,
            old,
            &old_readers,
        );
        Ok(())
    }

    /// Grows the allocation in place to `len` values (at least the old length), if the resource
    /// can, the values past the old length zero bytes: `Ok(false)`, the buffer as it was, where
    /// it cannot. The growth and the zeroing are queued on the buffer's stream after every use of
    /// the memory so far; the new slice's write event records them. On `Err` the buffer keeps
    /// its old length (its allocation may be larger, which a `GrowInPlace` resource allows).
    pub(crate) fn grow_zeroed_in_place(&mut self, len: usize) -> Result<bool, AllocError>
    where
        R: crate::resource::GrowInPlace,
    {
        let stream = self.stream().clone();
        let align = std::mem::align_of::<T>();
        let name = self.resource.name();
        let (old, bytes) = (self.bytes(), len_bytes::<T>(len, name)?);
        // The growth comes after every use of the memory so far: the recorded reads and cudarc's
        // events (the guard is forgotten: the write event is recorded below, after the zeroing).
        let managed = self.managed();
        self.readers.wait_all(&stream);
        std::mem::forget(self.slice.device_ptr_mut(&stream));
        // SAFETY: `ptr` is this buffer's live allocation from `resource`, of `old` bytes with
        // `T`'s alignment (or grown to that by an earlier call), only this buffer uses it, and it
        // is freed on `stream`, as the growth is asked on.
        let grown = unsafe {
            self.resource.grow_in_place(
                self.ptr.cast(),
                old,
                align,
                bytes,
                StreamRef::from(&stream),
            )
        }?;
        if !grown {
            return Ok(false);
        }
        // Zeroed before any slice covers the new bytes: on failure no one can read them.
        // SAFETY: the grown allocation's bytes past `old`, ordered on `stream`.
        unsafe { zero(&stream, self.address() + old as u64, bytes - old, name) }?;
        let Ok(slice) = new_slice::<T>(self.ptr, len, &stream) else {
            return Err(no_events(bytes, align, name));
        };
        let old_slice = std::mem::replace(&mut self.slice, slice);
        self.len = len;
        // Its memory is the new slice's prefix, whose uses the stream waited for above.
        let _ = ManuallyDrop::into_inner(old_slice).leak();
        self.readers.settle(&stream, managed);
        let events = record_write_point(&mut self.slice, &stream);
        self.readers.set_cudarc_events(events);
        Ok(true)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    pub(crate) fn ptr(&self) -> NonNull<T> {
        self.ptr
    }

    /// The pointer as a `CUdeviceptr` (under unified addressing, the same number for host memory).
    pub(crate) fn address(&self) -> sys::CUdeviceptr {
        self.ptr.as_ptr() as sys::CUdeviceptr
    }

    /// The memory as cudarc's slice, for kernel arguments, and the readers, for views.
    pub(crate) fn parts(&self) -> (&CudaSlice<T>, &Readers) {
        (&self.slice, &self.readers)
    }

    /// The memory as cudarc's slice, mutably, and the readers, for mutable views.
    pub(crate) fn parts_mut(&mut self) -> (&mut CudaSlice<T>, &Readers) {
        (&mut self.slice, &self.readers)
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        self.slice.stream()
    }

    pub(crate) fn resource(&self) -> &R {
        &self.resource
    }

    /// Orders a use on `stream` that may write the memory (see [`order_write_of`]), for
    /// cudarc's `DevicePtrMut` and `HostSlice` and the containers' copies.
    pub(crate) fn order_write<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        order_write_of(&mut *self.slice, &self.readers, stream)
    }

    /// Orders a use on `stream` that reads the memory (see [`order_read_of`]), for `by`.
    pub(crate) fn order_read<'a>(
        &'a self,
        stream: &'a CudaStream,
        by: ReadBy,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        order_read_of(&*self.slice, &self.readers, stream, by)
    }

    /// For a read on the container's own stream that the host waits for at once (`copy_to`): the
    /// stream waits for the last write; nothing is recorded, as the read is over before anything
    /// else can be queued after it.
    pub(crate) fn read_now(&self) -> sys::CUdeviceptr {
        let _parked = crate::leaf::park_error(self.stream().context());
        self.readers.after_last_write(self.stream());
        let (ptr, cudarc_read) = self.slice.device_ptr(self.stream());
        std::mem::forget(cudarc_read);
        ptr
    }

    /// Before a `&mut` kernel argument (see [`before_kernel_write`]).
    pub(crate) fn before_kernel_write(&mut self) {
        before_kernel_write(&mut *self.slice, &self.readers)
    }

    /// Waits until no device work writes the memory, on any stream: the container's stream
    /// first waits for the last write (the slice's write event; writes on other streams were
    /// ordered after each other, or waited for), then the host waits for the container's
    /// stream. What host reads of host-accessible memory need.
    pub(crate) fn wait_for_writes(&self) -> Result<(), AllocError> {
        let managed = self.managed();
        let _parked = crate::leaf::park_error(self.stream().context());
        self.readers.after_last_write(self.stream());
        // A write on a stream no event records: its guard's host wait can have been skipped.
        self.readers.sync_untracked();
        // A host read is no device read: nothing is recorded.
        std::mem::forget(self.slice.device_ptr(self.stream()));
        self.readers.settle(self.stream(), managed);
        self.resource.synchronize(StreamRef::from(self.stream()))
    }

    /// Whether the context keeps cudarc's events now.
    fn managed(&self) -> bool {
        self.stream().context().is_managing_stream_synchronization()
    }

    /// Waits until no device work uses the memory at all (every read and the last write): what
    /// host writes into host-accessible memory need.
    pub(crate) fn wait_for_uses(&mut self) -> Result<(), AllocError> {
        let stream = self.stream().clone();
        let managed = self.managed();
        self.readers.wait_all(&stream);
        std::mem::forget(self.slice.device_ptr_mut(&stream));
        self.readers.settle(&stream, managed);
        self.resource.synchronize(StreamRef::from(&stream))
    }
}

/// Gives a buffer's memory (`bytes` at `ptr`, under `slice`, read by `readers`) back to
/// `resource` on the slice's stream, after every use of it.
fn free_memory<T, R: MemoryResource>(
    resource: &R,
    slice: CudaSlice<T>,
    ptr: NonNull<T>,
    bytes: usize,
    readers: &Readers,
) {
    let stream = slice.stream().clone();
    // An error someone recorded in the context would make cudarc skip the waits below, and the
    // memory would go back in use.
    let _parked = crate::leaf::park_error(stream.context());
    // The container's stream waits for every recorded read, and for every use that cudarc
    // recorded on the slice's events (on any stream: where events are not kept, uses on other
    // streams were waited for when queued); the memory is not freed by cudarc.
    let managed = stream.context().is_managing_stream_synchronization();
    readers.wait_all(&stream);
    let _ = slice.leak();
    readers.settle(&stream, managed);
    // Host-accessible memory (pinned, managed) is freed by host calls that are not ordered on
    // the stream: wait for the kernels and copies that may still touch it. Where no wait
    // succeeds, the memory is leaked rather than freed under them.
    if !host_free_may_follow::<R>(resource, &stream, bytes) {
        return;
    }
    // SAFETY: the caller passes a buffer's allocation from `resource` with these bytes and T's
    // alignment (or grown in place to them, which a `GrowInPlace` resource frees by any size it
    // had), ordered on this stream, given up by the buffer: freed once.
    unsafe {
        resource.deallocate(
            ptr.cast(),
            bytes,
            std::mem::align_of::<T>(),
            StreamRef::from(&stream),
        )
    }
}

impl<T, R: MemoryResource> Drop for RawBuf<T, R> {
    fn drop(&mut self) {
        // SAFETY: the buffer is being dropped: its slice is taken once, here.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        free_memory::<T, R>(&self.resource, slice, self.ptr, self.bytes(), &self.readers);
    }
}

/// Queues a copy of `bytes` from `from` to `to` (device or host-and-device memory, one unified
/// address space) on `stream`, with its context current.
///
/// # Safety
///
/// Both ranges are `bytes` bytes of live allocations the caller's containers own (the
/// destination borrowed mutably), the copy is ordered on `stream` after their earlier uses and
/// recorded by the caller, and neither is freed before what it records has passed.
pub(super) unsafe fn queue_copy(
    stream: &CudaStream,
    name: &'static str,
    bytes: usize,
    to: sys::CUdeviceptr,
    from: sys::CUdeviceptr,
) -> Result<(), AllocError> {
    let err = || copy_error(name, bytes);
    let _current = crate::leaf::make_current(stream.context()).map_err(err())?;
    // SAFETY: the caller's promise.
    unsafe { sys::cuMemcpyAsync(to, from, bytes, stream.cu_stream()) }
        .result()
        .map_err(err())
}

/// Queues zero bytes over `[address, address + bytes)` on `stream`, with its context current.
///
/// # Safety
///
/// The range is device-accessible memory the caller owns, ordered on `stream`.
pub(super) unsafe fn zero(
    stream: &CudaStream,
    address: sys::CUdeviceptr,
    bytes: usize,
    name: &'static str,
) -> Result<(), AllocError> {
    if bytes == 0 {
        return Ok(());
    }
    let _current = crate::leaf::make_current(stream.context()).map_err(copy_error(name, bytes))?;
    // SAFETY: the caller's promise.
    unsafe { cudarc::driver::result::memset_d8_async(address, 0, bytes, stream.cu_stream()) }
        .map_err(copy_error(name, bytes))
}

/// `len * size_of::<T>()`, or an error naming the resource where it overflows.
fn len_bytes<T>(len: usize, resource: &'static str) -> Result<usize, AllocError> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(AllocError::new(
            AllocErrorKind::InvalidArgument("len * size_of::<T>() overflows usize"),
            len,
            std::mem::align_of::<T>(),
            resource,
        ))
}

fn no_events(bytes: usize, align: usize, resource: &'static str) -> AllocError {
    AllocError::new(
        AllocErrorKind::InvalidArgument(
            "the CUDA driver could not create the container's read/write events",
        ),
        bytes,
        align,
        resource,
    )
}

/// cudarc's slice over `len` values at `ptr`, or `Err` where the driver could not make its two
/// events (cudarc unwraps their creation).
fn new_slice<T>(
    ptr: NonNull<T>,
    len: usize,
    stream: &Arc<CudaStream>,
) -> Result<ManuallyDrop<CudaSlice<T>>, ()> {
    // cudarc makes the events after checking the context's recorded error, which anyone may set.
    let _parked = crate::leaf::park_error(stream.context());
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `ptr` is a live allocation of at least `len` values that the caller's buffer
        // owns, which takes the slice back with `leak` (so cudarc never frees it); the values
        // are not read through the slice before a container has written them (every constructor
        // and growth initializes them, or is `unsafe`).
        ManuallyDrop::new(unsafe {
            stream.upgrade_device_ptr::<T>(ptr.as_ptr() as sys::CUdeviceptr, len)
        })
    }))
    .map_err(|_| ())
}

/// Allocates `len` values from `resource` for `stream`, with cudarc's slice over them whose
/// write event records the allocation on `stream`.
fn allocate_slice<T, R: MemoryResource>(
    len: usize,
    resource: &R,
    stream: &Arc<CudaStream>,
) -> Result<NewSlice<T>, AllocError> {
    let align = std::mem::align_of::<T>();
    let bytes = len_bytes::<T>(len, resource.name())?;
    if crate::stream::is_per_thread(stream) {
        // The container's memory is ordered on one stream; this handle names another stream
        // on every thread the container might be used from.
        return Err(AllocError::new(
            AllocErrorKind::InvalidArgument(
                "cudarc's per-thread stream names a different stream on each thread: give the container a stream of its own (ctx.new_stream())",
            ),
            bytes,
            align,
            resource.name(),
        ));
    }
    let ptr = resource.allocate(bytes, align, StreamRef::from(stream))?;
    let Ok(mut slice) = new_slice::<T>(ptr.cast(), len, stream) else {
        // SAFETY: just allocated from `resource` with these arguments, handed to no one.
        unsafe { resource.deallocate(ptr, bytes, align, StreamRef::from(stream)) };
        return Err(no_events(bytes, align, resource.name()));
    };
    // The block is usable on `stream` from here (a suballocator may hand out a block that
    // work queued on `stream` still uses; a stream-ordered allocation exists only from here
    // on `stream`): the write event records this point, which a use on another stream waits
    // for, as for every later write.
    let events = record_write_point(&mut slice, stream);
    Ok((ptr.cast(), slice, events))
}

/// The driver handles of a slice's cudarc read and write events (null where it has none).
type CudarcEvents = (sys::CUevent, sys::CUevent);

/// A new allocation's pointer, cudarc's slice over it and the slice's event handles.
type NewSlice<T> = (NonNull<T>, ManuallyDrop<CudaSlice<T>>, CudarcEvents);

/// Records cudarc's write event of `slice` on `stream` (its own) and returns the driver handles
/// of its events, for [`Readers`].
fn record_write_point<T>(slice: &mut CudaSlice<T>, stream: &CudaStream) -> CudarcEvents {
    let handle = |guard: &SyncOnDrop<'_>| match guard {
        SyncOnDrop::Record(Some((event, _))) => event.cu_event(),
        _ => std::ptr::null_mut(),
    };
    let (_, read) = slice.device_ptr(stream);
    let read_event = handle(&read);
    // Not a read: nothing is recorded.
    std::mem::forget(read);
    let (_, written) = slice.device_ptr_mut(stream);
    let write_event = handle(&written);
    drop(written);
    (read_event, write_event)
}

impl<T, R: MemoryResource + std::fmt::Debug> std::fmt::Debug for RawBuf<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("resource", &self.resource)
            .finish()
    }
}

// SAFETY: the buffer owns its allocation like a Box<[T]>; sending it sends the Ts and the resource
// (cudarc's slice is Send and Sync).
unsafe impl<T: Send, R: MemoryResource + Send> Send for RawBuf<T, R> {}
// SAFETY: shared access gives only shared access to the Ts and the resource.
unsafe impl<T: Sync, R: MemoryResource + Sync> Sync for RawBuf<T, R> {}

/// Implements cudarc's `DeviceSlice`, `DevicePtr`, `DevicePtrMut` and `PushKernelArg` (for `&` and
/// `&mut`) for a container whose `RawBuf<T, R>` is at the given field path, with `touched(&self)`
/// (device work that reads the memory is queued) and `touched_mut(&mut self)` (work that may
/// write it). Copies go through [`order_read_of`]/[`order_write_of`] (see the module docs);
/// kernel arguments through cudarc's own implementations for the buffer's `CudaSlice`, a `&mut`
/// one after [`before_kernel_write`]. A `&` kernel argument is read-only to the kernel, as for
/// cudarc's own `&CudaSlice`. A macro because these are foreign traits on three distinct types:
/// no single generic impl covers them.
macro_rules! cudarc_interop {
    ($container:ident, $($buf:ident).+ where R: $($bound:tt)+) => {
        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DeviceSlice<T>
            for $container<T, R>
        {
            fn len(&self) -> usize {
                self.$($buf).+.len()
            }
            fn stream(&self) -> &std::sync::Arc<cudarc::driver::CudaStream> {
                self.$($buf).+.stream()
            }
        }

        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DevicePtr<T>
            for $container<T, R>
        {
            fn device_ptr<'a>(
                &'a self,
                stream: &'a cudarc::driver::CudaStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, cudarc::driver::SyncOnDrop<'a>) {
                self.touched();
                self.$($buf).+.order_read(stream, $crate::container::ReadBy::Cudarc)
            }
        }

        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DevicePtrMut<T>
            for $container<T, R>
        {
            fn device_ptr_mut<'a>(
                &'a mut self,
                stream: &'a cudarc::driver::CudaStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, cudarc::driver::SyncOnDrop<'a>) {
                self.touched_mut();
                self.$($buf).+.order_write(stream)
            }
        }

        // SAFETY: cudarc's own implementation for `&CudaSlice`, on the container's slice, which
        // lives as long as the borrow 'b of the container, itself outliving the builder 'a.
        unsafe impl<'a, 'b: 'a, T: cudarc::driver::DeviceRepr, R: $($bound)+>
            cudarc::driver::PushKernelArg<&'b $container<T, R>> for cudarc::driver::LaunchArgs<'a>
        {
            fn arg(&mut self, arg: &'b $container<T, R>) -> &mut Self {
                arg.touched();
                let (slice, readers) = arg.$($buf).+.parts();
                $crate::container::before_kernel_read(slice.stream(), readers);
                self.arg(slice)
            }
        }

        // SAFETY: as for `&`; the `&mut` borrow makes the kernel the only writer while it is held,
        // and the container's stream first waits for the reads recorded outside cudarc's events.
        unsafe impl<'a, 'b: 'a, T: cudarc::driver::DeviceRepr, R: $($bound)+>
            cudarc::driver::PushKernelArg<&'b mut $container<T, R>>
            for cudarc::driver::LaunchArgs<'a>
        {
            fn arg(&mut self, arg: &'b mut $container<T, R>) -> &mut Self {
                arg.touched_mut();
                arg.$($buf).+.before_kernel_write();
                self.arg(arg.$($buf).+.parts_mut().0)
            }
        }
    };
}
pub(crate) use cudarc_interop;

/// Whether `bytes` of `resource`'s memory ordered on `stream` may be freed now: always for
/// device-only memory (its frees are ordered on the stream); for host-accessible memory, whose
/// frees are host calls, once the host has waited for the stream, or for its whole context where
/// that wait fails. False: device work may still use the memory, which must be leaked.
fn host_free_may_follow<R: MemoryResource>(
    resource: &R,
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> bool {
    if !<R::Host as typenum::Bit>::BOOL || bytes == 0 {
        return true;
    }
    match resource.synchronize(StreamRef::from(stream)) {
        Ok(()) => true,
        Err(e) => wait_for_context_instead(stream, e),
    }
}

/// For a host wait on `stream` that failed with `failed` (recorded in the context, as
/// [`record_in_context`] does): waits for the whole context instead, raw. True when that wait
/// succeeded, so that no device work queued before, on any stream of the context, still runs;
/// false when device work may still use the memory, and the caller must neither hand it to the
/// host nor free it. A stream that is capturing a graph refuses `cuStreamSynchronize` at once.
pub(crate) fn wait_for_context_instead(stream: &CudaStream, failed: AllocError) -> bool {
    record_in_context(stream, failed);
    let ctx = stream.context();
    match crate::leaf::synchronize_context(ctx) {
        Ok(()) => true,
        Err(e) => {
            ctx.record_err::<()>(Err(e));
            false
        }
    }
}

/// Keeps a CUDA error from a call that cannot return one (`Drop`, `Deref`) in the stream's context,
/// where cudarc keeps such errors for `CudaContext::check_err`.
pub(crate) fn record_in_context(stream: &CudaStream, e: AllocError) {
    if let AllocErrorKind::Cuda(code) = e.kind {
        let err: Result<(), _> = Err(cudarc::driver::DriverError(code));
        stream.context().record_err(err);
    }
}

/// The error for a host slice whose length does not match the container's.
pub(crate) fn length_mismatch(got: usize, resource: &'static str) -> AllocError {
    AllocError::new(
        AllocErrorKind::InvalidArgument("host slice length differs from the container's length"),
        got,
        0,
        resource,
    )
}

/// Maps a driver error of a copy or memset to an `AllocError` naming the container's resource.
pub(crate) fn copy_error(
    resource: &'static str,
    bytes: usize,
) -> impl FnOnce(cudarc::driver::DriverError) -> AllocError {
    move |e| AllocError::cuda(e, bytes, 0, resource)
}
