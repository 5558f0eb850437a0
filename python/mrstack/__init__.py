"""mrstack for Python: CUDA memory-resource stacks for PyTorch and CuPy, their statistics, and
the replay that says which stack suits a workload.

Turn it on in one line, before anything touches CUDA::

    import mrstack.torch; mrstack.torch.use()            # PyTorch allocates through mrstack
    import mrstack.cupy;  mrstack.cupy.use()             # CuPy allocates through mrstack

and read what the stack did::

    mrstack.stats()        # {'live_bytes': ..., 'peak_live_bytes': ..., 'driver_bytes': ..., ...}
    mrstack.describe()     # 'cuda > pool(...) > binning(...) (gives ..., 256-byte aligned)'

A stack is text (``"cuda > pool(initial=1GiB) > binning"``): a leaf, then each layer over it.
PyTorch and CuPy use one stack per device, built at the device's first allocation from
``MRSTACK_STACK`` (default ``paged``); ``MRSTACK_LOG=path`` records every
request for ``mrstack.replay``. A stack text with a mistake raises ``ValueError`` whose message
names the column; a stack that cannot be built (no GPU, no driver) raises ``RuntimeError``.

``mrstack.replay(path)`` replays an RMM log, an ``MRSTACK_LOG``, or a PyTorch memory snapshot
through mrstack's preset stacks and returns the report and the stack to use.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _lib

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_STACK",
    "__version__",
    "ReplayResult",
    "Stack",
    "check",
    "cli_path",
    "describe",
    "lib_path",
    "replay",
    "stats",
]

#: The stack of each device when ``MRSTACK_STACK`` is not set.
DEFAULT_STACK = "paged"

lib_path = _lib.lib_path
cli_path = _lib.cli_path


def check(stack: str) -> None:
    """Checks the text of a stack without building it: its syntax and that every item names a
    leaf or layer mrstack knows.

    Raises ``ValueError`` whose message names the column of the first mistake. The fields of
    each item and what the stack's memory gives are checked when it is built.
    """
    if not isinstance(stack, str):
        raise TypeError(f"a stack is text, not {type(stack).__name__}")
    if _lib.lib().mrstack_check_config(stack.encode()) != 0:
        _lib.raise_last("mrstack_check_config")


class Stack:
    """A stack built from text, owned by this object: for stacks of your own (host memory for
    tests, ``simulated(capacity=…)`` for dry runs, a CUDA stack for raw buffers).

    PyTorch and CuPy do not use these: they use the per-device stacks (``MRSTACK_STACK``).
    ``Stack("bad text")`` raises ``ValueError`` naming the column; a stack that cannot be built
    raises ``RuntimeError``. ``close()`` (or leaving a ``with`` block) gives its memory back.
    """

    def __init__(self, text: str, device: int = 0, log: Optional[str] = None) -> None:
        # The text first, so that a mistake anywhere in it is a ValueError, not the error of a
        # leaf built before the builder reached it.
        self._handle: Optional[int] = None
        check(text)
        self._lib = _lib.lib()
        self._handle = self._lib.mrstack_create_ex(
            text.encode(), int(device), log.encode() if log is not None else None
        )
        if not self._handle:
            self._handle = None
            _lib.raise_last("mrstack_create")
        self.text = text

    def _live(self) -> int:
        if self._handle is None:
            raise RuntimeError("the stack is closed")
        return self._handle

    def describe(self) -> str:
        """The stack as text, every layer with its settings, what its memory gives and its
        alignment."""
        return _lib.read_text(self._lib.mrstack_describe, self._live())

    def stats(self) -> Dict[str, Any]:
        """The stack's counts: see ``mrstack.stats``."""
        return json.loads(_lib.read_text(self._lib.mrstack_statistics_json, self._live()))

    def allocate(self, size: int, align: int = 0, stream: int = 0) -> int:
        """``size`` bytes aligned to ``align`` (0: the stack's own), ordered on ``stream`` (a
        ``cudaStream_t`` as an int, 0 for the default stream): their address.

        Raises ``MemoryError`` when the stack cannot serve the request (the message says why).
        """
        if size == 0:
            return 0
        p = self._lib.mrstack_allocate(self._live(), int(size), int(align), stream or None)
        if not p:
            kind, text = _lib.last_error()
            raise MemoryError(f"mrstack: {size} bytes: {text}")
        return p

    def deallocate(self, ptr: int, size: int, align: int = 0, stream: int = 0) -> None:
        """Frees the block at ``ptr`` with the size and alignment it was allocated with.

        Raises ``ValueError`` for an address that is not a live block of the stack, or another
        size or alignment (nothing is freed then).
        """
        if not ptr:
            return
        rc = self._lib.mrstack_deallocate(
            self._live(), int(ptr), int(size), int(align), stream or None
        )
        if rc != 0:
            raise ValueError(_lib.last_error()[1])

    def close(self) -> None:
        """Destroys the stack: blocks still live go back to it, it gives back what it took, its
        log is written out. Closing twice does nothing."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            if self._lib.mrstack_destroy(handle) != 0:
                raise RuntimeError(f"mrstack_destroy: {_lib.last_error()[1]}")

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing may leave a finalizer
            pass

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else "open"
        return f"mrstack.Stack({self.text!r}) ({state})"


def _device_stack(device: int) -> int:
    l = _lib.lib()
    handle = l.mrstack_device_stack(int(device))
    if not handle:
        _lib.raise_last(f"the stack of device {device}")
    return handle


def describe(stack: Union[int, str, Stack] = 0, device: int = 0) -> str:
    """What a stack is, as text: every layer with its settings (sizes exact, so the text builds
    the same stack again), what its memory gives and its alignment.

    ``stack`` is a device number (that device's per-device stack, built from ``MRSTACK_STACK``
    if it is not yet), a stack text (built on ``device``, described, and given back), or a
    ``Stack``. A text with a mistake raises ``ValueError`` naming the column; a stack that
    cannot be built (a CUDA leaf without a GPU) raises ``RuntimeError``.
    """
    if isinstance(stack, Stack):
        return stack.describe()
    if isinstance(stack, str):
        with Stack(stack, device=device) as s:
            return s.describe()
    if isinstance(stack, bool) or not isinstance(stack, int):
        raise TypeError(f"describe takes a device number, a stack text or a Stack, not {stack!r}")
    return _lib.read_text(_lib.lib().mrstack_describe, _device_stack(stack))


def stats(device: Union[int, Stack] = 0) -> Dict[str, Any]:
    """The counts of a device's stack (the one PyTorch and CuPy allocate from; built from
    ``MRSTACK_STACK`` if it is not yet) or of a ``Stack``, as a dict:

    * ``config``, ``properties``: the stack's text and what its memory gives;
    * ``allocations``, ``deallocations``, ``failed_allocations``, ``bad_frees``: calls;
    * ``live_blocks``, ``live_bytes``, ``peak_live_bytes``: what the clients hold (each block at
      the size asked for), now and at most;
    * ``driver_bytes``, ``peak_driver_bytes``: what the stack's leaf handed out and not yet back
      (for a CUDA leaf, the bytes taken from the driver), now and at most;
    * ``layers``: each suballocator layer (pool, tlsf, binning, arena, fixed_size,
      thread_heaps), leaf side first: ``layer``, ``held`` and ``peak_held`` (bytes taken from
      the layer below), ``allocated`` (bytes of ``held`` in live blocks), ``free_blocks``,
      ``chunks``.

    Raises ``RuntimeError`` when the device's stack cannot be built (no GPU), ``ValueError``
    when ``MRSTACK_STACK`` has a mistake (naming the column).
    """
    if isinstance(device, Stack):
        return device.stats()
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"stats takes a device number or a Stack, not {device!r}")
    text = _lib.read_text(_lib.lib().mrstack_statistics_json, _device_stack(device))
    return json.loads(text)


@dataclass
class ReplayResult:
    """What ``mrstack.replay`` returns."""

    #: The report as the ``mrstack replay`` command prints it: the workload, a row per stack
    #: (ns/op, upstream peak, min capacity), and the recommendation.
    text: str
    #: The recommended stack as text (``"cuda > tlsf(initial=3.3 MiB, max=3.3 MiB)"``), ready for
    #: ``MRSTACK_STACK`` or ``mrstack.torch.use(stack=…)``; ``None`` when there is none (nothing
    #: to replay).
    stack: Optional[str]
    #: The notes the command printed on standard error (what of a snapshot was replayed, lines
    #: left out, the most PyTorch's caching allocator held in a snapshot's history).
    notes: List[str] = field(default_factory=list)
    #: The command that ran.
    command: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text


_TEXT_CONFIG = "as a text config (mrstack::config::build):"


def _recommended(text: str) -> Optional[str]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == _TEXT_CONFIG:
            for rest in lines[i + 1:]:
                if rest.strip():
                    return rest.strip()
    return None


def replay(
    source: Union[str, "os.PathLike[str]", Mapping[str, Any]],
    *,
    stacks: Optional[Sequence[str]] = None,
    upstream: Optional[str] = None,
    passes: Optional[int] = None,
    args: Sequence[str] = (),
    timeout: Optional[float] = None,
) -> ReplayResult:
    """Replays an allocation history through mrstack's preset stacks and says which to use.

    ``source`` is the path of an RMM log or an ``MRSTACK_LOG`` (CSV, plain or gzip), or of a
    PyTorch memory snapshot (the pickle ``torch.cuda.memory._dump_snapshot`` writes, plain or
    gzip), or the snapshot dict ``torch.cuda.memory._snapshot()`` returns (written to a
    temporary pickle first). A snapshot needs its history: record it with
    ``torch.cuda.memory._record_memory_history()`` before the workload runs.

    ``stacks`` names the preset stacks to replay (default: all), ``upstream`` is ``"cuda"``,
    ``"simulated"`` or ``None`` (a GPU when one opens, else simulated), ``passes`` the timed
    passes per stack, ``args`` more options of ``mrstack replay`` (``["--no-capacity"]``).

    Runs the ``mrstack`` command (``mrstack.cli_path()``) and returns its report and the
    recommended stack. Raises ``RuntimeError`` with the command's error when it fails (a file
    that cannot be read, a snapshot without history, a stack that failed).
    """
    cmd = [cli_path(), "replay"]
    if stacks:
        cmd += ["--stack", ",".join(stacks)]
    if upstream is not None:
        cmd += ["--upstream", upstream]
    if passes is not None:
        cmd += ["--passes", str(int(passes))]
    cmd += [str(a) for a in args]
    temp = None
    if isinstance(source, Mapping):
        if "device_traces" not in source and "segments" not in source:
            raise ValueError(
                "a dict given to replay must be a PyTorch memory snapshot "
                "(torch.cuda.memory._snapshot()), with its device_traces"
            )
        fd, temp = tempfile.mkstemp(prefix="mrstack-snapshot-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(dict(source), f, protocol=4)
        path = temp
    else:
        path = os.fspath(source)
    cmd += ["--quiet", path]
    try:
        done = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, check=False
        )
    finally:
        if temp is not None:
            os.unlink(temp)
    out = done.stdout.decode("utf-8", "replace")
    err = done.stderr.decode("utf-8", "replace")
    if done.returncode != 0:
        raise RuntimeError(
            f"mrstack replay failed (exit status {done.returncode}): {err.strip() or out.strip()}"
        )
    notes = [line for line in err.splitlines() if line.startswith(("note:", "warning:"))]
    return ReplayResult(text=out, stack=_recommended(out), notes=notes, command=cmd)


def _address(name: str) -> int:
    """The address of entry point ``name`` of the library, as the frameworks' doors take it."""
    value = ctypes.cast(getattr(_lib.lib(), name), ctypes.c_void_p).value
    if not value:
        raise RuntimeError(f"{name}: no address")
    return value
