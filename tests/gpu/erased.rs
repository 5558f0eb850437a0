//! GPU tests of run-time choice: the per-device registry on every device the machine has, the
//! `Callback` resource over foreign allocators (cudarc's stream-ordered allocation, the driver's
//! pinned allocation), `AnyResource` and text-built stacks under containers and kernels, and
//! `HostAllocator` on pinned memory. Every test writes, copies back and compares.
//!
//! Without a CUDA driver each test prints why and returns; with `MRSTACK_REQUIRE_GPU=1` a missing
//! GPU fails the test instead.

use cudarc::driver::{result, CudaContext};
use mrstack::prelude::*;
use mrstack::registry::{self, DeviceResource};
use mrstack::{erased::AnyResource, leaf::Callback, resource::AllocErrorKind};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use typenum::U256;

#[path = "../../examples/shared/cudarc_allocator.rs"]
mod cudarc_allocator;
use crate::increment;
use crate::support::{fill_and_check, gpu};
use cudarc_allocator::cudarc_allocator;

/// The process-wide registry is shared by the tests of this binary, which run on threads: the
/// tests that set or reset it take this lock.
static REGISTRY: Mutex<()> = Mutex::new(());

#[test]
fn the_registry_serves_every_device_from_its_own_slot() {
    let Some(_) = gpu() else { return };
    let _lock = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let devices = mrstack::device_count();
    assert!(devices >= 1);
    eprintln!("registry test on {devices} device(s)");
    for d in 0..devices {
        let ctx = mrstack::cuda_context(d).unwrap();
        let stream = ctx.new_stream().unwrap();
        registry::reset_per_device_resource(d).unwrap();

        // The default: a Cuda resource for this device, made on first use, shared after.
        let default = registry::per_device_resource(d).unwrap();
        assert_eq!(default.name(), "Cuda");
        assert!(default.ptr_eq(&registry::per_device_resource(d).unwrap()));
        let host: Vec<u32> = (0..100_003u32)
            .map(|i| i.wrapping_mul(2654435761))
            .collect();
        let v = DeviceVec::from_slice_in_current(&host, &stream).unwrap();
        assert_eq!(v.resource().name(), "Cuda");
        assert_eq!(v.to_vec().unwrap(), host);
        // The memory is on the stream's device: a kernel there writes it.
        let mut w = DeviceVec::<u32, _>::zeroed_in_current(4097, &stream).unwrap();
        fill_and_check(&ctx, &mut w, 5 + d as u32);

        // Set: a stream-ordered pool takes over; the previous resource comes back.
        let pool = AnyResource::new(CudaAsync::new(&ctx).unwrap());
        let previous = registry::set_per_device_resource(d, pool.clone()).unwrap();
        assert!(previous.unwrap().ptr_eq(&default));
        let z = DeviceVec::<u64, _>::zeroed_in_current(10_000, &stream).unwrap();
        assert!(z.resource().ptr_eq(&pool));
        assert!(z.to_vec().unwrap().iter().all(|&x| x == 0));
        let b = DeviceBox::new_in_current(0xfeed_beef_u64 + d as u64, &stream).unwrap();
        assert_eq!(b.get().unwrap(), 0xfeed_beef + d as u64);
        // SAFETY: `fill_and_check` writes every value before reading.
        let mut u = unsafe { DeviceVec::<u32, _>::uninit_in_current(777, &stream) }.unwrap();
        fill_and_check(&ctx, &mut u, 3);

        // Memory from the replaced default stays valid: `v` holds its resource.
        assert_eq!(v.to_vec().unwrap(), host);

        // The thread's current device picks the same slot.
        ctx.bind_to_thread().unwrap();
        assert_eq!(registry::current_device().unwrap(), d);
        assert!(registry::current_device_resource().unwrap().ptr_eq(&pool));

        // Reset: the pool comes back; the next get makes a new default.
        drop((z, b, u));
        let was = registry::reset_per_device_resource(d).unwrap();
        assert!(was.unwrap().ptr_eq(&pool));
        assert_eq!(registry::per_device_resource(d).unwrap().name(), "Cuda");
    }

    // Ids past the last device are errors, not panics.
    for bad in [devices, devices + 7] {
        let e = registry::per_device_resource(bad).unwrap_err();
        assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
        let any = AnyResource::new(Cuda::on_device(0).unwrap());
        assert!(registry::set_per_device_resource(bad, any).is_err());
    }
}

