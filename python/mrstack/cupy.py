"""CuPy on mrstack.

``use()`` makes mrstack CuPy's allocator (no CuPy memory pool in front): every array is a block
of the current device's mrstack stack, so ``mrstack.stats()`` says exactly what CuPy holds.
Call it before the first CuPy allocation::

    import mrstack.cupy
    mrstack.cupy.use("cuda > pool > binning")

An allocation the stack cannot serve raises ``cupy.cuda.memory.OutOfMemoryError`` naming the
size and the cause; CuPy goes on working.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from . import _lib, check

__all__ = ["allocator", "use"]

MALLOC = "mrstack_cupy_malloc"
FREE = "mrstack_cupy_free"


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeError("mrstack.cupy needs CuPy: pip install cupy-cuda12x") from e
    return cupy


def allocator(stack: Optional[str] = None) -> Any:
    """The function CuPy's ``set_allocator`` takes: ``size -> MemoryPointer``, each allocation a
    block of the current device's mrstack stack (``cupy.cuda.memory.CFunctionAllocator`` over
    ``mrstack_cupy_malloc`` / ``mrstack_cupy_free``, param 0: the per-device stacks).

    A failed allocation raises ``cupy.cuda.memory.OutOfMemoryError`` (size, and mrstack's reason
    in the message) instead of handing CuPy a null pointer. ``stack`` sets ``MRSTACK_STACK``
    first (checked: ``ValueError`` naming the column of a mistake).
    """
    cupy = _cupy()
    if stack is not None:
        check(stack)
        os.environ["MRSTACK_STACK"] = stack
    from . import _address

    lib = _lib.lib()
    inner = cupy.cuda.memory.CFunctionAllocator(0, _address(MALLOC), _address(FREE), lib)
    out_of_memory = cupy.cuda.memory.OutOfMemoryError

    def malloc(size: int) -> Any:
        if size == 0:
            return inner.malloc(0)
        try:
            mem = inner.malloc(size)
        except MemoryError as e:  # pragma: no cover - the library's own throwing entry point
            raise out_of_memory(size, 0, 0) from e
        if mem.ptr == 0:
            _kind, why = _lib.last_error()
            e = out_of_memory(size, 0)
            e.args = (f"mrstack: out of memory allocating {size:,} bytes on device "
                      f"{cupy.cuda.Device().id}: {why}",)
            raise e
        return mem

    return malloc


def use(stack: Optional[str] = None) -> None:
    """Makes CuPy allocate through mrstack's per-device stacks (``cupy.cuda.set_allocator``),
    with no CuPy memory pool in front.

    ``stack`` sets ``MRSTACK_STACK`` (default: its value, else ``paged``); it
    takes effect for each device's stack when that is first built. Call it before the first
    CuPy allocation: arrays made before stay in CuPy's own pool. Raises ``ValueError`` for a
    stack text with a mistake (naming the column), ``RuntimeError`` without CuPy.
    """
    cupy = _cupy()
    cupy.cuda.set_allocator(allocator(stack))
