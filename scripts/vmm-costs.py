#!/usr/bin/env python3
"""What the CUDA virtual memory calls cost per page on this GPU, and what they cost the work
beside them.

Measures, with the driver API through ctypes (PyTorch only to own the context and launch kernels):

- per 2 MiB page: cuMemCreate, cuMemMap, cuMemSetAccess (per page and once per run of pages),
  cuMemUnmap (per page and once per run), cuMemRelease; runs of 1, 16 and 128 pages;
- a swap of one page (unmapped at one address, mapped at another): given back and made anew, or
  the same allocation moved; and moved, for pages of 1 to 32 granules;
- one allocation of 4 or 16 granules mapped as one mapping, or as a mapping per granule;
- whether cuMemUnmap / cuMemMap of pages no work uses wait for a kernel running on another stream;
- cuEventRecord and cuEventQuery;
- what a thread that maps and unmaps pages in a loop costs a thread that launches small kernels.

    python3 scripts/vmm-costs.py            # prints one table, in microseconds

Needs a GPU, PyTorch and the driver (libcuda.so.1).
"""

import ctypes as C
import statistics
import threading
import time

import torch

cu = C.CDLL("libcuda.so.1")
CUdeviceptr = C.c_uint64
Handle = C.c_uint64


class Location(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class AllocFlags(C.Structure):
    _fields_ = [
        ("compressionType", C.c_ubyte),
        ("gpuDirectRDMACapable", C.c_ubyte),
        ("usage", C.c_ushort),
        ("reserved", C.c_ubyte * 4),
    ]


class Prop(C.Structure):
    _fields_ = [
        ("type", C.c_int),
        ("requestedHandleTypes", C.c_int),
        ("location", Location),
        ("win32HandleMetaData", C.c_void_p),
        ("allocFlags", AllocFlags),
    ]


class AccessDesc(C.Structure):
    _fields_ = [("location", Location), ("flags", C.c_int)]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


torch.cuda.init()
torch.zeros(1, device="cuda")  # the primary context, current on this thread
dev = torch.cuda.current_device()
ctx = C.c_void_p()
check(cu.cuCtxGetCurrent(C.byref(ctx)), "cuCtxGetCurrent")

prop = Prop()
prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
prop.location = Location(1, dev)  # CU_MEM_LOCATION_TYPE_DEVICE
gran = C.c_size_t()
check(cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0), "granularity")
PAGE = gran.value
access = AccessDesc(Location(1, dev), 3)  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


def now():
    return time.perf_counter_ns() / 1000.0


def reserve(n):
    va = CUdeviceptr()
    check(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(n * PAGE), C.c_size_t(0), CUdeviceptr(0), C.c_ulonglong(0)), "reserve")
    return va.value


def unmap_pages(va, n, per_page):
    """Unmaps the `n` pages at `va`: a cuMemUnmap for each, or one for them all."""
    if per_page:
        for i in range(n):
            check(cu.cuMemUnmap(CUdeviceptr(va + i * PAGE), C.c_size_t(PAGE)), "unmap")
    else:
        check(cu.cuMemUnmap(CUdeviceptr(va), C.c_size_t(n * PAGE)), "unmap")


