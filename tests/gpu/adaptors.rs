//! GPU tests of the behaviour adaptors: Prefetch over Managed, Statistics under a kernel workload,
//! Aligned over Cuda (which refuses large alignments, so Aligned over-allocates), and a stack of
//! five adaptors feeding a kernel. Each skips without a GPU, and fails instead when
//! `MRSTACK_REQUIRE_GPU=1`.

// resource_stack! always adds `..Default::default()`, which clippy flags for a configuration whose
// every field is given (`Limiting { limit: 1 TiB }`).
#![allow(clippy::needless_update)]

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use mrstack::prelude::*;
use mrstack::{
    resource::AllocErrorKind,
    suballoc::{Binning, Pool},
};
use std::sync::Arc;
use typenum::U4096;

use crate::support::{assert_filled, fill_and_check, gpu};

const AFFINE: &str = r#"
extern "C" __global__ void affine(float *out, const float *in, float a, float b, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a * in[i] + b;
    }
}
"#;

/// `out[i] = a * in[i] + b`, compiled with NVRTC.
fn affine(ctx: &Arc<CudaContext>) -> CudaFunction {
    let ptx = cudarc::nvrtc::compile_ptx(AFFINE).expect("NVRTC compiles the kernel");
    let module = ctx.load_module(ptx).expect("the module loads");
    module.load_function("affine").expect("the kernel is there")
}

/// Runs `out = a * x + b` on the vectors' stream.
fn run_affine<R1, R2>(
    f: &CudaFunction,
    stream: &Arc<CudaStream>,
    out: &mut DeviceVec<f32, R1>,
    x: &DeviceVec<f32, R2>,
    a: f32,
    b: f32,
) where
    R1: MemoryResource + Accessible<DeviceAccessible>,
    R2: MemoryResource + Accessible<DeviceAccessible>,
{
    let n = x.len() as u32;
    let mut launch = stream.launch_builder(f);
    launch.arg(out).arg(x).arg(&a).arg(&b).arg(&n);
    // SAFETY: the kernel takes (float*, const float*, float, float, unsigned int), as pushed; both
    // vectors hold n floats and the kernel touches indices below n only.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.expect("the kernel launches");
}

fn input(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32 * 31 + seed) % 1000) as f32 * 0.25)
        .collect()
}

/// The device a range of managed memory was last prefetched to (-1: the host).
fn last_prefetch_location(ctx: &CudaContext, address: u64, bytes: usize) -> i32 {
    ctx.bind_to_thread().unwrap();
    let mut device: i32 = -2;
    // SAFETY: the attribute is one 4-byte int, written into `device`; the range is live managed memory.
    unsafe {
        sys::cuMemRangeGetAttribute(
            (&mut device as *mut i32).cast(),
            std::mem::size_of::<i32>(),
            sys::CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
            address,
            bytes,
        )
    }
    .result()
    .expect("cuMemRangeGetAttribute");
    device
}

#[test]
fn prefetch_over_managed_moves_allocations_to_the_device() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let f = affine(&ctx);
    let ordinal = ctx.ordinal();
    let mr = resource_stack![Managed::new(&ctx).unwrap(), Prefetch { device: ordinal }];
    assert_eq!(mr.device(), ordinal);

    let n = 1 << 18; // 1 MiB of floats per vector
    let host = input(n, 7);
    let x = DeviceVec::from_slice(&host, &mr, &stream).unwrap();
    // SAFETY: every value is written by the kernel below before it is read.
    let mut y = unsafe { DeviceVec::<f32, _>::uninit(n, &mr, &stream) }.unwrap();
    stream.synchronize().unwrap();
    for v in [x.device_address(), y.device_address()] {
        assert_eq!(last_prefetch_location(&ctx, v, n * 4), ordinal as i32);
    }

    run_affine(&f, &stream, &mut y, &x, 3.0, -1.0);
    let want: Vec<f32> = host.iter().map(|v| 3.0 * v - 1.0).collect();
    assert_eq!(y.to_vec().unwrap(), want);
    // Managed memory reads on the host too.
    assert_eq!(y.as_host_slice().unwrap(), &want[..]);
}

