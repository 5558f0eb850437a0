//! Containers used on other streams than their own: kernel arguments, copies, views and drops
//! are ordered by the container's cudarc events, and staging through a `PinnedVec` is
//! asynchronous with the host waiting only when it touches the values. Each test queues slow
//! device work (`slow_fill`, ~100 ms) so that a missing wait shows as wrong values.

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use mrstack::prelude::*;
use mrstack::suballoc::Pool;
use mrstack::suballoc::PoolConfig;
use std::sync::Arc;

use crate::slow_fill;
use crate::support::{
    assert_filled, assert_zeros_then_filled, device_zeros, expected_fill, gpu, kernel, pinned_zeros,
};

/// `scale(in, out)` on `stream`: out[i] = 2*in[i] + 7.
fn scale_on<A, B>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<cudarc::driver::CudaStream>,
    input: &A,
    out: &mut B,
    n: usize,
) where
    for<'b> cudarc::driver::LaunchArgs<'b>: PushKernelArg<&'b A> + PushKernelArg<&'b mut B>,
{
    let f = kernel(ctx, "scale");
    let n32 = n as u32;
    let mut builder = stream.launch_builder(&f);
    builder.arg(input).arg(out).arg(&n32);
    // SAFETY: `scale` takes (const unsigned*, unsigned*, unsigned) and touches indices < n of
    // both, which hold n values.
    unsafe { builder.launch(LaunchConfig::for_num_elems(n32)) }.expect("launch scale");
}

/// A kernel on stream `t` writes a vector of stream `s`; the vector's own read (on `s`) waits
/// for it.
#[test]
fn a_kernel_write_on_another_stream_is_seen_by_the_vectors_reads() {
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 1 << 20;
    let mut v = device_zeros(&ctx, n, &s);
    slow_fill!(&ctx, &t, &mut v, n, 21);
    assert_filled(v.to_vec().unwrap(), n, 21);
}

/// A kernel on stream `t` reads a vector of stream `s` late (behind slow work on `t`); the
/// vector is dropped at once, and its block, reused at once from the pool on `s`, is
/// overwritten there. The kernel must still read the old values: the drop made `s` wait.
#[test]
fn a_vector_dropped_while_another_stream_reads_it_is_not_reused_early() {
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let pool = Pool::new(Cuda::new(&ctx).unwrap(), PoolConfig::default());
    let n = 1 << 20;
    let old = expected_fill(n, 23);
    let mut out = device_zeros(&ctx, n, &t);
    let address = {
        let v = DeviceVec::from_slice(&old, &pool, &s).unwrap();
        slow_fill!(&ctx, &t, &mut out, n, 1);
        scale_on(&ctx, &t, &v, &mut out, n);
        v.device_address()
    };
    let mut w = DeviceVec::<u32, _>::zeroed(n, &pool, &s).unwrap();
    assert_eq!(w.device_address(), address, "the pool reused the block");
    w.copy_from(&vec![0xdead; n]).unwrap();
    let want: Vec<u32> = old.iter().map(|&x| 2 * x + 7).collect();
    assert_eq!(out.to_vec().unwrap(), want);
    assert_eq!(w.to_vec().unwrap(), vec![0xdead; n]);
}

/// Views are cudarc's: a kernel writes one range through a mutable view, a copy reads another
/// range through a view, and a range outside the vector is an error.
#[test]
fn views_write_and_read_their_range_only() {
    let Some(ctx) = gpu() else { return };
    let s = ctx.new_stream().unwrap();
    let n = 1000;
    let mut v = DeviceVec::<u32, _>::zeroed(n, CudaAsync::new(&ctx).unwrap(), &s).unwrap();
    {
        let mut mid = v.slice_mut(100..300).unwrap();
        let f = kernel(&ctx, "fill");
        let (m, k) = (200u32, 3u32);
        let mut builder = s.launch_builder(&f);
        builder.arg(&mut mid).arg(&m).arg(&k);
        // SAFETY: `fill` takes (unsigned*, unsigned, unsigned) and writes indices < 200 of the
        // view, which holds 200 values.
        unsafe { builder.launch(LaunchConfig::for_num_elems(m)) }.unwrap();
    }
    let all = v.to_vec().unwrap();
    let mut want = vec![0u32; n];
    want[100..300].copy_from_slice(&expected_fill(200, 3));
    assert_eq!(all, want);
    let part = s.clone_dtoh(&v.slice(150..160).unwrap()).unwrap();
    assert_eq!(part, want[150..160]);
    assert!(v.slice(900..1001).is_err());
    assert!(v.slice_mut(1001..).is_err());
    assert_eq!(v.slice(..).unwrap().len(), n);
}

