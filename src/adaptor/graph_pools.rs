//! `GraphPools`: allocations made while a stream captures a CUDA graph come from a pool private to
//! that capture, kept until the graph is dropped (PyTorch's graph memory pools).

use crate::resource::{
    check_request, forward_upstream, AllocError, AllocErrorKind, Layer, MemoryResource, Result,
};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::{StreamHandle, StreamRef};
use crate::suballoc::growth::GRANULE;
use crate::suballoc::{Pool, PoolConfig};
use cudarc::driver::{sys, CudaGraph, CudaStream};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

const NAME: &str = "GraphPools";

/// The configuration of a [`GraphPools`]; `resource_stack!` builds one from `GraphPools`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphPoolsConfig {}

impl<U: MemoryResource> Layer<U> for GraphPoolsConfig {
    type Resource = GraphPools<U>;
    fn layer(self, upstream: U) -> GraphPools<U> {
        GraphPools::new(upstream)
    }
}

/// The upstream as a capture's pool sees it: the pool's chunks go back to the upstream only once
/// the capture's graph is gone. Before that, a chunk the pool gives up (a `Pool` releases wholly
/// free chunks when its upstream runs out) is held here: the graph's replays may still use it.
#[derive(Debug)]
struct Keep<U: MemoryResource> {
    upstream: Arc<U>,
    /// The chunks given up while the graph may live, and whether it is gone.
    held: Mutex<(Vec<Block>, bool)>,
}

/// A block to give back to the upstream later: address, size, alignment, stream.
type Block = (NonNull<u8>, usize, usize, StreamHandle);

impl<U: MemoryResource> Keep<U> {
    /// The graph is gone and its work done: what was held goes back, and later chunks at once.
    fn let_go(&self) {
        let held = {
            let mut h = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            h.1 = true;
            std::mem::take(&mut h.0)
        };
        for (ptr, size, align, stream) in held {
            // SAFETY: a chunk of the upstream the pool gave up with these arguments, held since;
            // the graph that used it is gone and its work done.
            unsafe { self.upstream.deallocate(ptr, size, align, stream.as_ref()) };
        }
    }
}

// SAFETY: the raw pointers held are chunks only this `Keep` gives back, under its mutex.
unsafe impl<U: MemoryResource + Send + Sync> Send for Keep<U> {}
// SAFETY: as above; the upstream is shared as `U: Sync` allows.
unsafe impl<U: MemoryResource + Send + Sync> Sync for Keep<U> {}

// SAFETY: every call goes to the upstream unchanged, but a deallocation, which waits (held, not
// reused by anyone) until the graph that may use the memory is gone.
unsafe impl<U: MemoryResource> MemoryResource for Keep<U> {
    forward_upstream!(U, upstream);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        self.upstream.allocate(size, align, stream)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        {
            let mut h = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            if !h.1 {
                h.0.push((ptr, size, align, stream.to_handle()));
                return;
            }
        }
        // SAFETY: the caller's promise (a chunk of the upstream, given up after the graph).
        unsafe { self.upstream.deallocate(ptr, size, align, stream) }
    }
}

/// A block freed on a capturing stream that the capture did not allocate: the graph uses it up
/// to that free, so it goes back only with the graph, to where it came from.
#[derive(Debug)]
enum Kept {
    /// A block of the upstream.
    Upstream(Block),
    /// A block of another capture's pool (that capture's id).
    Capture(u64, Block),
}

/// One capture's memory.
#[derive(Debug)]
struct Private<U: MemoryResource> {
    /// What the capture allocated: a pool of its own, whose blocks a free during the capture
    /// makes reusable by the capture alone, over the upstream through a `Keep`.
    pool: Arc<Pool<Arc<Keep<U>>>>,
    /// Blocks allocated outside the capture and freed on a capturing stream.
    kept: Vec<Kept>,
    /// Set when the graph is gone: the pool goes back to the upstream once its blocks are all
    /// free; until then nothing allocates from it (a capture's id is never reused).
    released: bool,
}

