//! GPU tests of the foundation: every leaf resource allocates real memory, kernels (compiled at run
//! time by NVRTC) write and read containers, and the host checks every value.
//!
//! Without a CUDA driver each test prints why and returns; with `MRSTACK_REQUIRE_GPU=1` a missing
//! GPU fails the test instead.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use mrstack::prelude::*;
use mrstack::{leaf::CudaAsyncOptions, resource::AllocErrorKind};
use std::sync::Arc;

use crate::increment;
use crate::support::{
    device_zeros, fill_and_check, fill_on_two_streams, gpu, kernel, pinned_zeros,
};

#[test]
fn every_leaf_round_trips_through_a_kernel() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let n = (1 << 20) + 3;
    // SAFETY: `fill_and_check` writes every element before reading.
    let mut a =
        unsafe { DeviceVec::<u32, _>::uninit(n, Cuda::new(&ctx).unwrap(), &stream) }.unwrap();
    fill_and_check(&ctx, &mut a, 3);
    // SAFETY: as above.
    let mut b =
        unsafe { DeviceVec::<u32, _>::uninit(n, CudaAsync::new(&ctx).unwrap(), &stream) }.unwrap();
    fill_and_check(&ctx, &mut b, 5);
    let mut c = DeviceVec::<u32, _>::zeroed(1 << 16, Managed::new(&ctx).unwrap(), &stream).unwrap();
    fill_and_check(&ctx, &mut c, 7);
    let mut d = DeviceVec::<u32, _>::zeroed(1 << 16, Pinned::new(&ctx).unwrap(), &stream).unwrap();
    fill_and_check(&ctx, &mut d, 11);
}

#[test]
fn stream_ordered_allocation_on_a_new_stream() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let pool = CudaAsync::with_options(
        &ctx,
        CudaAsyncOptions {
            initial_pool_size: Some(64 << 20),
            release_threshold: Some(256 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(pool.reserved_bytes().unwrap() >= 64 << 20);
    assert!(pool.reserved_high().unwrap() >= pool.reserved_bytes().unwrap());
    for round in 0..4u32 {
        let host: Vec<u32> = (0..100_000u32).map(|i| i ^ round).collect();
        let mut v = DeviceVec::from_slice(&host, &pool, &stream).unwrap();
        assert_eq!(v.to_vec().unwrap(), host);
        fill_and_check(&ctx, &mut v, round + 1);
    }
}

#[test]
fn pinned_vec_written_on_host_read_by_kernel_and_back() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let n = 300_001usize;
    let mut pinned = pinned_zeros(&ctx, n, &stream);
    for (i, x) in pinned.as_cells().unwrap().iter().enumerate() {
        x.set((i as u32) * 13);
    }
    let mut out = device_zeros(&ctx, n, &stream);
    let f = kernel(&ctx, "scale");
    let n32 = n as u32;
    // SAFETY: `scale` reads n values of `pinned` and writes n values of `out`.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&pinned)
            .arg(&mut out)
            .arg(&n32)
            .launch(LaunchConfig::for_num_elems(n32))
    }
    .unwrap();
    let got = out.to_vec().unwrap();
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, &x)| x == 2 * (i as u32 * 13) + 7));

    // A kernel writes the pinned memory; the next host read waits for it.
    increment!(&ctx, &stream, &mut pinned, n32);
    assert!(pinned
        .iter()
        .enumerate()
        .all(|(i, &x)| x == i as u32 * 13 + 1));
}

#[test]
fn managed_memory_is_touched_on_both_sides() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let n = 1 << 18; // 1 MiB of managed memory: far below what the card has free
    let mut v = DeviceVec::<u32, _>::zeroed(n, Managed::new(&ctx).unwrap(), &stream).unwrap();
    for (i, x) in v.as_host_cells().unwrap().iter().enumerate() {
        x.set(i as u32 * 3);
    }
    for _ in 0..2 {
        increment!(&ctx, &stream, &mut v, n);
    }
    let host = v.as_host_slice().unwrap();
    assert!(host.iter().enumerate().all(|(i, &x)| x == i as u32 * 3 + 2));
}

#[test]
#[allow(deprecated)] // memcpy_dtov is the name the interop promise is written against
fn cudarc_copies_take_containers_unchanged() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let cuda = Cuda::new(&ctx).unwrap();
    let host: Vec<f32> = (0..4099).map(|i| i as f32 * 0.5).collect();
    let mut v = DeviceVec::<f32, _>::zeroed(host.len(), &cuda, &stream).unwrap();
    stream.memcpy_htod(&host, &mut v).unwrap();
    assert_eq!(stream.memcpy_dtov(&v).unwrap(), host);
    assert_eq!(stream.clone_dtoh(&v).unwrap(), host);

    // A PinnedVec is a cudarc host slice too.
    let pinned = PinnedVec::from_slice(&host, Pinned::new(&ctx).unwrap(), &stream).unwrap();
    let mut w = DeviceVec::<f32, _>::zeroed(host.len(), &cuda, &stream).unwrap();
    stream.memcpy_htod(&pinned, &mut w).unwrap();
    assert_eq!(w.to_vec().unwrap(), host);

    // A copy on another stream than the container's is ordered after the container's work.
    let other = ctx.new_stream().unwrap();
    assert_eq!(other.clone_dtoh(&w).unwrap(), host);

    let mut b = DeviceBox::new(41u64, &cuda, &stream).unwrap();
    assert_eq!(b.get().unwrap(), 41);
    b.set(42).unwrap();
    assert_eq!(b.get().unwrap(), 42);
    assert_eq!(stream.memcpy_dtov(&b).unwrap(), [42]);
}