#[test]
fn statistics_count_a_kernel_workload_exactly() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let f = affine(&ctx);
    let mr = resource_stack![
        Cuda::new(&ctx).unwrap(),
        Pool { initial: 16 MiB, max: 256 MiB },
        Statistics,
    ];

    let sizes = [1000usize, 250_000, 4096, 77_777, 1 << 20, 3];
    let mut total_bytes = 0i128;
    let mut peak_bytes = 0i128;
    let mut kept = Vec::new();
    for (round, &n) in sizes.iter().enumerate() {
        let host = input(n, round as u32);
        let x = DeviceVec::from_slice(&host, &mr, &stream).unwrap();
        // SAFETY: every value is written by the kernel below before it is read.
        let mut y = unsafe { DeviceVec::<f32, _>::uninit(n, &mr, &stream) }.unwrap();
        let live_before: i128 = kept
            .iter()
            .map(|v: &DeviceVec<f32, _>| v.len() as i128 * 4)
            .sum();
        total_bytes += 2 * n as i128 * 4;
        peak_bytes = peak_bytes.max(live_before + 2 * n as i128 * 4);
        assert_eq!(mr.bytes().current, live_before + 2 * n as i128 * 4);

        run_affine(&f, &stream, &mut y, &x, 0.5, round as f32);
        let want: Vec<f32> = host.iter().map(|v| 0.5 * v + round as f32).collect();
        assert_eq!(y.to_vec().unwrap(), want, "round {round}");
        drop(x);
        kept.push(y);
    }
    let kept_bytes: i128 = kept.iter().map(|v| v.len() as i128 * 4).sum();
    let s = mr.stats();
    assert_eq!(s.bytes.current, kept_bytes);
    assert_eq!(s.bytes.total, total_bytes);
    assert_eq!(s.bytes.peak, peak_bytes);
    assert_eq!(s.allocations.current, sizes.len() as i128);
    assert_eq!(s.allocations.total, 2 * sizes.len() as i128);
    // The pool holds at least the peak from the device; the statistics see what the program uses.
    assert!(mr.upstream().usage().held >= peak_bytes as usize);
    drop(kept);
    assert_eq!(mr.bytes().current, 0);
    assert_eq!(mr.allocations().current, 0);
}

#[test]
fn aligned_over_cuda_over_allocates_and_kernels_see_the_right_bytes() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let f = affine(&ctx);
    let mr = resource_stack![Cuda::new(&ctx).unwrap(), Aligned<U4096>];
    // Cuda refuses 4096-byte alignment itself.
    let plain = Cuda::new(&ctx).unwrap();
    assert!(matches!(
        plain
            .allocate(64, 4096, StreamRef::DEFAULT)
            .unwrap_err()
            .kind,
        AllocErrorKind::Unsupported(_)
    ));

    let n = 10_000;
    let host = input(n, 3);
    let xs: Vec<_> = (0..8)
        .map(|_| DeviceVec::from_slice(&host, &mr, &stream).unwrap())
        .collect();
    assert_eq!(mr.over_allocated(), 8);
    for x in &xs {
        assert_eq!(x.device_address() % 4096, 0);
        // SAFETY: every value is written by the kernel below before it is read.
        let mut y = unsafe { DeviceVec::<f32, _>::uninit(n, &mr, &stream) }.unwrap();
        assert_eq!(y.device_address() % 4096, 0);
        run_affine(&f, &stream, &mut y, x, 2.0, 1.0);
        let want: Vec<f32> = host.iter().map(|v| 2.0 * v + 1.0).collect();
        assert_eq!(y.to_vec().unwrap(), want);
    }
    drop(xs);
    assert_eq!(mr.over_allocated(), 0);
}

#[test]
fn five_adaptors_over_cuda_feed_a_kernel() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let f = affine(&ctx);
    let mr = resource_stack![
        Cuda::new(&ctx).unwrap(),
        Aligned<U4096>,
        Limiting { limit: 64 MiB },
        Tracking,
        Statistics,
        Logging { to: Box::new(std::io::sink()) },
    ];
    let n = 1 << 16;
    let host = input(n, 11);
    let x = DeviceVec::from_slice(&host, &mr, &stream).unwrap();
    let mut y = DeviceVec::<f32, _>::zeroed(n, &mr, &stream).unwrap();
    run_affine(&f, &stream, &mut y, &x, -1.0, 0.0);
    let want: Vec<f32> = host.iter().map(|v| -v).collect();
    assert_eq!(y.to_vec().unwrap(), want);
    let stats = mr.upstream();
    assert_eq!(stats.bytes().current, 2 * n as i128 * 4);
    assert_eq!(stats.upstream().outstanding_count(), 2);
    // Over the cap: refused before reaching the driver.
    let err = DeviceVec::<f32, _>::zeroed(16 << 20, &mr, &stream).unwrap_err();
    assert!(matches!(err.kind, AllocErrorKind::LimitExceeded { .. }));
    drop((x, y));
    assert_eq!(stats.upstream().outstanding_count(), 0);
    mr.flush().unwrap();
}