impl<U: MemoryResource> Private<U> {
    fn new(upstream: &Arc<U>) -> Self {
        let keep = Arc::new(Keep {
            upstream: upstream.clone(),
            held: Mutex::new((Vec::new(), false)),
        });
        Private {
            pool: Arc::new(Pool::new(keep, PoolConfig::default())),
            kept: Vec::new(),
            released: false,
        }
    }
}

#[derive(Debug)]
struct State<U: MemoryResource> {
    captures: HashMap<u64, Private<U>>,
    /// Every live block a capture's pool handed out, and that capture.
    owner: HashMap<usize, u64, crate::hash::FastHash>,
}

/// Stream-ordered memory that CUDA graphs can keep: allocations made while their stream is
/// capturing a graph come from a pool private to that capture, and stay out of every other use
/// until the graph is dropped, so that a graph replayed a hundred times never finds its memory
/// handed to someone else (PyTorch's graph memory pools; RMM leaves graphs out of scope).
///
/// Outside a capture every call goes to the upstream unchanged. Inside one (the stream's
/// `cuStreamGetCaptureInfo` says so):
///
/// * an allocation comes from the capture's own [`Pool`] over the upstream;
/// * a free of such a block makes it reusable by that capture only (the work captured before the
///   free is ordered before the reuse, in the graph as on the stream);
/// * a free of a block allocated outside the capture keeps it until the graph is dropped: the
///   graph's replays use it up to that free.
///
/// After the capture, a block it allocated that is freed goes back to the capture's pool, not to
/// the upstream, and the pool goes back to the upstream when the graph is gone and its blocks are
/// all free. [`capture`](Self::capture) runs a capture and returns the graph as a
/// [`CapturedGraph`] that borrows this resource and gives the capture's memory back when dropped
/// (after waiting for its replays). A capture begun with cudarc's `begin_capture` directly is
/// served too, but nothing tells when its graph is gone: its memory stays for the life of this
/// resource and is leaked, not freed, when it drops (a graph may outlive it).
///
/// What this resource cannot keep: memory allocated *before* the capture that the graph reads or
/// writes, freed *after* it, goes back when its owner frees it. Keep the graph's inputs and
/// outputs alive as long as the graph (a `CapturedGraph` borrows this resource, not them).
///
/// # Cost
///
/// Each call asks the driver whether the stream is capturing (`cuStreamGetCaptureInfo`, a
/// fraction of a microsecond), and a free looks the block up in a map of the captures' blocks
/// under a mutex: meant for the allocations of a captured step, over a suballocator below it
/// for the rest. A capture's pool grows by the upstream's allocations during the capture: over
/// `Cuda` (`cuMemAlloc`, which global capture mode forbids) capture in relaxed mode, or give
/// [`capture`](Self::capture) a `reserve` taken before the capture begins.
///
/// # Streams
///
/// A capture's pool keeps free blocks per stream, as `Pool` does; streams that join the capture
/// (forked through events) share its pool. Calls outside captures keep their stream.
/// `synchronize` and `order_after` go to the upstream.
///
/// # Upstream
///
/// Any resource that allocates without queueing work on the stream (`Cuda`, `Pool` or `Binning`
/// over it): a stream-ordered upstream (`CudaAsync`) would make its allocations graph nodes of
/// their own. The memory has the upstream's properties.
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
/// use mrstack::adaptor::GraphPools;
/// use cudarc::driver::sys::CUstreamCaptureMode;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = mrstack::cuda_context(0)?;
/// let mr = resource_stack![Cuda::new(&ctx)?, GraphPools];
/// let stream = ctx.new_stream()?;
/// let mut out = DeviceVec::<f32, _>::zeroed(1 << 20, &mr, &stream)?;
/// let (graph, ()) = mr.capture(&stream, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED, 64 << 20, || {
///     // Work queued here is recorded, not run; scratch allocated here is the graph's.
///     let scratch = DeviceVec::<f32, _>::zeroed(1 << 20, &mr, &stream).expect("scratch");
///     drop(scratch);
/// })?;
/// for _ in 0..100 {
///     graph.launch()?;
/// }
/// # drop(out);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GraphPools<U: MemoryResource> {
    upstream: Arc<U>,
    state: Mutex<State<U>>,
}

