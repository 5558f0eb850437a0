//! PyTorch memory snapshots: the pickle `torch.cuda.memory._dump_snapshot` writes (the dict
//! `torch.cuda.memory._snapshot()` returns), read into the same [`Trace`] an RMM log gives.
//!
//! # What is read
//!
//! A snapshot is a dict. Its `device_traces` is a list with one list per device of trace entries,
//! each a dict with `action`, `addr`, `size` and `stream` (and `time_us`, `frames`, … which are
//! not read). PyTorch records them only while `torch.cuda.memory._record_memory_history()` is on;
//! a snapshot taken without it has no entries, which is an error here ([`SnapshotErrorKind::NoHistory`]).
//!
//! The actions become ops as a log's lines do:
//!
//! * `alloc`: an allocation of `size` bytes (the size the program asked for) at `addr`, on
//!   `stream` (streams are numbered in order of first appearance, as a log's are);
//! * `free_completed`: the free of the allocation at `addr`, when its memory may be handed out
//!   again (PyTorch completes a free once the streams that used the block are done with it);
//! * `free_requested`: not an op (its `free_completed` is);
//! * `oom`: a request that failed, counted in [`Trace::failures`] and skipped, as a log's
//!   `allocate failure` is;
//! * `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`: what PyTorch's caching
//!   allocator took from and gave back to the driver; not ops, but with the snapshot's `segments`
//!   (the state at its end) they give the most bytes the caching allocator held during the
//!   recorded history ([`Snapshot::reserved_peak`]);
//! * any other action (`snapshot`, actions of later PyTorch versions): skipped, counted in
//!   [`Snapshot::other_entries`].
//!
//! PyTorch keeps the last `max_entries` entries only, so the history may begin after some of its
//! blocks were allocated: a `free_completed` of an address no earlier entry allocated is such a
//! block's, left out and counted in [`Snapshot::older_frees`], not an error. An `alloc` at an
//! address still live, or a `free_completed` of another size than its `alloc`, is an error naming
//! the entry. A snapshot of several devices replays one: the one asked for, or else the one with
//! the most allocations.
//!
//! # The pickle
//!
//! The file is a pickle (first byte 0x80, the protocol opcode; protocols 2 to 5), plain or
//! gzip-compressed (told by its first bytes, not its name). The reader here understands the
//! opcodes of plain data (dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None)
//! and keeps class references and the objects built from them as opaque values, which are an
//! error only where a value that is read is one. Every problem is a [`SnapshotError`] naming the
//! file and where: a byte offset in the pickle, or the entry (`device_traces[0][17]`). Nothing
//! here panics on bad input, and nothing unbounded is allocated: the file is at most
//! [`MAX_PICKLE_BYTES`] bytes, each value it builds is made by an opcode of it, and a length in
//! the pickle is checked against the bytes left before anything is read.

use super::rmm_log::{Trace, MAX_OPS, MAX_SIZE, MAX_STREAMS};
use super::{Op, Workload, WorkloadError};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// The largest pickle read, in bytes (after decompression): the whole pickle is held in memory
/// while it is read, with some 32 bytes per value it builds.
pub const MAX_PICKLE_BYTES: u64 = 4 << 30;

/// The first byte of a pickle of protocol 2 or later: the `PROTO` opcode.
pub const PICKLE_MAGIC: u8 = 0x80;

/// A snapshot's allocations and frees on one device, with what else it says of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The ops, as [`rmm_log::read`](super::rmm_log::read) gives a log's: one thread; stream `i`
    /// is `stream_ids[i]` (the `stream` values, as `cudaStream_t` bits; 0 is the default stream);
    /// `failures` counts the `oom` entries and `skipped_empty` the allocations of 0 bytes.
    pub trace: Trace,
    /// The device whose history the trace is.
    pub device: usize,
    /// The devices whose history has at least one entry, in order.
    pub devices: Vec<usize>,
    /// `free_completed` entries of blocks allocated before the recorded history begins.
    pub older_frees: usize,
    /// Entries of an action that is no op and tells nothing of the segments (`snapshot`,
    /// `free_requested`, actions this reader does not know).
    pub other_entries: usize,
    /// The most bytes PyTorch's caching allocator held from the driver on the device during the
    /// recorded history, from the `segments` at the snapshot's end and the segment entries before
    /// it; `None` when the snapshot has no `segments`.
    pub reserved_peak: Option<usize>,
}

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

fn error(at: impl Into<String>, kind: SnapshotErrorKind) -> SnapshotError {
    SnapshotError {
        path: None,
        at: at.into(),
        kind,
    }
}

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
    let file_name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let name = file_name.strip_suffix(".gz").unwrap_or(&file_name);
    [".pickle", ".pkl"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
        .to_owned()
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

/// The value at the root of a snapshot, and its parts, as the structure names them.
struct At<'v> {
    values: &'v pickle::Values,
    id: pickle::Id,
    path: String,
}

