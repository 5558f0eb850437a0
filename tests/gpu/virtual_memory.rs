//! GPU tests of the footprint work: `VirtualMemory` over the driver's VMM API (`DevicePages`) and
//! `Tlsf` over `Cuda`. Kernels write every element, the host checks every value; page mapping is
//! checked against the resource's own count and the device's free memory.

use crate::support::{fill_and_check, fill_on_two_streams, gpu};
use cudarc::driver::{result, PushKernelArg};
use mrstack::leaf::{DevicePages, PhysicalPages};
use mrstack::leaf::{VirtualMemory, VirtualMemoryConfig};
use mrstack::prelude::*;
use mrstack::resource::GrowInPlace;

/// Whether the driver maps physical memory at `addr` (`cuMemRetainAllocationHandle`).
fn driver_maps(ctx: &std::sync::Arc<cudarc::driver::CudaContext>, addr: usize) -> bool {
    use cudarc::driver::sys;
    ctx.bind_to_thread().unwrap();
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: a valid place for the handle; the driver checks the address.
    let r = unsafe { sys::cuMemRetainAllocationHandle(&mut handle, addr as *mut std::ffi::c_void) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return false;
    }
    // SAFETY: the reference just retained.
    unsafe { sys::cuMemRelease(handle) }.result().unwrap();
    true
}

/// A `VirtualMemory` over `pages` with no cache: every page whose blocks are all freed goes back.
fn uncached(pages: DevicePages) -> VirtualMemory<DevicePages> {
    let config = VirtualMemoryConfig {
        cache: 0,
        ..Default::default()
    };
    VirtualMemory::new(pages, config).unwrap()
}

#[test]
fn device_pages_report_the_granularity_and_map_real_memory() {
    let Some(ctx) = gpu() else { return };
    let pages = DevicePages::new(&ctx).unwrap();
    let page = pages.page_size();
    println!("device page (granularity): {page} bytes");
    assert!(page.is_power_of_two() && page >= 64 << 10, "{page}");
    let vm = uncached(pages);
    let stream = ctx.new_stream().unwrap();
    // 3 pages and a bit: four pages mapped, written by a kernel and read back.
    let n = (3 * page + 4096) / 4;
    let mut v = DeviceVec::<u32, _>::zeroed(n, &vm, &stream).unwrap();
    assert_eq!(vm.usage().mapped, 4 * page);
    fill_and_check(&ctx, &mut v, 42);
    drop(v);
    assert_eq!(vm.usage().mapped, 0);
    // No cache: the pages went back to the device. The driver is asked whether it maps the
    // pages (a count of free device memory would race with the other tests of the process).
    let s = StreamRef::from(&stream);
    let p = vm.allocate(3 * page, 256, s).unwrap();
    let at = |k: usize| p.as_ptr() as usize + k * page;
    assert!((0..3).all(|k| driver_maps(&ctx, at(k))));
    // SAFETY: live with this size; nothing used it.
    unsafe { vm.deallocate(p, 3 * page, 256, s) };
    assert_eq!(vm.usage().mapped, 0);
    assert!((0..3).all(|k| !driver_maps(&ctx, at(k))));
}

#[test]
fn virtual_memory_serves_kernels_on_two_streams_and_reuses_cached_pages() {
    let Some(ctx) = gpu() else { return };
    // A cache smaller than a round's 20 MiB blocks: pages are trimmed (streams synchronized,
    // pages unmapped) and mapped again between kernels.
    let config = VirtualMemoryConfig {
        cache: 16 << 20,
        ..Default::default()
    };
    let vm = VirtualMemory::new(DevicePages::new(&ctx).unwrap(), config).unwrap();
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    fill_on_two_streams(&ctx, &vm, (&a, &b), 4, 5 << 20);
    let u = vm.usage();
    assert_eq!(u.allocated, 0);
    assert!(u.cached <= 16 << 20, "{u:?}");
    assert_eq!(u.mapped, u.cached, "only cached pages stay mapped");
    vm.release();
    assert_eq!(vm.usage().mapped, 0);
}

