"""Captures a real PyTorch memory snapshot on a GPU: records the allocation history while a small
model trains for a few steps, then writes the pickle ``torch.cuda.memory._dump_snapshot``
writes, which ``mrstack replay FILE`` (or ``mrstack.replay(FILE)``) reads.

    python3 python/tests/make_snapshot.py OUT.pickle [--steps N]

Runs on PyTorch's own allocator (a snapshot records what PyTorch's caching allocator saw).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models  # noqa: E402


def train(steps: int, seed: int = 0) -> list:
    """A small convolutional model trained on random data for ``steps`` steps on the current CUDA
    device, with deterministic algorithms; the losses."""
    # cuBLAS is deterministic only with a fixed workspace; read at its first use.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AvgPool2d(8), torch.nn.Flatten(),
        torch.nn.Linear(64 * 16, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(seed)

    def batch(step):
        # Batches of changing size: many sizes of blocks, freed and reused.
        n = 16 + 8 * (step % 4)
        x = torch.randn(n, 3, 32, 32, device="cuda", generator=g)
        return x, torch.randint(0, 10, (n,), device="cuda", generator=g)

    return models.fit(model, opt, steps, batch, torch.nn.functional.cross_entropy)


def capture(steps: int = 20) -> Dict[str, Any]:
    """The snapshot dict of ``steps`` training steps, history recorded from the start."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        train(steps)
        return torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the snapshot pickle to write")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    import torch

    torch.cuda.memory._record_memory_history(max_entries=200_000)
    train(args.steps)
    torch.cuda.memory._dump_snapshot(args.out)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(args.out)


if __name__ == "__main__":
    main()
