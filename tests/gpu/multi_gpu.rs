//! GPU tests for several GPUs of one host: each device's stack allocates on its device whatever
//! context is current on the thread and leaves that context current; copies between devices
//! (staged, then direct once peer access is enabled) keep the ordering rules; peer access is
//! explicit and idempotent, for context memory and for driver pools; the per-device registry
//! under threads on both devices never serves a device from another's stack; another process's
//! pool of device 0, imported, is read on device 1 once granted. The tests that need
//! two GPUs say so and return on a machine with one; the first runs on one GPU too (the thread
//! then has no context current).

use crate::slow_fill;
use crate::support::{assert_filled, fill_and_check, gpu, kernel};
use cudarc::driver::{result, sys, CudaContext, LaunchConfig, PushKernelArg};
use mrstack::leaf::{CudaAsyncView, DevicePages};
use mrstack::prelude::*;
use mrstack::suballoc::PoolConfig;
use mrstack::{
    adaptor::Logging, erased::AnyResource, leaf::VirtualMemory, resource::AllocErrorKind,
    suballoc::Pool,
};
use std::sync::Arc;

/// The device a pointer's memory is on, from the driver.
fn device_of(ptr: u64) -> i32 {
    let mut ordinal: i32 = -1;
    // SAFETY: a 4-byte place for this attribute of a live allocation.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    }
    .result()
    .unwrap();
    ordinal
}

fn current() -> sys::CUcontext {
    result::ctx::get_current()
        .unwrap()
        .unwrap_or(std::ptr::null_mut())
}

fn set_current(ctx: sys::CUcontext) {
    // SAFETY: a live context (held by the caller's CudaContext) or null.
    unsafe { result::ctx::set_current(ctx) }.unwrap();
}

/// Contexts of devices 0 and 1, or `None` with a line saying why.
fn two_gpus() -> Option<(Arc<CudaContext>, Arc<CudaContext>)> {
    gpu()?;
    let n = mrstack::device_count();
    if n < 2 {
        // MRSTACK_REQUIRE_GPUS=2 on a machine with two GPUs makes a missing one a failure.
        let required: usize = std::env::var("MRSTACK_REQUIRE_GPUS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(
            required < 2,
            "MRSTACK_REQUIRE_GPUS={required} but this machine has {n}"
        );
        crate::support::skipped(&format!("this test needs 2 GPUs and this machine has {n}"));
        return None;
    }
    Some((
        mrstack::cuda_context(0).unwrap(),
        mrstack::cuda_context(1).unwrap(),
    ))
}

/// Allocates through `mr` (of device `d`) with `other` current, and checks the device and that
/// `other` is still current after each call.
fn allocates_on<R: MemoryResource>(
    name: &str,
    mr: &R,
    d: i32,
    stream: &Arc<cudarc::driver::CudaStream>,
    other: sys::CUcontext,
) {
    let s = StreamRef::from(stream);
    set_current(other);
    let p = mr.allocate(3 << 20, 256, s).unwrap();
    assert_eq!(
        current(),
        other,
        "{name}: allocate left the thread on its context"
    );
    assert_eq!(
        device_of(p.as_ptr() as u64),
        d,
        "{name}: memory on the wrong device"
    );
    // SAFETY: from mr with this size and alignment, unused.
    unsafe { mr.deallocate(p, 3 << 20, 256, s) };
    assert_eq!(
        current(),
        other,
        "{name}: deallocate left the thread on its context"
    );
    mr.synchronize(s).unwrap();
    assert_eq!(
        current(),
        other,
        "{name}: synchronize left the thread on its context"
    );
}

#[test]
fn each_devices_stack_allocates_there_and_leaves_the_threads_context_alone() {
    let Some(_) = gpu() else { return };
    let n = mrstack::device_count();
    println!("devices: {n}");
    let contexts: Vec<_> = (0..n).map(|d| mrstack::cuda_context(d).unwrap()).collect();
    for (d, ctx) in contexts.iter().enumerate() {
        // Another device's context, or none where there is one GPU.
        let other = if n > 1 {
            contexts[(d + 1) % n].cu_ctx()
        } else {
            std::ptr::null_mut()
        };
        let stream = ctx.new_stream().unwrap();
        set_current(other);
        let cuda = Cuda::new(ctx).unwrap();
        let pool = Pool::new(Cuda::new(ctx).unwrap(), PoolConfig::default());
        let tlsf = resource_stack![Cuda::new(ctx).unwrap(), Tlsf];
        let cuda_async = CudaAsync::new(ctx).unwrap();
        let view = CudaAsyncView::default_pool(ctx).unwrap();
        let vm = VirtualMemory::new(DevicePages::new(ctx).unwrap(), Default::default()).unwrap();
        assert_eq!(
            current(),
            other,
            "a constructor left the thread on its context"
        );
        let d = d as i32;
        allocates_on("Cuda", &cuda, d, &stream, other);
        allocates_on("Pool", &pool, d, &stream, other);
        allocates_on("Tlsf", &tlsf, d, &stream, other);
        allocates_on("CudaAsync", &cuda_async, d, &stream, other);
        allocates_on("CudaAsyncView", &view, d, &stream, other);
        allocates_on("VirtualMemory", &vm, d, &stream, other);
        let mut v = DeviceVec::<u32, _>::zeroed(1000, &pool, &stream).unwrap();
        assert_eq!(device_of(v.device_address()), d);
        fill_and_check(ctx, &mut v, 3 + d as u32);
    }
}

