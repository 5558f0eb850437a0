//! GPU test of `GraphPools`: a graph captured once, with scratch memory allocated and freed inside
//! the capture, replayed 100 times with new input each time, every result checked, while other
//! work allocates from the same shared pool below and writes its blocks between replays. The
//! scratch never goes to that work, and comes back only when the graph is dropped. And containers
//! whose stream captures: a host read that cannot wait for the stream (the tests here run alone:
//! a capture makes other threads' work on the legacy default stream fail).

use crate::slow_fill;
use crate::support::{expected_fill, gpu, kernel, pinned_zeros};
use cudarc::driver::sys::CUstreamCaptureMode;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use mrstack::prelude::*;
use mrstack::suballoc::Pool;
use mrstack::{adaptor::GraphPools, suballoc::PoolConfig};

#[test]
fn a_graph_replayed_a_hundred_times_keeps_its_memory_while_other_work_allocates() {
    let Some(ctx) = gpu() else { return };
    // One stream, no cudarc events: the capture records the kernels and the memsets only (an
    // event recorded outside a capture cannot be waited for inside it).
    // SAFETY: this test's own context object; every use below is on one stream, or synchronous.
    unsafe { ctx.disable_event_tracking() };
    let scale = kernel(&ctx, "scale");
    let fill = kernel(&ctx, "fill");
    let stream = ctx.new_stream().unwrap();
    let other = ctx.new_stream().unwrap();
    // The shared pool below: a block the capture freed would be the first this pool hands out
    // again, were it given back.
    let shared = Pool::new(Cuda::new(&ctx).unwrap(), PoolConfig::default());
    let mr = GraphPools::new(&shared);
    let n = 1 << 20;
    let mut input = DeviceVec::<u32, _>::zeroed(n, &mr, &stream).unwrap();
    let mut out = DeviceVec::<u32, _>::zeroed(n, &mr, &stream).unwrap();
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let n32 = n as u32;
    let (graph, scratch_at) = mr
        .capture(
            &stream,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            0,
            || {
                let mut scratch = DeviceVec::<u32, _>::zeroed(n, &mr, &stream).unwrap();
                // SAFETY: `scale` takes (const unsigned*, unsigned*, unsigned) over n values.
                unsafe {
                    stream
                        .launch_builder(&scale)
                        .arg(&input)
                        .arg(&mut scratch)
                        .arg(&n32)
                        .launch(cfg)
                        .unwrap();
                    stream
                        .launch_builder(&scale)
                        .arg(&scratch)
                        .arg(&mut out)
                        .arg(&n32)
                        .launch(cfg)
                        .unwrap();
                }
                let at = scratch.device_address();
                drop(scratch); // freed inside the capture: the graph's, not the shared pool's
                at
            },
        )
        .unwrap();
    assert_eq!(mr.held().0, 1, "the capture's pool is held");
    let scratch = scratch_at..scratch_at + (n * 4) as u64;
    for round in 0..100u32 {
        let host: Vec<u32> = (0..n as u32)
            .map(|i| i ^ round.wrapping_mul(2654435761))
            .collect();
        input.copy_from(&host).unwrap();
        graph.launch().unwrap();
        // Other work allocates from the shared pool and writes its blocks, on another stream.
        let mut noise = DeviceVec::<u32, _>::zeroed(n, &mr, &other).unwrap();
        let at = noise.device_address();
        assert!(
            !scratch.contains(&at) && !scratch.contains(&(at + (n * 4) as u64 - 1)),
            "round {round}: the graph's scratch was handed to other work"
        );
        // SAFETY: `fill` takes (unsigned*, unsigned, unsigned) over n values.
        unsafe {
            other
                .launch_builder(&fill)
                .arg(&mut noise)
                .arg(&n32)
                .arg(&round)
                .launch(cfg)
                .unwrap();
        }
        other.synchronize().unwrap();
        drop(noise);
        let want: Vec<u32> = host
            .iter()
            .map(|&x| 4u32.wrapping_mul(x).wrapping_add(21))
            .collect();
        assert!(out.to_vec().unwrap() == want, "round {round}: wrong values");
    }
    // The graph gone, its memory goes back to the shared pool.
    let before = shared.usage().allocated;
    drop(graph);
    assert_eq!(mr.held(), (0, 0));
    assert!(
        shared.usage().allocated + n * 4 <= before,
        "the capture's chunk went back: {before} -> {}",
        shared.usage().allocated
    );
    drop((input, out));
    stream.synchronize().unwrap();
    other.synchronize().unwrap();
    assert_eq!(shared.usage().allocated, 0);
    // SAFETY: turned back on for this context object, whose streams are idle.
    unsafe { ctx.enable_event_tracking() };
}

