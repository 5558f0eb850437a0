//! The snapshot's structure read out of the pickle's values: one device's trace entries become
//! ops, and its segments the caching allocator's peak.

use super::error::error;
use super::{pickle, Snapshot, SnapshotError, SnapshotErrorKind};
use crate::replay::rmm_log::{Trace, MAX_OPS, MAX_SIZE, MAX_STREAMS};
use crate::replay::{Op, Workload};
use std::collections::HashMap;

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

pub(super) fn convert(
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