#[test]
fn copies_between_devices_wait_for_the_writes_staged_or_direct() {
    let Some((c0, c1)) = two_gpus() else { return };
    // No cudarc events: the crate's own joins and waits are all that order the copies.
    // SAFETY: this test's own context objects; their other uses below are synchronous.
    unsafe {
        c0.disable_event_tracking();
        c1.disable_event_tracking();
    }
    let (s0, s1) = (c0.new_stream().unwrap(), c1.new_stream().unwrap());
    let (mr0, mr1) = (Cuda::new(&c0).unwrap(), Cuda::new(&c1).unwrap());
    let n = 1 << 20;
    for round in 0..2u32 {
        if round == 1 {
            // Direct copies from here: peer access, enabled explicitly, twice (idempotent).
            for _ in 0..2 {
                mrstack::enable_peer_access(&c0, &c1).unwrap();
                mrstack::enable_peer_access(&c1, &c0).unwrap();
            }
        }
        let mut v1 = DeviceVec::<u32, _>::zeroed(n, &mr1, &s1).unwrap();
        let mut v0 = DeviceVec::<u32, _>::zeroed(n, &mr0, &s0).unwrap();
        // Still writing on device 1 when device 0 copies it.
        slow_fill!(&c1, &s1, &mut v1, n, 3 + round);
        v0.copy_from_device(&v1).unwrap();
        assert_filled(v0.to_vec().unwrap(), n, 3 + round);
        // And back, after a kernel on device 0.
        slow_fill!(&c0, &s0, &mut v0, n, 5 + round);
        v1.copy_from_device(&v0).unwrap();
        assert_filled(v1.to_vec().unwrap(), n, 5 + round);
        assert_eq!(device_of(v0.device_address()), 0);
        assert_eq!(device_of(v1.device_address()), 1);
    }
    let e = mrstack::enable_peer_access(&c0, &c0).unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::Unsupported(_)), "{e}");
}

/// cudarc's `memcpy_dtod` from a vector of device 0 into a slice of device 1 asks for the
/// vector's pointer on its own stream with device 1's (primary) context current, then reads it on
/// device 1's stream: the vector's drop waits for that read before the pool hands its block on,
/// without peer access and with it.
#[test]
fn a_copy_to_another_device_comes_before_the_blocks_next_owner() {
    let Some((c0, c1)) = two_gpus() else { return };
    crate::hostile::a_copy_into_context_to_comes_before_the_blocks_next_owner(&c0, &c1, 131);
    mrstack::enable_peer_access(&c1, &c0).unwrap();
    crate::hostile::a_copy_into_context_to_comes_before_the_blocks_next_owner(&c0, &c1, 137);
}

