"""CuPy on mrstack: matrix products and FFTs whose results must equal NumPy's, then a leak check;
or (--oom) an allocation far larger than the GPU, which must raise and leave CuPy working.

The allocator is set before the first CuPy allocation: CFunctionAllocator with param 0 (each
device's stack from MRSTACK_STACK) and mrstack_cupy_malloc_or_throw / mrstack_cupy_free, with no
CuPy memory pool in front, so every array is a block of the stack and the stack's statistics say
exactly what CuPy still holds.
"""

import argparse
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_checks  # noqa: E402
import mrstack_capi  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--lib", required=True)
p.add_argument("--out", required=True)
p.add_argument("--oom", action="store_true", help="the out-of-memory check instead")
p.add_argument("--oom-bytes", type=int, default=200 << 30)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

checks = client_checks.Checks("cupy/oom" if args.oom else "cupy", args.out)
checks.put("stack", os.environ.get("MRSTACK_STACK"))

import numpy as np  # noqa: E402
import cupy  # noqa: E402

# Before any CuPy allocation.
lib = mrstack_capi.use_with_cupy(args.lib)
checks.put("cupy", cupy.__version__)
checks.put("numpy", np.__version__)
checks.save()  # the versions survive a crash


def stats():
    return mrstack_capi.statistics(lib, cupy.cuda.Device().id)


def close(c, what, got, want, rtol):
    """`got` (a CuPy array) against `want` (NumPy's): allclose with rtol and an absolute
    tolerance of rtol times the largest magnitude (entries near zero carry the rounding of the
    large terms that cancelled there)."""
    got = cupy.asnumpy(got)
    if got.shape != want.shape:
        return c.check(what, False, f"shape {got.shape}, NumPy's {want.shape}")
    scale = float(np.abs(want).max()) or 1.0
    ok = np.allclose(got, want, rtol=rtol, atol=rtol * scale)
    err = float(np.abs(got - want).max()) / scale
    return c.check(what, ok, f"max |diff| / max |ref| = {err:.2e}, rtol {rtol:g}")


def work(c, rng, label):
    """One round of matrix products, FFTs and elementwise work, each against NumPy. Returns
    nothing: every array is dropped when it returns."""
    # float64 products: cuBLAS and NumPy's BLAS sum in different orders, so the results differ
    # by rounding only (about 1e-15 relative); 1e-10 would catch any wrong element.
    for m, k, n in [(1, 1, 1), (17, 33, 9), (256, 256, 256), (1000, 500, 700), (2048, 2048, 2048)]:
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        close(c, f"{label}: float64 matmul {m}x{k} @ {k}x{n}", cupy.asarray(a) @ cupy.asarray(b),
              a @ b, 1e-10)
    # float32, batched: single-precision rounding over k = 512 terms.
    a = rng.standard_normal((8, 300, 512)).astype(np.float32)
    b = rng.standard_normal((8, 512, 200)).astype(np.float32)
    close(c, f"{label}: float32 batched matmul 8x300x512 @ 8x512x200",
          cupy.matmul(cupy.asarray(a), cupy.asarray(b)), np.matmul(a, b), 1e-4)
    # FFTs in double precision: cuFFT against pocketfft.
    for n in [8, 1000, 12288, 1 << 20]:
        x = rng.standard_normal(n) + 1j * rng.standard_normal(n)
        close(c, f"{label}: complex128 fft n={n}", cupy.fft.fft(cupy.asarray(x)), np.fft.fft(x),
              1e-9)
    x = rng.standard_normal(100_000)
    close(c, f"{label}: float64 rfft n=100000", cupy.fft.rfft(cupy.asarray(x)), np.fft.rfft(x), 1e-9)
    x = rng.standard_normal((512, 384)) + 1j * rng.standard_normal((512, 384))
    close(c, f"{label}: complex128 fft2 512x384", cupy.fft.fft2(cupy.asarray(x)), np.fft.fft2(x),
          1e-9)
    close(c, f"{label}: ifft(fft(x)) round trip", cupy.fft.ifft(cupy.fft.fft(cupy.asarray(x[0]))),
          x[0], 1e-12)
    # Elementwise kernels and a reduction, over many sizes: many allocations of many sizes.
    for n in [1, 255, 256, 257, 4097, 1 << 16, 3 << 20]:
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        gx, gy = cupy.asarray(x), cupy.asarray(y)
        got = cupy.stack([(gx * gy + cupy.sin(gx)).sum(), cupy.abs(gx - gy).max()])
        want = np.array([(x * y + np.sin(x)).sum(), np.abs(x - y).max()])
        close(c, f"{label}: elementwise + reductions n={n}", got, want, 1e-9)


