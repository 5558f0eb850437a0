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

use cudarc::driver::{sys::CUstream, CudaContext, CudaStream};
use std::sync::Arc;

mod handle;
mod keeper;

use handle::Owned;
pub use handle::StreamHandle;
pub(crate) use keeper::{Held, IdMap, StreamKeeper};

/// A borrowed stream handle: what resources take with every call.
///
/// * [`StreamRef::DEFAULT`]: the default (null) stream of the resource's context.
/// * `StreamRef::from(&stream)` for a cudarc `Arc<CudaStream>`: borrows it, so the stream outlives
///   every use of the `StreamRef`; a resource that keeps it clones the `Arc`
///   ([`to_handle`](Self::to_handle)). A context's default stream (`ctx.default_stream()`)
///   stays that context's, and cudarc's per-thread stream (`ctx.per_thread_stream()`, one handle
///   that names a different stream on each thread) is the stream of the thread that made the
///   `StreamRef`: see [`usable_here`](Self::usable_here).
/// * [`StreamRef::simulated`]: a made-up stream for replays and tests over host resources; no
///   work can be queued on it.
/// * [`StreamRef::from_raw`] (`unsafe`): a raw `CUstream` from another library.
#[derive(Clone, Copy)]
pub struct StreamRef<'a>(Kind<'a>);

#[derive(Clone, Copy)]
enum Kind<'a> {
    /// The null stream of whatever context the resource works in.
    Default,
    /// A stream cudarc created (its handle is neither null nor a special handle).
    Stream(&'a Arc<CudaStream>),
    /// The null (or legacy) stream of the `CudaStream`'s own context.
    ContextDefault(&'a Arc<CudaStream>),
    /// The per-thread stream (handle 2) of thread number `.1`, in the `CudaStream`'s context (or
    /// the resource's, for one made by `from_raw`).
    PerThread(Option<&'a Arc<CudaStream>>, u32),
    /// A raw handle from `from_raw`, neither null nor special.
    Raw(CUstream),
    Simulated(u32),
}

/// The driver's special stream handles: the legacy default stream and the per-thread stream.
const LEGACY_HANDLE: usize = 0x1;
const PER_THREAD_HANDLE: usize = 0x2;

// SAFETY: a CUstream handle may be used from any thread (the driver serializes access to it), and
// `&Arc<CudaStream>` is Send/Sync because CudaStream is. A per-thread stream records the thread
// that made it, so sending it to another thread cannot make it name that thread's stream.
unsafe impl Send for StreamRef<'_> {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for StreamRef<'_> {}

impl StreamRef<'static> {
    /// The default (null) stream.
    pub const DEFAULT: StreamRef<'static> = StreamRef(Kind::Default);

    /// Wraps a raw stream handle: null and the legacy handle are [`DEFAULT`](Self::DEFAULT), the
    /// per-thread handle is the calling thread's per-thread stream.
    ///
    /// # Safety
    ///
    /// `stream` is null, a special handle, or a live stream of the context of the resources it is
    /// given to, and stays live as long as any resource it is given to (suballocators keep the
    /// handles of streams that freed blocks, to order later reuse after them, until they are
    /// dropped).
    pub unsafe fn from_raw(stream: CUstream) -> Self {
        match stream as usize {
            0 | LEGACY_HANDLE => StreamRef(Kind::Default),
            PER_THREAD_HANDLE => StreamRef(Kind::PerThread(None, thread_number())),
            _ => StreamRef(Kind::Raw(stream)),
        }
    }

    /// A simulated stream `n` (`n` = 0 is [`DEFAULT`](Self::DEFAULT)): distinct streams for
    /// replaying many-stream workloads over `Simulated` or `System`, where no stream exists. No
    /// work is ever queued on one: `CudaAsync` refuses to allocate on it
    /// ([`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported)), CUDA leaves have
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
    /// The raw handle, for driver calls: null for the default streams and simulated streams, 2
    /// for a per-thread stream (which names the right stream only where
    /// [`usable_here`](Self::usable_here)). Check [`is_simulated`](Self::is_simulated) before
    /// queuing work on it.
    pub fn as_raw(self) -> CUstream {
        match self.0 {
            Kind::Default | Kind::ContextDefault(_) | Kind::Simulated(_) => std::ptr::null_mut(),
            Kind::Stream(s) => s.cu_stream(),
            Kind::PerThread(..) => PER_THREAD_HANDLE as CUstream,
            Kind::Raw(s) => s,
        }
    }

    /// The context the stream belongs to, where it is known (a cudarc stream); `None` for
    /// [`DEFAULT`](Self::DEFAULT), raw and simulated streams, which are the resource's.
    pub fn context(self) -> Option<&'a Arc<CudaContext>> {
        self.cuda_stream().map(|s| s.context())
    }

    /// False only for a per-thread stream made on another thread: its handle would name this
    /// thread's per-thread stream, so resources wait for its whole context instead.
    pub fn usable_here(self) -> bool {
        match self.0 {
            Kind::PerThread(_, t) => t == thread_number(),
            _ => true,
        }
    }

    /// True for a default stream: [`DEFAULT`](Self::DEFAULT) or a context's default stream.
    pub fn is_default(self) -> bool {
        matches!(self.0, Kind::Default | Kind::ContextDefault(_))
    }

    /// True for a [`simulated`](Self::simulated) stream.
    pub fn is_simulated(self) -> bool {
        matches!(self.0, Kind::Simulated(_))
    }

    /// The stream's identity: equal for two `StreamRef`s of one stream, distinct for distinct
    /// live streams, the default streams of distinct contexts, the per-thread streams of distinct
    /// threads, and simulated streams.
    #[inline]
    pub fn id(self) -> StreamId {
        let ctx = |s: &Arc<CudaStream>| s.context().cu_ctx() as usize as u64;
        match self.0 {
            Kind::Default => StreamId::DEFAULT,
            Kind::Stream(s) => StreamId::new(s.cu_stream() as usize as u64, 0, 0),
            Kind::ContextDefault(s) => StreamId::new(0, ctx(s), 0),
            Kind::PerThread(s, t) => StreamId::new(PER_THREAD_HANDLE as u64, s.map_or(0, ctx), t),
            Kind::Raw(s) => StreamId::new(s as usize as u64, 0, 0),
            Kind::Simulated(n) => StreamId::new(SIMULATED_BIT | u64::from(n), 0, 0),
        }
    }

    /// The cudarc stream this was made from, if any.
    pub fn cuda_stream(self) -> Option<&'a Arc<CudaStream>> {
        match self.0 {
            Kind::Stream(s) | Kind::ContextDefault(s) | Kind::PerThread(Some(s), _) => Some(s),
            _ => None,
        }
    }

    /// An owned handle on the same stream that keeps it alive (it clones the `Arc` of a cudarc
    /// stream; the other kinds are plain values).
    pub fn to_handle(self) -> StreamHandle {
        StreamHandle(match self.0 {
            Kind::Default => Owned::Default,
            Kind::Stream(s) => Owned::Stream(s.clone()),
            Kind::ContextDefault(s) => Owned::ContextDefault(s.clone()),
            Kind::PerThread(s, t) => Owned::PerThread(s.cloned(), t),
            Kind::Raw(s) => Owned::Raw(s),
            Kind::Simulated(n) => Owned::Simulated(n),
        })
    }
}

