//! What can be wrong in a snapshot ([`SnapshotErrorKind`]), and where ([`SnapshotError`]).

use super::MAX_PICKLE_BYTES;
use crate::replay::rmm_log::{MAX_OPS, MAX_SIZE, MAX_STREAMS};
use crate::replay::WorkloadError;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// A problem in a snapshot, with where it is.
#[derive(Debug)]
pub struct SnapshotError {
    /// The file, when reading one.
    pub path: Option<PathBuf>,
    /// Where: `byte 123` of the pickle, a place in the data (`device_traces[0][17]`), or empty
    /// for the whole file.
    pub at: String,
    /// What is wrong.
    pub kind: SnapshotErrorKind,
}

/// What is wrong in a snapshot.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotErrorKind {
    /// The file could not be opened.
    #[error("cannot open: {0}")]
    Open(#[source] io::Error),
    /// Reading the file failed.
    #[error("cannot read: {0}")]
    Read(#[source] io::Error),
    /// Decompressing a gzip file failed: it is truncated or corrupt.
    #[error("cannot decompress (a gzip file that is truncated or corrupt?): {0}")]
    Gzip(#[source] io::Error),
    /// The pickle is larger than [`MAX_PICKLE_BYTES`].
    #[error("the pickle is larger than {limit} bytes", limit = MAX_PICKLE_BYTES)]
    TooLarge,
    /// The data does not start with a pickle's protocol opcode.
    #[error(
        "not a pickle of protocol 2 or later (first byte {0:#04x}, expected 0x80): \
         write the snapshot with torch.cuda.memory._dump_snapshot or pickle.dump"
    )]
    NotPickle(u8),
    /// The pickle is malformed or ends early.
    #[error("malformed pickle: {0}")]
    Pickle(String),
    /// The pickle uses an opcode this reader does not run.
    #[error("pickle opcode {opcode:#04x} ({name}) is not supported: a snapshot holds plain data")]
    Unsupported {
        /// The opcode.
        opcode: u8,
        /// Its name in Python's `pickletools`.
        name: &'static str,
    },
    /// A value has another type than the snapshot's structure has there.
    #[error("expected {expected}, found {found}")]
    Type {
        /// What the structure has there.
        expected: &'static str,
        /// What was found.
        found: &'static str,
    },
    /// A dict lacks a key the reader needs.
    #[error("no `{0}` key")]
    MissingKey(&'static str),
    /// The snapshot has no trace entries: it was taken without the history being recorded.
    #[error(
        "the snapshot has no allocation history (device_traces {0}): record it before the \
         workload runs with torch.cuda.memory._record_memory_history(), then take the snapshot"
    )]
    NoHistory(&'static str),
    /// The device asked for has no history in the snapshot.
    #[error(
        "device {device} has no allocation history in the snapshot (devices with one: {devices:?})"
    )]
    NoSuchDevice {
        /// The device asked for.
        device: usize,
        /// The devices that have one.
        devices: Vec<usize>,
    },
    /// An allocation at an address that is still live.
    #[error("alloc at {0:#x}, which is still live (an entry missing from the history?)")]
    AddressLive(u64),
    /// A free whose size differs from its allocation's.
    #[error("free_completed of {addr:#x} with {freed} bytes, allocated with {allocated}")]
    SizeMismatch {
        /// The address.
        addr: u64,
        /// Bytes allocated.
        allocated: usize,
        /// Bytes the free names.
        freed: usize,
    },
    /// An allocation larger than any resource can serve.
    #[error("alloc of {0} bytes, more than any resource can serve (at most {max})", max = MAX_SIZE)]
    SizeTooLarge(u64),
    /// An integer outside the range the field takes.
    #[error("`{key}` is {value}, outside 0..2^64")]
    OutOfRange {
        /// The key.
        key: &'static str,
        /// The value, as text.
        value: String,
    },
    /// More ops than a replay holds.
    #[error("more than {limit} allocations and frees", limit = MAX_OPS)]
    TooManyOps,
    /// More streams than a replay makes.
    #[error("more than {limit} distinct streams", limit = MAX_STREAMS)]
    TooManyStreams,
    /// The ops do not form a workload (cannot happen for ops built here; kept for completeness).
    #[error("{0}")]
    Workload(WorkloadError),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        if !self.at.is_empty() {
            write!(f, "{}: ", self.at)?;
        }
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.kind)
    }
}

/// A [`SnapshotError`] at `at` with no path: [`read`](super::read) adds the file's.
pub(super) fn error(at: impl Into<String>, kind: SnapshotErrorKind) -> SnapshotError {
    SnapshotError {
        path: None,
        at: at.into(),
        kind,
    }
}