#[test]
fn graph_pools_hold_against_a_hostile_closure() {
    let Some(ctx) = gpu() else { return };
    // SAFETY: this test's own context object; every use below is on one stream, or synchronous.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().unwrap();
    let shared = Pool::new(Cuda::new(&ctx).unwrap(), PoolConfig::default());
    let mr = GraphPools::new(&shared);
    let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    let n = 1 << 18;

    // A block of capture A, freed inside capture B: B's graph uses it up to that free, so A's
    // memory stays held until B's graph is gone too.
    let (g1, buf) = mr
        .capture(&stream, relaxed, 1 << 20, || {
            DeviceVec::<u32, _>::zeroed(n, &mr, &stream).unwrap()
        })
        .unwrap();
    let (g2, ()) = mr.capture(&stream, relaxed, 0, || drop(buf)).unwrap();
    g1.launch().unwrap();
    g2.launch().unwrap();
    drop(g1);
    assert_eq!(mr.held().0, 2, "A's pool is kept for B's graph");
    drop(g2);
    assert_eq!(mr.held(), (0, 0), "both gone once both graphs are");

    // A launch into another capture is refused (the other graph would outlive this memory).
    let (g3, ()) = mr
        .capture(&stream, relaxed, 0, || {
            drop(DeviceVec::<u32, _>::zeroed(n, &mr, &stream).unwrap())
        })
        .unwrap();
    stream.begin_capture(relaxed).unwrap();
    assert!(g3.launch().is_err());
    drop(stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0)));
    drop(g3);

    // A closure that ends the capture itself: an error, and the memory stays held.
    let mut theirs = None;
    let e = mr
        .capture(&stream, relaxed, 0, || {
            drop(DeviceVec::<u32, _>::zeroed(n, &mr, &stream).unwrap());
            theirs = stream
                .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
                .unwrap();
        })
        .map(drop)
        .unwrap_err();
    assert!(e.to_string().contains("ended the capture"), "{e}");
    assert!(theirs.is_some());
    assert_eq!(
        mr.held().0,
        1,
        "the capture's memory is held: its graph is the closure's"
    );
    theirs.unwrap().launch().unwrap();
    stream.synchronize().unwrap();

    // A closure that panics: the capture is ended, and the stream works again.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = mr.capture(&stream, relaxed, 0, || {
            let _v = DeviceVec::<u32, _>::zeroed(n, &mr, &stream).unwrap();
            panic!("inside the capture");
        });
    }));
    assert!(panicked.is_err());
    assert_eq!(
        stream.capture_status().unwrap(),
        cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    );
    let v = DeviceVec::<u32, _>::from_slice(&[1, 2, 3], &mr, &stream).unwrap();
    assert_eq!(v.to_vec().unwrap(), [1, 2, 3]);
    assert_eq!(
        mr.held().0,
        1,
        "only the capture the closure ended is still held"
    );
    drop(v);
    // SAFETY: turned back on for this context object, whose streams are idle.
    unsafe { ctx.enable_event_tracking() };
}

/// A host read of a `PinnedVec` while its stream captures a graph (`begin_capture` is safe in
/// cudarc), behind a slow kernel queued before the capture that writes the vector. A capturing
/// stream refuses `cuStreamSynchronize` at once, so the read waits for the whole context instead,
/// or panics where that fails too: it never hands out values the kernel is still writing, not
/// even after a failed wait.
#[test]
fn a_pinned_read_while_its_stream_captures_waits_or_refuses() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let n = 1 << 20;
    let mut p = pinned_zeros(&ctx, n, &stream);
    slow_fill!(&ctx, &stream, &mut p, n, 3);
    stream
        .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p[..].to_vec()));
    // The failed wait is recorded in the context, where cudarc's next call (ending the capture)
    // would return it instead of ending the capture.
    let _ = ctx.check_err();
    let _ = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
    let _ = ctx.check_err();
    stream.synchronize().unwrap();
    match seen {
        Ok(seen) => {
            let wrong = seen
                .iter()
                .zip(expected_fill(n, 3))
                .filter(|(a, b)| **a != *b);
            assert_eq!(
                wrong.count(),
                0,
                "the host read values the kernel still wrote"
            );
            println!("the read waited for the context");
        }
        Err(panic) => {
            let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(
                text.contains("PinnedVec: a host read could not wait"),
                "{text}"
            );
            println!("the read refused: {text}");
        }
    }
    let _ = ctx.check_err();
}

