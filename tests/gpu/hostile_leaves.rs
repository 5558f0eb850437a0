//! Attacks on the CUDA leaves: managed memory on a device whose
//! host may not touch it while kernels run, a pool of this process imported back after it was
//! dropped, and the 256-byte alignment every driver leaf promises whatever a request asks.

use crate::slow_fill;
use crate::support::gpu;
use cudarc::driver::{sys, PushKernelArg};
use mrstack::leaf::CudaAsyncOptions;
use mrstack::leaf::CudaAsyncView;
use mrstack::prelude::*;

/// `Managed` says `Host = B1` on every device, but on a device without
/// CONCURRENT_MANAGED_ACCESS (Windows/WDDM, some Tegra, pre-Pascal) the CPU may not touch
/// `cuMemAllocManaged(ATTACH_GLOBAL)` memory while ANY kernel runs on the device. A safe
/// `as_host_slice` waits only for the vector's own stream: reading it while a kernel of another
/// vector runs on another stream faults (SIGSEGV/SIGBUS). `CudaAsyncManaged::new` refuses such
/// devices, and so does `Managed::new` now. Returns at once on devices with concurrent access
/// (an H100): the fault needs such a device.
#[test]
fn managed_refuses_or_survives_a_device_without_concurrent_managed_access() {
    let Some(ctx) = gpu() else { return };
    let concurrent = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)
        .unwrap();
    if concurrent != 0 {
        eprintln!("device has concurrent managed access: the hole cannot show here");
        return;
    }
    let Ok(managed) = Managed::new(&ctx) else {
        return; // refused: fixed
    };
    let (s1, s2) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let host_side = DeviceVec::<u32, _>::zeroed(1 << 20, &managed, &s1).unwrap();
    let cuda = Cuda::new(&ctx).unwrap();
    let mut busy = DeviceVec::<u32, _>::zeroed(1 << 20, &cuda, &s2).unwrap();
    let slice = host_side.as_host_slice().unwrap();
    slow_fill!(&ctx, s2, &mut busy, 1 << 20, 3);
    // A kernel runs on the device now: this safe read faults on such a device.
    let sum: u64 = slice.iter().map(|&x| u64::from(x)).sum();
    assert_eq!(sum, 0);
}

/// `from_fd` refuses this process's own pool only while its `CudaAsync` lives
/// (`destroy_own` removes the `Own` entry). With a block of the pool leaked, the driver defers
/// the pool's release; an fd exported earlier still names it. If the import is accepted and the
/// driver hands back the old handle, `ImportedPool::drop` calls `cuMemPoolDestroy` on a handle the
/// `CudaAsync` destroyed already ("destroyed once" in its SAFETY comment is false).
#[test]
fn an_own_pool_dropped_with_a_leaked_block_is_not_imported_as_anothers() {
    let Some(ctx) = gpu() else { return };
    let options = CudaAsyncOptions {
        exportable: true,
        ..Default::default()
    };
    let mr = CudaAsync::with_options(&ctx, options).unwrap();
    let old = format!("{:?}", mr.pool_handle());
    let fd = mr.export_pool().unwrap();
    // Leaked: the pool's release is deferred while it is allocated.
    let _leaked = mr.allocate_sync(1 << 20, 256).unwrap();
    drop(mr);
    match mrstack::leaf::ImportedPool::from_fd(&ctx, fd) {
        Err(e) => println!("refused: {e}"),
        Ok(imported) => {
            let text = format!("{imported:?}");
            println!("accepted: {text} (old handle {old})");
            assert!(
                !text.contains(&format!("pool: {old}")),
                "the import got the destroyed pool's own handle back: its drop destroys it again"
            );
        }
    }
}

/// Every driver leaf promises 256-byte alignment (its `Alignment`), for an `align` of 1 too: the
/// allocation path now checks against that, not the request's alignment.
#[test]
fn driver_leaves_meet_their_256_alignment_for_align_one() {
    let Some(ctx) = gpu() else { return };
    fn check<R: MemoryResource>(r: &R) {
        let mut got = Vec::new();
        for size in 1..=64usize {
            let p = r.allocate_sync(size, 1).unwrap();
            assert_eq!(p.as_ptr() as usize % 256, 0, "{} size {size}", r.name());
            got.push((p, size));
        }
        for (p, size) in got {
            // SAFETY: allocated above with this size and align 1.
            unsafe { r.deallocate_sync(p, size, 1) };
        }
    }
    check(&Cuda::new(&ctx).unwrap());
    check(&Pinned::new(&ctx).unwrap());
    check(&Managed::new(&ctx).unwrap());
    check(&CudaAsync::new(&ctx).unwrap());
    check(&CudaAsyncView::default_pool(&ctx).unwrap());
}