impl<U: MemoryResource> GraphPools<U> {
    /// Graph pools over `upstream`.
    pub fn new(upstream: U) -> Self {
        GraphPools {
            upstream: Arc::new(upstream),
            state: Mutex::new(State {
                captures: HashMap::new(),
                owner: HashMap::default(),
            }),
        }
    }

    /// The resource below.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The captures whose memory is held now (their graphs alive, or begun outside
    /// [`capture`](Self::capture)), and the bytes their pools hold.
    pub fn held(&self) -> (usize, usize) {
        let st = self.lock();
        let bytes = st.captures.values().map(|p| p.pool.usage().held).sum();
        (st.captures.len(), bytes)
    }

    fn lock(&self) -> MutexGuard<'_, State<U>> {
        // Every update completes before the next upstream call: the state behind a poisoned
        // lock is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Captures the work `f` queues on `stream` (and on streams that join it) into a graph, in
    /// capture `mode` (`RELAXED` lets the capture's pool grow with `cuMemAlloc`), with `reserve`
    /// bytes taken for the capture's pool on `stream` before the capture begins. Returns the
    /// graph, which gives the capture's memory back when dropped, and what `f` returned.
    ///
    /// `Err` where the capture cannot begin or end (the driver's error; a capture that `f`
    /// invalidated ends without a graph: `InvalidArgument`), and where `f` ended the capture
    /// itself: its graph is then the caller's, so the capture's memory stays held for the life
    /// of this resource (and is leaked with it). If `f` panics, the capture is ended and its
    /// memory given back before the panic goes on.
    pub fn capture<R>(
        &self,
        stream: &Arc<CudaStream>,
        mode: sys::CUstreamCaptureMode,
        reserve: usize,
        f: impl FnOnce() -> R,
    ) -> Result<(CapturedGraph<'_, U>, R), AllocError> {
        let err = |e| AllocError::cuda(e, reserve, 0, NAME);
        let private = Private::new(&self.upstream);
        if reserve > 0 {
            // Taken and freed on `stream` before it captures, so the capture finds it on its own
            // stream's list (a block of another stream would need an event from outside).
            let s = StreamRef::from(stream);
            let p = private.pool.allocate(reserve, GRANULE, s)?;
            // SAFETY: just allocated from this pool with these arguments, unused.
            unsafe { private.pool.deallocate(p, reserve, GRANULE, s) };
        }
        stream.begin_capture(mode).map_err(err)?;
        let id = match capture_id(StreamRef::from(stream)) {
            Ok(Some(id)) => id,
            other => {
                let _ = stream.end_capture(sys::CUgraphInstantiate_flags(0));
                private.pool.upstream().let_go();
                return Err(match other {
                    Err(e) => e,
                    _ => not_captured(),
                });
            }
        };
        {
            let mut st = self.lock();
            match st.captures.entry(id) {
                // Another thread allocated on this stream first: its pool serves the capture, and
                // the reserve, which no graph uses, goes back.
                std::collections::hash_map::Entry::Occupied(_) => {
                    drop(st);
                    private.pool.upstream().let_go();
                    drop(private);
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(private);
                }
            }
        }
        let unwinding = Unwind {
            pools: self,
            stream,
            id,
        };
        let out = f();
        std::mem::forget(unwinding);
        if !matches!(capture_id(StreamRef::from(stream)), Ok(Some(x)) if x == id) {
            // `f` ended the capture (and may hold its graph): nothing may be given back.
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "the closure ended the capture itself: its memory stays held for the life of the GraphPools",
                ),
                0,
                0,
                NAME,
            ));
        }
        match stream.end_capture(sys::CUgraphInstantiate_flags(0)) {
            Ok(Some(graph)) => Ok((
                CapturedGraph {
                    graph: Some(graph),
                    stream: stream.clone(),
                    pools: self,
                    id,
                },
                out,
            )),
            // No graph: nothing can replay the capture's work, but what it queued may still
            // run on the stream (an invalidated capture), so the stream is waited for.
            failed => {
                let synced = stream.synchronize();
                if synced.is_ok() {
                    self.release(id);
                }
                Err(match failed {
                    Err(e) => err(e),
                    _ => not_captured(),
                })
            }
        }
    }

    /// The graph of capture `id` is gone and its work done: what it kept goes back, the chunks
    /// its pool gave up too, and its pool once its blocks are all free.
    fn release(&self, id: u64) {
        let (kept, keep, done) = {
            let mut st = self.lock();
            let Some(private) = st.captures.get_mut(&id) else {
                return;
            };
            private.released = true;
            let kept = std::mem::take(&mut private.kept);
            let keep = private.pool.upstream().clone();
            let done = (private.pool.usage().allocated == 0)
                .then(|| st.captures.remove(&id))
                .flatten();
            (kept, keep, done)
        };
        keep.let_go();
        for k in kept {
            match k {
                Kept::Upstream((ptr, size, align, stream)) => {
                    // SAFETY: a block of the upstream, freed by its owner during the capture with
                    // this size and alignment, kept since; the graph is gone and its work done.
                    unsafe { self.upstream.deallocate(ptr, size, align, stream.as_ref()) };
                }
                Kept::Capture(owner, block) => self.free_into(owner, block),
            }
        }
        // The pool drops here, outside the lock, giving its chunks back through its `Keep`.
        drop(done);
    }

    /// Frees `block` into the pool of capture `owner`, which allocated it, and gives that pool
    /// back if its graph is gone and it is empty now.
    fn free_into(&self, owner: u64, (ptr, size, align, stream): Block) {
        let Some(pool) = self.lock().captures.get(&owner).map(|p| p.pool.clone()) else {
            return;
        };
        // SAFETY: a block this pool handed out with this size and alignment (the pool's
        // alignment as `allocate` raised it), freed by its owner, not yet given back.
        unsafe { pool.deallocate(ptr, size, align, stream.as_ref()) };
        drop(pool);
        let done = {
            let mut st = self.lock();
            let empty = st
                .captures
                .get(&owner)
                .is_some_and(|p| p.released && p.pool.usage().allocated == 0);
            empty.then(|| st.captures.remove(&owner)).flatten()
        };
        drop(done);
    }
}

