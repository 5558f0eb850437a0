"""PyTorch on mrstack.

``use()`` makes mrstack PyTorch's CUDA allocator for the whole process: every tensor is a block
of the device's mrstack stack, and PyTorch's caching allocator is out of the way. Call it
before anything touches CUDA (PyTorch cannot swap an allocator it has initialised)::

    import mrstack.torch
    mrstack.torch.use("cuda > pool(initial=8GiB) > binning")

``MemPool()`` keeps PyTorch's caching allocator and gives it an mrstack stack as the source of
one pool's segments, for one region of a program::

    pool = mrstack.torch.MemPool()
    with torch.cuda.use_mem_pool(pool):
        y = model(x)        # the segments of these tensors come from mrstack

Out of memory: with ``use()``, an allocation the stack has no memory for raises
``torch.OutOfMemoryError`` naming the cause, as PyTorch's own allocator does (the library's
entry point throws PyTorch's C++ ``c10::OutOfMemoryError``, built by PyTorch's own library);
any other failure raises ``RuntimeError``, of which ``torch.OutOfMemoryError`` is a subclass, so
``except RuntimeError`` catches both. Inside a ``MemPool``, PyTorch's caching allocator takes a
failed segment as the driver's out of memory: it frees its cached blocks, tries again, and
raises ``torch.OutOfMemoryError``. Either way the process goes on.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from . import _lib, check

__all__ = ["MemPool", "allocator", "use"]

# The entry points PyTorch's pluggable-allocator door calls. `use` takes the one that throws on
# failure (PyTorch would make a tensor at address 0 of a null pointer); a MemPool's segments come
# through the caching allocator, which checks for null and reports out of memory itself.
MALLOC_OR_THROW = "mrstack_torch_malloc_or_throw"
MALLOC = "mrstack_torch_malloc"
FREE = "mrstack_torch_free"

_used: Optional[str] = None


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeError("mrstack.torch needs PyTorch: pip install torch") from e
    return torch


def _require_gpu(torch: Any) -> None:
    if not torch.cuda.is_available():
        why = (
            "this PyTorch is built without CUDA"
            if torch.version.cuda is None
            else "PyTorch sees no CUDA GPU (no device, or no driver)"
        )
        raise RuntimeError(f"mrstack.torch needs a CUDA GPU: {why}")


def _set_stack(stack: Optional[str]) -> None:
    if stack is None:
        return
    check(stack)
    current = os.environ.get("MRSTACK_STACK")
    if _used is not None and current != stack:
        raise RuntimeError(
            f"mrstack.torch.use already chose the stack {current or _lib_default()!r} for this "
            "process; the per-device stacks are built once"
        )
    os.environ["MRSTACK_STACK"] = stack


def _lib_default() -> str:
    from . import DEFAULT_STACK

    return DEFAULT_STACK


def allocator(stack: Optional[str] = None, *, for_pool: bool = False) -> Any:
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over mrstack's per-device stacks.

    ``stack`` sets ``MRSTACK_STACK`` first (checked: ``ValueError`` naming the column of a
    mistake). ``for_pool`` picks the entry point that returns null on failure, for PyTorch's
    caching allocator to report (a ``MemPool``'s), rather than the one that throws.
    """
    torch = _torch()
    _set_stack(stack)
    return torch.cuda.memory.CUDAPluggableAllocator(
        _lib.lib_path(), MALLOC if for_pool else MALLOC_OR_THROW, FREE
    )


def use(stack: Optional[str] = None, device: Optional[int] = None) -> None:
    """Makes PyTorch allocate all CUDA memory through mrstack, for the rest of the process.

    ``stack`` is the text of each device's stack (it sets ``MRSTACK_STACK``; default: the
    variable's value, else ``paged``). ``device``, when given, builds that
    device's stack now, so that a stack that cannot be built fails here rather than at the first
    tensor; otherwise each device's stack is built at its first allocation.

    Call it before anything touches CUDA in PyTorch. Raises ``RuntimeError`` when PyTorch has
    initialised CUDA (and its allocator) already, when there is no GPU or driver, or when the
    device's stack cannot be built; ``ValueError`` for a stack text with a mistake (naming the
    column). Calling it again with the same stack does nothing.
    """
    global _used
    torch = _torch()
    if _used is not None:
        _set_stack(stack)
        return
    _require_gpu(torch)
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "PyTorch has initialised CUDA and its caching allocator already: call "
            "mrstack.torch.use() before the first CUDA tensor, stream or device query "
            "(torch.cuda.current_device() and friends initialise it)"
        )
    _set_stack(stack)
    if device is not None:
        from . import _device_stack

        _device_stack(device)
    alloc = allocator()
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError(
            f"PyTorch refused to switch to mrstack's allocator ({e}): call mrstack.torch.use() "
            "before anything allocates on CUDA"
        ) from e
    _used = os.environ.get("MRSTACK_STACK") or _lib_default()
    # Keep the allocator object alive with the process, as PyTorch keeps the library loaded.
    globals()["_allocator"] = alloc


def MemPool(stack: Optional[str] = None, **kwargs: Any) -> Any:
    """A ``torch.cuda.MemPool`` whose segments come from mrstack's per-device stacks.

    Use it with ``torch.cuda.use_mem_pool(pool)`` for one region of a program. PyTorch's caching
    allocator still stands above mrstack there: it asks the stack for segments (2 MiB for small
    tensors, the rounded size or more for large ones), splits them into tensors, caches freed
    blocks in the pool and reuses them, and gives segments back only when the pool is destroyed
    or ``torch.cuda.empty_cache()`` runs. So ``mrstack.stats()`` counts segments, not tensors,
    and mrstack decides where the segments come from (a pool, binning, the driver), not how
    tensors share them. For tensors straight from mrstack, use ``use()``.

    ``stack`` sets ``MRSTACK_STACK`` (it must be set before the device's stack is first built);
    ``kwargs`` go to ``torch.cuda.MemPool`` (``use_on_oom``, ``no_split``). Raises
    ``RuntimeError`` without a GPU, ``ValueError`` for a stack text with a mistake.
    """
    torch = _torch()
    _require_gpu(torch)
    alloc = allocator(stack, for_pool=True)
    pool = torch.cuda.MemPool(allocator=alloc.allocator(), **kwargs)
    # The pool refers to the allocator's C++ object; keep its Python owner with it.
    try:
        pool._mrstack_allocator = alloc
    except AttributeError:  # pragma: no cover - a MemPool without a __dict__
        _pools.append(alloc)
    return pool


_pools: list = []
