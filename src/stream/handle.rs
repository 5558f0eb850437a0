//! [`StreamHandle`], an owned stream: what a resource keeps past a call.

use cudarc::driver::{sys::CUstream, CudaStream};
use std::sync::Arc;

use super::{Kind, StreamId, StreamRef};

/// An owned stream handle: keeps a cudarc stream alive (it holds its `Arc`) and lends
/// [`StreamRef`]s of it. What a resource or a replayer keeps when it needs a stream after the call
/// that gave it.
#[derive(Clone)]
pub struct StreamHandle(pub(super) Owned);

#[derive(Clone)]
pub(super) enum Owned {
    Default,
    Stream(Arc<CudaStream>),
    ContextDefault(Arc<CudaStream>),
    PerThread(Option<Arc<CudaStream>>, u32),
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
        StreamRef(match &self.0 {
            Owned::Default => Kind::Default,
            Owned::Stream(s) => Kind::Stream(s),
            Owned::ContextDefault(s) => Kind::ContextDefault(s),
            Owned::PerThread(s, t) => Kind::PerThread(s.as_ref(), *t),
            Owned::Raw(s) => Kind::Raw(*s),
            Owned::Simulated(n) => Kind::Simulated(*n),
        })
    }

    /// The stream's identity.
    pub fn id(&self) -> StreamId {
        self.as_ref().id()
    }
}

impl From<Arc<CudaStream>> for StreamHandle {
    fn from(stream: Arc<CudaStream>) -> Self {
        StreamRef::from(&stream).to_handle()
    }
}

impl From<&Arc<CudaStream>> for StreamHandle {
    fn from(stream: &Arc<CudaStream>) -> Self {
        StreamRef::from(stream).to_handle()
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

static_assertions::assert_impl_all!(StreamHandle: Send, Sync, Clone);
