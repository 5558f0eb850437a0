//! What the CUDA leaves share: the driver's presence, contexts, and the allocate, free, synchronize
//! and order calls each makes with its context current, on streams located by their identity.

use crate::resource::{AllocError, AllocErrorKind};
use crate::stream::StreamRef;
use cudarc::driver::{result, sys, CudaContext, DriverError};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

/// True when the CUDA driver library can be loaded here. Checked once, then cached.
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen the library names and drops what it opened.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Opens (retains) the primary context of device `ordinal`, or says why it cannot:
/// [`AllocErrorKind::NoDriver`] without libcuda, a CUDA error without a device
/// (`CUDA_ERROR_INVALID_DEVICE` for an ordinal past `i32::MAX`, which cudarc would wrap).
///
/// cudarc panics when the driver library is missing; this checks first.
pub fn cuda_context(ordinal: usize) -> Result<Arc<CudaContext>, AllocError> {
    // cudarc passes the ordinal on as an `i32`: a larger one would wrap to another device.
    if i32::try_from(ordinal).is_err() {
        return Err(AllocError::cuda(
            DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_DEVICE),
            0,
            0,
            "CudaContext",
        ));
    }
    if !driver_available() {
        return Err(AllocError::new(
            AllocErrorKind::NoDriver,
            0,
            0,
            "CudaContext",
        ));
    }
    CudaContext::new(ordinal).map_err(|e| AllocError::cuda(e, 0, 0, "CudaContext"))
}

/// Lets kernels and copies on `ctx`'s device reach memory that `cuMemAlloc` (`Cuda`, and the
/// suballocators over it) made on `peer`'s device: `cuCtxEnablePeerAccess`. (Pinned host memory
/// needs none: every device reaches it.)
/// Explicit, one direction, and idempotent: a second call is `Ok`. Driver pools and
/// `VirtualMemory` grant access their own way (`CudaAsync::grant_access`,
/// `VirtualMemory::grant_access`). `Unsupported` where the two devices cannot reach each other
/// (`cuDeviceCanAccessPeer`), or for one device with itself.
///
/// No type changes: a container's `DeviceAccessible` means its own device, and a use from
/// another device is the caller's to allow with this call.
pub fn enable_peer_access(ctx: &CudaContext, peer: &CudaContext) -> Result<(), AllocError> {
    const NAME: &str = "enable_peer_access";
    let err = |e| AllocError::cuda(e, 0, 0, NAME);
    let unsupported = |why| {
        Err(AllocError::new(
            AllocErrorKind::Unsupported(why),
            0,
            0,
            NAME,
        ))
    };
    if ctx.cu_device() == peer.cu_device() {
        return unsupported("a device reaches its own memory: no peer access to enable");
    }
    let mut can: std::ffi::c_int = 0;
    // SAFETY: a valid place for the answer; both devices are live handles of their contexts.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()) }
        .result()
        .map_err(err)?;
    if can == 0 {
        return unsupported(
            "these two devices cannot access each other's memory (cuDeviceCanAccessPeer)",
        );
    }
    let _current = make_current(ctx).map_err(err)?;
    // SAFETY: `peer` holds its context alive; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) } {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        other => Err(err(DriverError(other))),
    }
}

