//! Streams as resources see them: [`StreamRef`] (borrowed, `Copy`), [`StreamHandle`] (owned),
//! [`StreamId`] (a number for logs and keys).
//!
//! A `StreamRef<'a>` borrows the stream it names for `'a`, so safe code cannot hand a resource a
//! stream that is gone: one made from a cudarc `&'a Arc<CudaStream>` keeps the borrow, the
//! default stream and simulated streams live forever, and a raw handle needs `unsafe`
//! ([`StreamRef::from_raw`]). A resource that keeps a stream past the call (a suballocator's
//! per-stream free list, a chunk to give back on its stream) keeps a [`StreamHandle`], which holds
//! the `Arc` and so keeps the stream alive: the driver never sees a destroyed stream, and a stream
//! handle value cannot be reused by a new stream while anything keys a free list by it.

use cudarc::driver::{sys::CUstream, CudaStream};
use std::collections::HashMap;
use std::sync::Arc;

/// A borrowed stream handle: what resources take with every call.
///
/// * [`StreamRef::DEFAULT`]: the default (null) stream.
/// * `StreamRef::from(&stream)` for a cudarc `Arc<CudaStream>`: borrows it, so the stream outlives
///   every use of the `StreamRef`; a resource that keeps it clones the `Arc`
///   ([`to_handle`](Self::to_handle)).
/// * [`StreamRef::simulated`]: a made-up stream for replays and tests over host resources; no
///   work can be queued on it, CUDA resources refuse to allocate on it and have nothing to wait for.
/// * [`StreamRef::from_raw`] (`unsafe`): a raw `CUstream` from another library.
#[derive(Clone, Copy)]
pub struct StreamRef<'a>(Kind<'a>);

#[derive(Clone, Copy)]
enum Kind<'a> {
    Default,
    Borrowed(&'a Arc<CudaStream>),
    Raw(CUstream),
    Simulated(u32),
}

// SAFETY: a CUstream handle may be used from any thread (the driver serializes access to it), and
// `&Arc<CudaStream>` is Send/Sync because CudaStream is.
unsafe impl Send for StreamRef<'_> {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for StreamRef<'_> {}

impl StreamRef<'static> {
    /// The default (null) stream.
    pub const DEFAULT: StreamRef<'static> = StreamRef(Kind::Default);

    /// Wraps a raw stream handle (a null handle is [`DEFAULT`](Self::DEFAULT)).
    ///
    /// # Safety
    ///
    /// `stream` is null or a live stream, and stays live as long as any resource it is given to
    /// (suballocators keep the handles of streams that freed blocks, to order later reuse after
    /// them, until they are dropped), and no other live stream of the process has the same handle
    /// value meanwhile (true of any live stream).
    pub const unsafe fn from_raw(stream: CUstream) -> Self {
        if stream.is_null() {
            StreamRef(Kind::Default)
        } else {
            StreamRef(Kind::Raw(stream))
        }
    }

    /// A simulated stream `n` (`n` = 0 is [`DEFAULT`](Self::DEFAULT)): distinct streams for
    /// replaying many-stream workloads over `Simulated` or `System`, where no stream exists. No
    /// work is ever queued on one: `CudaAsync` refuses to allocate on it
    /// ([`AllocErrorKind::Unsupported`](crate::AllocErrorKind::Unsupported)), CUDA leaves have
    /// nothing to wait for on it, and ordering one after a real stream waits for that stream on
    /// the host (a suballocator may hand the real stream's blocks on through it).
    pub const fn simulated(n: u32) -> Self {
        if n == 0 {
            StreamRef(Kind::Default)
        } else {
            StreamRef(Kind::Simulated(n))
        }
    }
}

impl<'a> StreamRef<'a> {
    /// The raw handle, for driver calls: null for the default stream and for simulated streams.
    /// Check [`is_simulated`](Self::is_simulated) before queuing work on it.
    pub fn as_raw(self) -> CUstream {
        match self.0 {
            Kind::Default | Kind::Simulated(_) => std::ptr::null_mut(),
            Kind::Borrowed(s) => s.cu_stream(),
            Kind::Raw(s) => s,
        }
    }

    /// True for the default (null) stream, however it was made.
    pub fn is_default(self) -> bool {
        !self.is_simulated() && self.as_raw().is_null()
    }

    /// True for a [`simulated`](Self::simulated) stream.
    pub fn is_simulated(self) -> bool {
        matches!(self.0, Kind::Simulated(_))
    }

    /// The stream's identity: equal for two `StreamRef`s of one stream, distinct for distinct
    /// live streams and simulated streams.
    pub fn id(self) -> StreamId {
        match self.0 {
            Kind::Simulated(n) => StreamId(SIMULATED_BIT | u64::from(n)),
            _ => StreamId(self.as_raw() as usize as u64),
        }
    }

    /// The cudarc stream this was made from, if any.
    pub fn cuda_stream(self) -> Option<&'a Arc<CudaStream>> {
        match self.0 {
            Kind::Borrowed(s) => Some(s),
            _ => None,
        }
    }

    /// An owned handle on the same stream that keeps it alive (it clones the `Arc` of a cudarc
    /// stream; the other kinds are plain values).
    pub fn to_handle(self) -> StreamHandle {
        StreamHandle(match self.0 {
            Kind::Default => Owned::Default,
            Kind::Borrowed(s) => Owned::Cuda(s.clone()),
            Kind::Raw(s) => Owned::Raw(s),
            Kind::Simulated(n) => Owned::Simulated(n),
        })
    }
}

/// Marks simulated ids: user-space addresses (handles) never have the top bit set.
const SIMULATED_BIT: u64 = 1 << 63;

