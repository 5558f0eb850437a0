"""Kernel times on memory from each allocator: whether the way an allocator maps its memory slows
the kernels that read it. Four kernels over tensors of a few GiB: a 2 GiB copy (bound by memory
bandwidth, the most sensitive to how the GPU translates addresses), a gather of 64 Mi random
elements of 2 GiB, a 3x3 convolution and a batch norm. Each allocator runs in a child process of
its own (native, expandable segments, then each --stack through the C library), --rounds times,
taking turns; a kernel's time is the lowest of its rounds' means.

    python3 capi/python/kernels_torch.py --lib gpu-bin/lib/libmrstack_c.so \\
        --stack paged --stack 'paged(page=16MiB)'
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mrstack_capi  # noqa: E402 (beside this file)
KERNELS = ["copy", "gather", "conv", "batch norm"]


def child(args):
    import torch

    if args.allocator == "mrstack":
        mrstack_capi.use_with_torch(args.lib)
    n = 1 << 29  # 2 GiB of float32
    a = torch.ones(n, device="cuda")
    b = torch.empty_like(a)
    idx = torch.randint(0, n, (1 << 26,), device="cuda")
    x = torch.randn(128, 256, 56, 56, device="cuda")
    w = torch.randn(256, 256, 3, 3, device="cuda")
    bn = torch.nn.BatchNorm2d(256).cuda()

    def mean_ms(f, k):
        f()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(k):
            f()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / k * 1e3

    row = {
        "copy": mean_ms(lambda: b.copy_(a), 20),
        "gather": mean_ms(lambda: a[idx], 20),
        "conv": mean_ms(lambda: torch.nn.functional.conv2d(x, w, padding=1), 10),
        "batch norm": mean_ms(lambda: bn(x), 20),
    }
    # The copy's check: every element arrived.
    if not bool((b == 1).all()):
        sys.exit("the copy's values are wrong")
    print(json.dumps(row))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True, help="libmrstack_c.so")
    p.add_argument("--stack", action="append", default=[], help="an MRSTACK_STACK to compare (repeat)")
    p.add_argument("--rounds", type=int, default=2, help="runs of every allocator, taking turns")
    p.add_argument("--allocator", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.allocator:
        return child(args)

    runs = mrstack_capi.torch_allocator_runs(args.stack)
    best = {name: None for name, _, _ in runs}
    for _ in range(args.rounds):
        for name, allocator, env in runs:
            cmd = [sys.executable, os.path.abspath(__file__), "--lib", args.lib, "--allocator", allocator]
            r = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name}: failed\n{r.stderr[-3000:]}")
                return 1
            row = json.loads(r.stdout.strip().splitlines()[-1])
            if best[name] is None:
                best[name] = row
            else:
                best[name] = {k: min(best[name][k], row[k]) for k in KERNELS}
    native = best["native"]
    print(f"{'allocator':<28}" + "".join(f"{k + ' ms':>16}" for k in KERNELS))
    for name, _, _ in runs:
        row = best[name]
        cells = "".join(f"{row[k]:>8.3f} ({row[k] / native[k]:.3f})" for k in KERNELS)
        print(f"{name:<28}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