/// Lets kernels and copies on `peer`'s device read and write the memory of driver pool `pool`,
/// which lives on `owner`'s device (`cuMemPoolSetAccess`, read-write): its allocations now and
/// later. `Ok` at once for the owner's own device; `Unsupported` where the two devices cannot
/// reach each other. What `CudaAsync::grant_access` and `ImportedPool::grant_access` do.
pub(crate) fn grant_pool_access(
    pool: sys::CUmemoryPool,
    owner: &CudaContext,
    peer: &CudaContext,
    name: &'static str,
) -> Result<(), AllocError> {
    if peer.cu_device() == owner.cu_device() {
        return Ok(());
    }
    let err = |e| AllocError::cuda(e, 0, 0, name);
    let mut can: std::ffi::c_int = 0;
    // SAFETY: a valid place for the answer; both devices are live handles of their contexts.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, peer.cu_device(), owner.cu_device()) }
        .result()
        .map_err(err)?;
    if can == 0 {
        return Err(AllocError::new(
            AllocErrorKind::Unsupported(
                "the peer device cannot access this pool's device (cuDeviceCanAccessPeer)",
            ),
            0,
            0,
            name,
        ));
    }
    let _current = make_current(owner).map_err(err)?;
    let access = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: peer.cu_device(),
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `pool` is a live pool handle (the caller holds it); one valid descriptor, read
    // during the call. Granting access changes what other devices may touch, never what this
    // process's safe code may: nothing is freed or remapped.
    unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }
        .result()
        .map_err(err)
}

/// A driver entry point looked up by name at run time, for the calls whose bindings depend on the
/// CUDA version cudarc was built for (a program beside its own cudarc may pick 12.2, whose
/// bindings lack CUDA 13's calls); `None` where the driver lacks it (or there is no driver).
///
/// # Safety
///
/// `F` is the entry point's C signature (an `unsafe extern "C" fn`), and `name` ends with a NUL.
pub(crate) unsafe fn driver_symbol<F: Copy>(name: &[u8]) -> Option<F> {
    if !driver_available() {
        return None;
    }
    // SAFETY: the library is loaded (checked above), and the caller's `F` is the symbol's type.
    unsafe { sys::culib().get::<F>(name).ok().map(|f| *f) }
}

/// The number of CUDA devices, 0 without a driver.
pub fn device_count() -> usize {
    if !driver_available() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// A context made current for a call of the crate's, until dropped: then the context that was
/// current on the thread before (none included) is current again, so that a stack of one device
/// never leaves the caller's thread on another device's context. The switch is a push onto the
/// thread's context stack and a pop (`cuCtxPushCurrent` / `cuCtxPopCurrent`): the driver keeps
/// the previous context, which the guard never names again.
///
/// An error recorded in the context (`CudaContext::record_err`, which anyone may call) is parked
/// meanwhile and recorded again at the end: cudarc's calls inside the guard, which check it first,
/// would otherwise skip their waits and binds for it.
#[must_use = "the context is current only while the guard lives"]
pub(crate) struct Current<'a> {
    ctx: &'a CudaContext,
    pushed: bool,
    parked: Option<DriverError>,
    /// Not `Send`: the pop in the drop must run on the thread that pushed.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops what `make_current` pushed on this thread (the guard is not `Send`,
            // and guards drop in the reverse order they were made).
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
        if let Some(e) = self.parked.take() {
            self.ctx.record_err::<()>(Err(e));
        }
    }
}

/// Makes `ctx` current on this thread until the guard drops (see [`Current`]).
pub(crate) fn make_current(ctx: &CudaContext) -> Result<Current<'_>, DriverError> {
    let parked = ctx.check_err().err();
    let mut guard = Current {
        ctx,
        pushed: false,
        parked,
        _thread: std::marker::PhantomData,
    };
    if result::ctx::get_current()? != Some(ctx.cu_ctx()) {
        // SAFETY: the CudaContext holds its context alive; it is popped when the guard drops.
        unsafe { sys::cuCtxPushCurrent_v2(ctx.cu_ctx()) }.result()?;
        guard.pushed = true;
    }
    Ok(guard)
}

/// Parks the error recorded in `ctx` (see [`Current`]) while the guard lives, for calls that
/// order memory through cudarc (its waits check that error first and skip their work for it):
/// a container's drop, its uses on other streams.
pub(crate) fn park_error(ctx: &CudaContext) -> Current<'_> {
    Current {
        ctx,
        pushed: false,
        parked: ctx.check_err().err(),
        _thread: std::marker::PhantomData,
    }
}