/// cudarc's copies to and from a `PinnedVec` on a stream that captures a graph: a captured copy
/// would run at each launch of the graph, when the vector may be gone (its pinned memory freed)
/// and with no host read of it waiting. Both directions are refused before anything is queued,
/// and the graph holds no copy of the vector.
#[test]
fn copies_of_a_pinned_vector_are_refused_while_its_stream_captures() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let n = 1 << 16;
    let mut dev = DeviceVec::from_slice(&vec![5u32; n], Cuda::new(&ctx).unwrap(), &stream).unwrap();
    let mut p = pinned_zeros(&ctx, n, &stream);
    stream.synchronize().unwrap();
    stream
        .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let into = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        stream.memcpy_dtoh(&dev, &mut p)
    }));
    // What the refused copy left recorded in the context (the device side's waits on the
    // capturing stream) would make cudarc return it before the next copy reaches the vector.
    let _ = ctx.check_err();
    let from = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        stream.memcpy_htod(&p, &mut dev)
    }));
    let _ = ctx.check_err();
    let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
    let _ = ctx.check_err();
    for (what, outcome) in [("into", into.map(|_| ())), ("from", from.map(|_| ()))] {
        let panic = outcome.expect_err(what);
        let text = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        assert!(text.contains("capturing a graph"), "{what}: {text}");
    }
    if let Ok(Some(graph)) = graph {
        graph.launch().unwrap();
    }
    stream.synchronize().unwrap();
    assert!(
        p.iter().all(|&x| x == 0),
        "the graph copied into the vector"
    );
    assert!(
        dev.to_vec().unwrap().iter().all(|&x| x == 5),
        "the graph copied from it"
    );
}

/// Frees pages on a stream while it captures a graph: the capture must end well, and the pages
/// must still go back once it has (an event recorded during a capture is the graph's, and could
/// never be waited for).
fn free_pages_during_a_capture<R: MemoryResource>(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    mr: &R,
    page: usize,
) {
    use cudarc::driver::sys::CUgraphInstantiate_flags;
    let s = ctx.new_stream().unwrap();
    let sr = StreamRef::from(&s);
    let b = mr.allocate(page, 256, sr).unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let c = mr.allocate(6 * page, 256, sr).unwrap();
    // SAFETY: live with this size; nothing uses it.
    unsafe { mr.deallocate(c, 6 * page, 256, sr) };
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(graph.is_ok(), "the capture ended badly: {:?}", graph.err());
    drop(graph);
    // SAFETY: live with this size.
    unsafe { mr.deallocate(b, page, 256, sr) };
    for _ in 0..100 {
        let x = mr.allocate(256, 256, sr).unwrap();
        // SAFETY: live with this size.
        unsafe { mr.deallocate(x, 256, 256, sr) };
    }
    s.synchronize().unwrap();
    ctx.check_err().unwrap();
}

#[test]
fn pages_freed_while_their_stream_captures_go_back_after_the_capture() {
    use mrstack::leaf::{DevicePages, PagedHeaps, PagedHeapsConfig, PhysicalPages};
    use mrstack::leaf::{VirtualMemory, VirtualMemoryConfig};
    let Some(ctx) = gpu() else { return };
    let pages = DevicePages::new(&ctx).unwrap();
    let page = pages.page_size();
    let config = VirtualMemoryConfig {
        cache: 0,
        ..Default::default()
    };
    let vm = VirtualMemory::new(pages.clone(), config).unwrap();
    free_pages_during_a_capture(&ctx, &vm, page);
    vm.release();
    assert_eq!(vm.usage().mapped, 0, "{:?}", vm.usage());
    let heaps = PagedHeaps::new(
        pages,
        PagedHeapsConfig {
            cache: 0,
            ..Default::default()
        },
    );
    free_pages_during_a_capture(&ctx, &heaps, page);
    heaps.release();
    assert_eq!(heaps.usage().mapped, 0, "{:?}", heaps.usage());
}

#[test]
fn a_release_while_a_freeing_stream_captures_leaves_the_capture_whole() {
    use cudarc::driver::sys::CUgraphInstantiate_flags;
    use mrstack::leaf::{DevicePages, PhysicalPages, VirtualMemory, VirtualMemoryConfig};
    let Some(ctx) = gpu() else { return };
    let pages = DevicePages::new(&ctx).unwrap();
    let page = pages.page_size();
    let vm = VirtualMemory::new(pages, VirtualMemoryConfig::default()).unwrap();
    let s = ctx.new_stream().unwrap();
    let sr = StreamRef::from(&s);
    let v = DeviceVec::from_slice(&vec![7u32; page / 4], &vm, &s).unwrap();
    assert!(v.to_vec().unwrap().iter().all(|&x| x == 7));
    drop(v);
    assert_eq!(vm.usage().cached, page);
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    // The freed page's stream captures: it cannot be waited for, so the page stays.
    assert_eq!(vm.release(), 0);
    let refused = vm.synchronize(sr).unwrap_err().to_string();
    assert!(refused.contains("captures a graph"), "{refused}");
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(
        graph.is_ok(),
        "the capture was invalidated: {:?}",
        graph.err()
    );
    drop(graph);
    // Once the capture is over, the page goes.
    assert_eq!(vm.release(), page);
    assert_eq!(vm.usage().mapped, 0);
    ctx.check_err().unwrap();
}