/// Ends a capture whose closure panicked, gives its memory back once the stream is done, and lets
/// the panic go on. Only if the capture is still the one `capture` began.
struct Unwind<'a, U: MemoryResource> {
    pools: &'a GraphPools<U>,
    stream: &'a Arc<CudaStream>,
    id: u64,
}

impl<U: MemoryResource> Drop for Unwind<'_, U> {
    fn drop(&mut self) {
        if !matches!(capture_id(StreamRef::from(self.stream)), Ok(Some(x)) if x == self.id) {
            return;
        }
        drop(self.stream.end_capture(sys::CUgraphInstantiate_flags(0)));
        if self.stream.synchronize().is_ok() {
            self.pools.release(self.id);
        }
    }
}

fn not_captured() -> AllocError {
    AllocError::new(
        AllocErrorKind::InvalidArgument(
            "the stream was not capturing a graph (the capture was invalidated)",
        ),
        0,
        0,
        NAME,
    )
}

/// The alignment a capture's pool is asked for: what `U` guarantees, which this resource promises
/// in its type, or more.
fn pool_align<U: MemoryResource>(align: usize) -> usize {
    align.max(<U::Alignment as typenum::Unsigned>::USIZE)
}

/// The id of the capture `stream` is part of, if it is capturing now.
fn capture_id(stream: StreamRef) -> Result<Option<u64>> {
    if stream.is_simulated() || !stream.usable_here() {
        return Ok(None);
    }
    // The legacy default stream cannot capture; a stream with no cudarc context is that one or
    // a raw handle, which `StreamRef::from_raw`'s caller vouched for.
    let Some(ctx) = stream.context() else {
        return Ok(None);
    };
    let err = |e| AllocError::cuda(e, 0, 0, NAME);
    let _current = crate::leaf::make_current(ctx).map_err(err)?;
    /// `cuStreamGetCaptureInfo_v2(stream, status, id, graph, dependencies, count)`, which every
    /// driver since CUDA 11.3 exports whatever version the bindings are (the status as its
    /// number: 0 none, 1 active, 2 invalidated).
    type CaptureInfo = unsafe extern "C" fn(
        sys::CUstream,
        *mut std::ffi::c_uint,
        *mut u64,
        *mut sys::CUgraph,
        *mut *const sys::CUgraphNode,
        *mut usize,
    ) -> sys::CUresult;
    static INFO: std::sync::OnceLock<Option<CaptureInfo>> = std::sync::OnceLock::new();
    // SAFETY: the signature of cuStreamGetCaptureInfo_v2, a NUL-terminated name.
    let info = *INFO.get_or_init(|| unsafe {
        crate::leaf::driver_symbol::<CaptureInfo>(b"cuStreamGetCaptureInfo_v2\0")
    });
    let Some(info) = info else {
        return Err(AllocError::new(
            AllocErrorKind::Unsupported("this CUDA driver cannot say whether a stream captures"),
            0,
            0,
            NAME,
        ));
    };
    let (mut status, mut id): (std::ffi::c_uint, u64) = (0, 0);
    // SAFETY: a live stream of `ctx` (a StreamRef borrows it); valid places for the status and
    // id; null for the outputs not asked for.
    let r = unsafe {
        info(
            stream.as_raw(),
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    r.result().map_err(err)?;
    // Active (1) or invalidated (2): either way the work belongs to that capture.
    Ok((status != 0).then_some(id))
}

// SAFETY: outside captures every call is the upstream's, unchanged. A capture's blocks come from
// its own Pool over the same upstream (disjoint from everything else the upstream hands out) and
// go back only to that pool, which serves only that capture and returns its memory to the upstream
// only after the graph is gone and its replays done; blocks freed during a capture that it did not
// allocate go back to the upstream only then too. The memory is the upstream's.
unsafe impl<U: MemoryResource> MemoryResource for GraphPools<U> {
    forward_upstream!(U, upstream);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        let Some(id) = capture_id(stream)? else {
            return self.upstream.allocate(size, align, stream);
        };
        let pool = {
            let mut st = self.lock();
            let private = st
                .captures
                .entry(id)
                .or_insert_with(|| Private::new(&self.upstream));
            private.pool.clone()
        };
        // No lock of ours across the upstream's calls (a `Retry` callback may free through
        // this resource). The pool guarantees 256 bytes: it is asked for what `U` guarantees.
        let ptr = pool.allocate(size, pool_align::<U>(align), stream)?;
        self.lock().owner.insert(ptr.as_ptr() as usize, id);
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        let capturing = capture_id(stream).ok().flatten();
        let mut st = self.lock();
        let owner = st.owner.remove(&(ptr.as_ptr() as usize));
        let block = || (ptr, size, align, stream.to_handle());
        match (owner, capturing) {
            // Freed during another capture than its own: that graph uses it up to the free.
            (Some(a), Some(b)) if a != b => {
                let block = (ptr, size, pool_align::<U>(align), stream.to_handle());
                st.captures
                    .entry(b)
                    .or_insert_with(|| Private::new(&self.upstream))
                    .kept
                    .push(Kept::Capture(a, block));
            }
            // Back to its capture's pool: reusable by that capture only (its graph is the only
            // user of the pool), or waiting there for the graph to go.
            (Some(a), _) => {
                drop(st);
                self.free_into(a, (ptr, size, pool_align::<U>(align), stream.to_handle()));
            }
            // An outside block freed during a capture: kept until that graph is gone.
            (None, Some(b)) => {
                st.captures
                    .entry(b)
                    .or_insert_with(|| Private::new(&self.upstream))
                    .kept
                    .push(Kept::Upstream(block()));
            }
            (None, None) => {
                drop(st);
                // SAFETY: the caller's promise: a block of the upstream with these arguments.
                unsafe { self.upstream.deallocate(ptr, size, align, stream) }
            }
        }
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &*self.upstream, "graph_pools").finish()
    }

    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        Some(&*self.upstream)
    }
}

