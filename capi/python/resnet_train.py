"""Trains torchvision's ResNet-50 on random data for a fixed number of steps with one CUDA
allocator, and writes per-step losses, the median step time and peak device memory as JSON.

One allocator per process: PyTorch swaps its allocator only before CUDA is initialized, so the
driver starts this script once per configuration:

    native           PyTorch's caching allocator
    cudaMallocAsync  PyTorch's cudaMallocAsync backend (the driver sets PYTORCH_CUDA_ALLOC_CONF)
    mrstack          libmrstack_c.so through CUDAPluggableAllocator (stack from MRSTACK_STACK)

Everything that decides the numbers is fixed: the seed of the weights and of the data (drawn on
the GPU by a seeded generator, so no allocator changes them), deterministic algorithms, cuDNN
without benchmark mode (which also calls the allocator's cacheInfo, which a pluggable allocator
does not have). So every configuration must compute the same losses, bit for bit; the driver
compares them step by step.
"""

import argparse
import gc
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_checks  # noqa: E402
import mrstack_capi  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--allocator", choices=["native", "cudaMallocAsync", "mrstack"], required=True)
p.add_argument("--lib", help="libmrstack_c.so (with --allocator mrstack)")
p.add_argument("--out", required=True, help="the JSON result")
p.add_argument("--report", help="where mrstack_report writes the stack's statistics")
p.add_argument("--steps", type=int, default=50, help="timed steps, after the warm-up")
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--image-size", type=int, default=224)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--device", default="cuda", help="cpu only to try the script without a GPU")
args = p.parse_args()

checks = client_checks.Checks(f"resnet50/{args.allocator}", args.out)
checks.put_allocator(args.allocator)
checks.put("logged", bool(os.environ.get("MRSTACK_LOG")) if args.allocator == "mrstack" else False)

# cuBLAS reads this when its handle is made: deterministic algorithms refuse to run without it.
if os.environ.get("CUBLAS_WORKSPACE_CONFIG") != ":4096:8":
    sys.exit("CUBLAS_WORKSPACE_CONFIG must be :4096:8 (the driver sets it)")

import torch  # noqa: E402

lib = mrstack_capi.use_with_torch_if_chosen(args)  # before anything touches CUDA

import torchvision  # noqa: E402

cuda = args.device == "cuda"


def body(c):
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    c.put("torch", torch.__version__)
    c.put("torchvision", torchvision.__version__)
    if cuda:
        c.put("cudnn", torch.backends.cudnn.version())
        c.put("gpu", torch.cuda.get_device_name(0))
        backend = torch.cuda.memory.get_allocator_backend()
        c.put("allocator_backend", backend)
        if args.allocator in ("native", "cudaMallocAsync"):
            c.check(f"PyTorch's allocator backend is {args.allocator}", backend == args.allocator,
                    f"get_allocator_backend() = {backend!r}")

    def used():
        if not cuda:
            return 0
        free, total = torch.cuda.mem_get_info()
        return total - free

    device = torch.device(args.device)
    if cuda:
        torch.cuda.init()
    c.put("device_used_at_start", used())

    torch.manual_seed(args.seed)
    model = torchvision.models.resnet50(weights=None).to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    g = torch.Generator(device=device)
    g.manual_seed(args.seed)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    losses, times_ms, peak = [], [], used()
    nondeterministic = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(args.warmup + args.steps):
            x = torch.randn((args.batch, 3, args.image_size, args.image_size), generator=g,
                            device=device)
            y = torch.randint(0, 1000, (args.batch,), generator=g, device=device)
            sync()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            # Device memory at the step's peak (activations held, backward not begun) and after
            # backward: an allocator that gives memory back at synchronization (a driver pool
            # with release threshold 0) shows its peak only inside the step. The same calls in
            # every configuration, so the timings stay comparable.
            peak = max(peak, used())
            loss.backward()
            peak = max(peak, used())
            opt.step()
            sync()
            times_ms.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.item())
            peak = max(peak, used())
            del x, y, loss
        for w in caught:
            if "deterministic" in str(w.message):
                nondeterministic.add(str(w.message).split(".")[0])
    c.put("losses", losses)
    c.put("step_ms", times_ms)
    c.put("median_step_ms", client_checks.median(times_ms[args.warmup:]))
    c.put("peak_device_bytes", peak)
    c.put("nondeterministic_ops", sorted(nondeterministic))
    c.check(f"{len(losses)} finite losses", len(losses) == args.warmup + args.steps
            and client_checks.finite(losses), f"first {losses[0]:.6f}, last {losses[-1]:.6f}")
    if nondeterministic:
        # Not a failure by itself: the driver's native-again control says whether it mattered.
        print(f"note: ops without a deterministic implementation: {sorted(nondeterministic)}")

    if cuda and args.allocator != "mrstack":
        # The allocators' own peak of allocated bytes, for comparison with the stack's peak live
        # bytes. Not for mrstack: a pluggable allocator has no device stats (PyTorch raises).
        try:
            c.put("max_memory_allocated", torch.cuda.max_memory_allocated())
        except RuntimeError as e:
            c.put("max_memory_allocated", None)
            print(f"note: max_memory_allocated: {e}")

    if lib is not None:
        stats = mrstack_capi.statistics(lib)
        c.put("stack_after_training", stats)
        c.put("stack_description", mrstack_capi.describe(lib))
        c.check("the stack served PyTorch's allocations", stats["allocations"] > 0,
                f"{stats['allocations']} allocations, peak live "
                f"{stats['peak_live_bytes'] / client_checks.MIB:.1f} MiB")
        c.check("no bad frees", stats["bad_frees"] == 0, f"bad_frees {stats['bad_frees']}")
        c.check("no failed allocations", stats["failed_allocations"] == 0,
                f"failed_allocations {stats['failed_allocations']}")
    c.save()

    del model, opt, criterion
    gc.collect()
    sync()
    if lib is not None:
        # Also flushes MRSTACK_LOG, so the log holds the frees of the model too.
        rep = mrstack_capi.report(lib, args.report or args.out + ".report.json")
        stats = rep["stacks"][0]
        c.put("stack_after_free", stats)
        # What PyTorch keeps past the model (cuBLAS and cuDNN workspaces): shown, not checked.
        print(f"after freeing the model: {stats['live_blocks']} live blocks, "
              f"{stats['live_bytes'] / client_checks.MIB:.1f} MiB")
    print(f"median step {c.data['median_step_ms']:.2f} ms, peak device "
          f"{peak / client_checks.MIB:.0f} MiB, last loss {losses[-1]!r}")


checks.run(body)