#[test]
fn a_hole_between_live_blocks_serves_a_larger_request_on_the_gpu() {
    let Some(ctx) = gpu() else { return };
    let pages = DevicePages::new(&ctx).unwrap();
    let page = pages.page_size();
    // Physical memory capped at 8 pages: a 6-page hole between two live blocks must serve a
    // 6-page request after the hole is freed, by mapping pages anew.
    let vm = VirtualMemory::new(
        pages,
        VirtualMemoryConfig {
            max: 8 * page,
            cache: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let stream = ctx.new_stream().unwrap();
    let words = |pages: usize| pages * page / 4;
    let mut left = DeviceVec::<u32, _>::zeroed(words(1), &vm, &stream).unwrap();
    let hole = DeviceVec::<u32, _>::zeroed(words(6), &vm, &stream).unwrap();
    let mut right = DeviceVec::<u32, _>::zeroed(words(1), &vm, &stream).unwrap();
    fill_and_check(&ctx, &mut left, 1);
    fill_and_check(&ctx, &mut right, 2);
    assert!(DeviceVec::<u32, _>::zeroed(words(1), &vm, &stream)
        .unwrap_err()
        .is_out_of_memory());
    drop(hole);
    let mut big = DeviceVec::<u32, _>::zeroed(words(6), &vm, &stream).unwrap();
    fill_and_check(&ctx, &mut big, 3);
    assert_eq!(vm.usage().mapped, 8 * page);
    // The neighbours kept their values through the unmapping and mapping next to them.
    fill_and_check(&ctx, &mut left, 4);
    fill_and_check(&ctx, &mut right, 5);
}

#[test]
fn grow_in_place_keeps_the_values_and_maps_the_rest() {
    let Some(ctx) = gpu() else { return };
    let vm = VirtualMemory::new(
        DevicePages::new(&ctx).unwrap(),
        VirtualMemoryConfig::default(),
    )
    .unwrap();
    let stream = ctx.default_stream();
    let raw = StreamRef::from(&stream);
    let (n, grown) = (1 << 20, 3 << 20);
    let p = vm.allocate(n * 4, 256, raw).unwrap();
    let host: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
    ctx.bind_to_thread().unwrap();
    // SAFETY: `p` is a live device allocation of n * 4 bytes; the copy completes before return
    // (synchronize below) while `host` lives.
    unsafe {
        result::memcpy_htod_async(p.as_ptr() as u64, &host, stream.cu_stream()).unwrap();
    }
    stream.synchronize().unwrap();
    // SAFETY: `p` is live, owned here, and freed on `raw` below.
    assert!(unsafe { vm.grow_in_place(p, n * 4, 256, grown * 4, raw) }.unwrap());
    let tail: Vec<u32> = (0..(grown - n) as u32).map(|i| !i).collect();
    let mut back = vec![0u32; grown];
    // SAFETY: the allocation is now grown * 4 bytes; the copies complete before the reads.
    unsafe {
        result::memcpy_htod_async(
            p.as_ptr() as u64 + (n * 4) as u64,
            &tail,
            stream.cu_stream(),
        )
        .unwrap();
        result::memcpy_dtoh_async(&mut back, p.as_ptr() as u64, stream.cu_stream()).unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(&back[..n], &host[..], "the old values stayed");
    assert_eq!(&back[n..], &tail[..], "the new pages hold what was written");
    // SAFETY: live, grown to this size.
    unsafe { vm.deallocate(p, grown * 4, 256, raw) };
    assert_eq!(vm.usage().allocated, 0);
}

#[test]
fn tlsf_serves_kernels_on_two_streams() {
    let Some(ctx) = gpu() else { return };
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mr = resource_stack![Cuda::new(&ctx).unwrap(), Tlsf { initial: 64 MiB, max: 1 GiB }];
    for round in 0..3u32 {
        for (k, stream) in [(round * 2 + 3, &a), (round * 2 + 4, &b)] {
            let mut small = DeviceVec::<u32, _>::zeroed(1000, &mr, stream).unwrap();
            let mut large = DeviceVec::<u32, _>::zeroed(3 << 20, &mr, stream).unwrap();
            fill_and_check(&ctx, &mut small, k);
            fill_and_check(&ctx, &mut large, k + 100);
        }
    }
    assert_eq!(mr.usage().allocated, 0);
}

#[test]
fn a_text_config_builds_virtual_memory_on_the_device() {
    let Some(ctx) = gpu() else { return };
    let mr = mrstack::config::build::<DeviceAccessible>("vmm(device=0, cache=0 B)").unwrap();
    assert_eq!(mr.describe().to_string(), "vmm(device=0, cache=0 B)");
    let stream = ctx.new_stream().unwrap();
    let mut v = DeviceVec::<u32, _>::zeroed(3 << 20, &mr, &stream).unwrap();
    fill_and_check(&ctx, &mut v, 9);
    let vm: &VirtualMemory<DevicePages> = mr.downcast_ref().unwrap();
    assert_eq!(vm.usage().mapped, 12 << 20, "twelve MiB of 2 MiB pages");
    drop(v);
    assert_eq!(vm.usage().mapped, 0, "no cache: the pages went back");
}

/// The first `n` values are `fill`'s with `k`, the rest zero.
fn filled_then_zero(n: usize, len: usize, k: u32) -> Vec<u32> {
    let mut want = crate::support::expected_fill(n, k);
    want.resize(len, 0);
    want
}

#[test]
fn a_device_vec_grows_in_place_on_virtual_memory_after_a_kernel_on_another_stream() {
    let Some(ctx) = gpu() else { return };
    let vm = VirtualMemory::new(
        DevicePages::new(&ctx).unwrap(),
        VirtualMemoryConfig::default(),
    )
    .unwrap();
    let (own, other) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 300_000;
    let mut v = DeviceVec::<u32, _>::zeroed(n, &vm, &own).unwrap();
    let address = v.device_address();
    // Still writing on `other` when the vector grows on `own`: the growth and its memset wait.
    crate::slow_fill!(&ctx, &other, &mut v, n, 7);
    let len = 5 << 20; // 20 MiB: pages mapped behind the first 1.2 MB
    assert!(
        v.grow_zeroed_in_place(len).unwrap(),
        "the range after it is free"
    );
    assert_eq!(v.device_address(), address, "grown without moving");
    assert_eq!(v.len(), len);
    assert_eq!(v.to_vec().unwrap(), filled_then_zero(n, len, 7));
    // The new pages serve kernels like the old.
    fill_and_check(&ctx, &mut v, 11);
    assert_eq!(vm.usage().allocated, len * 4);
    drop(v);
    assert_eq!(vm.usage().allocated, 0);
}

#[test]
fn a_device_vec_moves_when_a_neighbour_blocks_it_and_keeps_its_values() {
    let Some(ctx) = gpu() else { return };
    let mr = resource_stack![Cuda::new(&ctx).unwrap(), Tlsf { initial: 64 MiB, max: 1 GiB }];
    let (own, other) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 100_000;
    let mut v = DeviceVec::<u32, _>::zeroed(n, &mr, &own).unwrap();
    let mut neighbour = DeviceVec::<u32, _>::zeroed(1000, &mr, &own).unwrap();
    assert_eq!(
        neighbour.device_address(),
        v.device_address() + (n * 4).next_multiple_of(256) as u64,
        "Tlsf carves the next block right after"
    );
    crate::slow_fill!(&ctx, &other, &mut v, n, 5);
    assert!(
        !v.grow_zeroed_in_place(2 * n).unwrap(),
        "the neighbour is live"
    );
    assert_eq!(v.len(), n, "a refused growth changes nothing");
    let address = v.device_address();
    v.grow_zeroed(4 * n).unwrap();
    assert_ne!(v.device_address(), address, "moved");
    assert_eq!(v.to_vec().unwrap(), filled_then_zero(n, 4 * n, 5));
    fill_and_check(&ctx, &mut neighbour, 9);
    // With the neighbour gone, the moved vector grows into what follows it.
    drop(neighbour);
    fill_and_check(&ctx, &mut v, 13);
    assert!(v.grow_zeroed_in_place(5 * n).unwrap());
    assert_eq!(
        v.to_vec().unwrap(),
        filled_then_zero(4 * n, 5 * n, 13),
        "the values of the kernel before the growth, then zeros"
    );
    assert!(v.grow_zeroed(3 * n).is_err(), "a vector only grows");
    drop(v);
    assert_eq!(mr.usage().allocated, 0);
}

#[test]
fn a_mark_shared_by_threads_is_queried_and_waited_for_from_each() {
    let Some(ctx) = gpu() else { return };
    let pages = DevicePages::new(&ctx).unwrap();
    let s = ctx.new_stream().unwrap();
    let n = 1 << 20;
    let mut v = DeviceVec::<u32, _>::zeroed(n, uncached(pages.clone()), &s).unwrap();
    crate::slow_fill!(&ctx, &s, &mut v, n, 5);
    let mark = pages.mark(StreamRef::from(&s)).unwrap().unwrap();
    // Four threads query the one mark at once, then wait for it; each finds the work done.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let (pages, mark) = (&pages, &mark);
            scope.spawn(move || {
                while !pages.reached(mark).unwrap() {
                    std::hint::spin_loop();
                }
                pages.wait(mark).unwrap();
                assert!(pages.reached(mark).unwrap());
            });
        }
    });
    // The mark stood for the kernel: what it wrote is there.
    assert_eq!(v.to_vec().unwrap(), crate::support::expected_fill(n, 5));
    drop(mark);
    ctx.check_err().unwrap();
}

