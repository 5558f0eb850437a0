"""The GPU tests' scenarios, each in a process of its own (PyTorch's allocator and mrstack's
per-device stacks are chosen once per process). Each prints one JSON object on its last line.

    python3 gpu_scenarios.py SCENARIO [ARGS]

train-native | train-mrstack [STACK]: the training loop of make_snapshot.py on PyTorch's
allocator or on mrstack (mrstack.torch.use, the default stack or STACK), its losses and peaks; model-native | model-mrstack NAME: the
same for a model of models.py (resnet50, transformer); mempool: mrstack.torch.MemPool for one
region; oom | mempool-oom: an allocation far larger than the GPU, then work goes on; cupy:
mrstack.cupy.use, results against NumPy, out of memory; snapshot OUT: a snapshot captured on
PyTorch's allocator, replayed from the file and from the dict.
"""

from __future__ import annotations

import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_snapshot  # noqa: E402
import models  # noqa: E402

HUGE = 1 << 50  # bytes: more than any GPU has
STEPS = 12


def emit(result):
    # NumPy scalars (np.bool_, np.float64) print as their Python values.
    print(json.dumps(result, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


# The models `model-native NAME` / `model-mrstack NAME` train, by name, with their steps.
MODELS = {
    "small": lambda: make_snapshot.train(STEPS),
    "resnet50": lambda: models.resnet50(6),
    "transformer": lambda: models.transformer(12),
}


def train(use_mrstack: bool, model: str = "small", stack=None):
    import torch

    if use_mrstack:
        import mrstack
        import mrstack.torch

        mrstack.torch.use(stack, device=0)
    losses = MODELS[model]()
    out = {"losses": losses}
    if use_mrstack:
        out["stats"] = mrstack.stats(0)
    else:
        stats = torch.cuda.memory_stats()
        out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        # The peak of the bytes tensors asked for, before PyTorch rounds a block up (to 512
        # bytes, and by a remainder of up to 1 MiB it does not split off a large block).
        out["requested_peak"] = stats["requested_bytes.all.peak"]
    emit(out)


def mempool():
    import torch
    import mrstack
    import mrstack.torch

    pool = mrstack.torch.MemPool()
    x_host = torch.arange(1 << 20, dtype=torch.float32)
    before = mrstack.stats(0)
    with torch.cuda.use_mem_pool(pool):
        x = x_host.cuda()
        y = x * 2 + 1
        torch.cuda.synchronize()
        inside = mrstack.stats(0)
    z = torch.ones(1 << 20, device="cuda")  # PyTorch's own segments
    torch.cuda.synchronize()
    outside = mrstack.stats(0)
    ok = bool(torch.equal(y.cpu(), x_host * 2 + 1)) and z.sum().item() == float(1 << 20)
    del x, y
    gc.collect()
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    end = mrstack.stats(0)
    emit({"values_ok": ok, "before": before, "inside": inside, "outside": outside, "end": end})


def oom(in_pool: bool):
    import torch
    import mrstack
    import mrstack.torch

    pool = None
    if in_pool:
        pool = mrstack.torch.MemPool()
    else:
        mrstack.torch.use(device=0)
    a = torch.arange(1000, dtype=torch.float64, device="cuda")
    before = mrstack.stats(0)
    caught = []
    for _ in range(2):
        try:
            if pool is not None:
                with torch.cuda.use_mem_pool(pool):
                    torch.empty(HUGE, dtype=torch.uint8, device="cuda")
            else:
                torch.empty(HUGE, dtype=torch.uint8, device="cuda")
            caught.append(None)
        except Exception as e:  # noqa: BLE001 - which exception is what is checked
            caught.append([type(e).__module__ + "." + type(e).__name__,
                           isinstance(e, torch.OutOfMemoryError), isinstance(e, RuntimeError),
                           str(e).splitlines()[0] if str(e) else ""])
    after = mrstack.stats(0)
    big = torch.ones(1 << 26, device="cuda")
    goes_on = big.sum().item() == float(1 << 26) and a.sum().item() == 999 * 1000 / 2
    emit({"caught": caught, "before": before, "after": after, "goes_on": goes_on})


def cupy_scenario():
    import numpy as np
    import cupy
    import mrstack
    import mrstack.cupy

    mrstack.cupy.use()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 200))
    b = rng.standard_normal((200, 100))
    prod = cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(b))
    x = rng.standard_normal(100_000)
    s = float(cupy.asarray(x).sum())
    values_ok = bool(np.allclose(prod, a @ b, rtol=1e-10, atol=1e-10)) and bool(abs(s - x.sum()) < 1e-8)
    stats = mrstack.stats(cupy.cuda.Device().id)
    oom_type = None
    try:
        cupy.empty(HUGE, dtype=cupy.uint8)
    except Exception as e:  # noqa: BLE001 - which exception is what is checked
        oom_type = [type(e).__name__,
                    isinstance(e, cupy.cuda.memory.OutOfMemoryError), str(e)]
    after = float(cupy.ones(1 << 20).sum())
    emit({"values_ok": values_ok, "stats": stats, "oom": oom_type,
          "goes_on": after == float(1 << 20)})


def snapshot(out: str):
    import torch
    import mrstack

    torch.cuda.memory._record_memory_history(max_entries=200_000)
    make_snapshot.train(STEPS)
    torch.cuda.memory._dump_snapshot(out)
    as_dict = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    from_file = mrstack.replay(out, passes=1, args=["--precision", "0.01"])
    from_dict = mrstack.replay(as_dict, passes=1, args=["--precision", "0.01"])
    emit({"file_stack": from_file.stack, "dict_stack": from_dict.stack,
          "notes": from_file.notes, "text": from_file.text})


# Each scenario by the name the test passes; `snapshot` also takes the path after it.
SCENARIOS = {
    "train-native": lambda: train(False),
    "train-mrstack": lambda: train(True, stack=sys.argv[2] if len(sys.argv) > 2 else None),
    "model-native": lambda: train(False, sys.argv[2]),
    "model-mrstack": lambda: train(True, sys.argv[2]),
    "mempool": mempool,
    "oom": lambda: oom(False),
    "mempool-oom": lambda: oom(True),
    "cupy": cupy_scenario,
    "snapshot": lambda: snapshot(sys.argv[2]),
}


def main():
    what = sys.argv[1]
    if what not in SCENARIOS:
        sys.exit(f"unknown scenario {what!r}")
    SCENARIOS[what]()


if __name__ == "__main__":
    main()