/// [`make_current`] for a call that cannot return an error (a free, a drop): the error goes to
/// the context (`CudaContext::check_err`), and the call goes on.
pub(crate) fn make_current_or_record(ctx: &CudaContext) -> Option<Current<'_>> {
    match make_current(ctx) {
        Ok(c) => Some(c),
        Err(e) => {
            ctx.record_err::<()>(Err(e));
            None
        }
    }
}

/// Makes `ctx` current on this thread, then runs one allocating driver call for a request its
/// resource has checked (`check_request`), checking the pointer it returns against the alignment
/// asked. Shared by the CUDA leaves, whose guarantee is 256 bytes.
pub(crate) fn driver_allocate(
    ctx: &CudaContext,
    size: usize,
    align: usize,
    name: &'static str,
    alloc: impl FnOnce(usize) -> Result<usize, DriverError>,
    free: impl FnOnce(usize) -> Result<(), DriverError>,
) -> Result<NonNull<u8>, AllocError> {
    if align > CUDA_ALIGNMENT {
        return Err(AllocError::new(
            AllocErrorKind::Unsupported(
                "alignment above the 256 bytes CUDA allocations guarantee; wrap the resource in Aligned",
            ),
            size,
            align,
            name,
        ));
    }
    let _current = make_current(ctx).map_err(|e| AllocError::cuda(e, size, align, name))?;
    let addr = alloc(size).map_err(|e| AllocError::cuda(e, size, align, name))?;
    match NonNull::new(addr as *mut u8) {
        // The resource promises 256 whatever the request asked (its `Alignment`): checked
        // against that, not the request's (an `align` of 1 would check nothing).
        Some(ptr) if addr % align.max(CUDA_ALIGNMENT) == 0 => Ok(ptr),
        _ => {
            if addr != 0 {
                ctx.record_err(free(addr));
            }
            Err(AllocError::new(
                AllocErrorKind::Unsupported("the driver returned a null or misaligned pointer"),
                size,
                align,
                name,
            ))
        }
    }
}

/// Frees through one driver call with `ctx` current; a failure is recorded in the context
/// (`CudaContext::check_err`), since `deallocate` cannot return it.
pub(crate) fn driver_free(ctx: &CudaContext, free: impl FnOnce() -> Result<(), DriverError>) {
    let _current = crate::leaf::make_current_or_record(ctx);
    ctx.record_err(free());
}

/// Where a driver call on `stream` goes: the context to make current and the raw handle; `None`
/// for another thread's per-thread stream, which no handle names from this thread. A stream of a
/// cudarc context is addressed in that context, the others in the resource's (`ctx`).
fn locate<'s>(
    ctx: &'s CudaContext,
    stream: StreamRef<'s>,
) -> Option<(&'s CudaContext, sys::CUstream)> {
    if !stream.usable_here() {
        return None;
    }
    let context = stream.context().map_or(ctx, |c| &**c);
    Some((context, stream.as_raw()))
}

/// The handle to queue `stream`-ordered work of a resource in `ctx` on, or why there is none:
/// a simulated stream, another thread's per-thread stream, a stream of another context.
pub(crate) fn stream_in(
    ctx: &CudaContext,
    stream: StreamRef<'_>,
    size: usize,
    align: usize,
    name: &'static str,
) -> Result<sys::CUstream, AllocError> {
    let refuse = |why| {
        Err(AllocError::new(
            AllocErrorKind::Unsupported(why),
            size,
            align,
            name,
        ))
    };
    if stream.is_simulated() {
        return refuse("a simulated stream reached a resource that orders memory on CUDA streams");
    }
    match locate(ctx, stream) {
        None => {
            refuse("a per-thread stream made on another thread (its handle names this thread's)")
        }
        Some((c, _)) if c.cu_ctx() != ctx.cu_ctx() => {
            refuse("a stream of another context than the resource's")
        }
        Some((_, handle)) => Ok(handle),
    }
}