/// Tests whose kernel must still run while the host checks (a timed spin): the suite runs them
/// alone (`::alone::`), since a test beside them that synchronizes the whole context can hold
/// their thread up past the spin, and the kernel ends before the check.
mod alone {
    use super::*;

    #[test]
    fn pages_freed_under_a_running_kernel_stay_mapped_until_it_ends() {
        let Some(ctx) = gpu() else { return };
        let pages = DevicePages::new(&ctx).unwrap();
        let page = pages.page_size();
        // No cache: every page whose blocks are freed goes back, but only once the freeing stream's
        // work is done, and the allocating thread never waits for it.
        let vm = uncached(pages);
        let s = ctx.new_stream().unwrap();
        let n = 4 * page / 4;
        let mut v = DeviceVec::<u32, _>::zeroed(n, &vm, &s).unwrap();
        crate::slow_fill!(&ctx, &s, &mut v, n, 3); // still running when `v` drops
        drop(v);
        // The kernel still writes those pages: they are still mapped.
        assert_eq!(vm.usage().mapped, 4 * page);
        // Calls meanwhile query the kernel's event without waiting; then a block on the same stream
        // is checked value by value after the kernel, which faults if its pages went early.
        for _ in 0..100 {
            let small = DeviceVec::<u32, _>::zeroed(1000, &vm, &s).unwrap();
            drop(small);
        }
        let mut w = DeviceVec::<u32, _>::zeroed(1000, &vm, &s).unwrap();
        fill_and_check(&ctx, &mut w, 9);
        drop(w);
        s.synchronize().unwrap();
        ctx.check_err().unwrap();
        vm.release();
        assert_eq!(vm.usage().mapped, 0);
    }
}