/// The identity of a cudarc stream used on this thread, as `StreamRef::from(&arc).id()` gives it:
/// for where cudarc lends a `&CudaStream` without its `Arc`.
pub(crate) fn id_of(stream: &CudaStream) -> StreamId {
    let ctx = stream.context().cu_ctx() as usize as u64;
    match stream.cu_stream() as usize {
        0 | LEGACY_HANDLE => StreamId::new(0, ctx, 0),
        PER_THREAD_HANDLE => StreamId::new(PER_THREAD_HANDLE as u64, ctx, thread_number()),
        handle => StreamId::new(handle as u64, 0, 0),
    }
}

/// True for a stream cudarc made with `new_stream`/`fork` (a handle neither null nor special),
/// which its `CudaContext` object counts while it lives: while one lives, that context keeps
/// cudarc's read/write events (unless tracking was turned off, which is `unsafe`). A borrowed
/// stream (`wrap_borrowed_stream`, `unsafe`) looks the same but is not counted: its caller orders
/// work on it.
pub(crate) fn is_counted(stream: &CudaStream) -> bool {
    !matches!(
        stream.cu_stream() as usize,
        0 | LEGACY_HANDLE | PER_THREAD_HANDLE
    )
}

/// True for cudarc's per-thread stream, whose one handle names a different stream on each thread.
pub(crate) fn is_per_thread(stream: &CudaStream) -> bool {
    stream.cu_stream() as usize == PER_THREAD_HANDLE
}

/// Marks simulated ids: user-space addresses (handles) never have the top bit set.
const SIMULATED_BIT: u64 = 1 << 63;

