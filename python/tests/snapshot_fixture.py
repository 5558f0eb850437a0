"""A small PyTorch memory snapshot, built by hand with the structure
``torch.cuda.memory._snapshot()`` returns (CPU-only PyTorch cannot record one), for tests
where there is no GPU.

Run as a script, it writes ``data/snapshots/small.pickle`` (protocol 4, as
``torch.cuda.memory._dump_snapshot`` writes with Python's default), the fixture of the Rust
reader's tests (src/replay/snapshot/tests.rs), which state what it holds:

* device 0 only; a 20 MiB segment allocated in the history and still held at its end
  (the caching allocator's peak: 20 MiB);
* 6 allocations on 2 streams (the default stream and one other), with a peak of 3 MiB live;
* one block outlives the history (never freed), one ``free_completed`` is of a block
  allocated before the history began;
* one ``oom`` entry and one ``snapshot`` marker.
"""

import os
import pickle

MIB = 1 << 20
SEGMENT = 0x7F3A_0000_0000
# A stream other than the default, as PyTorch writes it: the cudaStream_t bits as an int.
SIDE_STREAM = 0x55D5_C0A3_B2F0


def _frames(name, line):
    return [
        {"filename": "/opt/model/train.py", "line": line, "name": name},
        {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1736,
         "name": "_call_impl"},
    ]


def _entry(action, addr, size, stream=0, t=0, name="forward", line=10):
    key = "device_free" if action == "oom" else "addr"
    return {
        "action": action,
        key: addr,
        "size": size,
        "stream": stream,
        "time_us": 1_700_000_000_000_000 + t,
        "frames": _frames(name, line),
        "compile_context": "N/A",
        "user_metadata": "",
    }


def snapshot():
    """The snapshot dict."""
    a1, a2, a3, a4, a5, a6 = (SEGMENT + off for off in (0, 2 * MIB, 4 * MIB, 6 * MIB, 8 * MIB,
                                                         9 * MIB))
    trace = [
        _entry("segment_alloc", SEGMENT, 20 * MIB, t=1, name="__init__", line=3),
        # A block from before the history began: its free has no alloc here.
        _entry("free_completed", SEGMENT + 12 * MIB, 512, t=2),
        _entry("alloc", a1, 1 * MIB, t=3),
        _entry("alloc", a2, 2 * MIB, t=4),
        _entry("free_requested", a1, 1 * MIB, t=5),
        _entry("free_completed", a1, 1 * MIB, t=6),
        _entry("alloc", a3, MIB // 2, SIDE_STREAM, t=7, name="backward", line=20),
        _entry("oom", 1 << 30, 1 << 40, t=8),
        _entry("free_requested", a2, 2 * MIB, t=9),
        _entry("free_completed", a2, 2 * MIB, t=10),
        _entry("alloc", a4, 1 * MIB, t=11),
        _entry("alloc", a5, 256, SIDE_STREAM, t=12, name="backward", line=21),
        _entry("free_requested", a3, MIB // 2, SIDE_STREAM, t=13),
        _entry("free_completed", a3, MIB // 2, SIDE_STREAM, t=14),
        _entry("free_requested", a5, 256, SIDE_STREAM, t=15),
        _entry("free_completed", a5, 256, SIDE_STREAM, t=16),
        _entry("free_requested", a4, 1 * MIB, t=17),
        _entry("free_completed", a4, 1 * MIB, t=18),
        _entry("alloc", a6, 100, t=19, name="step", line=30),
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0,
         "time_us": 1_700_000_000_000_020},
    ]
    segment = {
        "device": 0,
        "address": SEGMENT,
        "total_size": 20 * MIB,
        "allocated_size": 512,
        "active_size": 512,
        "requested_size": 100,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": _frames("__init__", 3),
        "blocks": [
            {"address": a6, "size": 512, "requested_size": 100, "state": "active_allocated",
             "frames": _frames("step", 30)},
            {"address": a6 + 512, "size": 20 * MIB - 9 * MIB - 512, "requested_size": 0,
             "state": "inactive", "frames": []},
        ],
    }
    return {
        "segments": [segment],
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {},
        },
        "external_annotations": [],
    }


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = os.path.join(root, "data", "snapshots", "small.pickle")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as f:
        pickle.dump(snapshot(), f, protocol=4)
    print(out)


if __name__ == "__main__":
    main()