#[test]
fn leaves_reject_bad_input_with_errors() {
    let Some(ctx) = gpu() else { return };
    let cuda = Cuda::new(&ctx).unwrap();
    let asyncr = CudaAsync::new(&ctx).unwrap();
    let managed = Managed::new(&ctx).unwrap();
    let pinned = Pinned::new(&ctx).unwrap();
    let check = |r: &dyn Fn(usize, usize) -> Result<std::ptr::NonNull<u8>, AllocError>,
                 name: &str| {
        use AllocErrorKind::{InvalidArgument, Unsupported};
        let kind = |size, align| r(size, align).unwrap_err().kind;
        assert!(matches!(kind(64, 3), InvalidArgument(_)), "{name}");
        assert!(matches!(kind(usize::MAX, 1), InvalidArgument(_)), "{name}");
        assert!(matches!(kind(64, 4096), Unsupported(_)), "{name}");
        assert_eq!(
            r(0, 64).unwrap().as_ptr() as usize,
            256,
            "{name}: size 0 gives a dangling pointer"
        );
    };
    check(&|s, a| cuda.allocate(s, a, StreamRef::DEFAULT), "Cuda");
    check(
        &|s, a| asyncr.allocate(s, a, StreamRef::DEFAULT),
        "CudaAsync",
    );
    check(
        &|s, a| managed.allocate(s, a, StreamRef::DEFAULT),
        "Managed",
    );
    check(&|s, a| pinned.allocate(s, a, StreamRef::DEFAULT), "Pinned");

    // More than the device has: a clean out-of-memory error, and the resource still works.
    let (_, total) = ctx.mem_get_info().unwrap();
    let e = cuda
        .allocate(total * 2, 256, StreamRef::DEFAULT)
        .unwrap_err();
    assert_eq!(e.kind, AllocErrorKind::OutOfMemory, "{e}");
    let p = cuda.allocate_sync(1 << 20, 256).unwrap();
    assert_eq!(p.as_ptr() as usize % 256, 0);
    // SAFETY: p came from cuda with this size and align.
    unsafe { cuda.deallocate_sync(p, 1 << 20, 256) };

    // An overflowing element count is an error, not a panic.
    let stream = ctx.default_stream();
    // SAFETY: never read: the allocation fails.
    let e = unsafe { DeviceVec::<u64, _>::uninit(usize::MAX / 4, &cuda, &stream) }.unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
    let e = DeviceVec::from_slice(&[1u8, 2], &cuda, &stream)
        .unwrap()
        .copy_from(&[1u8])
        .unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
}

#[test]
fn any_thread_may_allocate() {
    let Some(ctx) = gpu() else { return };
    let cuda = Arc::new(Cuda::new(&ctx).unwrap());
    let handles: Vec<_> = (0..4u32)
        .map(|t| {
            let cuda = cuda.clone();
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                let stream = ctx.new_stream().unwrap();
                let host: Vec<u32> = (0..50_000).map(|i| i * 4 + t).collect();
                let v = DeviceVec::from_slice(&host, &cuda, &stream).unwrap();
                assert_eq!(v.to_vec().unwrap(), host);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_stack_built_by_the_macro_allocates_on_the_gpu() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let mr = resource_stack![Cuda::new(&ctx).unwrap()];
    let mut v = DeviceVec::<u32, _>::zeroed(12_345, &mr, &stream).unwrap();
    fill_and_check(&ctx, &mut v, 17);
}

#[test]
fn suballocators_serve_kernels_on_two_streams() {
    let Some(ctx) = gpu() else { return };
    let a = ctx.new_stream().unwrap();
    let b = ctx.new_stream().unwrap();
    let mr = resource_stack![
        Cuda::new(&ctx).unwrap(),
        Pool { initial: 64 MiB, max: 1 GiB },
        Binning { min: 256 B, max: 1 MiB },
    ];
    // Blocks freed on `a` are handed to `b` only after `b` waits for `a` (Pool::order_after).
    fill_on_two_streams(&ctx, &mr, (&a, &b), 3, 3 << 20);
    let fixed = resource_stack![Cuda::new(&ctx).unwrap(), FixedSize { block_size: 1 MiB, blocks_to_preallocate: 4 }];
    let vs: Vec<_> = (0..10u32)
        .map(|k| {
            let mut v = DeviceVec::<u32, _>::zeroed(1 << 18, &fixed, &a).unwrap();
            fill_and_check(&ctx, &mut v, k);
            v
        })
        .collect();
    let addrs: std::collections::HashSet<_> = vs.iter().map(|v| v.device_address()).collect();
    assert_eq!(addrs.len(), 10, "live blocks are distinct");
}