impl<'v> At<'v> {
    fn value(&self) -> &'v pickle::Value {
        self.values.get(self.id)
    }

    fn fail(&self, kind: SnapshotErrorKind) -> SnapshotError {
        error(self.path.clone(), kind)
    }

    fn wrong(&self, expected: &'static str) -> SnapshotError {
        self.fail(SnapshotErrorKind::Type {
            expected,
            found: self.value().kind(),
        })
    }

    /// The value at `key` of this dict; `None` when the dict has no such key.
    fn get(&self, key: &'static str) -> Result<Option<At<'v>>, SnapshotError> {
        let pickle::Value::Dict(items) = self.value() else {
            return Err(self.wrong("a dict"));
        };
        let found = items
            .iter()
            .find(|&&(k, _)| self.values.str(k) == Some(key));
        Ok(found.map(|&(_, v)| At {
            values: self.values,
            id: v,
            path: if self.path.is_empty() {
                key.to_owned()
            } else {
                format!("{}[{key:?}]", self.path)
            },
        }))
    }

    fn need(&self, key: &'static str) -> Result<At<'v>, SnapshotError> {
        self.get(key)?
            .ok_or_else(|| self.fail(SnapshotErrorKind::MissingKey(key)))
    }

    /// The items of this list (or tuple).
    fn items(&self) -> Result<impl Iterator<Item = At<'v>> + '_, SnapshotError> {
        let (pickle::Value::List(items) | pickle::Value::Tuple(items)) = self.value() else {
            return Err(self.wrong("a list"));
        };
        Ok(items.iter().enumerate().map(move |(i, &id)| At {
            values: self.values,
            id,
            path: format!("{}[{i}]", self.path),
        }))
    }

    fn str(&self) -> Result<&'v str, SnapshotError> {
        match self.value() {
            pickle::Value::Str(s) => Ok(s),
            _ => Err(self.wrong("a string")),
        }
    }

    fn int(&self) -> Result<i128, SnapshotError> {
        match self.value() {
            pickle::Value::Int(n) => Ok(*n),
            pickle::Value::Bool(b) => Ok(i128::from(*b)),
            _ => Err(self.wrong("an integer")),
        }
    }

    /// An integer in 0..2^64, as `key` is.
    fn u64(&self, key: &'static str) -> Result<u64, SnapshotError> {
        let n = self.int()?;
        u64::try_from(n).map_err(|_| {
            self.fail(SnapshotErrorKind::OutOfRange {
                key,
                value: n.to_string(),
            })
        })
    }
}

/// A stream value as the bits of its `cudaStream_t` (PyTorch writes it as a signed 64-bit int).
fn stream_bits(n: i128) -> Option<u64> {
    i64::try_from(n)
        .map(|v| v as u64)
        .or_else(|_| u64::try_from(n))
        .ok()
}

fn convert(
    values: &pickle::Values,
    name: String,
    device: Option<usize>,
) -> Result<Snapshot, SnapshotError> {
    let root = At {
        values,
        id: values.root(),
        path: String::new(),
    };
    if !matches!(root.value(), pickle::Value::Dict(_)) {
        return Err(root.wrong("a dict (the snapshot)"));
    }
    let traces = root
        .get("device_traces")?
        .ok_or_else(|| root.fail(SnapshotErrorKind::NoHistory("missing")))?;
    let per_device: Vec<At> = traces.items()?.collect();
    let mut devices = Vec::new();
    for (d, trace) in per_device.iter().enumerate() {
        if trace.items()?.next().is_some() {
            devices.push(d);
        }
    }
    if devices.is_empty() {
        return Err(root.fail(SnapshotErrorKind::NoHistory("empty")));
    }
    let device = match device {
        Some(d) if devices.contains(&d) => d,
        Some(d) => return Err(root.fail(SnapshotErrorKind::NoSuchDevice { device: d, devices })),
        None => {
            // The most allocations; the first such device on a tie.
            let mut best = (devices[0], 0usize);
            for &d in &devices {
                let mut allocs = 0;
                for entry in per_device[d].items()? {
                    if let Some(action) = entry.get("action")? {
                        allocs += usize::from(action.str()? == "alloc");
                    }
                }
                if allocs > best.1 {
                    best = (d, allocs);
                }
            }
            best.0
        }
    };
    let mut snapshot = history(&per_device[device], name, device, devices)?;
    snapshot.reserved_peak = reserved_peak(&root, &per_device[device], device)?;
    Ok(snapshot)
}

