//! Helpers shared by the test crates (`host` and `gpu`, each of which declares `mod support;`):
//! the GPU context or a skip, the test kernels, the slow kernel that catches a missing wait, and
//! the trace fixture (`traces`, which the benches include too).

// Each test crate uses only some of these helpers.
#![allow(dead_code)]

pub(crate) mod files;
pub(crate) mod traces;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use mrstack::prelude::*;
use std::sync::Arc;

/// Device 0's context, or `None` (printing why) where there is no GPU. With
/// `MRSTACK_REQUIRE_GPU=1` a missing GPU fails the test instead of skipping it.
pub(crate) fn gpu() -> Option<Arc<cudarc::driver::CudaContext>> {
    match mrstack::cuda_context(0) {
        Ok(ctx) => Some(ctx),
        Err(e) if std::env::var_os("MRSTACK_REQUIRE_GPU").is_some_and(|v| v == "1") => {
            panic!("MRSTACK_REQUIRE_GPU=1 but no GPU: {e}")
        }
        Err(e) => {
            skipped(&format!("no GPU: {e}"));
            None
        }
    }
}

/// Whether a CUDA driver is loaded here; if so, counts the calling test of the no-driver paths
/// as skipped, saying `why`, and the test returns early (the GPU suite covers such a machine).
pub(crate) fn driver_loaded(why: &str) -> bool {
    let loaded = mrstack::driver_available();
    if loaded {
        skipped(why);
    }
    loaded
}

/// Checks that `e` says no CUDA driver could be loaded.
#[track_caller]
pub(crate) fn assert_no_driver(e: AllocError) {
    assert_eq!(e.kind, mrstack::resource::AllocErrorKind::NoDriver, "{e}");
}

/// Allocates a block of `size` bytes at `align` on `stream` from `mr`, panicking if that fails,
/// and frees it at once: a request the resource must serve.
#[track_caller]
pub(crate) fn serve_one<R: MemoryResource>(mr: &R, size: usize, align: usize, stream: StreamRef) {
    let p = mr.allocate(size, align, stream).unwrap();
    // SAFETY: p came from mr just now, with this size and alignment.
    unsafe { mr.deallocate(p, size, align, stream) };
}

/// Tests of this binary that skipped so far, and the first one's reason.
static SKIPPED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static FIRST_REASON: std::sync::OnceLock<String> = std::sync::OnceLock::new();

extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// Prints the count of skipped tests after the test harness's own summary (the harness shows no
/// output of a passing test, and counts a skipped one as passed).
extern "C" fn report_skipped() {
    let n = SKIPPED.load(std::sync::atomic::Ordering::Relaxed);
    let why = FIRST_REASON.get().map_or("", String::as_str);
    eprintln!("skipped: {n} tests returned early without running their checks (the first: {why})");
}

/// Counts a test that returns without running its checks, saying why; the binary prints the
/// count when it exits.
pub(crate) fn skipped(why: &str) {
    eprintln!("skipping: {why}");
    if FIRST_REASON.set(why.to_string()).is_ok() {
        // SAFETY: registers a function that takes no arguments and only reads atomics and a
        // OnceLock, which stay valid until the process ends.
        unsafe { atexit(report_skipped) };
    }
    SKIPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Test kernels: `fill` (out[i] = i*k + 1), `scale` (out[i] = 2*in[i] + 7), `increment`, and
/// `slow_fill` (`fill` after spinning `cycles` clock cycles: work that is still running when the
/// host goes on, to catch a missing wait).
pub(crate) const KERNELS: &str = r#"
extern "C" __global__ void slow_fill(unsigned int* out, unsigned int n, unsigned int k, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * k + 1u;
}
extern "C" __global__ void fill(unsigned int* out, unsigned int n, unsigned int k) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * k + 1u;
}
extern "C" __global__ void scale(const unsigned int* in, unsigned int* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2u * in[i] + 7u;
}
extern "C" __global__ void increment(unsigned int* data, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1u;
}
"#;

pub(crate) fn kernel(ctx: &Arc<CudaContext>, name: &str) -> CudaFunction {
    let ptx = cudarc::nvrtc::compile_ptx(KERNELS).expect("NVRTC compiles the test kernels");
    ctx.load_module(ptx)
        .expect("module loads")
        .load_function(name)
        .expect("function exists")
}

