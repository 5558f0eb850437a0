//! The ordering of a container's uses across streams: [`Readers`], the events of the reads (and
//! writes) on streams other than the container's own, and the functions that order a copy's or a
//! kernel's read or write of a container, or of a view of it, after the uses before it.

use super::raw::CudarcEvents;
use cudarc::driver::{sys, CudaEvent, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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
    pub(super) fn new(events: bool, (read_event, write_event): CudarcEvents) -> Self {
        Readers {
            events,
            write_event: AtomicPtr::new(write_event),
            read_event: AtomicPtr::new(read_event),
            list: Mutex::new(ReadList::default()),
            kernel_elsewhere: AtomicBool::new(false),
        }
    }

    /// The handles of a new slice's events (see `write_event`), where the slice is replaced.
    pub(super) fn set_cudarc_events(&mut self, (read_event, write_event): CudarcEvents) {
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
    pub(super) fn after_last_write(&self, own: &CudaStream) {
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
    pub(super) fn settle(&self, own: &CudaStream, managed: bool) {
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
    pub(super) fn wait_all(&self, stream: &CudaStream) {
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
    pub(super) fn sync_untracked(&self) {
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