def round_of_work(c, rng, n):
    """Runs round `n` of the work, lets go of what CuPy keeps, and returns the stack's stats."""
    work(c, rng, f"round {n}")
    # What CuPy caches on its own: FFT plans hold their work areas (blocks of the stack).
    cupy.fft.config.get_plan_cache().clear()
    gc.collect()
    cupy.cuda.Device().synchronize()
    after = stats()
    c.put(f"stack_after_round_{n}", after)
    return after


def main(c):
    rng = np.random.default_rng(args.seed)
    before = stats()
    c.put("stack_at_start", before)
    first = round_of_work(c, rng, 1)
    c.check("CuPy allocated through the stack", first["allocations"] > before["allocations"],
            f"{first['allocations']} allocations, peak live "
            f"{first['peak_live_bytes'] / client_checks.MIB:.1f} MiB")
    c.check("nothing leaks: 0 live blocks after freeing everything", first["live_blocks"] == 0,
            f"live_blocks {first['live_blocks']}, live_bytes {first['live_bytes']}")
    # A second round: the same again, from a warm CuPy (kernels compiled, handles made).
    second = round_of_work(c, rng, 2)
    # Against the first round, not 0: a cache CuPy keeps would fail the check above and pass
    # this one (it does not grow with the work), a leak fails both.
    c.check("a second round leaves no more live blocks than the first",
            second["live_blocks"] <= first["live_blocks"]
            and second["allocations"] > first["allocations"],
            f"live_blocks {first['live_blocks']} -> {second['live_blocks']}, live_bytes "
            f"{first['live_bytes']} -> {second['live_bytes']}, allocations {second['allocations']}")
    c.check("no bad frees, no failed allocations",
            second["bad_frees"] == 0 and second["failed_allocations"] == 0,
            f"bad_frees {second['bad_frees']}, failed_allocations {second['failed_allocations']}")
    print(f"stack after both rounds: {second}")


def oom(c):
    c.put("oom_bytes", args.oom_bytes)
    small = cupy.arange(1000, dtype=cupy.float64)
    before = stats()
    caught = c.raises(f"{args.oom_bytes / (1 << 30):.0f} GiB raises",
                      lambda: cupy.empty(args.oom_bytes, dtype=cupy.uint8),
                      lambda huge: f"an array at {huge.data.ptr:#x}")
    if caught is not None:
        c.put("exception", f"{type(caught).__name__}: {caught}")
        # mrstack_cupy_malloc_or_throw throws std::bad_alloc, which CuPy (`except +`) raises as
        # MemoryError, as it does for its own out-of-memory errors.
        c.check(f"{args.oom_bytes / (1 << 30):.0f} GiB raises MemoryError",
                isinstance(caught, MemoryError), f"{type(caught).__name__}: {caught}")
    after = stats()
    c.put("stack_after_oom", after)
    c.check("the stack counted the failure", after["failed_allocations"] > before["failed_allocations"],
            f"failed_allocations {before['failed_allocations']} -> {after['failed_allocations']}")
    # And CuPy goes on: a GiB, a kernel, the old array still right, everything freed.
    big = cupy.ones(1 << 27, dtype=cupy.float64)
    total = float(big.sum())
    c.check("CuPy goes on: 1 GiB of ones sums right", total == float(1 << 27), f"sum {total}")
    c.check("an array from before is intact", float(small.sum()) == 999 * 1000 / 2)
    del big, small
    gc.collect()
    cupy.cuda.Device().synchronize()
    end = stats()
    c.put("stack_at_end", end)
    c.check("everything freed: 0 live blocks, no bad frees",
            end["live_blocks"] == 0 and end["bad_frees"] == 0,
            f"live_blocks {end['live_blocks']}, bad_frees {end['bad_frees']}")


checks.run(oom if args.oom else main)
