//! [`AllocError`], what every failed resource operation returns, and its [`AllocErrorKind`].

/// What went wrong in an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocErrorKind {
    /// The resource (or the device) has no room for the request.
    OutOfMemory,
    /// The request itself is malformed; the text says how.
    InvalidArgument(&'static str),
    /// A byte cap was reached: `limit` bytes, of which `in_use` are allocated.
    LimitExceeded {
        /// The cap.
        limit: usize,
        /// Bytes allocated when the request came.
        in_use: usize,
    },
    /// The resource cannot do this (an alignment above what it guarantees, say); the text says what.
    Unsupported(&'static str),
    /// No CUDA driver library (libcuda) could be loaded on this machine.
    NoDriver,
    /// The CUDA driver returned this error.
    Cuda(cudarc::driver::sys::CUresult),
}

impl std::fmt::Display for AllocErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllocErrorKind::OutOfMemory => f.write_str("out of memory"),
            AllocErrorKind::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            AllocErrorKind::LimitExceeded { limit, in_use } => write!(
                f,
                "limit of {limit} bytes exceeded ({in_use} bytes already allocated)"
            ),
            AllocErrorKind::Unsupported(what) => write!(f, "unsupported: {what}"),
            AllocErrorKind::NoDriver => {
                f.write_str("no CUDA driver: libcuda could not be loaded on this machine")
            }
            AllocErrorKind::Cuda(code) => write!(f, "CUDA driver error {code:?}"),
        }
    }
}

/// A failed allocation or resource construction: what failed, for which request, in which resource.
///
/// `{:?}` (what `main` prints for an error returned through `?`) reads as `Display` does, then
/// names the kind to match on; `{:#?}` shows every field.
///
/// ```
/// use mrstack::{resource::AllocError, resource::AllocErrorKind};
///
/// let e = AllocError::new(AllocErrorKind::NoDriver, 0, 0, "Cuda");
/// assert_eq!(
///     format!("{e:?}"),
///     "Cuda: no CUDA driver: libcuda could not be loaded on this machine [AllocErrorKind::NoDriver]"
/// );
/// let oom = AllocError::out_of_memory(1 << 20, 256, "Pool");
/// assert_eq!(
///     format!("{oom:?}"),
///     "Pool: out of memory (requested 1048576 bytes, alignment 256) [AllocErrorKind::OutOfMemory]"
/// );
/// assert!(format!("{oom:#?}").contains("size: 1048576"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub struct AllocError {
    /// What went wrong.
    pub kind: AllocErrorKind,
    /// The requested size in bytes (0 for a constructor).
    pub size: usize,
    /// The requested alignment.
    pub align: usize,
    /// The name of the resource that failed.
    pub resource: &'static str,
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.resource, self.kind)?;
        // Constructors fail with no request: size and alignment 0 say nothing then.
        if self.size != 0 || self.align != 0 {
            write!(
                f,
                " (requested {} bytes, alignment {})",
                self.size, self.align
            )?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The derived form (`AllocError { kind: NoDriver, size: 0, align: 0, … }`) read as a
        // failed 0-byte request when `main` printed a constructor's error. The message already
        // carries the resource, size and alignment; the kind is what code matches on.
        if f.alternate() {
            return f
                .debug_struct("AllocError")
                .field("kind", &self.kind)
                .field("size", &self.size)
                .field("align", &self.align)
                .field("resource", &self.resource)
                .finish();
        }
        write!(f, "{self} [AllocErrorKind::{:?}]", self.kind)
    }
}

impl AllocError {
    /// An error of `kind` for a request of `size` bytes aligned to `align`, in `resource`.
    pub const fn new(
        kind: AllocErrorKind,
        size: usize,
        align: usize,
        resource: &'static str,
    ) -> Self {
        AllocError {
            kind,
            size,
            align,
            resource,
        }
    }

    /// [`AllocErrorKind::OutOfMemory`] for this request.
    pub const fn out_of_memory(size: usize, align: usize, resource: &'static str) -> Self {
        Self::new(AllocErrorKind::OutOfMemory, size, align, resource)
    }

    /// An error from a CUDA driver call; `CUDA_ERROR_OUT_OF_MEMORY` becomes
    /// [`AllocErrorKind::OutOfMemory`] so that callers need test only one kind.
    pub fn cuda(
        err: cudarc::driver::DriverError,
        size: usize,
        align: usize,
        resource: &'static str,
    ) -> Self {
        let kind = match err.0 {
            cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => AllocErrorKind::OutOfMemory,
            code => AllocErrorKind::Cuda(code),
        };
        Self::new(kind, size, align, resource)
    }

    /// True for [`AllocErrorKind::OutOfMemory`] and [`AllocErrorKind::LimitExceeded`]: failures
    /// that freeing memory elsewhere could cure.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self.kind,
            AllocErrorKind::OutOfMemory | AllocErrorKind::LimitExceeded { .. }
        )
    }
}