has_upstream!(impl<U> for GraphPools<U> where U: MemoryResource);

impl<U: MemoryResource> Drop for GraphPools<U> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        // Captures begun outside `capture` may have graphs that outlive this resource: their
        // memory is leaked, never handed out again. (Those of `capture` are released already:
        // their graphs borrowed this resource.)
        for (_, private) in st.captures.drain() {
            std::mem::forget(private);
        }
    }
}

/// A graph [`GraphPools::capture`] made, which keeps the capture's memory until it is dropped.
///
/// Dropping it destroys the graph, waits for its replays (on its stream), then gives the memory
/// back to the capture's pool and the pool to the upstream once its blocks are free.
pub struct CapturedGraph<'a, U: MemoryResource> {
    graph: Option<CudaGraph>,
    stream: Arc<CudaStream>,
    pools: &'a GraphPools<U>,
    id: u64,
}

impl<U: MemoryResource> std::fmt::Debug for CapturedGraph<'_, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGraph")
            .field("capture", &self.id)
            .field("graph", &self.graph.is_some())
            .finish()
    }
}

impl<U: MemoryResource> CapturedGraph<'_, U> {
    /// Replays the graph on the stream it was captured on. Refused while that stream captures
    /// another graph: the launch would become part of that graph, which could then outlive this
    /// one and the memory it holds. (The `CudaGraph` itself is not handed out, for that reason.)
    pub fn launch(&self) -> Result<(), AllocError> {
        if capture_id(StreamRef::from(&self.stream))?.is_some() {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "a CapturedGraph is not launched into another capture (that graph would outlive this one's memory)",
                ),
                0,
                0,
                NAME,
            ));
        }
        match &self.graph {
            Some(graph) => graph.launch(),
            None => Ok(()),
        }
        .map_err(|e| AllocError::cuda(e, 0, 0, NAME))
    }

    /// Uploads the graph to the device ahead of its first launch (`cuGraphUpload`).
    pub fn upload(&self) -> Result<(), AllocError> {
        match &self.graph {
            Some(graph) => graph.upload(),
            None => Ok(()),
        }
        .map_err(|e| AllocError::cuda(e, 0, 0, NAME))
    }
}

impl<U: MemoryResource> Drop for CapturedGraph<'_, U> {
    fn drop(&mut self) {
        drop(self.graph.take());
        if self.stream.synchronize().is_err() {
            // The replays may still run: the memory stays (held until the resource drops, then
            // leaked) rather than be handed out under them.
            return;
        }
        self.pools.release(self.id);
    }
}

// SAFETY: `Private` holds blocks (raw pointers) only this resource touches, under its mutex.
unsafe impl<U: MemoryResource + Send + Sync> Send for GraphPools<U> {}
// SAFETY: as above: every access to the state is under the mutex.
unsafe impl<U: MemoryResource + Send + Sync> Sync for GraphPools<U> {}

static_assertions::assert_impl_all!(GraphPools<crate::leaf::Cuda>: Send, Sync, crate::property::Accessible<crate::property::DeviceAccessible>);
static_assertions::assert_not_impl_any!(GraphPools<crate::leaf::Cuda>: crate::property::Accessible<crate::property::HostAccessible>);