/// Synchronizes `stream`: its context made current, then the stream; for another thread's
/// per-thread stream, which cannot be named here, the whole of its context. A stream that
/// captures a graph is refused (`Unsupported`), its capture left whole; the whole context's
/// synchronization cannot see whether one of its streams captures, and fails such a capture.
pub(crate) fn driver_synchronize(
    ctx: &CudaContext,
    stream: StreamRef,
    name: &'static str,
) -> Result<(), AllocError> {
    if stream.is_simulated() {
        // No work is ever queued on a simulated stream.
        return Ok(());
    }
    let err = |e| AllocError::cuda(e, 0, 0, name);
    match locate(ctx, stream) {
        Some((c, handle)) => {
            let _current = crate::leaf::make_current(c).map_err(err)?;
            // Waiting for a capturing stream fails and invalidates its capture: say why instead,
            // and leave the capture whole.
            // SAFETY: as below.
            if unsafe { captures(handle) }.map_err(err)? {
                return Err(AllocError::new(
                    AllocErrorKind::Unsupported(
                        "the stream captures a graph: its work cannot be waited for until the capture ends",
                    ),
                    0,
                    0,
                    name,
                ));
            }
            // SAFETY: `handle` is null, a special handle valid on this thread, or a live stream
            // of `c`: a StreamRef borrows its stream for the call (or was made by `from_raw`,
            // whose caller promised it live).
            unsafe { result::stream::synchronize(handle) }.map_err(err)
        }
        None => synchronize_context(stream.context().map_or(ctx, |c| &**c)).map_err(err),
    }
}

/// Waits on the host for every stream of `ctx`, made current for the call (raw: it reads no
/// error slot).
pub(crate) fn synchronize_context(ctx: &CudaContext) -> Result<(), DriverError> {
    let _current = make_current(ctx)?;
    result::ctx::synchronize()
}

