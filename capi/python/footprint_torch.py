"""PyTorch's live bytes against the device memory an allocator holds for them, and the step
time it costs: GPT-style training (a pre-norm decoder, tiny_gpt.py) with the sequence length and
the batch drawn at every step, or torchvision's ResNet-50 with the batch drawn at every step
(--model resnet50; its warm-up also runs a step at each batch size the timed steps draw, since
cuDNN plans each new shape on the host), run once per allocator in a child process each, side
by side.

For each allocator: the device memory in use (cuMemGetInfo's total - free), sampled every
millisecond by a thread while the steps run, its peak; the median step time; the losses. The
ratio reported is that peak, less the memory native mode shows outside its allocator (the
context, cuBLAS and kernels: native's peak in use - its max_memory_reserved), over native's
max_memory_allocated (what PyTorch's tensors needed at most, rounded as PyTorch rounds).

    python3 capi/python/footprint_torch.py --lib gpu-bin/lib/libmrstack_c.so \\
        --stack 'vmm(device=0)' --stack 'paged(device=0)'

Prints one table; --json writes the rows. --rounds N runs every allocator N times, after one
native run that is not counted (a call's first minute ran ResNet-50 up to 1.25x faster than the
rest), in turns that start one allocator later each round; a row's step time is the median of
its runs' median step times, and its ratio to native's the median over the rounds of its run's
over native's run of the same round: the machine's speed drifts over minutes, and a ratio taken
within a round, where each allocator holds each place in turn, does not see it.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(args):
    sys.path.insert(0, HERE)
    import mrstack_capi
    import tiny_gpt
    import torch

    if args.allocator == "mrstack":
        mrstack_capi.use_with_torch(args.lib)
    device = torch.device("cuda")
    torch.manual_seed(args.seed)
    draw = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    if args.model == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def shape():
            return draw.randint(args.min_batch, args.max_batch)

        def batch(b):
            x = torch.randn(b, 3, args.image, args.image, generator=gen).to(device)
            return x, torch.randint(0, 1000, (b,), generator=gen).to(device)

        def loss_of(x, target):
            return torch.nn.functional.cross_entropy(model(x), target)
    else:
        model = tiny_gpt.model(args).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def shape():
            return draw.randint(args.min_len, args.max_len), draw.randint(args.min_batch, args.max_batch)

        def batch(shape):
            n, b = shape
            start = torch.randint(0, args.vocab, (b, 1), generator=gen)
            seq = ((start + torch.arange(n + 1)) % args.vocab).to(device)
            return seq[:, :-1], seq[:, 1:]

        def loss_of(x, target):
            logits = model(x)
            return torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), target.reshape(-1))
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            free, total = torch.cuda.mem_get_info()
            peak[0] = max(peak[0], total - free)
            time.sleep(0.001)

    # The shapes of the warm-up, then of the timed steps. ResNet-50's warm-up also meets each
    # batch size its timed steps draw: cuDNN builds a plan for each new convolution shape, tens
    # of milliseconds of host time that would otherwise land in whichever timed step meets the
    # shape first, and time cuDNN rather than the allocator.
    warmup = [shape() for _ in range(args.warmup)]
    timed = [shape() for _ in range(args.steps)]
    if args.model == "resnet50":
        warmup += list(dict.fromkeys(timed))
    losses, times = [], []
    sampler = None
    for step, s in enumerate(warmup + timed):
        if step == len(warmup):
            torch.cuda.synchronize()
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
        x, target = batch(s)
        t0 = time.perf_counter()
        loss = loss_of(x, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # synchronizes: the step is done
        if step >= len(warmup):
            times.append(time.perf_counter() - t0)
    stop.set()
    sampler.join()
    free, total = torch.cuda.mem_get_info()
    peak[0] = max(peak[0], total - free)
    row = {
        "warmup_steps": len(warmup),
        "peak_in_use": peak[0],
        "median_step_s": statistics.median(times),
        "step_s": times,
        "losses": losses,
    }
    if args.allocator == "mrstack":
        # What the page leaf did over the whole run (warm-up included): pages mapped and
        # unmapped, and the time requests waited for the device.
        stats = mrstack_capi.statistics(mrstack_capi.load(args.lib))
        pages = [layer for layer in stats.get("layers", []) if "maps" in layer]
        if pages:
            row["pages"] = {k: pages[0][k] for k in ("maps", "unmaps", "waited_ns", "slack_doublings", "busy")}
    if args.allocator == "native":
        row["max_allocated"] = torch.cuda.max_memory_allocated()
        row["max_reserved"] = torch.cuda.max_memory_reserved()
    with open(args.out, "w") as f:
        json.dump(row, f)


def summarize(names, results):
    """One row per allocator from its runs, `results[name][round]` (a child's result, or None
    where the run failed); `names[0]` is native. A row with a failed run is marked failed. Its
    peak is its runs' highest; its step time the median of its runs' median steps; its step
    ratio the median over the rounds of its run's median step over native's run's in the same
    round (the host's speed drifts between rounds, less within one)."""
    rows = []
    for name in names:
        done = results[name]
        if any(r is None for r in done):
            rows.append({"name": name, "failed": True})
            continue
        row = dict(done[0])
        row["name"] = name
        row["peak_in_use"] = max(r["peak_in_use"] for r in done)
        row["run_median_step_s"] = [statistics.median(r["step_s"]) for r in done]
        row["median_step_s"] = statistics.median(row["run_median_step_s"])
        row["rounds"] = len(done)
        rows.append(row)
    native = rows[0]
    for row in rows:
        if not row.get("failed") and not native.get("failed"):
            row["step_ratio"] = statistics.median(
                a / b for a, b in zip(row["run_median_step_s"], native["run_median_step_s"]))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True, help="libmrstack_c.so")
    p.add_argument("--stack", action="append", default=[], help="an MRSTACK_STACK to compare (repeat)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--model", choices=["gpt", "resnet50"], default="gpt",
                   help="the GPT below (default), or torchvision's ResNet-50 on random images")
    p.add_argument("--image", type=int, default=224, help="ResNet-50's image side")
    p.add_argument("--min-batch", type=int, default=8)
    p.add_argument("--max-batch", type=int, default=24)
    p.add_argument("--rounds", type=int, default=1,
                   help="run every allocator this many times, taking turns; a row's step ratio is the "
                        "median of its per-round ratios to native, its peak the highest")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--allocator", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    sys.path.insert(0, HERE)
    import mrstack_capi
    import tiny_gpt

    tiny_gpt.add_model_args(p, vocab=32000, d_model=1024, heads=16, layers=12, min_len=128, max_len=1024)
    args = p.parse_args()
    if args.allocator:
        return child(args)

    runs = mrstack_capi.torch_allocator_runs(args.stack)

    def run(i):
        """Allocator `i` run once in a child process: its result, or None."""
        name, allocator, env = runs[i]
        out = f"/tmp/footprint-{i}.json"
        # The child gets this run's options, one by one, and its own allocator and output.
        own = {"lib", "stack", "json", "allocator", "out", "rounds"}
        clean = [sys.executable, os.path.abspath(__file__), "--lib", args.lib, "--allocator", allocator,
                 "--out", out]
        for key, value in vars(args).items():
            if key not in own:
                clean += ["--" + key.replace("_", "-"), str(value)]
        r = subprocess.run(clean, env={**os.environ, **env}, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name}: failed\n{r.stderr[-3000:]}")
            return None
        return json.load(open(out))

    if args.rounds > 1:
        run(0)
    # Each allocator runs once per round, in turn, the first one later each round, so that a
    # slow spell of the machine falls on every allocator alike rather than on one.
    results = {name: [None] * args.rounds for name, _, _ in runs}
    for k in range(args.rounds):
        for j in range(len(runs)):
            i = (j + k) % len(runs)
            results[runs[i][0]][k] = run(i)
    rows = summarize([name for name, _, _ in runs], results)
    native = rows[0]
    if native.get("failed"):
        sys.exit("native failed: nothing to compare with")
    overhead = native["peak_in_use"] - native["max_reserved"]
    print(f"native: max_memory_allocated {native['max_allocated'] / 2**30:.2f} GiB, "
          f"max_memory_reserved {native['max_reserved'] / 2**30:.2f} GiB, "
          f"outside the allocator {overhead / 2**20:.0f} MiB")
    print(f"{'allocator':<34} {'peak in use':>12} {'ratio':>7} {'step ms':>8} {'x native':>8} {'losses = native':>16}")
    for row in rows:
        if row.get("failed"):
            print(f"{row['name']:<34} failed")
            continue
        ratio = (row["peak_in_use"] - overhead) / native["max_allocated"]
        same = row["losses"] == native["losses"]
        close = max(abs(a - b) for a, b in zip(row["losses"], native["losses"]))
        row["ratio"] = ratio
        print(f"{row['name']:<34} {row['peak_in_use'] / 2**30:>10.2f} G {ratio:>7.3f} "
              f"{row['median_step_s'] * 1e3:>8.1f} {row['step_ratio']:>8.3f} "
              f"{'equal' if same else f'max diff {close:.2g}':>16}")
    if args.rounds > 1:
        print("each run's median step, ms: " + "; ".join(
            f"{row['name']} " + ", ".join(f"{t * 1e3:.1f}" for t in row["run_median_step_s"])
            for row in rows if not row.get("failed")))
    for row in rows:
        if "pages" in row:
            p = row["pages"]
            steps = row["warmup_steps"] + args.steps
            print(f"{row['name']}: {p['maps']} pages mapped, {p['unmaps']} unmapped, "
                  f"{p['waited_ns'] / 1e6:.1f} ms waited for the device, slack doubled {p['slack_doublings']} "
                  f"times, {p['busy']} allocations found their stream's heap held by another thread, "
                  f"over its first run's {steps} steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