#[test]
fn threads_race_on_the_registry_with_real_memory() {
    let Some(ctx) = gpu() else { return };
    let _lock = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let cuda: DeviceResource = AnyResource::new(Cuda::new(&ctx).unwrap());
    let pool: DeviceResource = AnyResource::new(CudaAsync::new(&ctx).unwrap());
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (ctx, cuda, pool) = (ctx.clone(), cuda.clone(), pool.clone());
            s.spawn(move || {
                let stream = ctx.new_stream().unwrap();
                for i in 0..20u32 {
                    if (t + i) % 3 == 0 {
                        let next = if i % 2 == 0 { &cuda } else { &pool };
                        registry::set_per_device_resource(0, next.clone()).unwrap();
                    }
                    let host: Vec<u32> = (0..10_000).map(|x| x ^ (t << 24) ^ i).collect();
                    let v = DeviceVec::from_slice_in_current(&host, &stream).unwrap();
                    assert_eq!(v.to_vec().unwrap(), host);
                }
            });
        }
    });
    registry::reset_per_device_resource(0).unwrap();
}

#[test]
fn callback_wraps_cudarcs_stream_ordered_allocation() {
    let Some(ctx) = gpu() else { return };
    let own = ctx.new_stream().unwrap();
    let mr = cudarc_allocator(own.clone());
    for (round, stream) in [own.clone(), ctx.new_stream().unwrap()].iter().enumerate() {
        let host: Vec<u32> = (0..250_000u32).map(|i| i * 7 + round as u32).collect();
        let v = DeviceVec::from_slice(&host, &mr, stream).unwrap();
        assert_eq!(v.device_address() % 256, 0);
        assert_eq!(v.to_vec().unwrap(), host);
        let mut w = DeviceVec::<u32, _>::zeroed(65_537, &mr, stream).unwrap();
        fill_and_check(&ctx, &mut w, 11);
    }
    // Under erasure and in the registry's slot type, it is one more device resource.
    let any: DeviceResource = AnyResource::new(cudarc_allocator(own.clone()));
    let mut v = DeviceVec::<u32, _>::zeroed(1000, any, &own).unwrap();
    fill_and_check(&ctx, &mut v, 9);
    assert_eq!(v.resource().name(), "cudarc");
}

/// Pinned memory from the driver, through a Callback: host and device may both touch it.
fn pinned_callback(
    ctx: Arc<CudaContext>,
) -> Callback<Arc<CudaContext>, (HostAccessible, DeviceAccessible), U256> {
    fn allocate(
        ctx: &Arc<CudaContext>,
        size: usize,
        align: usize,
        _: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        let err = |e| AllocError::cuda(e, size, align, "pinned callback");
        ctx.bind_to_thread().map_err(err)?;
        let flags = cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE
            | cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a plain allocation with the context current; the memory is not read.
        let p = unsafe { result::malloc_host(size, flags) }.map_err(err)?;
        NonNull::new(p.cast()).ok_or(AllocError::out_of_memory(size, align, "pinned callback"))
    }
    /// # Safety
    /// `p` came from `allocate` and was not freed since.
    unsafe fn deallocate(ctx: &Arc<CudaContext>, p: NonNull<u8>, _: usize, _: usize, _: StreamRef) {
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: p came from malloc_host above and is freed once.
        ctx.record_err(unsafe { result::free_host(p.as_ptr().cast()) });
    }
    // SAFETY: cuMemHostAlloc(PORTABLE | DEVICEMAP) returns page-locked host memory mapped for the
    // device (unified addressing), page-aligned (checked by Callback), valid until cuMemFreeHost;
    // neither call is stream-ordered, and the default synchronize waits for kernels using it.
    unsafe { Callback::new(ctx, allocate, deallocate) }.with_name("pinned callback")
}

#[test]
fn callback_pinned_memory_is_shared_by_host_and_kernels() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let mr = pinned_callback(ctx.clone());
    let n = 200_001usize;
    let mut v = PinnedVec::<u32, _>::zeroed(n, &mr, &stream).unwrap();
    for (i, x) in v.as_cells().unwrap().iter().enumerate() {
        x.set(i as u32 * 5);
    }
    increment!(&ctx, &stream, &mut v, n);
    // The host read waits for the kernel through the Callback's default synchronize.
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32 * 5 + 1));
    let d = DeviceVec::from_slice(&v, Cuda::new(&ctx).unwrap(), &stream).unwrap();
    assert_eq!(d.to_vec().unwrap(), &v[..]);
}