/// Makes `stream` wait for the work queued on `after` so far: an event recorded on `after` (in
/// its context), waited for by `stream`, then destroyed (the driver keeps it until the wait is
/// satisfied). Where either cannot be named from this thread, or `stream` is simulated, the host
/// waits for `after` instead, which orders everything queued later anywhere.
pub(crate) fn driver_order_after(
    ctx: &CudaContext,
    stream: StreamRef,
    after: StreamRef,
    name: &'static str,
) -> Result<(), AllocError> {
    if stream == after || after.is_simulated() {
        // No work is ever queued on a simulated stream: nothing to wait for.
        return Ok(());
    }
    let (Some((sc, s)), Some((ac, a))) = (locate(ctx, stream), locate(ctx, after)) else {
        return driver_synchronize(ctx, after, name);
    };
    if stream.is_simulated() {
        // A suballocator hands `after`'s blocks to the simulated stream, and may later hand them
        // on to a real stream ordered only after the simulated one: wait for `after` now.
        return driver_synchronize(ctx, after, name);
    }
    if sc.cu_ctx() == ac.cu_ctx() && s == a {
        // Two names of one stream (`DEFAULT` and the resource context's default stream).
        return Ok(());
    }
    let err = |e| AllocError::cuda(e, 0, 0, name);
    let _current = crate::leaf::make_current(ac).map_err(err)?;
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(err)?;
    // SAFETY: the event was just created in `ac`, current; `a` is null, a special handle valid on
    // this thread, or a live stream of `ac` (a StreamRef borrows its stream for the call, or was
    // made by `from_raw`, whose caller promised it live).
    let recorded = unsafe { result::event::record(event, a) };
    let waited = recorded.and_then(|()| {
        let _in_sc = make_current(sc)?;
        // SAFETY: as above for `s` in `sc`; a stream may wait on an event of another context.
        unsafe {
            result::stream::wait_event(s, event, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        }
    });
    // SAFETY: the event is destroyed once, after the wait is queued, which the driver allows.
    ac.record_err(unsafe { result::event::destroy(event) });
    waited.map_err(err)
}

/// Whether `handle` captures a graph now (`cuStreamIsCapturing`).
///
/// # Safety
///
/// `handle` is null, a special handle valid on this thread, or a live stream of the current
/// context.
unsafe fn captures(handle: sys::CUstream) -> Result<bool, DriverError> {
    let mut capturing = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a valid place for the answer; `handle` as the caller promised.
    unsafe { sys::cuStreamIsCapturing(handle, &mut capturing) }.result()?;
    Ok(capturing != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// An event recorded on a stream: what the stream had queued when it was recorded is complete
/// once the event is. Destroyed when dropped.
#[derive(Debug)]
pub struct StreamMark {
    ctx: Arc<CudaContext>,
    event: sys::CUevent,
}

// SAFETY: a CUevent may be queried, waited for and destroyed from any thread of the process, with
// its context current (each use makes `ctx` current first).
unsafe impl Send for StreamMark {}
// SAFETY: a shared `StreamMark` only queries and waits for its event (`cuEventQuery`,
// `cuEventSynchronize`), driver calls that any number of threads may make on one live event at
// once; only its drop, which has it alone, destroys it.
unsafe impl Sync for StreamMark {}

impl StreamMark {
    /// An event recorded on `stream` in its context (the resource's `ctx` for a stream that
    /// names none); `None` for a simulated stream (no work is ever queued on one).
    /// `Unsupported` where the stream cannot be marked without waiting: it captures a graph
    /// (an event recorded there is the graph's, and can be neither queried nor waited for), or
    /// it is another thread's per-thread stream, which cannot be named here.
    pub(crate) fn record(
        ctx: &Arc<CudaContext>,
        stream: StreamRef,
        name: &'static str,
    ) -> Result<Option<StreamMark>, AllocError> {
        if stream.is_simulated() {
            return Ok(None);
        }
        let unsupported = |why| {
            Err(AllocError::new(
                AllocErrorKind::Unsupported(why),
                0,
                0,
                name,
            ))
        };
        let Some((_, handle)) = locate(ctx, stream) else {
            return unsupported("another thread's per-thread stream cannot be marked");
        };
        // The context `locate` found the stream in.
        let owner = stream.context().unwrap_or(ctx);
        let err = |e| AllocError::cuda(e, 0, 0, name);
        let _current = make_current(owner).map_err(err)?;
        // SAFETY: `handle` as below.
        if unsafe { captures(handle) }.map_err(err)? {
            return unsupported("the stream captures a graph");
        }
        let event =
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(err)?;
        let mark = StreamMark {
            ctx: owner.clone(),
            event,
        };
        // SAFETY: the event was just created in the current context; `handle` is null, a special
        // handle valid on this thread, or a live stream of it (a StreamRef borrows its stream for
        // the call, or was made by `from_raw`, whose caller promised it live).
        unsafe { result::event::record(mark.event, handle) }.map_err(err)?;
        Ok(Some(mark))
    }

    /// Whether the work before the event is complete (`cuEventQuery`); never waits.
    pub(crate) fn reached(&self, name: &'static str) -> Result<bool, AllocError> {
        // SAFETY: a live event of this context, recorded once.
        self.relaxed(name, || match unsafe { sys::cuEventQuery(self.event) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(DriverError(e)),
        })
    }

    /// Waits on the host for the work before the event (`cuEventSynchronize`).
    pub(crate) fn wait(&self, name: &'static str) -> Result<(), AllocError> {
        // SAFETY: a live event of this context, recorded once.
        self.relaxed(name, || unsafe { result::event::synchronize(self.event) })
    }

    /// Runs `call` in the event's context and this thread's relaxed capture mode: another
    /// thread's graph capture in global mode would otherwise fail, and be invalidated, at a
    /// query or a wait it cannot see (an allocation on any thread may make one).
    fn relaxed<T>(
        &self,
        name: &'static str,
        call: impl FnOnce() -> Result<T, DriverError>,
    ) -> Result<T, AllocError> {
        let err = |e| AllocError::cuda(e, 0, 0, name);
        let _current = make_current(&self.ctx).map_err(err)?;
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid place for the mode, exchanged back below.
        let relaxed = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result();
        let answer = call().map_err(err);
        if relaxed.is_ok() {
            // SAFETY: as above; `mode` holds the thread's mode from before.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
        answer
    }
}

impl Drop for StreamMark {
    fn drop(&mut self) {
        let _current = make_current_or_record(&self.ctx);
        // SAFETY: the event is live and destroyed once; the driver keeps it until the work
        // before it is complete.
        self.ctx
            .record_err(unsafe { result::event::destroy(self.event) });
    }
}

/// Keeps the CUDA error of a call that cannot return one (a `deallocate`) in `ctx`, where cudarc
/// keeps such errors for `CudaContext::check_err`.
pub(crate) fn record(ctx: &CudaContext, r: Result<(), AllocError>) {
    if let Err(AllocError {
        kind: AllocErrorKind::Cuda(code),
        ..
    }) = r
    {
        ctx.record_err::<()>(Err(DriverError(code)));
    }
}

/// The alignment every CUDA allocation guarantees.
pub(crate) const CUDA_ALIGNMENT: usize = 256;

/// Refuses a device whose host may not touch managed memory while any kernel runs on it
/// (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` 0: Windows under WDDM, some Tegra, devices
/// before Pascal): a host read of a managed block there faults while a kernel runs on any
/// stream, which no wait on the block's own stream prevents. With `ctx` current.
pub(crate) fn require_concurrent_managed_access(
    ctx: &CudaContext,
    name: &'static str,
) -> Result<(), AllocError> {
    let concurrent = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)
        .map_err(|e| AllocError::cuda(e, 0, 0, name))?;
    if concurrent == 0 {
        return Err(AllocError::new(
            AllocErrorKind::Unsupported(
                "managed memory needs a device with concurrent managed access (the host may not touch it while kernels run otherwise)",
            ),
            0,
            0,
            name,
        ));
    }
    Ok(())
}

/// Writes what the leaves over one context (a field `ctx: Arc<CudaContext>`) share:
/// `context_leaf!(Type, "what it allocates")` the constructors, `context_leaf!(streams)` the
/// stream calls of its `MemoryResource` impl, which go to the driver in that context,
/// `context_leaf!(driver "name", alloc = …, free = …)` those, its description and
/// `allocate`/`deallocate` for a leaf of one allocating and one freeing driver call (`free` serves
/// both a misaligned pointer just allocated and the caller's `deallocate`),
/// `context_leaf!(pool)` the stream calls and `allocate`/`deallocate` for a leaf over a driver
/// pool (a field `pool: CUmemoryPool`, live while the leaf is), `context_leaf!(pool accessors)`
/// such a leaf's `pool_handle` and `context`, and
/// `context_leaf!(describe "name")` its description, `name(device=N)` as text configurations
/// write it.
macro_rules! context_leaf {
    ($T:ident, $memory:literal $(, check = $check:path)?) => {
        impl $T {
            const NAME: &'static str = stringify!($T);

            #[doc = concat!("A resource allocating ", $memory, " for `ctx`'s device.")]
            pub fn new(
                ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
            ) -> Result<Self, $crate::resource::AllocError> {
                let _current = $crate::leaf::make_current(ctx)
                    .map_err(|e| $crate::resource::AllocError::cuda(e, 0, 0, Self::NAME))?;
                $( $check(ctx, Self::NAME)?; )?
                Ok($T { ctx: ctx.clone() })
            }

            #[doc = concat!("A resource allocating ", $memory, " for device `ordinal`; ")]
            /// `Err(NoDriver)` on a machine without CUDA.
            pub fn on_device(ordinal: usize) -> Result<Self, $crate::resource::AllocError> {
                Self::new(&$crate::cuda_context(ordinal)?)
            }

            /// The context this resource allocates in.
            pub fn context(&self) -> &std::sync::Arc<cudarc::driver::CudaContext> {
                &self.ctx
            }
        }
    };
    (streams) => {
        fn synchronize(
            &self,
            stream: $crate::stream::StreamRef<'_>,
        ) -> Result<(), $crate::resource::AllocError> {
            $crate::leaf::driver_synchronize(&self.ctx, stream, Self::NAME)
        }

        fn order_after(
            &self,
            stream: $crate::stream::StreamRef<'_>,
            after: $crate::stream::StreamRef<'_>,
        ) -> Result<(), $crate::resource::AllocError> {
            $crate::leaf::driver_order_after(&self.ctx, stream, after, Self::NAME)
        }

        fn name(&self) -> &'static str {
            Self::NAME
        }
    };
    (driver $text:literal, alloc = $alloc:expr, free = $free:expr $(,)?) => {
        fn allocate(
            &self,
            size: usize,
            align: usize,
            _: $crate::stream::StreamRef<'_>,
        ) -> $crate::resource::Result<std::ptr::NonNull<u8>> {
            match $crate::resource::check_request::<Self>(size, align, Self::NAME)? {
                Some(empty) => Ok(empty),
                None => $crate::leaf::driver_allocate(&self.ctx, size, align, Self::NAME, $alloc, $free),
            }
        }

        unsafe fn deallocate(
            &self,
            ptr: std::ptr::NonNull<u8>,
            size: usize,
            _: usize,
            _: $crate::stream::StreamRef<'_>,
        ) {
            if size == 0 {
                return;
            }
            let free = $free;
            $crate::leaf::driver_free(&self.ctx, || free(ptr.as_ptr() as usize));
        }

        $crate::leaf::context_leaf!(streams);
        $crate::leaf::context_leaf!(describe $text);
    };
    (pool) => {
        fn allocate(
            &self,
            size: usize,
            align: usize,
            stream: $crate::stream::StreamRef<'_>,
        ) -> $crate::resource::Result<std::ptr::NonNull<u8>> {
            if let Some(empty) = $crate::resource::check_request::<Self>(size, align, Self::NAME)? {
                return Ok(empty);
            }
            // SAFETY: the leaf's pool lives as long as the leaf (its impl's SAFETY says why).
            unsafe {
                $crate::leaf::pool_allocate(&self.ctx, self.pool, size, align, stream, Self::NAME)
            }
        }

        unsafe fn deallocate(
            &self,
            ptr: std::ptr::NonNull<u8>,
            size: usize,
            align: usize,
            stream: $crate::stream::StreamRef<'_>,
        ) {
            // SAFETY: the caller's promise: a live pointer from this leaf's pool.
            unsafe { $crate::leaf::pool_free(&self.ctx, ptr, size, align, stream, Self::NAME) }
        }

        $crate::leaf::context_leaf!(streams);
    };
    (pool accessors) => {
        /// The driver pool handle, for `cuMemPool*` calls this type does not wrap.
        pub fn pool_handle(&self) -> cudarc::driver::sys::CUmemoryPool {
            self.pool
        }

        /// The context this resource allocates in.
        pub fn context(&self) -> &std::sync::Arc<cudarc::driver::CudaContext> {
            &self.ctx
        }
    };
    (describe $text:literal) => {
        fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            $crate::stack::ItemWriter::leaf(f, $text)
                .number("device", self.ctx.ordinal())
                .finish()
        }
    };
}
pub(crate) use context_leaf;

// The context pushed by `make_current` is popped on the thread that pushed it.
static_assertions::assert_not_impl_any!(Current<'static>: Send);