#[test]
fn a_bin_of_its_own_resource_serves_kernels() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let own = Arc::new(CudaAsync::new(&ctx).unwrap());
    let mr = Binning::new(
        Pool::new(
            Cuda::new(&ctx).unwrap(),
            mrstack::suballoc::PoolConfig::default(),
        ),
        mrstack::suballoc::BinningConfig::default(),
    )
    .with_bin(64 << 10, own.clone())
    .unwrap();
    // 10,000 u32 = 40,000 bytes: the 64 KiB bin, served by the driver pool.
    let mut binned = DeviceVec::<u32, _>::zeroed(10_000, &mr, &stream).unwrap();
    let mut small = DeviceVec::<u32, _>::zeroed(100, &mr, &stream).unwrap();
    let mut large = DeviceVec::<u32, _>::zeroed(1 << 20, &mr, &stream).unwrap();
    assert!(
        own.reserved_bytes().unwrap() > 0,
        "the bin's pool holds memory"
    );
    fill_and_check(&ctx, &mut binned, 3);
    fill_and_check(&ctx, &mut small, 4);
    fill_and_check(&ctx, &mut large, 5);
    drop((binned, small, large));
    stream.synchronize().unwrap();
    // The same from text: the bin's resource a stack of its own.
    let text = "cuda(device=0) > pool > binning(min=256 B, max=1 MiB, bins=\"64 KiB = cuda_async(device=0)\")";
    let built = mrstack::config::build::<DeviceAccessible>(text).unwrap();
    assert_eq!(built.describe().to_string(), text);
    let mut v = DeviceVec::<u32, _>::zeroed(10_000, &built, &stream).unwrap();
    fill_and_check(&ctx, &mut v, 9);
}

/// A pool over a binning whose 1 MiB bin is device memory of its own, over an upstream that
/// orders nothing (a stand-in of no memory): a block freed on `s` under a slow kernel and reused
/// on `t` is ordered by the bin's resource, or `t`'s values are overwritten by `s`'s kernel.
#[test]
fn a_block_of_a_bins_own_resource_reused_on_another_stream_waits_for_the_first() {
    use mrstack::suballoc::BinningConfig;
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let binning = Binning::new(
        mrstack::testing::DeviceStandIn::new(),
        BinningConfig::default(),
    )
    .with_bin(1 << 20, Cuda::new(&ctx).unwrap())
    .unwrap();
    let pool = resource_stack![binning, Pool { initial: 1 MiB, max: 1 MiB }];
    let n = (1 << 20) / 4;
    let address = {
        let mut v = DeviceVec::<u32, _>::zeroed(n, &pool, &s).unwrap();
        crate::slow_fill!(&ctx, &s, &mut v, n, 3); // still running when `v` drops
        v.device_address()
    };
    let x = DeviceVec::from_slice(&vec![0xdead_u32; n], &pool, &t).unwrap();
    assert_eq!(x.device_address(), address, "the pool reused the block");
    ctx.synchronize().unwrap();
    assert_eq!(
        x.to_vec().unwrap(),
        vec![0xdead_u32; n],
        "s's kernel wrote the block after t's vector had it"
    );
}

#[test]
fn a_host_device_pair_serves_each_container_from_its_own_pool() {
    use mrstack::suballoc::{HostDevicePair, HostDevicePairConfig, PoolConfig, Storage};
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let pair = HostDevicePair::new(
        &ctx,
        HostDevicePairConfig {
            host: PoolConfig {
                initial: 8 << 20,
                max: 16 << 20,
            },
            device: PoolConfig {
                initial: 64 << 20,
                max: 128 << 20,
            },
        },
    )
    .unwrap();
    assert_eq!(pair.host().usage().held, 8 << 20);
    assert_eq!(pair.device().usage().held, 64 << 20);
    let n = 1 << 20;
    let mut data = DeviceVec::<u32, _>::zeroed(n, pair.device(), &stream).unwrap();
    let mut staging = PinnedVec::<u32, _>::zeroed(n, pair.host(), &stream).unwrap();
    fill_and_check(&ctx, &mut data, 7);
    data.copy_to_async(&mut staging).unwrap();
    // The host reads the pinned side in place once the copy is done (Deref waits for it).
    assert_filled(&staging[..], n, 7);
    assert_eq!(pair.host().usage().allocated, n * 4);
    assert_eq!(pair.device().usage().allocated, n * 4);
    // Each pool keeps to its own maximum.
    let e = DeviceVec::<u8, _>::zeroed(100 << 20, pair.device(), &stream).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let e = PinnedVec::<u8, _>::zeroed(16 << 20, pair.host(), &stream).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // The choice at run time.
    let s = StreamRef::from(&stream);
    let h = pair.allocate(Storage::Host, 4096, 256, s).unwrap();
    // SAFETY: pinned memory of the host pool, 4096 bytes, not in use by the device.
    unsafe { h.as_ptr().write_bytes(0x5A, 4096) };
    // SAFETY: as above; the bytes were just written.
    assert!(unsafe { std::slice::from_raw_parts(h.as_ptr(), 4096) }
        .iter()
        .all(|&b| b == 0x5A));
    let d = pair.allocate(Storage::Device, 4096, 256, s).unwrap();
    assert_eq!(pair.device().usage().allocated, n * 4 + 4096);
    // SAFETY: each from this pair with this storage, size and alignment.
    unsafe {
        pair.deallocate(Storage::Host, h, 4096, 256, s);
        pair.deallocate(Storage::Device, d, 4096, 256, s);
    }
    drop((data, staging));
    assert_eq!(pair.host().usage().allocated, 0);
    assert_eq!(pair.device().usage().allocated, 0);
}