#[test]
fn paged_heaps_serve_kernels_on_many_threads_and_take_frees_from_any() {
    use mrstack::leaf::{PagedHeaps, PagedHeapsConfig};
    let Some(ctx) = gpu() else { return };
    let heaps = PagedHeaps::new(DevicePages::new(&ctx).unwrap(), PagedHeapsConfig::default());
    let handed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let (heaps, ctx, handed) = (&heaps, &ctx, &handed);
            scope.spawn(move || {
                let s = ctx.new_stream().unwrap();
                for round in 0..3u32 {
                    let k = t * 10 + round + 2;
                    let mut small =
                        DeviceVec::<u32, _>::zeroed(1000 + t as usize, heaps, &s).unwrap();
                    let mut large = DeviceVec::<u32, _>::zeroed((3 << 20) + 7, heaps, &s).unwrap();
                    fill_and_check(ctx, &mut small, k);
                    fill_and_check(ctx, &mut large, k + 100);
                    // Every other block is freed by another thread.
                    s.synchronize().unwrap();
                    handed
                        .lock()
                        .unwrap()
                        .push((k, small.to_vec().unwrap(), large));
                }
            });
        }
    });
    let handed = handed.into_inner().unwrap();
    assert_eq!(handed.len(), 12);
    for (k, small, large) in handed {
        assert_eq!(small, crate::support::expected_fill(small.len(), k));
        assert_eq!(
            large.to_vec().unwrap(),
            crate::support::expected_fill(large.len(), k + 100)
        );
        drop(large); // freed here, on the main thread, into the heap that made it
    }
    let u = heaps.usage();
    assert_eq!(u.allocated, 0, "{u:?}");
    assert!(heaps.heaps() >= 1);
    heaps.release();
    assert_eq!(heaps.usage().mapped, 0);
    ctx.check_err().unwrap();
}

#[test]
fn paged_heaps_from_text_describe_themselves() {
    let Some(_ctx) = gpu() else { return };
    let mr =
        mrstack::config::build::<DeviceAccessible>("paged(device=0, peak_slack=8 MiB)").unwrap();
    assert_eq!(
        mr.describe().to_string(),
        "paged(device=0, peak_slack=8 MiB)"
    );
    let s = StreamRef::DEFAULT;
    let p = mr.allocate(5 << 20, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { mr.deallocate(p, 5 << 20, 256, s) };
}