/// A view used on another stream is ordered like the vector: a kernel on `t` writes through it,
/// and the vector's read on `s` sees the values.
#[test]
fn a_view_written_on_another_stream_is_seen_by_the_vector() {
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 1 << 20;
    let mut v = device_zeros(&ctx, 2 * n, &s);
    {
        let mut back = v.slice_mut(n..).unwrap();
        slow_fill!(&ctx, &t, &mut back, n, 29);
    }
    let all = v.to_vec().unwrap();
    assert_zeros_then_filled(&all, n, 29);
}

/// Device-to-host staging without blocking: the copy into a `PinnedVec` (of another stream) is
/// queued behind slow work; the vector's next host read waits for it.
#[test]
fn copy_to_async_is_waited_for_by_the_pinned_vecs_next_read() {
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 1 << 20;
    let mut dev = device_zeros(&ctx, n, &s);
    let mut pinned = pinned_zeros(&ctx, n, &t);
    slow_fill!(&ctx, &s, &mut dev, n, 31);
    dev.copy_to_async(&mut pinned).unwrap();
    assert_eq!(pinned.len(), n);
    assert_filled(&pinned[..], n, 31);
}

/// Host-to-device staging without blocking: the copy out of a `PinnedVec` runs late (behind
/// slow work on the vector's stream); a host write into the `PinnedVec` waits for it, so the
/// device gets the old values.
#[test]
fn copy_from_async_is_waited_for_by_the_pinned_vecs_next_write() {
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 1 << 20;
    let values = expected_fill(n, 37);
    let mut pinned = PinnedVec::from_slice(&values, Pinned::new(&ctx).unwrap(), &t).unwrap();
    let mut dev = device_zeros(&ctx, n, &s);
    let mut scratch = device_zeros(&ctx, 1, &s);
    slow_fill!(&ctx, &s, &mut scratch, 1, 1);
    dev.copy_from_async(&pinned).unwrap();
    pinned.fill(0).unwrap(); // waits for the copy to have read the old values
    assert_eq!(dev.to_vec().unwrap(), values);
    assert!(pinned.iter().all(|&x| x == 0));
    // Lengths must match.
    let short = pinned_zeros(&ctx, n - 1, &t);
    assert!(dev.copy_from_async(&short).is_err());
}

/// A `PinnedVec` written by a kernel on another stream than its own: its host read waits for
/// that stream's write (the event), not only for its own stream.
#[test]
fn a_pinned_vec_written_on_another_stream_is_waited_for() {
    let Some(ctx) = gpu() else { return };
    let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 1 << 20;
    let mut pinned = pinned_zeros(&ctx, n, &s);
    slow_fill!(&ctx, &t, &mut pinned, n, 41);
    assert_filled(&pinned[..], n, 41);
}

/// Two `CudaContext` objects of one device: the vector's context has made no stream (so cudarc
/// keeps no events for it), the other has. A copy into the vector on the other's stream, queued
/// behind slow work, is still seen by the vector's own read: where events are off, a use on a
/// foreign stream is joined and waited for.
#[test]
fn a_copy_on_another_context_objects_stream_is_waited_for() {
    let Some(_) = gpu() else { return };
    let (ctx1, ctx2) = (CudaContext::new(0).unwrap(), CudaContext::new(0).unwrap());
    assert!(!Arc::ptr_eq(&ctx1, &ctx2));
    let s1 = ctx1.default_stream();
    let t2 = ctx2.new_stream().unwrap();
    assert!(!ctx1.is_managing_stream_synchronization());
    let n = 1 << 20;
    let mut v = device_zeros(&ctx1, n, &s1);
    let mut scratch = device_zeros(&ctx2, 1, &t2);
    slow_fill!(&ctx2, &t2, &mut scratch, 1, 1);
    let host = expected_fill(n, 43);
    t2.memcpy_htod(&host, &mut v).unwrap();
    assert_eq!(v.to_vec().unwrap(), host);
}