impl PartialEq for StreamRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for StreamRef<'_> {}

impl std::hash::Hash for StreamRef<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id().hash(state)
    }
}

impl std::fmt::Debug for StreamRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamRef({})", self.id())
    }
}

impl Default for StreamRef<'static> {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl<'a> From<&'a Arc<CudaStream>> for StreamRef<'a> {
    fn from(stream: &'a Arc<CudaStream>) -> Self {
        if stream.cu_stream().is_null() {
            // A context's default stream: the null handle, as every other path names it.
            StreamRef(Kind::Default)
        } else {
            StreamRef(Kind::Borrowed(stream))
        }
    }
}

/// A stream's identity, for logs and hash keys: the handle value for a CUDA stream (0 for the
/// default stream), a tagged number for a simulated one. It cannot reach the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamId(u64);

impl StreamId {
    /// The default stream's id.
    pub const DEFAULT: StreamId = StreamId(0);

    /// The id as a number (the handle value of a CUDA stream; simulated ids have the top bit set).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 & SIMULATED_BIT != 0 {
            write!(f, "sim{}", self.0 & !SIMULATED_BIT)
        } else {
            write!(f, "{:#x}", self.0)
        }
    }
}

/// An owned stream handle: keeps a cudarc stream alive (it holds its `Arc`) and lends
/// [`StreamRef`]s of it. What a resource or a replayer keeps when it needs a stream after the call
/// that gave it.
#[derive(Clone)]
pub struct StreamHandle(Owned);

#[derive(Clone)]
enum Owned {
    Default,
    Cuda(Arc<CudaStream>),
    Raw(CUstream),
    Simulated(u32),
}

// SAFETY: as for StreamRef: the handle may be used from any thread; Arc<CudaStream> is Send+Sync.
unsafe impl Send for StreamHandle {}
// SAFETY: as above.
unsafe impl Sync for StreamHandle {}

impl StreamHandle {
    /// The default stream.
    pub const DEFAULT: StreamHandle = StreamHandle(Owned::Default);

    /// A borrowed view of the stream, valid while `self` is.
    pub fn as_ref(&self) -> StreamRef<'_> {
        match &self.0 {
            Owned::Default => StreamRef::DEFAULT,
            Owned::Cuda(s) => StreamRef::from(s),
            Owned::Raw(s) => StreamRef(Kind::Raw(*s)),
            Owned::Simulated(n) => StreamRef::simulated(*n),
        }
    }

    /// The stream's identity.
    pub fn id(&self) -> StreamId {
        self.as_ref().id()
    }
}

impl From<Arc<CudaStream>> for StreamHandle {
    fn from(stream: Arc<CudaStream>) -> Self {
        StreamHandle(Owned::Cuda(stream))
    }
}

impl From<&Arc<CudaStream>> for StreamHandle {
    fn from(stream: &Arc<CudaStream>) -> Self {
        StreamHandle(Owned::Cuda(stream.clone()))
    }
}

impl Default for StreamHandle {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl std::fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamHandle({})", self.id())
    }
}

/// A stream kept alive by a [`StreamKeeper`]: `Copy`, so suballocators store it in their free
/// lists and chunk tables; valid while the keeper that made it lives.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Held(StreamRef<'static>);

impl Held {
    /// The default stream, which needs no keeping.
    pub(crate) const DEFAULT: Held = Held(StreamRef::DEFAULT);

    /// The stream, for a call to the upstream or a comparison.
    pub(crate) fn get(self) -> StreamRef<'static> {
        self.0
    }

    pub(crate) fn id(self) -> StreamId {
        self.0.id()
    }
}

/// The streams a suballocator keeps: every cudarc stream it has stored a [`Held`] of, by id.
/// Boxed so that a `Held`'s borrow of the `Arc` stays put when the map grows.
///
/// A suballocator keeps its keeper at least as long as anything it stores (its free lists, its
/// chunk table) and gives it up only when dropped: the streams that blocks were freed on stay
/// alive until then, so that reusing such a block can still be ordered after that stream's work.
#[derive(Default)]
pub(crate) struct StreamKeeper {
    // The Box is the point: a `Held` borrows the `Arc` itself, which must not move.
    #[allow(clippy::redundant_allocation)]
    kept: HashMap<StreamId, Box<Arc<CudaStream>>>,
}

impl StreamKeeper {
    /// A `Held` of `stream`, keeping the stream alive as long as `self`.
    pub(crate) fn hold(&mut self, stream: StreamRef<'_>) -> Held {
        let kind = match stream.0 {
            Kind::Default => Kind::Default,
            Kind::Raw(s) => Kind::Raw(s),
            Kind::Simulated(n) => Kind::Simulated(n),
            Kind::Borrowed(s) => {
                let boxed = self
                    .kept
                    .entry(stream.id())
                    .or_insert_with(|| Box::new(s.clone()));
                let arc: *const Arc<CudaStream> = &**boxed;
                // SAFETY: the box is owned by `self.kept` and never removed while `self` lives,
                // and a Box's contents do not move when the map rehashes; a `Held` is used only
                // while its keeper lives (the suballocator's contract above), so the reference
                // is valid at every use.
                Kind::Borrowed(unsafe { &*arc })
            }
        };
        Held(StreamRef(kind))
    }
}

impl std::fmt::Debug for StreamKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamKeeper({} streams)", self.kept.len())
    }
}

static_assertions::assert_impl_all!(StreamRef<'static>: Send, Sync, Copy);
static_assertions::assert_impl_all!(StreamHandle: Send, Sync, Clone);
static_assertions::assert_eq_size!(StreamRef<'static>, [usize; 2]);