def cycle(n, va, per_page_access, per_page_unmap, t):
    hs = []
    a = now()
    for _ in range(n):
        h = Handle()
        check(cu.cuMemCreate(C.byref(h), C.c_size_t(PAGE), C.byref(prop), C.c_ulonglong(0)), "create")
        hs.append(h)
    b = now()
    for i, h in enumerate(hs):
        check(cu.cuMemMap(CUdeviceptr(va + i * PAGE), C.c_size_t(PAGE), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
    c = now()
    if per_page_access:
        for i in range(n):
            check(cu.cuMemSetAccess(CUdeviceptr(va + i * PAGE), C.c_size_t(PAGE), C.byref(access), C.c_size_t(1)), "access")
    else:
        check(cu.cuMemSetAccess(CUdeviceptr(va), C.c_size_t(n * PAGE), C.byref(access), C.c_size_t(1)), "access")
    d = now()
    unmap_pages(va, n, per_page_unmap)
    e = now()
    for h in hs:
        check(cu.cuMemRelease(h), "release")
    f = now()
    for k, v in zip(("create", "map", "access", "unmap", "release"), (b - a, c - b, d - c, e - d, f - e)):
        t.setdefault(k, []).append(v / n)


print(f"device: {torch.cuda.get_device_name(dev)}, page {PAGE >> 20} MiB")
print("calls per page, µs (median of 7 rounds)")
print(f"{'pages':>6} {'how':<22} {'create':>8} {'map':>8} {'access':>8} {'unmap':>8} {'release':>8} {'total':>8}")
for n in (1, 16, 128):
    va = reserve(n)
    for per_access, per_unmap, how in ((True, True, "access+unmap per page"), (False, False, "access+unmap per run")):
        t = {}
        cycle(n, va, per_access, per_unmap, {})  # warm
        for _ in range(7):
            cycle(n, va, per_access, per_unmap, t)
        m = {k: statistics.median(v) for k, v in t.items()}
        print(f"{n:>6} {how:<22} " + " ".join(f"{m[k]:8.1f}" for k in ("create", "map", "access", "unmap", "release")) + f" {sum(m.values()):8.1f}")
    check(cu.cuMemAddressFree(CUdeviceptr(va), C.c_size_t(n * PAGE)), "free")

def swaps(size, rounds):
    """A swap of one allocation of `size` bytes, unmapped at one address and mapped at another
    (as VirtualMemory does for its bound, one page at a time): the medians, µs, of `rounds`
    swaps given back and made anew (unmap+release+create+map+access) and `rounds` of the same
    allocation moved (unmap+map+access), taking turns."""
    va = CUdeviceptr()
    check(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(2 * size), C.c_size_t(0), CUdeviceptr(0), C.c_ulonglong(0)), "reserve")
    va = va.value
    h = Handle()
    check(cu.cuMemCreate(C.byref(h), C.c_size_t(size), C.byref(prop), C.c_ulonglong(0)), "create")
    check(cu.cuMemMap(CUdeviceptr(va), C.c_size_t(size), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
    check(cu.cuMemSetAccess(CUdeviceptr(va), C.c_size_t(size), C.byref(access), C.c_size_t(1)), "access")
    at = 0
    times = {"anew": [], "moved": []}
    for rnd in range(2 * rounds):
        how = "anew" if rnd % 2 == 0 else "moved"
        src, dst = va + at * size, va + (1 - at) * size
        a = now()
        check(cu.cuMemUnmap(CUdeviceptr(src), C.c_size_t(size)), "unmap")
        if how == "anew":
            check(cu.cuMemRelease(h), "release")
            h = Handle()
            check(cu.cuMemCreate(C.byref(h), C.c_size_t(size), C.byref(prop), C.c_ulonglong(0)), "create")
        check(cu.cuMemMap(CUdeviceptr(dst), C.c_size_t(size), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
        check(cu.cuMemSetAccess(CUdeviceptr(dst), C.c_size_t(size), C.byref(access), C.c_size_t(1)), "access")
        times[how].append(now() - a)
        at = 1 - at
    check(cu.cuMemUnmap(CUdeviceptr(va + at * size), C.c_size_t(size)), "unmap")
    check(cu.cuMemRelease(h), "release")
    check(cu.cuMemAddressFree(CUdeviceptr(va), C.c_size_t(2 * size)), "free")
    return statistics.median(times["anew"]), statistics.median(times["moved"])


anew, moved = swaps(PAGE, 200)
print(f"a swap of one page, µs (median of 200): given back and made anew "
      f"(unmap+release+create+map+access) {anew:.1f}, the same allocation moved "
      f"(unmap+map+access) {moved:.1f} ({moved / anew:.2f}x)")

# The cost of a swap is per mapping, not per byte: pages of several granules cost the same.
print("a swap by page size, one allocation moved (unmap+map+access), µs (median of 60): " + ", ".join(
    f"{(PAGE << k) >> 20} MiB {swaps(PAGE << k, 60)[1]:.1f}" for k in range(6)))



def one_allocation(k, rounds, pieces):
    """One allocation of `k` granules mapped and enabled, then unmapped: as one mapping
    (`pieces` false) or as `k` mappings of a granule each, at offsets into it (`pieces` true),
    one cuMemSetAccess and one cuMemUnmap over the whole range either way; the medians, µs, of
    the map+access and of the unmap."""
    va = reserve(k)
    h = Handle()
    check(cu.cuMemCreate(C.byref(h), C.c_size_t(k * PAGE), C.byref(prop), C.c_ulonglong(0)), "create")
    try:
        return map_rounds(va, h, k, rounds, pieces)
    finally:
        check(cu.cuMemRelease(h), "release")
        check(cu.cuMemAddressFree(CUdeviceptr(va), C.c_size_t(k * PAGE)), "free")


def map_rounds(va, h, k, rounds, pieces):
    """`one_allocation`'s rounds over the reservation `va` and the allocation `h`."""
    mapped, unmapped = [], []
    for _ in range(rounds):
        a = now()
        if pieces:
            for i in range(k):
                check(cu.cuMemMap(CUdeviceptr(va + i * PAGE), C.c_size_t(PAGE), C.c_size_t(i * PAGE), h, C.c_ulonglong(0)), "map")
        else:
            check(cu.cuMemMap(CUdeviceptr(va), C.c_size_t(k * PAGE), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
        check(cu.cuMemSetAccess(CUdeviceptr(va), C.c_size_t(k * PAGE), C.byref(access), C.c_size_t(1)), "access")
        b = now()
        unmap_pages(va, k, pieces)
        mapped.append(b - a)
        unmapped.append(now() - b)
    return statistics.median(mapped), statistics.median(unmapped)


# Whether the calls cost per mapping or per allocation: one allocation of several granules
# mapped whole, or granule by granule at offsets into it (which would let its pieces move apart,
# where the driver maps at an offset at all).
for k in (4, 16):
    whole = one_allocation(k, 30, False)
    try:
        pieces = one_allocation(k, 30, True)
        apart = f"as {k} mappings {pieces[0]:.1f} / {pieces[1]:.1f}"
    except RuntimeError as e:
        apart = f"as {k} mappings: {e} (an allocation maps only whole here)"
    print(f"one allocation of {k} pages, map+access / unmap, µs (median of 30): as one mapping "
          f"{whole[0]:.1f} / {whole[1]:.1f}, {apart}")

# Does unmapping (or mapping) pages that no work uses wait for a kernel on another stream?
va = reserve(16)
busy = torch.cuda.Stream()
with torch.cuda.stream(busy):
    torch.cuda._sleep(50)  # warm the sleep kernel
torch.cuda.synchronize()


def map_all(n):
    """New pages mapped and enabled over the first n pages of `va`; their handles."""
    hs = []
    for i in range(n):
        h = Handle()
        check(cu.cuMemCreate(C.byref(h), C.c_size_t(PAGE), C.byref(prop), C.c_ulonglong(0)), "create")
        check(cu.cuMemMap(CUdeviceptr(va + i * PAGE), C.c_size_t(PAGE), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
        hs.append(h)
    check(cu.cuMemSetAccess(CUdeviceptr(va), C.c_size_t(n * PAGE), C.byref(access), C.c_size_t(1)), "access")
    return hs


def unmap_all(hs):
    check(cu.cuMemUnmap(CUdeviceptr(va), C.c_size_t(len(hs) * PAGE)), "unmap")
    for h in hs:
        check(cu.cuMemRelease(h), "release")


for what in ("map+access", "unmap+release"):
    hs = map_all(16) if what == "unmap+release" else []
    with torch.cuda.stream(busy):
        torch.cuda._sleep(int(2e9))  # about a second of spinning
    a = now()
    if what == "map+access":
        hs = map_all(16)
    else:
        unmap_all(hs)
    b = now()
    torch.cuda.synchronize()
    c = now()
    print(f"16 pages {what} while a ~1 s kernel runs on another stream: {b - a:.0f} µs (the kernel had {c - a:.0f} µs to go with it)")
    if what == "map+access":
        unmap_all(hs)

# Events.
ev = C.c_void_p()
check(cu.cuEventCreate(C.byref(ev), 2), "event")  # CU_EVENT_DISABLE_TIMING
s = torch.cuda.current_stream().cuda_stream
a = now()
for _ in range(10000):
    cu.cuEventRecord(ev, C.c_void_p(s))
b = now()
for _ in range(10000):
    cu.cuEventQuery(ev)
c = now()
print(f"cuEventRecord {(b - a) / 10000:.2f} µs, cuEventQuery {(c - b) / 10000:.2f} µs")

# A launching thread beside a thread that maps and unmaps.
x = torch.ones(1024, device="cuda")


def launches(k):
    torch.cuda.synchronize()
    a = now()
    for _ in range(k):
        x.add_(1.0)
    torch.cuda.synchronize()
    return (now() - a) / k


stop = threading.Event()
churned = [0]


def churn():
    check(cu.cuCtxSetCurrent(ctx), "set current")
    va2 = reserve(8)
    while not stop.is_set():
        cycle(8, va2, False, False, {})
        churned[0] += 8


base = statistics.median(launches(20000) for _ in range(3))
t = threading.Thread(target=churn)
t.start()
time.sleep(0.05)
busy_rate = statistics.median(launches(20000) for _ in range(3))
stop.set()
t.join()
print(f"small kernel launch+run: {base:.2f} µs alone, {busy_rate:.2f} µs beside a thread mapping and unmapping ({churned[0]} pages)")