/// The ops of one device's trace.
fn history(
    trace: &At,
    name: String,
    device: usize,
    devices: Vec<usize>,
) -> Result<Snapshot, SnapshotError> {
    let mut ops = Vec::new();
    let mut live: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut streams: HashMap<u64, usize> = HashMap::new();
    let mut stream_ids = Vec::new();
    let (mut failures, mut empty, mut older_frees, mut other) = (0, 0, 0, 0);
    let (mut allocations, mut live_bytes) = (0usize, 0usize);
    for entry in trace.items()? {
        let action = entry.need("action")?.str()?;
        match action {
            "alloc" => {
                let addr = entry.need("addr")?.u64("addr")?;
                let size64 = entry.need("size")?.u64("size")?;
                let size = usize::try_from(size64)
                    .ok()
                    .filter(|&s| s <= MAX_SIZE)
                    .ok_or_else(|| entry.fail(SnapshotErrorKind::SizeTooLarge(size64)))?;
                if size == 0 {
                    empty += 1;
                    continue;
                }
                let stream_at = entry.get("stream")?;
                let stream = match &stream_at {
                    None => 0,
                    Some(s) => {
                        let n = s.int()?;
                        stream_bits(n).ok_or_else(|| {
                            s.fail(SnapshotErrorKind::OutOfRange {
                                key: "stream",
                                value: n.to_string(),
                            })
                        })?
                    }
                };
                if live.contains_key(&addr) {
                    return Err(entry.fail(SnapshotErrorKind::AddressLive(addr)));
                }
                live_bytes = live_bytes
                    .checked_add(size)
                    .ok_or_else(|| entry.fail(SnapshotErrorKind::SizeTooLarge(size64)))?;
                let next = streams.len();
                let stream = *streams.entry(stream).or_insert_with(|| {
                    stream_ids.push(stream);
                    next
                });
                if stream >= MAX_STREAMS {
                    return Err(entry.fail(SnapshotErrorKind::TooManyStreams));
                }
                live.insert(addr, (allocations, size));
                ops.push(Op::Alloc {
                    id: allocations,
                    size,
                    stream,
                });
                allocations += 1;
            }
            "free_completed" => {
                let addr = entry.need("addr")?.u64("addr")?;
                let Some(&(id, allocated)) = live.get(&addr) else {
                    older_frees += 1;
                    continue;
                };
                let freed = entry.need("size")?.u64("size")?;
                if usize::try_from(freed).ok() != Some(allocated) {
                    return Err(entry.fail(SnapshotErrorKind::SizeMismatch {
                        addr,
                        allocated,
                        freed: usize::try_from(freed).unwrap_or(usize::MAX),
                    }));
                }
                live.remove(&addr);
                live_bytes -= allocated;
                ops.push(Op::Free { id });
            }
            "oom" => failures += 1,
            "segment_alloc" | "segment_free" | "segment_map" | "segment_unmap" => {}
            _ => other += 1,
        }
        if ops.len() > MAX_OPS {
            return Err(entry.fail(SnapshotErrorKind::TooManyOps));
        }
    }
    if stream_ids.is_empty() {
        stream_ids.push(0);
    }
    let workload =
        Workload::new(name, ops).map_err(|e| trace.fail(SnapshotErrorKind::Workload(e)))?;
    Ok(Snapshot {
        trace: Trace {
            workload,
            thread_ids: vec![0],
            stream_ids,
            failures,
            skipped_empty: empty,
            skipped_lines: 0,
            skipped: Vec::new(),
        },
        device,
        devices,
        older_frees,
        other_entries: other,
        reserved_peak: None,
    })
}

/// The most bytes the caching allocator held on `device` during the history: the segments at
/// the end (`segments`, those of `device`), walked back through the history's segment entries.
fn reserved_peak(root: &At, trace: &At, device: usize) -> Result<Option<usize>, SnapshotError> {
    let Some(segments) = root.get("segments")? else {
        return Ok(None);
    };
    let mut held: i128 = 0;
    for segment in segments.items()? {
        let on = match segment.get("device")? {
            Some(d) => d.int()? == device as i128,
            None => true,
        };
        if on {
            held += i128::from(segment.need("total_size")?.u64("total_size")?);
        }
    }
    let mut entries: Vec<(bool, i128)> = Vec::new();
    for entry in trace.items()? {
        let grows = match entry.need("action")?.str()? {
            "segment_alloc" | "segment_map" => true,
            "segment_free" | "segment_unmap" => false,
            _ => continue,
        };
        entries.push((grows, i128::from(entry.need("size")?.u64("size")?)));
    }
    let mut peak = held;
    for (grows, size) in entries.into_iter().rev() {
        held += if grows { -size } else { size };
        peak = peak.max(held);
    }
    Ok(Some(usize::try_from(peak.max(0)).unwrap_or(usize::MAX)))
}

/// A pickle reader for plain data.
mod pickle {
    use super::{error, SnapshotError, SnapshotErrorKind};

    /// A value's index in [`Values`].
    pub(super) type Id = u32;