#[test]
fn thread_caches_serve_kernels_on_eight_threads_and_streams() {
    let Some(ctx) = gpu() else { return };
    let mr = resource_stack![
        Cuda::new(&ctx).unwrap(),
        Tlsf { initial: 256 MiB, max: 1 GiB },
        ThreadCache { bytes: 64 MiB },
    ];
    std::thread::scope(|s| {
        for t in 0..8u32 {
            let (mr, ctx) = (&mr, &ctx);
            s.spawn(move || {
                // Two streams per thread, alternating: blocks come back through the caches and
                // the shared lists, each only on its own stream.
                let streams = [ctx.new_stream().unwrap(), ctx.new_stream().unwrap()];
                for round in 0..6u32 {
                    let stream = &streams[round as usize % 2];
                    let k = t * 100 + round;
                    let mut small =
                        DeviceVec::<u32, _>::zeroed(1000 + t as usize, mr, stream).unwrap();
                    let mut large =
                        DeviceVec::<u32, _>::zeroed((1 << 20) + 7 * t as usize, mr, stream)
                            .unwrap();
                    fill_and_check(ctx, &mut small, k);
                    fill_and_check(ctx, &mut large, k + 1);
                }
            });
        }
    });
    // No block is live: what the pool has out is what the caches hold (read from the pool: a
    // scoped thread's exit hook may still be moving its blocks to the shared lists, and
    // `cached()` counts a block in motion twice), at most the budget.
    let out = mr.upstream().usage().allocated;
    assert!(out > 0 && out <= 64 << 20, "{out} bytes wait in the caches");
    // Emptying waits for such a hook (it takes each cache's lock), so nothing stays out.
    mr.empty();
    assert_eq!(mr.upstream().usage().allocated, 0);
}

#[test]
fn thread_heaps_serve_kernels_on_eight_threads_and_take_blocks_back_across_them() {
    let Some(ctx) = gpu() else { return };
    let mr = resource_stack![Cuda::new(&ctx).unwrap(), ThreadHeaps { max: 2 GiB }];
    let kept = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8u32)
            .map(|t| {
                let (mr, ctx) = (&mr, &ctx);
                s.spawn(move || {
                    // A stream of its own: the thread's heap serves it, block after block.
                    let stream = ctx.new_stream().unwrap();
                    for round in 0..6u32 {
                        let k = t * 100 + round;
                        let mut small =
                            DeviceVec::<u32, _>::zeroed(1000 + t as usize, mr, &stream).unwrap();
                        let mut large =
                            DeviceVec::<u32, _>::zeroed((1 << 20) + 7 * t as usize, mr, &stream)
                                .unwrap();
                        fill_and_check(ctx, &mut small, k);
                        fill_and_check(ctx, &mut large, k + 1);
                    }
                    // One vector outlives the thread's loop, for the main thread to read and free.
                    let mut kept =
                        DeviceVec::<u32, _>::zeroed(3000 + t as usize, mr, &stream).unwrap();
                    fill_and_check(ctx, &mut kept, 7000 + t);
                    (t, kept)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(mr.heaps() >= 2, "{} heaps", mr.heaps());
    // Read here, then freed here: each block goes back to the heap of the thread that made it.
    for (t, kept) in &kept {
        assert_filled(kept.to_vec().unwrap(), kept.len(), 7000 + t);
    }
    drop(kept);
    assert_eq!(mr.usage().allocated, 0);
    let held = mr.usage().held;
    assert_eq!(mr.release(), held, "every chunk wholly free");
}
