"""Training of the small GPT-2-shaped transformer (tiny_gpt.py) with a sequence length drawn at
random at every step, so the allocator sees a new set of activation and gradient sizes each time:
the training trace of the footprint work (`scripts/capture-traces` records it through
MRSTACK_LOG). The task is learnable (each token is followed by the next one, modulo the
vocabulary, from a random start), so the loss must fall: the check that training really ran.
"""

import argparse
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
p.add_argument("--steps", type=int, default=60)
p.add_argument("--batch", type=int, default=8)
tiny_gpt.add_model_args(p, vocab=4096, d_model=384, heads=6, layers=4, min_len=32, max_len=512)
args = p.parse_args()

checks = client_checks.Checks(f"transformer-train/{args.allocator}", args.out)
checks.put_allocator(args.allocator)

import torch  # noqa: E402

lib = mrstack_capi.use_with_torch_if_chosen(args)  # before anything touches CUDA


def body(c):
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = tiny_gpt.model(args).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    draw = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # on the CPU: no allocator involved
    losses, lengths = [], []
    for _ in range(args.steps):
        n = draw.randint(args.min_len, args.max_len)
        start = torch.randint(0, args.vocab, (args.batch, 1), generator=gen)
        seq = ((start + torch.arange(n + 1)) % args.vocab).to(device)
        logits = model(seq[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        lengths.append(n)
    c.put("lengths", lengths)
    c.put("losses", losses)
    tail = sum(losses[-10:]) / min(10, len(losses))
    c.check(f"{args.steps} steps, every loss finite",
            len(losses) == args.steps and all(l == l and abs(l) != float("inf") for l in losses),
            f"lengths {min(lengths)}..{max(lengths)}")
    c.check("the loss falls (the task is learnable)", tail < losses[0] / 2,
            f"first {losses[0]:.3f}, mean of the last 10 {tail:.3f}")
    if lib is not None:
        stats = mrstack_capi.statistics(lib)
        c.put("stack_stats", stats)
        c.check("no bad frees, no failed allocations",
                stats["bad_frees"] == 0 and stats["failed_allocations"] == 0,
                f"bad_frees {stats['bad_frees']}, failed_allocations {stats['failed_allocations']}")


checks.run(body)