    /// A value the pickle builds. Containers hold the ids of their items, so that the memo and the
    /// containers share values without reference counts, and no value is dropped recursively.
    #[derive(Debug)]
    pub(super) enum Value {
        None,
        Bool(bool),
        Int(i128),
        /// An integer outside i128.
        BigInt,
        Float,
        Str(Box<str>),
        Bytes,
        List(Vec<Id>),
        Tuple(Vec<Id>),
        Dict(Vec<(Id, Id)>),
        Set(Vec<Id>),
        /// A class reference, or an object built from one.
        Object,
    }

    impl Value {
        /// What the value is, for an error.
        pub(super) fn kind(&self) -> &'static str {
            match self {
                Value::None => "None",
                Value::Bool(_) => "a boolean",
                Value::Int(_) | Value::BigInt => "an integer",
                Value::Float => "a float",
                Value::Str(_) => "a string",
                Value::Bytes => "bytes",
                Value::List(_) => "a list",
                Value::Tuple(_) => "a tuple",
                Value::Dict(_) => "a dict",
                Value::Set(_) => "a set",
                Value::Object => "an object",
            }
        }
    }

    /// Every value a pickle built, and the one it returned.
    #[derive(Debug)]
    pub(super) struct Values {
        values: Vec<Value>,
        root: Id,
    }

    impl Values {
        pub(super) fn root(&self) -> Id {
            self.root
        }

        pub(super) fn get(&self, id: Id) -> &Value {
            // Ids come from `push`, which made each one's value.
            &self.values[id as usize]
        }

        pub(super) fn str(&self, id: Id) -> Option<&str> {
            match self.get(id) {
                Value::Str(s) => Some(s),
                _ => None,
            }
        }
    }

    /// The most values on the stack at once: far more than plain data nests (the pickler batches
    /// a container's items in thousands), and a bound on what a pickle can make wait there.
    const MAX_STACK: usize = 1 << 20;

    struct Machine<'b> {
        bytes: &'b [u8],
        pos: usize,
        /// Where the opcode being run starts, for errors.
        op_at: usize,
        values: Vec<Value>,
        stack: Vec<Id>,
        marks: Vec<usize>,
        memo: std::collections::HashMap<u64, Id>,
    }

    /// Runs the pickle in `bytes` and returns what it built.
    pub(super) fn load(bytes: &[u8]) -> Result<Values, SnapshotError> {
        match bytes.first() {
            None => return Err(error("", SnapshotErrorKind::Pickle("empty input".into()))),
            Some(&b) if b != super::PICKLE_MAGIC => {
                return Err(error("byte 0", SnapshotErrorKind::NotPickle(b)))
            }
            Some(_) => {}
        }
        let mut m = Machine {
            bytes,
            pos: 0,
            op_at: 0,
            values: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: std::collections::HashMap::new(),
        };
        let root = m.run()?;
        Ok(Values {
            values: m.values,
            root,
        })
    }

    impl<'b> Machine<'b> {
        fn fail(&self, what: impl Into<String>) -> SnapshotError {
            error(
                format!("byte {}", self.op_at),
                SnapshotErrorKind::Pickle(what.into()),
            )
        }

        fn take(&mut self, n: u64) -> Result<&'b [u8], SnapshotError> {
            let left = self.bytes.len() - self.pos;
            match usize::try_from(n) {
                Ok(n) if n <= left => {
                    let bytes: &'b [u8] = self.bytes;
                    let s = &bytes[self.pos..self.pos + n];
                    self.pos += n;
                    Ok(s)
                }
                _ => Err(self.fail(format!(
                    "a length of {n} bytes where {left} are left (a file cut short?)"
                ))),
            }
        }

        fn uint(&mut self, n: u64) -> Result<u64, SnapshotError> {
            let b = self.take(n)?;
            Ok(b.iter()
                .rev()
                .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
        }

        fn line(&mut self) -> Result<&'b [u8], SnapshotError> {
            let bytes: &'b [u8] = self.bytes;
            let rest = &bytes[self.pos..];
            match rest.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.pos += i + 1;
                    Ok(&rest[..i])
                }
                None => Err(self.fail("a text argument without its end of line")),
            }
        }

        fn push(&mut self, v: Value) -> Result<(), SnapshotError> {
            let id = Id::try_from(self.values.len())
                .map_err(|_| self.fail("more values than this reader holds"))?;
            self.values.push(v);
            self.push_id(id)
        }

        fn push_id(&mut self, id: Id) -> Result<(), SnapshotError> {
            if self.stack.len() >= MAX_STACK {
                return Err(self.fail(format!("more than {MAX_STACK} values on the stack")));
            }
            self.stack.push(id);
            Ok(())
        }

        fn pop(&mut self) -> Result<Id, SnapshotError> {
            match self.marks.last() {
                Some(&mark) if self.stack.len() <= mark => {
                    Err(self.fail("a value taken from an empty stack (below a mark)"))
                }
                _ => self
                    .stack
                    .pop()
                    .ok_or_else(|| self.fail("a value taken from an empty stack")),
            }
        }

        fn top(&self) -> Result<Id, SnapshotError> {
            self.stack
                .last()
                .copied()
                .ok_or_else(|| self.fail("a value read from an empty stack"))
        }

        /// The values above the last mark, which is removed.
        fn pop_mark(&mut self) -> Result<Vec<Id>, SnapshotError> {
            let mark = self
                .marks
                .pop()
                .ok_or_else(|| self.fail("no mark to take values up to"))?;
            Ok(self.stack.split_off(mark))
        }

        fn str(&mut self, n: u64) -> Result<(), SnapshotError> {
            let b = self.take(n)?;
            let s = std::str::from_utf8(b)
                .map_err(|_| self.fail("a string that is not UTF-8"))?
                .into();
            self.push(Value::Str(s))
        }

        fn bytes(&mut self, n: u64) -> Result<(), SnapshotError> {
            self.take(n)?;
            self.push(Value::Bytes)
        }

        /// A little-endian two's-complement integer of `n` bytes.
        fn long(&mut self, n: u64) -> Result<(), SnapshotError> {
            let b = self.take(n)?;
            let value = if b.len() > 16 {
                // Larger than i128 unless its top bytes only extend the sign.
                let (low, high) = b.split_at(16);
                let sign = if low[15] & 0x80 != 0 { 0xff } else { 0 };
                if high.iter().all(|&x| x == sign) {
                    Value::Int(le_int(low))
                } else {
                    Value::BigInt
                }
            } else {
                Value::Int(le_int(b))
            };
            self.push(value)
        }

        fn memo_put(&mut self, key: u64) -> Result<(), SnapshotError> {
            let id = self.top()?;
            self.memo.insert(key, id);
            Ok(())
        }

        fn memo_get(&mut self, key: u64) -> Result<(), SnapshotError> {
            let id = *self
                .memo
                .get(&key)
                .ok_or_else(|| self.fail(format!("memo key {key} was never stored")))?;
            self.push_id(id)
        }

        /// Appends `items` to the list (or set) `to`.
        fn extend(&mut self, to: Id, items: Vec<Id>) -> Result<(), SnapshotError> {
            match &mut self.values[to as usize] {
                Value::List(v) | Value::Set(v) => {
                    v.extend(items);
                    Ok(())
                }
                // Appending to an object calls its methods: nothing here keeps it.
                Value::Object => Ok(()),
                other => {
                    let kind = other.kind();
                    Err(self.fail(format!("items appended to {kind}, not a list")))
                }
            }
        }

        fn set_items(&mut self, to: Id, items: Vec<Id>) -> Result<(), SnapshotError> {
            if items.len() % 2 != 0 {
                return Err(self.fail("a dict's keys and values are not in pairs"));
            }
            match &mut self.values[to as usize] {
                Value::Dict(d) => {
                    for pair in items.chunks_exact(2) {
                        d.push((pair[0], pair[1]));
                    }
                    Ok(())
                }
                Value::Object => Ok(()),
                other => {
                    let kind = other.kind();
                    Err(self.fail(format!("items set in {kind}, not a dict")))
                }
            }
        }

        fn text_number(&mut self) -> Result<Value, SnapshotError> {
            let line = self.line()?;
            let text = std::str::from_utf8(line).unwrap_or("").trim();
            let text = text.strip_suffix('L').unwrap_or(text);
            match text {
                "00" => return Ok(Value::Bool(false)),
                "01" => return Ok(Value::Bool(true)),
                _ => {}
            }
            text.parse::<i128>()
                .map(Value::Int)
                .or_else(|_| text.parse::<f64>().map(|_| Value::Float))
                .map_err(|_| self.fail(format!("`{text}` is not a number")))
        }

        fn run(&mut self) -> Result<Id, SnapshotError> {
            loop {
                self.op_at = self.pos;
                let op = *self
                    .bytes
                    .get(self.pos)
                    .ok_or_else(|| self.fail("the pickle ends before its STOP opcode"))?;
                self.pos += 1;
                match op {
                    // PROTO
                    0x80 => {
                        self.take(1)?;
                    }
                    // FRAME: a length hint only.
                    0x95 => {
                        self.take(8)?;
                    }
                    // STOP
                    b'.' => return self.pop(),
                    // MARK
                    b'(' => self.marks.push(self.stack.len()),
                    // POP
                    b'0' => {
                        if self.marks.last() == Some(&self.stack.len()) {
                            self.marks.pop();
                        } else {
                            self.pop()?;
                        }
                    }
                    // POP_MARK
                    b'1' => {
                        self.pop_mark()?;
                    }
                    // DUP
                    b'2' => {
                        let top = self.top()?;
                        self.push_id(top)?;
                    }
                    // NONE, NEWTRUE, NEWFALSE
                    b'N' => self.push(Value::None)?,
                    0x88 => self.push(Value::Bool(true))?,
                    0x89 => self.push(Value::Bool(false))?,
                    // BININT, BININT1, BININT2
                    b'J' => {
                        let v = self.uint(4)? as u32 as i32;
                        self.push(Value::Int(i128::from(v)))?;
                    }
                    b'K' => {
                        let v = self.uint(1)?;
                        self.push(Value::Int(i128::from(v)))?;
                    }
                    b'M' => {
                        let v = self.uint(2)?;
                        self.push(Value::Int(i128::from(v)))?;
                    }
                    // LONG1, LONG4
                    0x8a => {
                        let n = self.uint(1)?;
                        self.long(n)?;
                    }
                    0x8b => {
                        let n = self.uint(4)?;
                        if n & 0x8000_0000 != 0 {
                            return Err(self.fail("a negative LONG4 length"));
                        }
                        self.long(n)?;
                    }
                    // INT, LONG (text)
                    b'I' | b'L' => {
                        let v = self.text_number()?;
                        self.push(v)?;
                    }
                    // BINFLOAT, FLOAT
                    b'G' => {
                        self.take(8)?;
                        self.push(Value::Float)?;
                    }
                    b'F' => {
                        self.line()?;
                        self.push(Value::Float)?;
                    }
                    // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
                    0x8c => {
                        let n = self.uint(1)?;
                        self.str(n)?;
                    }
                    b'X' => {
                        let n = self.uint(4)?;
                        self.str(n)?;
                    }
                    0x8d => {
                        let n = self.uint(8)?;
                        self.str(n)?;
                    }
                    // UNICODE (raw-unicode-escape text): kept as its text.
                    b'V' => {
                        let line = self.line()?;
                        let s = String::from_utf8_lossy(line).into_owned().into_boxed_str();
                        self.push(Value::Str(s))?;
                    }
                    // SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8, SHORT_BINSTRING, BINSTRING
                    b'C' | b'U' => {
                        let n = self.uint(1)?;
                        self.bytes(n)?;
                    }
                    b'B' | b'T' => {
                        let n = self.uint(4)?;
                        self.bytes(n)?;
                    }
                    0x8e | 0x96 => {
                        let n = self.uint(8)?;
                        self.bytes(n)?;
                    }
                    // STRING (quoted text)
                    b'S' => {
                        self.line()?;
                        self.push(Value::Bytes)?;
                    }
                    // EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE, EMPTY_SET
                    b']' => self.push(Value::List(Vec::new()))?,
                    b'}' => self.push(Value::Dict(Vec::new()))?,
                    b')' => self.push(Value::Tuple(Vec::new()))?,
                    0x8f => self.push(Value::Set(Vec::new()))?,
                    // LIST, TUPLE, DICT, FROZENSET: from the values above the mark.
                    b'l' => {
                        let items = self.pop_mark()?;
                        self.push(Value::List(items))?;
                    }
                    b't' => {
                        let items = self.pop_mark()?;
                        self.push(Value::Tuple(items))?;
                    }
                    b'd' => {
                        let items = self.pop_mark()?;
                        let dict = self.push_empty_dict()?;
                        self.set_items(dict, items)?;
                    }
                    0x91 => {
                        let items = self.pop_mark()?;
                        self.push(Value::Set(items))?;
                    }
                    // TUPLE1, TUPLE2, TUPLE3
                    0x85..=0x87 => {
                        let n = usize::from(op - 0x84);
                        let mut items = vec![0; n];
                        for slot in items.iter_mut().rev() {
                            *slot = self.pop()?;
                        }
                        self.push(Value::Tuple(items))?;
                    }
                    // APPEND, APPENDS, ADDITEMS
                    b'a' => {
                        let item = self.pop()?;
                        let list = self.top()?;
                        self.extend(list, vec![item])?;
                    }
                    b'e' | 0x90 => {
                        let items = self.pop_mark()?;
                        let list = self.top()?;
                        self.extend(list, items)?;
                    }
                    // SETITEM, SETITEMS
                    b's' => {
                        let value = self.pop()?;
                        let key = self.pop()?;
                        let dict = self.top()?;
                        self.set_items(dict, vec![key, value])?;
                    }
                    b'u' => {
                        let items = self.pop_mark()?;
                        let dict = self.top()?;
                        self.set_items(dict, items)?;
                    }
                    // MEMOIZE, BINPUT, LONG_BINPUT, PUT
                    0x94 => {
                        let key = self.memo.len() as u64;
                        self.memo_put(key)?;
                    }
                    b'q' => {
                        let key = self.uint(1)?;
                        self.memo_put(key)?;
                    }
                    b'r' => {
                        let key = self.uint(4)?;
                        self.memo_put(key)?;
                    }
                    b'p' => {
                        let key = self.text_key()?;
                        self.memo_put(key)?;
                    }
                    // BINGET, LONG_BINGET, GET
                    b'h' => {
                        let key = self.uint(1)?;
                        self.memo_get(key)?;
                    }
                    b'j' => {
                        let key = self.uint(4)?;
                        self.memo_get(key)?;
                    }
                    b'g' => {
                        let key = self.text_key()?;
                        self.memo_get(key)?;
                    }
                    // GLOBAL (two text lines), STACK_GLOBAL: a class reference.
                    b'c' => {
                        self.line()?;
                        self.line()?;
                        self.push(Value::Object)?;
                    }
                    0x93 => {
                        self.pop()?;
                        self.pop()?;
                        self.push(Value::Object)?;
                    }
                    // REDUCE, NEWOBJ: a callable and its arguments make an object.
                    b'R' | 0x81 => {
                        self.pop()?;
                        self.pop()?;
                        self.push(Value::Object)?;
                    }
                    // NEWOBJ_EX: a class, its arguments and keyword arguments.
                    0x92 => {
                        self.pop()?;
                        self.pop()?;
                        self.pop()?;
                        self.push(Value::Object)?;
                    }
                    // BUILD: sets an object's state; the object stays.
                    b'b' => {
                        self.pop()?;
                        self.top()?;
                    }
                    // INST (two text lines, arguments above a mark), OBJ (class and arguments
                    // above a mark).
                    b'i' => {
                        self.line()?;
                        self.line()?;
                        self.pop_mark()?;
                        self.push(Value::Object)?;
                    }
                    b'o' => {
                        self.pop_mark()?;
                        self.push(Value::Object)?;
                    }
                    _ => {
                        return Err(error(
                            format!("byte {}", self.op_at),
                            SnapshotErrorKind::Unsupported {
                                opcode: op,
                                name: unsupported_name(op),
                            },
                        ))
                    }
                }
            }
        }

        fn push_empty_dict(&mut self) -> Result<Id, SnapshotError> {
            self.push(Value::Dict(Vec::new()))?;
            self.top()
        }

        fn text_key(&mut self) -> Result<u64, SnapshotError> {
            let line = self.line()?;
            let text = std::str::from_utf8(line).unwrap_or("").trim();
            text.parse()
                .map_err(|_| self.fail(format!("memo key `{text}` is not a number")))
        }
    }

    /// A little-endian two's-complement integer of at most 16 bytes.
    fn le_int(b: &[u8]) -> i128 {
        if b.is_empty() {
            return 0;
        }
        let negative = b[b.len() - 1] & 0x80 != 0;
        let mut full = [if negative { 0xff } else { 0 }; 16];
        full[..b.len()].copy_from_slice(b);
        i128::from_le_bytes(full)
    }

    /// The name of an opcode [`Machine::run`] does not run, or "unknown".
    fn unsupported_name(op: u8) -> &'static str {
        match op {
            b'P' => "PERSID",
            b'Q' => "BINPERSID",
            0x82 => "EXT1",
            0x83 => "EXT2",
            0x84 => "EXT4",
            0x97 => "NEXT_BUFFER",
            0x98 => "READONLY_BUFFER",
            _ => "unknown",
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn long_integers_read_as_two_s_complement() {
            assert_eq!(le_int(&[]), 0);
            assert_eq!(le_int(&[0xff]), -1);
            assert_eq!(le_int(&[0x00, 0x80]), -32768);
            assert_eq!(le_int(&[0xff, 0x00]), 255);
            let mut big = u64::MAX.to_le_bytes().to_vec();
            big.push(0);
            assert_eq!(le_int(&big), i128::from(u64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// python3 -c "import pickle,sys; sys.stdout.buffer.write(pickle.dumps(X, protocol=4))" of
    /// the `X` in each test's comment.
    fn load(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        from_bytes(bytes, "t", None)
    }

    #[test]
    fn the_small_snapshot_replays_its_allocations_and_frees() {
        // data/snapshots/small.pickle: python/tests/snapshot_fixture.py writes it.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/snapshots/small.pickle");
        assert!(is_pickle_file(path).unwrap());
        let s = read(path, None).unwrap();
        let w = &s.trace.workload;
        assert_eq!(w.name(), "small");
        assert_eq!((s.device, s.devices.clone()), (0, vec![0]));
        assert_eq!(w.allocations(), 6);
        // One block outlives the history; one free is of a block from before it.
        assert_eq!((w.unfreed(), s.older_frees), (1, 1));
        assert_eq!(w.stream_count(), 2);
        assert_eq!(s.trace.stream_ids[0], 0);
        assert_eq!(w.peak_live(), 3 << 20);
        assert_eq!(s.trace.failures, 1);
        assert_eq!(s.reserved_peak, Some(20 << 20));
    }

    #[test]
    fn a_gzip_compressed_snapshot_reads_the_same() {
        use std::io::Write;
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/snapshots/small.pickle");
        let plain = std::fs::read(path).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain).unwrap();
        let gz = gz.finish().unwrap();
        let a = from_bytes(&plain, "a", None).unwrap();
        let b = read_from(&gz[..], "a", None).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn a_snapshot_without_history_says_so() {
        // {'segments': []}
        let e =
            load(b"\x80\x04\x95\x11\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x08segments\x94]\x94s.")
                .unwrap_err();
        assert!(
            matches!(e.kind, SnapshotErrorKind::NoHistory("missing")),
            "{e}"
        );
        assert!(e.to_string().contains("_record_memory_history"), "{e}");
        // {'device_traces': [[]]}
        let e = load(b"\x80\x04\x95\x19\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94as.")
            .unwrap_err();
        assert!(
            matches!(e.kind, SnapshotErrorKind::NoHistory("empty")),
            "{e}"
        );
    }

    #[test]
    fn bad_input_is_an_error_naming_where() {
        // Not a pickle.
        let e = load(b"Thread,Time,Action\n").unwrap_err();
        assert!(matches!(e.kind, SnapshotErrorKind::NotPickle(b'T')), "{e}");
        assert_eq!(e.at, "byte 0");
        // Cut short inside a string of 13 bytes.
        let e = load(b"\x80\x04}\x8c\rdevice_tr").unwrap_err();
        assert_eq!(e.at, "byte 3", "{e}");
        assert!(
            e.to_string()
                .contains("a length of 13 bytes where 9 are left"),
            "{e}"
        );
        // No STOP.
        let e = load(b"\x80\x04}").unwrap_err();
        assert!(e.to_string().contains("before its STOP"), "{e}");
        // An opcode of a persistent id.
        let e = load(b"\x80\x04}Q.").unwrap_err();
        assert!(
            matches!(
                e.kind,
                SnapshotErrorKind::Unsupported {
                    opcode: b'Q',
                    name: "BINPERSID"
                }
            ),
            "{e}"
        );
        // A list at the root: [1]
        let e = load(b"\x80\x04]K\x01a.").unwrap_err();
        assert_eq!(
            e.to_string(),
            "expected a dict (the snapshot), found a list"
        );
        // An entry without its size:
        // {'device_traces': [[{'action': 'alloc', 'addr': 1, 'stream': 0}]]}
        let e = load(b"\x80\x04\x95C\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94K\x01\x8c\x06stream\x94K\x00uaas.")
            .unwrap_err();
        assert_eq!(e.at, "device_traces[0][0]");
        assert!(
            matches!(e.kind, SnapshotErrorKind::MissingKey("size")),
            "{e}"
        );
        // A size that is a string: {'device_traces': [[{'action': 'alloc', 'addr': 1, 'size': 'x'}]]}
        let e = load(b"\x80\x04\x95C\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94K\x01\x8c\x04size\x94\x8c\x01x\x94uaas.")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "device_traces[0][0][\"size\"]: expected an integer, found a string"
        );
    }

    #[test]
    fn an_alloc_at_a_live_address_is_an_error() {
        // {'device_traces': [[{'action': 'alloc', 'addr': 1, 'size': 8}] * 2]} (one dict twice)
        let e = load(b"\x80\x04\x95D\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94K\x01\x8c\x04size\x94K\x08uh\x04eas.")
            .unwrap_err();
        assert_eq!(e.at, "device_traces[0][1]");
        assert!(matches!(e.kind, SnapshotErrorKind::AddressLive(1)), "{e}");
    }

    #[test]
    fn no_input_of_any_bytes_panics() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/snapshots/small.pickle");
        let plain = std::fs::read(path).unwrap();
        // Every prefix, and every single-byte change at a spread of offsets.
        for n in 0..plain.len() {
            let _ = load(&plain[..n]);
        }
        for i in (0..plain.len()).step_by(3) {
            for b in [
                0x00, 0x28, 0x2e, 0x30, 0x61, 0x65, 0x68, 0x75, 0x80, 0x8c, 0x94, 0xff,
            ] {
                let mut bad = plain.clone();
                bad[i] = b;
                let _ = load(&bad);
            }
        }
    }

    #[test]
    fn a_device_is_chosen_by_its_allocations_or_by_asking() {
        // {'device_traces': [[], [{'action': 'alloc', 'addr': 1, 'size': 8, 'stream': 0}]]}
        let p = b"\x80\x04\x95O\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94(]\x94]\x94}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94K\x01\x8c\x04size\x94K\x08\x8c\x06stream\x94K\x00uaes.";
        let s = load(p).unwrap();
        assert_eq!((s.device, s.devices), (1, vec![1]));
        let e = from_bytes(p, "t", Some(0)).unwrap_err();
        assert!(
            matches!(e.kind, SnapshotErrorKind::NoSuchDevice { device: 0, .. }),
            "{e}"
        );
    }

    #[test]
    fn names_drop_the_pickle_suffixes() {
        assert_eq!(workload_name(Path::new("/x/run.pickle.gz")), "run");
        assert_eq!(workload_name(Path::new("run.pkl")), "run");
        assert_eq!(workload_name(Path::new("run")), "run");
    }
}
