//! Reading a snapshot from a file, a reader (plain or gzip-compressed) or a pickle's bytes.

use super::convert::convert;
use super::error::error;
use super::{pickle, Snapshot, SnapshotError, SnapshotErrorKind, MAX_PICKLE_BYTES, PICKLE_MAGIC};
use crate::replay::rmm_log::file_stem;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// Whether the file at `path` holds a pickle, plain or gzip-compressed: its first byte, after
/// decompression, is [`PICKLE_MAGIC`]. Errors are the file's (it cannot be opened or read);
/// a file too short to tell is not a pickle.
pub fn is_pickle_file(path: impl AsRef<Path>) -> io::Result<bool> {
    let mut reader = BufReader::new(File::open(path)?);
    let head = reader.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        let mut first = [0u8; 1];
        let mut gz = flate2::bufread::MultiGzDecoder::new(reader);
        return Ok(matches!(gz.read(&mut first), Ok(1) if first[0] == PICKLE_MAGIC));
    }
    Ok(head.first() == Some(&PICKLE_MAGIC))
}

/// Reads the snapshot at `path` (a pickle, plain or gzip-compressed), replaying `device` or, with
/// `None`, the device with the most allocations; the workload is named after the file, less
/// `.gz` and `.pickle`/`.pkl`.
pub fn read(path: impl AsRef<Path>, device: Option<usize>) -> Result<Snapshot, SnapshotError> {
    let path = path.as_ref();
    let named = |e: SnapshotError| SnapshotError {
        path: Some(path.to_owned()),
        ..e
    };
    let file = File::open(path).map_err(|e| named(error("", SnapshotErrorKind::Open(e))))?;
    read_from(file, workload_name(path), device).map_err(named)
}

/// The name [`read`] gives the workload of the snapshot at `path`.
pub fn workload_name(path: &Path) -> String {
    file_stem(path, &[".pickle", ".pkl"])
}

/// [`read`] from `reader`, naming the workload `name`.
pub fn read_from(
    reader: impl Read,
    name: impl Into<String>,
    device: Option<usize>,
) -> Result<Snapshot, SnapshotError> {
    let mut reader = BufReader::new(reader);
    let gzip = reader
        .fill_buf()
        .map_err(|e| error("", SnapshotErrorKind::Read(e)))?
        .starts_with(&[0x1f, 0x8b]);
    let bytes = if gzip {
        read_all(
            flate2::bufread::MultiGzDecoder::new(reader),
            SnapshotErrorKind::Gzip,
        )?
    } else {
        read_all(reader, SnapshotErrorKind::Read)?
    };
    from_bytes(&bytes, name, device)
}

/// Everything `reader` yields, at most [`MAX_PICKLE_BYTES`].
fn read_all(
    reader: impl Read,
    fail: fn(io::Error) -> SnapshotErrorKind,
) -> Result<Vec<u8>, SnapshotError> {
    let mut bytes = Vec::new();
    reader
        .take(MAX_PICKLE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| error("", fail(e)))?;
    if bytes.len() as u64 > MAX_PICKLE_BYTES {
        return Err(error("", SnapshotErrorKind::TooLarge));
    }
    Ok(bytes)
}

/// Reads the snapshot pickled in `bytes` (not compressed), naming the workload `name`.
///
/// ```
/// // pickle.dumps({"device_traces": [[
/// //     {"action": "alloc", "addr": 4096, "size": 1000, "stream": 0},
/// //     {"action": "free_completed", "addr": 4096, "size": 1000, "stream": 0}]]}, protocol=2)
/// let pickle = b"\x80\x02}q\x00X\r\x00\x00\x00device_tracesq\x01]q\x02]q\x03(}q\x04(X\x06\x00\x00\x00actionq\x05X\x05\x00\x00\x00allocq\x06X\x04\x00\x00\x00addrq\x07M\x00\x10X\x04\x00\x00\x00sizeq\x08M\xe8\x03X\x06\x00\x00\x00streamq\tK\x00u}q\n(h\x05X\x0e\x00\x00\x00free_completedq\x0bh\x07M\x00\x10h\x08M\xe8\x03h\tK\x00ueas.";
/// let s = mrstack::replay::snapshot::from_bytes(pickle, "example", None).unwrap();
/// assert_eq!(s.trace.workload.allocations(), 1);
/// assert_eq!(s.trace.workload.peak_live(), 1000);
/// ```
pub fn from_bytes(
    bytes: &[u8],
    name: impl Into<String>,
    device: Option<usize>,
) -> Result<Snapshot, SnapshotError> {
    let values = pickle::load(bytes)?;
    convert(&values, name.into(), device)
}
