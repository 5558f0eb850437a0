//! GPU tests of the soundness rules: a block freed on a stream that its owner has since
//! dropped is reused by another stream only after the work that used it, for every suballocator;
//! pinned memory copied into or written by kernels is waited for before the host reads it or the
//! block is reused. Each test queues slow device work (`slow_fill`, ~100 ms), goes on at once on
//! the host, and checks the values that come back.
//!
//! Without a CUDA driver each test prints why and returns; with `MRSTACK_REQUIRE_GPU=1` a missing
//! GPU fails the test instead.

use crate::slow_fill;
use crate::support::{
    assert_filled, device_zeros, expected_fill, gpu, kernel, pinned_zeros, slow_copy_into_pinned,
};
use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use mrstack::prelude::*;
use mrstack::suballoc::{ArenaConfig, BinningConfig, PoolConfig};
use mrstack::{
    resource::AllocErrorKind,
    suballoc::{Arena, Binning, Pool},
};
use std::sync::Arc;

/// Frees a block on stream `a` while slow work on `a` still writes it, drops `a`, then takes a
/// block of the same size on a new stream `b` and writes it there: the pool must hand over the
/// same block (checked, so the test exercises reuse) ordered after `a`'s work, so `b`'s values
/// survive. Without the ordering, `a`'s late write would overwrite them.
fn reuse_after_dead_stream<R>(ctx: &Arc<CudaContext>, mr: R, n: usize, name: &str)
where
    R: MemoryResource + Accessible<DeviceAccessible> + Copy,
{
    let a = ctx.new_stream().unwrap();
    let a_id = StreamRef::from(&a).id();
    let address = {
        let mut v = DeviceVec::<u32, _>::zeroed(n, mr, &a).unwrap();
        slow_fill!(ctx, &a, &mut v, n, 3);
        v.device_address()
        // `v` is freed here on `a`, whose slow_fill still runs.
    };
    drop(a); // the caller's last handle: the stream lives on only where the resource keeps it
    let b = ctx.new_stream().unwrap();
    assert_ne!(
        StreamRef::from(&b).id(),
        a_id,
        "{name}: a new stream got the handle of a stream the resource still keys a free list by"
    );
    // SAFETY: every value is written by `fill` below before it is read.
    let mut w = unsafe { DeviceVec::<u32, _>::uninit(n, mr, &b) }.unwrap();
    assert_eq!(
        w.device_address(),
        address,
        "{name}: the block freed on the dropped stream was not reused (the test would prove nothing)"
    );
    let f = kernel(ctx, "fill");
    let n32 = n as u32;
    // SAFETY: `fill` writes indices < n of a buffer of n values.
    unsafe {
        b.launch_builder(&f)
            .arg(&mut w)
            .arg(&n32)
            .arg(&5u32)
            .launch(LaunchConfig::for_num_elems(n32))
    }
    .unwrap();
    assert_eq!(
        w.to_vec().unwrap(),
        expected_fill(n, 5),
        "{name}: the dropped stream's work overwrote the block after it was handed to another stream"
    );
    ctx.synchronize().unwrap();
}

#[test]
fn pool_orders_reuse_after_a_dropped_stream() {
    let Some(ctx) = gpu() else { return };
    let mr = Pool::new(Cuda::new(&ctx).unwrap(), PoolConfig::default());
    reuse_after_dead_stream(&ctx, &mr, 1 << 16, "Pool<Cuda>");
}

#[test]
fn pool_over_cuda_async_gives_chunks_back_on_a_dropped_stream() {
    let Some(ctx) = gpu() else { return };
    let mr = Pool::new(CudaAsync::new(&ctx).unwrap(), PoolConfig::default());
    reuse_after_dead_stream(&ctx, &mr, 1 << 16, "Pool<CudaAsync>");
    // The chunk was allocated on the dropped stream and goes back on it (cuMemFreeAsync) here:
    // the pool kept the stream alive for that.
    drop(mr);
    ctx.synchronize().unwrap();
}

#[test]
fn fixed_size_orders_reuse_after_a_dropped_stream() {
    let Some(ctx) = gpu() else { return };
    let mr = resource_stack![
        Cuda::new(&ctx).unwrap(),
        FixedSize {
            block_size: 1 << 18,
            blocks_to_preallocate: 4
        },
    ];
    reuse_after_dead_stream(&ctx, &mr, 1 << 16, "FixedSize<Cuda>");
}

#[test]
fn binning_orders_reuse_after_a_dropped_stream() {
    let Some(ctx) = gpu() else { return };
    let mr = Binning::new(
        Pool::new(Cuda::new(&ctx).unwrap(), PoolConfig::default()),
        BinningConfig::default(),
    );
    reuse_after_dead_stream(&ctx, &mr, 1024, "Binning<Pool<Cuda>>");
}

