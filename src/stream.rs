//! [`StreamRef`]: a copyable handle on a CUDA stream.

use cudarc::driver::{sys::CUstream, CudaStream};
use std::sync::Arc;

/// A `Copy` handle on a `CUstream`; the null handle ([`StreamRef::DEFAULT`]) is the default stream.
///
/// It does not keep the stream alive: it names the stream an allocation is ordered on, as RMM's
/// `cuda_stream_view` does. Containers hold an `Arc<CudaStream>` for that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamRef(CUstream);

// SAFETY: a CUstream handle may be used from any thread; the driver serializes access to it.
unsafe impl Send for StreamRef {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for StreamRef {}

impl StreamRef {
    /// The default (null) stream.
    pub const DEFAULT: StreamRef = StreamRef(std::ptr::null_mut());

    /// Wraps a raw stream handle.
    ///
    /// # Safety
    ///
    /// `stream` is null or a stream that stays valid while memory ordered on it is in use.
    pub const unsafe fn from_raw(stream: CUstream) -> Self {
        StreamRef(stream)
    }

    /// The raw handle, for driver calls.
    pub const fn as_raw(self) -> CUstream {
        self.0
    }

    /// True for the default (null) stream.
    pub fn is_default(self) -> bool {
        self.0.is_null()
    }

    /// The handle as an integer, for logs and hash keys.
    pub fn id(self) -> usize {
        self.0 as usize
    }
}

impl Default for StreamRef {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl From<&CudaStream> for StreamRef {
    fn from(stream: &CudaStream) -> Self {
        StreamRef(stream.cu_stream())
    }
}

impl From<&Arc<CudaStream>> for StreamRef {
    fn from(stream: &Arc<CudaStream>) -> Self {
        StreamRef(stream.cu_stream())
    }
}
