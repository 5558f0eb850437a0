"""PyTorch on mrstack out of memory: a tensor far larger than the GPU must raise a Python
exception (mrstack_torch_malloc_or_throw throws std::runtime_error, a RuntimeError in Python),
not come back as a tensor at address 0, which is what a null return from the allocator would
give (PyTorch does not check it); and the process goes on: it allocates, computes and frees.
"""

import argparse
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_checks  # noqa: E402
import mrstack_capi  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--lib", required=True)
p.add_argument("--out", required=True)
p.add_argument("--oom-bytes", type=int, default=200 << 30)
args = p.parse_args()

checks = client_checks.Checks("torch/oom", args.out)
checks.put("stack", os.environ.get("MRSTACK_STACK"))

import torch  # noqa: E402

lib = mrstack_capi.use_with_torch(args.lib)  # before anything touches CUDA


def body(c):
    gib = args.oom_bytes / (1 << 30)
    a = torch.arange(1000, dtype=torch.float64, device="cuda")
    before = mrstack_capi.statistics(lib)
    for attempt in range(3):  # more than once: a failure must leave nothing behind
        caught = c.raises(f"{gib:.0f} GiB raises (attempt {attempt + 1})",
                          lambda: torch.empty(args.oom_bytes, dtype=torch.uint8, device="cuda"),
                          lambda t: f"a tensor at {t.data_ptr():#x}")
        if caught is not None:
            first_line = str(caught).splitlines()[0] if str(caught) else ""
            c.put(f"exception_{attempt + 1}", f"{type(caught).__name__}: {caught}")
            c.check(f"{gib:.0f} GiB raises RuntimeError (attempt {attempt + 1})",
                    isinstance(caught, RuntimeError), f"{type(caught).__name__}: {first_line}")
    after = mrstack_capi.statistics(lib)
    c.put("stack_after_oom", after)
    c.check("the stack counted the failures",
            after["failed_allocations"] >= before["failed_allocations"] + 3,
            f"failed_allocations {before['failed_allocations']} -> {after['failed_allocations']}")
    c.check("no block left behind by the failures", after["live_blocks"] == before["live_blocks"],
            f"live_blocks {before['live_blocks']} -> {after['live_blocks']}")
    # The process goes on: a GiB, a kernel, a matrix product, the tensor from before intact.
    big = torch.ones(1 << 28, device="cuda")
    c.check("PyTorch goes on: 1 GiB of ones sums right", big.sum().item() == float(1 << 28))
    m = torch.full((512, 512), 2.0, device="cuda")
    c.check("and multiplies matrices", bool(((m @ m) == 2048.0).all()))
    c.check("a tensor from before is intact", a.sum().item() == 999 * 1000 / 2)
    del big, m, a
    gc.collect()
    torch.cuda.synchronize()
    end = mrstack_capi.statistics(lib)
    c.put("stack_at_end", end)
    # What PyTorch keeps for itself (the cuBLAS workspace of the product above) stays live.
    c.check("frees fine after: no bad frees, live bytes back near the start",
            end["bad_frees"] == 0 and end["live_bytes"] <= before["live_bytes"] + (256 << 20),
            f"bad_frees {end['bad_frees']}, live {before['live_bytes']} -> {end['live_bytes']} B")


checks.run(body)