#[test]
fn arena_orders_reuse_after_a_dropped_stream() {
    let Some(ctx) = gpu() else { return };
    let mr = Arena::new(
        Cuda::new(&ctx).unwrap(),
        ArenaConfig {
            size: 64 << 20,
            ..Default::default()
        },
    );
    // Larger than a superblock: the global arena, whose free ranges are tagged with streams.
    reuse_after_dead_stream(&ctx, &mr, 4 << 20, "Arena<Cuda>");
}

/// A device-to-host copy into a `PinnedVec` on its own stream, behind slow device work: the next
/// host read waits for it.
#[test]
fn a_copy_into_a_pinned_vec_is_waited_for_before_the_host_reads() {
    let Some(ctx) = gpu() else { return };
    let s = ctx.new_stream().unwrap();
    slow_copy_into_pinned((&ctx, &s), (&ctx, &s), 7);
}

/// The same copy queued on another stream than the vector's.
#[test]
fn a_copy_into_a_pinned_vec_on_a_foreign_stream_is_waited_for() {
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    slow_copy_into_pinned((&ctx, &t), (&ctx, &s), 11);
}

/// A kernel writes a `PinnedVec` in place; readers on four threads, sharing it, each see the
/// final values (each may be the one that waits).
#[test]
fn a_kernel_write_to_a_pinned_vec_is_waited_for_by_every_reader() {
    let Some(ctx) = gpu() else { return };
    let s = ctx.new_stream().unwrap();
    let n = 1 << 20;
    let mut pinned = pinned_zeros(&ctx, n, &s);
    slow_fill!(&ctx, &s, &mut pinned, n, 13);
    let want = expected_fill(n, 13);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| assert_eq!(&pinned[..], &want[..]));
        }
    });
}

/// A `PinnedVec` dropped while a kernel still writes it: its block, reused by a new vector on
/// another stream, keeps the new vector's values after the kernel's time has passed.
#[test]
fn a_pinned_block_is_not_reused_while_a_kernel_writes_it() {
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let pool = Pool::new(Pinned::new(&ctx).unwrap(), PoolConfig::default());
    let n = 1 << 18;
    let address = {
        let mut first = PinnedVec::<u32, _>::zeroed(n, &pool, &s).unwrap();
        slow_fill!(&ctx, &s, &mut first, n, 17);
        first.device_address()
    };
    let ones = vec![1u32; n];
    let second = PinnedVec::from_slice(&ones, &pool, &t).unwrap();
    assert_eq!(second.device_address(), address, "the block was reused");
    std::thread::sleep(std::time::Duration::from_millis(300));
    ctx.synchronize().unwrap();
    assert_eq!(&second[..], &ones[..]);
}

/// Host writes through cells wait for a copy that still reads the vector, on its stream.
#[test]
fn host_writes_wait_for_a_copy_that_reads_the_pinned_vec() {
    let Some(ctx) = gpu() else { return };
    let s = ctx.new_stream().unwrap();
    let n = 1 << 20;
    let src = expected_fill(n, 19);
    let mut pinned = PinnedVec::from_slice(&src, Pinned::new(&ctx).unwrap(), &s).unwrap();
    let mut dev = device_zeros(&ctx, n, &s);
    // Slow work first on the stream, so the copy out of the pinned memory runs late.
    let mut scratch = device_zeros(&ctx, 1, &s);
    slow_fill!(&ctx, &s, &mut scratch, 1, 1);
    s.memcpy_htod(&pinned, &mut dev).unwrap();
    pinned.fill(0).unwrap(); // must wait for the copy to have read the old values
    assert_eq!(dev.to_vec().unwrap(), src);
    assert!(pinned.iter().all(|&x| x == 0));
}

/// Launches `fill` (or `slow_fill` with `cycles`) on `stream` over `n` values at `ptr`.
fn fill_raw(
    ctx: &Arc<CudaContext>,
    stream: &Arc<cudarc::driver::CudaStream>,
    ptr: std::ptr::NonNull<u8>,
    n: usize,
    k: u32,
    slow: bool,
) {
    let (addr, n32, cycles) = (ptr.as_ptr() as u64, n as u32, crate::support::slow_cycles());
    let f = kernel(ctx, if slow { "slow_fill" } else { "fill" });
    let mut b = stream.launch_builder(&f);
    b.arg(&addr).arg(&n32).arg(&k);
    if slow {
        b.arg(&cycles);
    }
    // SAFETY: `ptr` is a live allocation of n u32 values; the kernel writes indices < n.
    unsafe { b.launch(LaunchConfig::for_num_elems(n32)) }.unwrap();
}

/// Copies `n` values at `ptr` back after waiting for `stream`.
fn read_raw(
    stream: &Arc<cudarc::driver::CudaStream>,
    ptr: std::ptr::NonNull<u8>,
    n: usize,
) -> Vec<u32> {
    let mut out = vec![0u32; n];
    stream.context().bind_to_thread().unwrap();
    // SAFETY: `ptr` holds n u32 values; the copy is waited for below, before `out` is read.
    unsafe {
        cudarc::driver::result::memcpy_dtoh_async(&mut out, ptr.as_ptr() as u64, stream.cu_stream())
    }
    .unwrap();
    stream.synchronize().unwrap();
    out
}

