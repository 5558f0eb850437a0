"""The two models the GPU tests train on PyTorch's allocator and on mrstack's: torchvision's
ResNet-50 and a GPT-style transformer with a sequence length drawn at every step. Everything that
decides the losses is fixed (seeds, data drawn by a seeded generator on the host, deterministic
algorithms), so an allocator can change no loss: each run must give the same ones, bit for bit."""

from __future__ import annotations

import os
import random
import sys


def _deterministic():
    # cuBLAS is deterministic only with a fixed workspace; read when its handle is made.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return torch


def fit(model, opt, steps: int, batch, loss) -> list:
    """Trains ``model`` for ``steps`` steps, each on ``batch(step)``'s (input, target) and
    ``loss(output, target)``; the losses, after the device finished."""
    import torch

    losses = []
    for step in range(steps):
        x, target = batch(step)
        value = loss(model(x), target)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        losses.append(value.item())
    torch.cuda.synchronize()
    return losses


def resnet50(steps: int, seed: int = 0, batch_size: int = 16, size: int = 112) -> list:
    """torchvision's ResNet-50 (random weights) trained with SGD on random images; the losses."""
    torch = _deterministic()
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.resnet50(weights=None).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)  # on the host: no allocator draws the data

    def batch(_step):
        x = torch.randn(batch_size, 3, size, size, generator=gen).cuda()
        return x, torch.randint(0, 1000, (batch_size,), generator=gen).cuda()

    return fit(model, opt, steps, batch, torch.nn.functional.cross_entropy)


def transformer(steps: int, seed: int = 0, batch_size: int = 8, vocab: int = 4096, d_model: int = 256,
                heads: int = 4, layers: int = 4, lengths: tuple = (32, 384)) -> list:
    """A GPT-style decoder (pre-norm layers under a causal mask, tied head) learning to continue
    a counting sequence, with a sequence length drawn at every step; the losses."""
    torch = _deterministic()
    # The C library's clients' model (capi/python/tiny_gpt.py), random weights from the seed.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "capi", "python"))
    import tiny_gpt

    torch.manual_seed(seed)
    model = tiny_gpt.TinyGPT(vocab, d_model, heads, layers, lengths[1]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    draw = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)

    def batch(_step):
        n = draw.randint(*lengths)
        start = torch.randint(0, vocab, (batch_size, 1), generator=gen)
        seq = ((start + torch.arange(n + 1)) % vocab).cuda()
        return seq[:, :-1], seq[:, 1:]

    def loss(logits, target):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))

    return fit(model, opt, steps, batch, loss)
