"""Shared helpers of the package's tests: where the repository's fixtures are, whether this
machine has a GPU, and running Python in a fresh process (the per-device stacks, and PyTorch's
choice of allocator, are fixed once per process)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from typing import Dict, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The repository's root: MRSTACK_REPO where the tests run from a copy elsewhere (python/ci.sh
# runs them outside the source tree, so that they import the installed package).
REPO = os.environ.get("MRSTACK_REPO") or os.path.dirname(os.path.dirname(HERE))


def repo_file(*parts: str) -> str:
    """A file of the repository (``data/...``): skips the test when this checkout lacks it."""
    path = os.path.join(REPO, *parts)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not here (the tests run from a checkout of the repository)")
    return path


def gpu_count() -> int:
    """CUDA devices the driver reports; 0 without a driver or a device. Asks the driver
    itself, so that neither PyTorch nor CuPy is imported (or initialised) for it."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if cuda.cuInit(0) != 0:
        return 0
    n = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return 0
    return n.value


def run_python(code_or_args, env: Optional[Dict[str, str]] = None, timeout: float = 600):
    """Runs ``python -c CODE`` (a str) or ``python ARGS...`` (a list) in a fresh process with
    this process's environment plus ``env``; the CompletedProcess, text captured."""
    full = dict(os.environ)
    full.update(env or {})
    # The package under test, wherever this process found it.
    import mrstack

    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(mrstack.__file__)))
    full["PYTHONPATH"] = os.pathsep.join(
        p for p in (pkg_parent, full.get("PYTHONPATH", "")) if p
    )
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    return subprocess.run(
        [sys.executable, *args], env=full, capture_output=True, text=True, timeout=timeout
    )