/// cudarc's per-thread stream is one handle that names a different stream on each thread: a
/// block freed on thread A's is reused on thread B's only after A's work, and containers refuse
/// the handle.
#[test]
fn per_thread_streams_of_two_threads_are_two_streams() {
    let Some(ctx) = gpu() else { return };
    let pool = Pool::new(Cuda::new(&ctx).unwrap(), PoolConfig::default());
    let pt = ctx.per_thread_stream();
    let err = DeviceVec::<u32, _>::zeroed(16, &pool, &pt).unwrap_err();
    assert!(err.to_string().contains("per-thread"), "{err}");
    let n = 1 << 16;
    let bytes = n * 4;
    let address = std::thread::scope(|s| {
        s.spawn(|| {
            let a = ctx.per_thread_stream();
            let p = pool.allocate(bytes, 256, StreamRef::from(&a)).unwrap();
            fill_raw(&ctx, &a, p, n, 3, true);
            // SAFETY: p came from the pool with this size and alignment; freed on the stream
            // whose slow_fill still writes it.
            unsafe { pool.deallocate(p, bytes, 256, StreamRef::from(&a)) };
            p.as_ptr() as usize
        })
        .join()
        .unwrap()
    });
    std::thread::scope(|s| {
        s.spawn(|| {
            let b = ctx.per_thread_stream();
            let p = pool.allocate(bytes, 256, StreamRef::from(&b)).unwrap();
            assert_eq!(
                p.as_ptr() as usize,
                address,
                "the block freed on the other thread's stream was reused"
            );
            fill_raw(&ctx, &b, p, n, 5, false);
            assert_filled(read_raw(&b, p, n), n, 5);
            // SAFETY: as above.
            unsafe { pool.deallocate(p, bytes, 256, StreamRef::from(&b)) };
        })
        .join()
        .unwrap()
    });
    ctx.synchronize().unwrap();
}

/// A block handed through a simulated stream (a replay over a real stack) is still ordered after
/// the real stream that freed it when a third stream takes it.
#[test]
fn a_simulated_stream_does_not_launder_a_blocks_ordering() {
    let Some(ctx) = gpu() else { return };
    let pool = Pool::new(Cuda::new(&ctx).unwrap(), PoolConfig::default());
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 1 << 16;
    let bytes = n * 4;
    let p = pool.allocate(bytes, 256, StreamRef::from(&s)).unwrap();
    fill_raw(&ctx, &s, p, n, 3, true);
    // SAFETY: p came from the pool with this size and alignment; freed while s still writes it.
    unsafe { pool.deallocate(p, bytes, 256, StreamRef::from(&s)) };
    let sim = StreamRef::simulated(1);
    let q = pool.allocate(bytes, 256, sim).unwrap();
    assert_eq!(q, p);
    // SAFETY: as above, on the simulated stream it was allocated on.
    unsafe { pool.deallocate(q, bytes, 256, sim) };
    let r = pool.allocate(bytes, 256, StreamRef::from(&t)).unwrap();
    assert_eq!(r, p);
    fill_raw(&ctx, &t, r, n, 5, false);
    assert_filled(read_raw(&t, r, n), n, 5);
    // SAFETY: as above.
    unsafe { pool.deallocate(r, bytes, 256, StreamRef::from(&t)) };
    ctx.synchronize().unwrap();
}

/// `testing::DeviceStandIn` is DeviceAccessible by its type only: on a machine with a GPU, a
/// container over it is refused at allocation (it serves no CUDA stream), before any copy or
/// memset could be queued on its addresses and fail in the context.
#[test]
fn containers_refuse_the_device_stand_in() {
    let Some(ctx) = gpu() else { return };
    let mr = mrstack::testing::DeviceStandIn::new();
    for stream in [ctx.new_stream().unwrap(), ctx.default_stream()] {
        let err = DeviceVec::<u32, _>::zeroed(1024, &mr, &stream).unwrap_err();
        assert!(matches!(err.kind, AllocErrorKind::Unsupported(_)), "{err}");
        let err = DeviceBox::new(7u64, &mr, &stream).unwrap_err();
        assert!(matches!(err.kind, AllocErrorKind::Unsupported(_)), "{err}");
    }
    assert_eq!((mr.live(), mr.allocation_count()), (0, 0));
    // The context is untouched: real work still runs in it.
    let stream = ctx.new_stream().unwrap();
    let v = DeviceVec::from_slice(&[1u32, 2, 3], Cuda::new(&ctx).unwrap(), &stream).unwrap();
    assert_eq!(v.to_vec().unwrap(), [1, 2, 3]);
}