/// Clock cycles that `slow_fill` spins: 200 M by default, about 100 ms on an H100 (1.98 GHz
/// boost clock), far longer than the host takes to go on to its next call;
/// `MRSTACK_SLOW_CYCLES` overrides it (smaller under compute-sanitizer, which slows kernels).
pub(crate) fn slow_cycles() -> i64 {
    std::env::var("MRSTACK_SLOW_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000_000)
}

/// Queues `slow_fill(out, n, k, SLOW)` on `stream`, over every value of `out` (a container
/// argument, `&mut v`, so that the container tracks the write). A macro: the argument's type
/// varies and cudarc's launch builder borrows it.
#[macro_export]
macro_rules! slow_fill {
    ($ctx:expr, $stream:expr, $out:expr, $n:expr, $k:expr) => {{
        let f = $crate::support::kernel($ctx, "slow_fill");
        let (n32, k, cycles): (u32, u32, i64) = ($n as u32, $k, $crate::support::slow_cycles());
        let mut builder = $stream.launch_builder(&f);
        builder.arg($out).arg(&n32).arg(&k).arg(&cycles);
        // SAFETY: `slow_fill` takes (unsigned*, unsigned, unsigned, long long) and writes indices
        // < n of `out`, which holds n values.
        unsafe { builder.launch(cudarc::driver::LaunchConfig::for_num_elems(n32)) }
            .expect("launch slow_fill");
        // Unloading the module (when `f`, its last function, drops) would wait for the kernel:
        // it must still be running when the macro returns, or the test checks no ordering.
        std::mem::forget(f);
    }};
}

/// Queues `increment(out, n)` on `stream`: adds one to each of the `n` values of `out` (a
/// container argument, `&mut v`, so that the container tracks the write). A macro for the reason
/// `slow_fill!` is one.
#[macro_export]
macro_rules! increment {
    ($ctx:expr, $stream:expr, $out:expr, $n:expr) => {{
        use cudarc::driver::PushKernelArg;
        let f = $crate::support::kernel($ctx, "increment");
        let n32: u32 = $n as u32;
        let mut builder = $stream.launch_builder(&f);
        builder.arg($out).arg(&n32);
        // SAFETY: `increment` takes (unsigned*, unsigned) and updates indices < n of `out`, which
        // holds n values.
        unsafe { builder.launch(cudarc::driver::LaunchConfig::for_num_elems(n32)) }
            .expect("launch increment");
        // As in `slow_fill!`: unloading the module would wait for the kernel, and the test would
        // check no ordering.
        std::mem::forget(f);
    }};
}

/// `rounds` rounds of a small vector and one of `large` values on `a`, then on `b`, each filled
/// and checked: blocks freed on `a` go to `b` only after `b` waits for `a` (`order_after`).
pub(crate) fn fill_on_two_streams<R>(
    ctx: &Arc<CudaContext>,
    mr: &R,
    (a, b): (&Arc<CudaStream>, &Arc<CudaStream>),
    rounds: u32,
    large: usize,
) where
    R: MemoryResource + Accessible<DeviceAccessible>,
{
    for round in 0..rounds {
        for (k, stream) in [(round * 2 + 3, a), (round * 2 + 4, b)] {
            let mut small = DeviceVec::<u32, _>::zeroed(1000, mr, stream).unwrap();
            let mut large = DeviceVec::<u32, _>::zeroed(large, mr, stream).unwrap();
            fill_and_check(ctx, &mut small, k);
            fill_and_check(ctx, &mut large, k + 100);
        }
    }
}

pub(crate) fn expected_fill(n: usize, k: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(k) + 1).collect()
}

/// Fills `v` on its stream with the `fill` kernel and checks every value on the host.
pub(crate) fn fill_and_check<R>(ctx: &Arc<CudaContext>, v: &mut DeviceVec<u32, R>, k: u32)
where
    R: MemoryResource + Accessible<DeviceAccessible>,
{
    let f = kernel(ctx, "fill");
    let n = v.len() as u32;
    let stream = v.stream().clone();
    // SAFETY: `fill` takes (unsigned*, unsigned, unsigned) and writes indices < n of a buffer of n.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut *v)
            .arg(&n)
            .arg(&k)
            .launch(LaunchConfig::for_num_elems(n))
    }
    .expect("launch");
    assert_eq!(v.to_vec().unwrap(), expected_fill(v.len(), k));
}

/// A context, as the GPU tests pass one.
type Ctx = Arc<CudaContext>;
/// A stream, as the GPU tests pass one.
type Stream = Arc<CudaStream>;

/// `n` zeros in a `DeviceVec` of a plain `Cuda` leaf on `ctx`, ordered on `stream`.
pub(crate) fn device_zeros(ctx: &Ctx, n: usize, stream: &Stream) -> DeviceVec<u32, Cuda> {
    DeviceVec::zeroed(n, Cuda::new(ctx).unwrap(), stream).unwrap()
}

/// `n` zeros in a `PinnedVec` of a plain `Pinned` leaf on `ctx`, ordered on `stream`.
pub(crate) fn pinned_zeros(ctx: &Ctx, n: usize, stream: &Stream) -> PinnedVec<u32, Pinned> {
    PinnedVec::zeroed(n, Pinned::new(ctx).unwrap(), stream).unwrap()
}

/// Queues slow `fill` work on a `DeviceVec` of `dev`'s context and stream, copies it on that
/// stream into a `PinnedVec` of `pinned`'s context and stream without waiting, and checks every
/// value of the `PinnedVec`'s host read: the read must wait for the copy, whichever stream it
/// was queued on.
pub(crate) fn slow_copy_into_pinned(dev: (&Ctx, &Stream), pinned: (&Ctx, &Stream), k: u32) {
    let n = 1 << 20;
    let mut from = device_zeros(dev.0, n, dev.1);
    let mut to = pinned_zeros(pinned.0, n, pinned.1);
    slow_fill!(dev.0, dev.1, &mut from, n, k);
    dev.1.memcpy_dtoh(&from, &mut to).unwrap();
    assert_filled(&to[..], n, k);
}

/// Checks that `got` holds exactly what `fill` writes over `n` values with `k`.
#[track_caller]
pub(crate) fn assert_filled(got: impl AsRef<[u32]>, n: usize, k: u32) {
    assert_eq!(got.as_ref(), &expected_fill(n, k)[..]);
}

/// Checks that the first `n` values of `host` are still zero and the rest what `fill` writes
/// over `n` values with `k`: a copy into the second half of a zeroed vector of `2 * n`.
#[track_caller]
pub(crate) fn assert_zeros_then_filled(host: &[u32], n: usize, k: u32) {
    assert!(host[..n].iter().all(|&x| x == 0));
    assert_eq!(host[n..], expected_fill(n, k)[..]);
}