/// A number for the calling thread, distinct among the threads that ever name a per-thread
/// stream (only they get one), never reused: the identity of their per-thread streams.
///
/// # Panics
///
/// When 2^32 - 1 threads have been numbered, as std's `ThreadId` does when its space runs out: a
/// repeated number would merge two threads' streams, so it is never handed out. Four bytes keep
/// `StreamRef` two words, which the allocation paths measurably prefer to three.
fn thread_number() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local!(static NUMBER: u32 = NEXT
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
        .expect("mrstack: 2^32 - 1 threads have named a per-thread stream; numbers for more would repeat"));
    NUMBER.with(|n| *n)
}

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
        StreamRef(match stream.cu_stream() as usize {
            0 | LEGACY_HANDLE => Kind::ContextDefault(stream),
            PER_THREAD_HANDLE => Kind::PerThread(Some(stream), thread_number()),
            _ => Kind::Stream(stream),
        })
    }
}

/// A stream's identity, for logs and hash keys: the handle value of a CUDA stream, with the
/// context for a context's default stream and the thread for a per-thread stream; a tagged number
/// for a simulated one. It cannot reach the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamId {
    /// The handle value; for a per-thread stream, `thread << 3 | 2` (a real handle is an aligned
    /// pointer, whose low three bits are 0; thread numbers are below 2^32).
    handle: u64,
    /// The context, for the context-relative handles (null, per-thread); 0 otherwise.
    context: u64,
}

impl StreamId {
    /// The id of [`StreamRef::DEFAULT`].
    pub const DEFAULT: StreamId = StreamId {
        handle: 0,
        context: 0,
    };

    const fn new(handle: u64, context: u64, thread: u32) -> Self {
        StreamId {
            handle: handle | (thread as u64) << 3,
            context,
        }
    }

    fn thread(self) -> u64 {
        if self.handle & 7 == PER_THREAD_HANDLE as u64 && self.handle & SIMULATED_BIT == 0 {
            self.handle >> 3
        } else {
            0
        }
    }

    /// A cheap 64-bit mix of the id, for spreading streams over a few slots.
    #[inline]
    pub(crate) fn mix(self) -> u64 {
        (self.handle ^ self.context.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17
    }

    /// The handle as a number, as RMM logs print it (0 for default streams, 2 for per-thread
    /// streams; simulated ids have the top bit set).
    pub fn get(self) -> u64 {
        if self.thread() != 0 {
            PER_THREAD_HANDLE as u64
        } else {
            self.handle
        }
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.handle & SIMULATED_BIT != 0 {
            return write!(f, "sim{}", self.handle & !SIMULATED_BIT);
        }
        write!(f, "{:#x}", self.get())?;
        if self.context != 0 {
            write!(f, "@ctx{:#x}", self.context)?;
        }
        if self.thread() != 0 {
            write!(f, "@thread{}", self.thread())?;
        }
        Ok(())
    }
}

static_assertions::assert_impl_all!(StreamRef<'static>: Send, Sync, Copy);
static_assertions::assert_eq_size!(StreamId, [u64; 2]);
static_assertions::assert_eq_size!(StreamRef<'static>, [usize; 2]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_raw_handles_keep_their_meaning() {
        // SAFETY: null and the special handles need no live stream behind them.
        let (null, legacy, per_thread) = unsafe {
            (
                StreamRef::from_raw(std::ptr::null_mut()),
                StreamRef::from_raw(LEGACY_HANDLE as CUstream),
                StreamRef::from_raw(PER_THREAD_HANDLE as CUstream),
            )
        };
        assert_eq!(null, StreamRef::DEFAULT);
        assert_eq!(legacy, StreamRef::DEFAULT);
        assert_ne!(per_thread, StreamRef::DEFAULT);
        assert!(per_thread.usable_here());
        // The same handle made on another thread is another stream, and not usable here.
        let there = std::thread::spawn(|| {
            // SAFETY: as above.
            unsafe { StreamRef::from_raw(PER_THREAD_HANDLE as CUstream) }
        })
        .join()
        .unwrap();
        assert_ne!(there, per_thread);
        assert!(!there.usable_here());
        assert_eq!(there.as_raw() as usize, PER_THREAD_HANDLE);
    }

    #[test]
    fn simulated_streams_are_distinct_and_reach_no_driver() {
        assert_eq!(StreamRef::simulated(0), StreamRef::DEFAULT);
        let (a, b) = (StreamRef::simulated(1), StreamRef::simulated(2));
        assert_ne!(a, b);
        assert!(a.is_simulated() && !a.is_default());
        assert!(a.as_raw().is_null());
        assert_eq!(a.to_handle().id(), a.id());
        assert_eq!(a.id().to_string(), "sim1");
        // No simulated id equals a handle value's.
        // SAFETY: the handle is only compared, never given to a driver.
        let raw = unsafe { StreamRef::from_raw(1usize as CUstream) };
        assert_ne!(raw, a);
    }
}
