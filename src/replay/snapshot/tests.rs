//! The snapshot reader's tests: the repository's small snapshot, pickles of plain data built
//! with Python, and bad input of every kind.

use super::*;
use std::path::Path;

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
    let e = load(b"\x80\x04\x95\x11\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x08segments\x94]\x94s.")
        .unwrap_err();
    assert!(
        matches!(e.kind, SnapshotErrorKind::NoHistory("missing")),
        "{e}"
    );
    assert!(e.to_string().contains("_record_memory_history"), "{e}");
    // {'device_traces': [[]]}
    let e = load(
        b"\x80\x04\x95\x19\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94as.",
    )
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