#[test]
fn erased_and_text_built_stacks_carry_kernels() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let cuda: AnyResource<DeviceAccessible> = AnyResource::new(Cuda::new(&ctx).unwrap());
    assert_eq!(cuda.properties().alignment, 256);
    let mut v = DeviceVec::<u32, _>::zeroed(50_000, cuda.as_resource_ref(), &stream).unwrap();
    fill_and_check(&ctx, &mut v, 2);

    let both = AnyResource::<(HostAccessible, DeviceAccessible)>::new(Pinned::new(&ctx).unwrap());
    let p = PinnedVec::from_slice(&[3u32, 1, 4, 1, 5], both.clone(), &stream).unwrap();
    let on_device = DeviceVec::from_slice(&p, both.forget::<DeviceAccessible>(), &stream).unwrap();
    assert_eq!(on_device.to_vec().unwrap(), [3, 1, 4, 1, 5]);

    for text in [
        "cuda",
        "cuda(device=0)",
        "cuda_async(initial=4MiB, release_threshold=64MiB)",
        "managed",
        "pinned",
    ] {
        let mr = mrstack::config::build::<DeviceAccessible>(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        let mut v = DeviceVec::<u32, _>::zeroed(65_536, &mr, &stream).unwrap();
        fill_and_check(&ctx, &mut v, 13);
    }
    let e = mrstack::config::build::<DeviceAccessible>(&format!(
        "cuda(device={})",
        mrstack::device_count()
    ))
    .unwrap_err();
    assert!(
        matches!(e.kind, mrstack::config::ConfigErrorKind::Resource { .. }),
        "{e}"
    );
}

/// Text configs build suballocators with their fallible constructors: on a GPU, an initial
/// reservation the device can hold is made at build time and serves kernels; one it cannot hold
/// is an error naming the item, not a panic or an abort.
#[test]
fn text_built_suballocators_reserve_at_build_time_or_fail_cleanly() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    for text in [
        "cuda_async > pool(initial=64MiB)",
        "cuda > pool(initial=32MiB, max=256MiB) > binning",
        "cuda > arena(size=64MiB)",
        "cuda > fixed_size(block_size=1MiB, blocks_to_preallocate=16)",
    ] {
        let mr = mrstack::config::build::<DeviceAccessible>(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        let mut v = DeviceVec::<u32, _>::zeroed(65_536, &mr, &stream).unwrap();
        fill_and_check(&ctx, &mut v, 17);
    }
    for text in [
        "cuda_async > pool(initial=1000TiB)",
        "cuda > pool(initial=1000TiB)",
        "cuda > arena(size=1000TiB)",
        "cuda > fixed_size(block_size=1GiB, blocks_to_preallocate=1000000)",
    ] {
        let e = mrstack::config::build::<DeviceAccessible>(text).unwrap_err();
        assert!(
            matches!(e.kind, mrstack::config::ConfigErrorKind::Resource { .. }),
            "{text}: {e}"
        );
    }
}

#[test]
fn cuda_leaves_describe_themselves_as_text_builds_them() {
    let Some(_) = gpu() else { return };
    type Managed3 = (HostAccessible, DeviceAccessible, Migratable);
    for (text, expected) in [
        ("cuda", "cuda(device=0)"),
        (
            "cuda_async(initial=4MiB, release_threshold=64MiB) > pool(max=1GiB) > statistics",
            "cuda_async(device=0, initial=4 MiB, release_threshold=64 MiB) > pool(max=1 GiB) > statistics",
        ),
        ("managed > prefetch", "managed(device=0) > prefetch(device=0)"),
        ("pinned > binning", "pinned(device=0) > binning(min=256 B, max=1 MiB)"),
    ] {
        let mr = mrstack::config::build::<DeviceAccessible>(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(mr.describe().to_string(), expected);
        let again = mrstack::config::build::<DeviceAccessible>(expected).unwrap();
        assert_eq!(again.describe().to_string(), expected);
    }
    // `prefetch` sits over what is below it cast to managed memory: that is the type to find.
    let mr = mrstack::config::build::<DeviceAccessible>("managed > prefetch(device=0)").unwrap();
    let prefetch = mr
        .find::<mrstack::adaptor::Prefetch<AnyResource<Managed3>>>()
        .unwrap();
    assert_eq!(prefetch.device(), 0);
    assert!(mr.find::<Managed>().is_some());
    let ctx = mrstack::cuda_context(0).unwrap();
    let stack = resource_stack![Cuda::new(&ctx).unwrap(), Pool { max: 64 MiB }];
    assert_eq!(
        stack.describe().to_string(),
        "cuda(device=0) > pool(max=64 MiB)"
    );
}
