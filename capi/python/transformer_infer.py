"""Inference of a small GPT-2-shaped transformer (plain torch.nn: token and position embeddings,
pre-norm encoder layers under a causal mask, final LayerNorm, tied LM head; random weights from a
fixed seed, nothing downloaded) on batches of random sequence lengths, so the allocator sees a
new set of sizes at every batch (and random batch sizes with --max-batch).

Run once with the native allocator (--save: the logits of every batch) and once with mrstack
(--reference: the native run's file): the logits must be equal, bit for bit, batch by batch.
"""

import argparse
import gc
import hashlib
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_checks  # noqa: E402
import mrstack_capi  # noqa: E402
import tiny_gpt  # noqa: E402 (imports torch, which touches no device)

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--allocator", choices=["native", "mrstack"], required=True)
p.add_argument("--lib", help="libmrstack_c.so (with --allocator mrstack)")
p.add_argument("--out", required=True, help="the JSON result")
p.add_argument("--save", help="write every batch's logits here (torch.save)")
p.add_argument("--reference", help="compare the logits with this file (another run's --save)")
p.add_argument("--batches", type=int, default=40)
p.add_argument("--batch", type=int, default=2)
p.add_argument("--max-batch", type=int, help="draw each batch's size in [--batch, --max-batch]")
tiny_gpt.add_model_args(p, vocab=8192, d_model=512, heads=8, layers=6, min_len=16, max_len=512)
args = p.parse_args()

checks = client_checks.Checks(f"transformer/{args.allocator}", args.out)
checks.put_allocator(args.allocator)

if os.environ.get("CUBLAS_WORKSPACE_CONFIG") != ":4096:8":
    sys.exit("CUBLAS_WORKSPACE_CONFIG must be :4096:8 (the driver sets it)")

import torch  # noqa: E402

lib = mrstack_capi.use_with_torch_if_chosen(args)  # before anything touches CUDA


def body(c):
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    c.put("torch", torch.__version__)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = tiny_gpt.model(args).to(device).eval()
    lengths = random.Random(args.seed)
    tokens_gen = torch.Generator().manual_seed(args.seed)  # on the CPU: no allocator involved
    outputs, digests, shapes = [], [], []
    with torch.inference_mode():
        for _ in range(args.batches):
            n = lengths.randint(args.min_len, args.max_len)
            b = lengths.randint(args.batch, args.max_batch) if args.max_batch else args.batch
            tokens = torch.randint(0, args.vocab, (b, n), generator=tokens_gen).to(device)
            logits = model(tokens).float().cpu()
            outputs.append(logits)
            digests.append(hashlib.sha256(logits.numpy().tobytes()).hexdigest())
            shapes.append(list(logits.shape))
    c.put("lengths", [s[1] for s in shapes])
    c.put("sha256", digests)
    c.check(f"{args.batches} batches of logits, all finite",
            len(outputs) == args.batches and all(bool(torch.isfinite(o).all()) for o in outputs),
            f"lengths {min(s[1] for s in shapes)}..{max(s[1] for s in shapes)}")
    if args.save:
        torch.save(outputs, args.save)
    if args.reference:
        ref = torch.load(args.reference)
        worst, unequal = 0.0, []
        for i, (a, b) in enumerate(zip(outputs, ref)):
            if a.shape != b.shape:
                unequal.append(i)
                continue
            if not torch.equal(a, b):
                unequal.append(i)
                worst = max(worst, (a - b).abs().max().item())
        c.put("max_abs_diff", worst)
        c.check("logits equal the reference's, batch by batch (bit for bit)",
                len(ref) == len(outputs) and not unequal,
                f"{len(outputs) - len(unequal)}/{len(outputs)} batches equal, "
                f"max abs diff {worst}" + (f", unequal batches {unequal[:10]}" if unequal else ""))
    if lib is not None:
        stats = mrstack_capi.statistics(lib)
        c.put("stack_stats", stats)
        c.check("the stack served PyTorch's allocations", stats["allocations"] > 0,
                f"{stats['allocations']} allocations, peak live "
                f"{stats['peak_live_bytes'] / client_checks.MIB:.1f} MiB")
        c.check("no bad frees, no failed allocations",
                stats["bad_frees"] == 0 and stats["failed_allocations"] == 0,
                f"bad_frees {stats['bad_frees']}, failed_allocations {stats['failed_allocations']}")
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize()
        c.put("stack_after_free", mrstack_capi.statistics(lib))


checks.run(body)