#[test]
fn a_kernel_reads_another_devices_memory_once_access_is_granted() {
    let Some((c0, c1)) = two_gpus() else { return };
    let (s0, s1) = (c0.new_stream().unwrap(), c1.new_stream().unwrap());
    let scale = kernel(&c0, "scale");
    let n = 1 << 16;
    let host: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
    let want: Vec<u32> = host
        .iter()
        .map(|&x| 2u32.wrapping_mul(x).wrapping_add(7))
        .collect();
    let mr0 = Cuda::new(&c0).unwrap();
    // Context memory of device 1: cuCtxEnablePeerAccess from device 0.
    mrstack::enable_peer_access(&c0, &c1).unwrap();
    let cuda1 = Cuda::new(&c1).unwrap();
    // A driver pool of device 1: cuMemPoolSetAccess for device 0.
    let pool1 = CudaAsync::new(&c1).unwrap();
    pool1.grant_access(&c0).unwrap();
    pool1.grant_access(&c0).unwrap(); // idempotent
                                      // Virtual memory of device 1: a page mapped before the grant, and one after.
    let vm1 = VirtualMemory::new(DevicePages::new(&c1).unwrap(), Default::default()).unwrap();
    let before = DeviceVec::from_slice(&host, &vm1, &s1).unwrap();
    vm1.grant_access(&c0).unwrap();
    vm1.grant_access(&c0).unwrap(); // idempotent
                                    // Past the 2 MiB page `before` is on: `after` is on pages mapped after the grant.
    let spacer = DeviceVec::<u8, _>::zeroed(3 << 20, &vm1, &s1).unwrap();
    let after = DeviceVec::from_slice(&host, &vm1, &s1).unwrap();
    assert!(after.device_address() >= before.device_address() + (2 << 20));
    let from_cuda = DeviceVec::from_slice(&host, &cuda1, &s1).unwrap();
    let from_pool = DeviceVec::from_slice(&host, &pool1, &s1).unwrap();
    for (name, input) in [
        ("Cuda", from_cuda.device_address()),
        ("CudaAsync", from_pool.device_address()),
        (
            "VirtualMemory, mapped before the grant",
            before.device_address(),
        ),
        (
            "VirtualMemory, mapped after the grant",
            after.device_address(),
        ),
    ] {
        s1.synchronize().unwrap();
        let mut out = DeviceVec::<u32, _>::zeroed(n, &mr0, &s0).unwrap();
        let n32 = n as u32;
        // SAFETY: `scale` takes (const unsigned*, unsigned*, unsigned); `input` is n values of
        // device 1 that device 0 may read (access granted above), written and synchronized.
        unsafe {
            s0.launch_builder(&scale)
                .arg(&input)
                .arg(&mut out)
                .arg(&n32)
                .launch(LaunchConfig::for_num_elems(n32))
                .unwrap();
        }
        assert_eq!(
            out.to_vec().unwrap(),
            want,
            "{name} memory of device 1 read on device 0"
        );
    }
    drop(spacer);
}

#[test]
fn the_registry_under_threads_on_both_devices_serves_each_device_its_own() {
    let Some((c0, c1)) = two_gpus() else { return };
    let contexts = [c0, c1];
    std::thread::scope(|scope| {
        // One thread keeps swapping each device's resource for a pool of that device and back.
        let swapper = scope.spawn(|| {
            for i in 0..200 {
                let d = i % 2;
                let pool = Pool::new(Cuda::new(&contexts[d]).unwrap(), PoolConfig::default());
                mrstack::registry::set_per_device_resource(d, AnyResource::new(pool)).unwrap();
                if i % 3 == 0 {
                    mrstack::registry::reset_per_device_resource(d).unwrap();
                }
            }
        });
        for t in 0..8usize {
            let contexts = &contexts;
            scope.spawn(move || {
                let streams: Vec<_> = contexts.iter().map(|c| c.new_stream().unwrap()).collect();
                for i in 0..100usize {
                    let d = (t + i) % 2;
                    // The thread sits on the other device's context: the stream decides.
                    set_current(contexts[1 - d].cu_ctx());
                    let mut v =
                        DeviceVec::<u32, _>::zeroed_in_current(4096 + i, &streams[d]).unwrap();
                    assert_eq!(
                        device_of(v.device_address()),
                        d as i32,
                        "thread {t}, step {i}"
                    );
                    if i % 10 == 0 {
                        fill_and_check(&contexts[d], &mut v, (t * 100 + i) as u32);
                    }
                }
            });
        }
        swapper.join().unwrap();
    });
    for d in 0..2 {
        mrstack::registry::reset_per_device_resource(d).unwrap();
    }
}

#[test]
fn logs_recorded_on_two_devices_replay_per_device() {
    use mrstack::replay::rmm_log::{self, OnError};
    use mrstack::replay::{simulated_streams, Replayer};
    let Some((c0, c1)) = two_gpus() else { return };
    // One log per device: RMM's format has no device column, so each device's stack logs to a
    // writer of its own (README, "Several GPUs").
    let logged: Vec<_> = [&c0, &c1]
        .iter()
        .map(|c| Logging::new(Cuda::new(c).unwrap(), Vec::new()))
        .collect();
    let streams = [c0.new_stream().unwrap(), c1.new_stream().unwrap()];
    for round in 0..3usize {
        for (d, (mr, stream)) in logged.iter().zip(&streams).enumerate() {
            // Device 1 allocates twice as much as device 0, so the logs differ.
            let vs: Vec<_> = (0..(d + 1) * 2)
                .map(|i| DeviceVec::<u32, _>::zeroed(1000 * (i + 1) + round, mr, stream).unwrap())
                .collect();
            for v in &vs {
                assert_eq!(device_of(v.device_address()), d as i32);
            }
        }
    }
    for (d, mr) in logged.into_iter().enumerate() {
        let (_, bytes) = mr.into_parts().unwrap();
        let trace = rmm_log::read_from(&bytes[..], format!("device {d}"), OnError::Stop).unwrap();
        let w = trace.workload;
        assert_eq!(w.allocations(), 3 * (d + 1) * 2, "device {d}'s log");
        let sim = Simulated::new(1 << 30);
        let mut r = Replayer::new(&sim, &w, simulated_streams(w.stream_count())).unwrap();
        r.pass().unwrap();
        assert_eq!(
            sim.in_use(),
            0,
            "device {d}'s log replays and frees everything"
        );
    }
}

