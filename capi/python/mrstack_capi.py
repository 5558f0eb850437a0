"""mrstack's C library (libmrstack_c.so) from Python: the recipes for PyTorch and CuPy, and the
statistics and report calls, through ctypes. Plain Python: it imports torch or cupy only in the
function that needs it, so a CuPy program never loads torch and the other way round.

PyTorch (before anything touches CUDA: once per process):

    import mrstack_capi
    lib = mrstack_capi.use_with_torch("/path/to/libmrstack_c.so")

CuPy (before the first CuPy allocation):

    lib = mrstack_capi.use_with_cupy("/path/to/libmrstack_c.so")

Both use the per-device stacks the environment describes: MRSTACK_STACK (text config, default
`paged`), MRSTACK_LOG (record every request for `mrstack replay`),
MRSTACK_REPORT (statistics JSON at exit).
"""

import ctypes
import json
import sys

# The entry points each client's door calls. The `_or_throw` allocations throw a C++ exception on
# failure, which PyTorch and CuPy turn into a Python exception: neither checks a null return
# (PyTorch would make a tensor at address 0).
TORCH_MALLOC = "mrstack_torch_malloc_or_throw"
TORCH_FREE = "mrstack_torch_free"
CUPY_MALLOC = "mrstack_cupy_malloc_or_throw"
CUPY_FREE = "mrstack_cupy_free"

ENTRY_POINTS = (
    TORCH_MALLOC,
    TORCH_FREE,
    CUPY_MALLOC,
    CUPY_FREE,
    "mrstack_device_stack",
    "mrstack_statistics_json",
    "mrstack_describe",
    "mrstack_report",
    "mrstack_last_error",
)


def load(path):
    """The library at `path`, with the argument and result types of the calls used here.

    ctypes.CDLL of a path that is already loaded returns the same library instance (dlopen counts
    references), so this sees the very stacks PyTorch's CUDAPluggableAllocator loaded.
    """
    lib = ctypes.CDLL(path)
    missing = [name for name in ENTRY_POINTS if not hasattr(lib, name)]
    if missing:
        raise RuntimeError(f"{path} lacks the entry points {missing}: not libmrstack_c.so?")
    lib.mrstack_device_stack.restype = ctypes.c_void_p
    lib.mrstack_device_stack.argtypes = [ctypes.c_int]
    lib.mrstack_statistics_json.restype = ctypes.c_size_t
    lib.mrstack_statistics_json.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.mrstack_describe.restype = ctypes.c_size_t
    lib.mrstack_describe.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.mrstack_report.restype = ctypes.c_int
    lib.mrstack_report.argtypes = [ctypes.c_char_p]
    lib.mrstack_last_error.restype = ctypes.c_char_p
    lib.mrstack_last_error.argtypes = []
    return lib


def address(lib, name):
    """The address of entry point `name`, as the clients' doors take it (an int)."""
    value = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    if not value:
        raise RuntimeError(f"{name}: no address")
    return value


def last_error(lib):
    return (lib.mrstack_last_error() or b"").decode("utf-8", "replace")


def device_stack(lib, device=0):
    """The handle of `device`'s stack (built on first use from MRSTACK_STACK)."""
    handle = lib.mrstack_device_stack(device)
    if not handle:
        raise RuntimeError(f"mrstack_device_stack({device}): {last_error(lib)}")
    return handle


def _text(call, handle):
    # snprintf-like: the first call learns the length, the second writes it all.
    n = call(handle, None, 0)
    if n == 0:
        raise RuntimeError(f"{call.__name__}: nothing written")
    buf = ctypes.create_string_buffer(n + 1)
    call(handle, buf, n + 1)
    return buf.value.decode("utf-8")


def statistics(lib, device=0):
    """`device`'s stack's counts: allocations, deallocations, failed_allocations, bad_frees,
    live_blocks, live_bytes, peak_live_bytes, config, properties."""
    return json.loads(_text(lib.mrstack_statistics_json, device_stack(lib, device)))


def describe(lib, device=0):
    return _text(lib.mrstack_describe, device_stack(lib, device))


def report(lib, path):
    """Writes every per-device stack's statistics as JSON to `path` and flushes their logs."""
    if lib.mrstack_report(path.encode()) != 0:
        raise RuntimeError(f"mrstack_report({path}): {last_error(lib)}")
    with open(path) as f:
        return json.load(f)


def use_with_torch(path):
    """Makes mrstack PyTorch's CUDA allocator for this process. Call it before anything
    allocates on (or initializes) CUDA: PyTorch refuses to swap an allocator in use."""
    import torch

    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, TORCH_MALLOC, TORCH_FREE)
    torch.cuda.memory.change_current_allocator(allocator)
    return load(path)


def torch_allocator_runs(stacks):
    """The allocators a side-by-side PyTorch client compares, each run in a child process:
    (name, the child's --allocator, its environment) for PyTorch's native allocator, its
    expandable segments, then each MRSTACK_STACK in `stacks` through the C library."""
    runs = [("native", "native", {}),
            ("expandable segments", "native", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})]
    return runs + [(s, "mrstack", {"MRSTACK_STACK": s}) for s in stacks]


def use_with_torch_if_chosen(args):
    """`use_with_torch(args.lib)` for a client run with `--allocator mrstack` (which needs
    `--lib`), else None: PyTorch's own allocator. Call it right after importing torch."""
    if args.allocator != "mrstack":
        return None
    if not args.lib:
        sys.exit("--allocator mrstack needs --lib")
    return use_with_torch(args.lib)


def use_with_cupy(path):
    """Makes mrstack CuPy's allocator (no CuPy pool in front) for this process. Call it before
    the first CuPy allocation. param 0: each device's stack from the environment."""
    import cupy

    lib = load(path)
    allocator = cupy.cuda.memory.CFunctionAllocator(
        0, address(lib, CUPY_MALLOC), address(lib, CUPY_FREE), lib
    )
    cupy.cuda.set_allocator(allocator.malloc)
    return lib
