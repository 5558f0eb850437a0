"""Where the package finds libmrstack_c.so and the mrstack command, and the ctypes bindings.

The library is, in order: the file ``MRSTACK_LIB`` names; the one shipped in the package
(``mrstack/_bin/libmrstack_c.so``). The command is: the file ``MRSTACK_CLI`` names; the one
shipped in the package (``mrstack/_bin/mrstack``); ``mrstack`` on ``PATH``. The variables let a
machine without the wheel use a library and a command built elsewhere, with the package on
``PYTHONPATH``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
from typing import Optional

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")
_LIB_NAME = "libmrstack_c.so"
_CLI_NAME = "mrstack"

# mrstack_last_error_kind's values.
ERROR_NONE = 0
ERROR_CONFIG = 1
ERROR_OTHER = 2
ERROR_OUT_OF_MEMORY = 3

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def _given_or_packaged(variable: str, name: str):
    """The file the environment `variable` names (an error where it names no file), else the
    packaged `name` where it is there, else None; and the packaged path, for the error to name."""
    env = os.environ.get(variable)
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"{variable} is {env!r}, which is not a file")
        return os.path.abspath(env), None
    packaged = os.path.join(_BIN, name)
    return (packaged if os.path.isfile(packaged) else None), packaged


def lib_path() -> str:
    """The path of libmrstack_c.so this package uses (``MRSTACK_LIB``, else the packaged one).

    Raises ``RuntimeError`` naming both places when neither holds the library.
    """
    found, packaged = _given_or_packaged("MRSTACK_LIB", _LIB_NAME)
    if found:
        return found
    raise RuntimeError(
        f"libmrstack_c.so not found: not at {packaged} (install the mrstack wheel) and "
        "MRSTACK_LIB is not set (set it to a libmrstack_c.so built with "
        "`cargo build --release -p mrstack-capi`)"
    )


def cli_path() -> str:
    """The path of the ``mrstack`` command (``MRSTACK_CLI``, the packaged one, or ``PATH``'s).

    Raises ``RuntimeError`` naming the places looked at when none holds it.
    """
    found, packaged = _given_or_packaged("MRSTACK_CLI", _CLI_NAME)
    if found:
        return found
    found = shutil.which(_CLI_NAME)
    if found:
        return found
    raise RuntimeError(
        f"the mrstack command was not found: not at {packaged} (install the mrstack wheel), "
        "MRSTACK_CLI is not set, and there is no `mrstack` on PATH (build it with "
        "`cargo build --release -p mrstack-cli`)"
    )


def lib() -> ctypes.CDLL:
    """The loaded library, with the argument and result types of the calls this package makes.

    Loading a path that is already loaded (PyTorch's CUDAPluggableAllocator loads the same file)
    gives the same library, so its per-device stacks are the ones PyTorch allocates from.
    """
    global _lib
    with _lock:
        if _lib is None:
            path = lib_path()
            try:
                loaded = ctypes.CDLL(path)
            except OSError as e:
                raise RuntimeError(f"cannot load {path}: {e}") from e
            _declare(loaded)
            _lib = loaded
        return _lib


def _declare(l: ctypes.CDLL) -> None:
    vp, cp, sz, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int
    for name, res, args in [
        ("mrstack_create_ex", vp, [cp, i, cp]),
        ("mrstack_destroy", i, [vp]),
        ("mrstack_describe", sz, [vp, cp, sz]),
        ("mrstack_statistics_json", sz, [vp, cp, sz]),
        ("mrstack_device_stack", vp, [i]),
        ("mrstack_check_config", i, [cp]),
        ("mrstack_report", i, [cp]),
        ("mrstack_last_error", cp, []),
        ("mrstack_last_error_kind", i, []),
        ("mrstack_allocate", vp, [vp, sz, sz, vp]),
        ("mrstack_deallocate", i, [vp, vp, sz, sz, vp]),
    ]:
        try:
            f = getattr(l, name)
        except AttributeError as e:
            raise RuntimeError(
                f"{l._name} lacks {name}: a libmrstack_c.so older than this package?"
            ) from e
        f.restype, f.argtypes = res, args


def last_error() -> tuple[int, str]:
    """The kind (``ERROR_CONFIG``, ``ERROR_OUT_OF_MEMORY`` or ``ERROR_OTHER``) and text of this
    thread's last error."""
    l = lib()
    text = (l.mrstack_last_error() or b"").decode("utf-8", "replace")
    return l.mrstack_last_error_kind(), text


def raise_last(what: str) -> None:
    """Raises this thread's last error: ``ValueError`` for the text of a config (its message
    names the column), ``RuntimeError`` for any other."""
    kind, text = last_error()
    if kind == ERROR_CONFIG:
        raise ValueError(text)
    raise RuntimeError(f"{what}: {text}")


def read_text(call, handle) -> str:
    """The text a snprintf-like call (``mrstack_describe``, ``mrstack_statistics_json``) writes."""
    n = call(handle, None, 0)
    if n == 0:
        raise_last(call.__name__)
    buf = ctypes.create_string_buffer(n + 1)
    call(handle, buf, n + 1)
    return buf.value.decode("utf-8")