/// Set in the child process of the cross-device IPC test (`driver_pools::run_ipc_child`).
const IPC_PEER_CHILD: &str = "MRSTACK_IPC_PEER_CHILD";

/// What `scale` makes of `x`.
fn scaled(x: u32) -> u32 {
    2u32.wrapping_mul(x).wrapping_add(7)
}

fn ipc_values(n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2246822519) ^ 0x5bd1_e995)
        .collect()
}

/// The child's side: the pool of device 0 is refused with device 1's context, imported with
/// device 0's, opened to device 1, and read there by a kernel.
fn ipc_peer_child(spec: &str) {
    use crate::driver_pools::{ipc_share, IpcShare};
    use mrstack::leaf::ImportedPool;
    let IpcShare {
        fds: (fd_a, fd_b),
        len: bytes,
        pointer,
    } = ipc_share(spec);
    let n = bytes / 4; // u32 values
    let (c0, c1) = (
        mrstack::cuda_context(0).unwrap(),
        mrstack::cuda_context(1).unwrap(),
    );
    let e = ImportedPool::from_fd(&c1, fd_b).unwrap_err();
    assert!(
        matches!(e.kind, AllocErrorKind::InvalidArgument(_)),
        "a pool of device 0 imported with device 1's context: {e}"
    );
    let pool = ImportedPool::from_fd(&c0, fd_a).unwrap();
    assert!(pool.is_accessible_from(&c0).unwrap());
    assert!(
        !pool.is_accessible_from(&c1).unwrap(),
        "device 1 has no access before the grant"
    );
    let mem = pool.import(&pointer).unwrap();
    assert!(mem.len() >= 4 * n, "{} < {}", mem.len(), 4 * n);
    pool.grant_access(&c1).unwrap();
    pool.grant_access(&c1).unwrap(); // idempotent
    pool.grant_access(&c0).unwrap(); // its own device: nothing to do
    assert!(pool.is_accessible_from(&c1).unwrap());
    let s1 = c1.new_stream().unwrap();
    let scale = kernel(&c1, "scale");
    let mr1 = Cuda::new(&c1).unwrap();
    let mut out = DeviceVec::<u32, _>::zeroed(n, &mr1, &s1).unwrap();
    let (input, n32) = (mem.device_address(), n as u32);
    // SAFETY: `scale` takes (const unsigned*, unsigned*, unsigned); `input` holds n values the
    // parent wrote and synchronized before exporting, on device 0, which device 1 may read
    // (granted above); `mem` outlives the launch (`to_vec` below waits for it).
    unsafe {
        s1.launch_builder(&scale)
            .arg(&input)
            .arg(&mut out)
            .arg(&n32)
            .launch(LaunchConfig::for_num_elems(n32))
            .unwrap();
    }
    let want: Vec<u32> = ipc_values(n).into_iter().map(scaled).collect();
    assert_eq!(out.to_vec().unwrap(), want, "device 1 read device 0's pool");
    assert_eq!(device_of(out.device_address()), 1);
    println!("ipc peer child: device 1 read {n} values of device 0's imported pool");
}

#[test]
fn an_imported_pool_is_read_on_another_device_once_granted() {
    if let Ok(spec) = std::env::var(IPC_PEER_CHILD) {
        return ipc_peer_child(&spec);
    }
    let Some((c0, _c1)) = two_gpus() else { return };
    let s0 = c0.new_stream().unwrap();
    let options = mrstack::leaf::CudaAsyncOptions {
        exportable: true,
        ..Default::default()
    };
    let mr = CudaAsync::with_options(&c0, options).unwrap();
    let n = 1 << 16;
    let v = DeviceVec::from_slice(&ipc_values(n), &mr, &s0).unwrap();
    assert_eq!(device_of(v.device_address()), 0);
    // Complete before another process may touch it.
    v.synchronize().unwrap();
    let ptr = std::ptr::NonNull::new(v.device_address() as *mut u8).unwrap();
    let test = "multi_gpu::an_imported_pool_is_read_on_another_device_once_granted";
    // SAFETY: u32 values, valid for any bytes, exported after the copy completed; `v` lives until
    // the child is done (it only reads).
    let text = unsafe { crate::driver_pools::run_ipc_child(&mr, ptr, 4 * n, test, IPC_PEER_CHILD) };
    assert!(
        text.contains("ipc peer child: device 1 read"),
        "the child ran:\n{text}"
    );
    // The child only read: the values are as written.
    assert_eq!(v.to_vec().unwrap(), ipc_values(n));
}
