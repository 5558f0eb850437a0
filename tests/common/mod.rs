//! Helpers shared by the integration tests (each test file is its own crate and includes this
//! module with `mod common;`).

// Each test crate uses only some of these helpers.
#![allow(dead_code)]

use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};
use mrstack::prelude::*;
use std::sync::Arc;

/// Device 0's context, or `None` (printing why) where there is no GPU. With
/// `MRSTACK_REQUIRE_GPU=1` a missing GPU fails the test instead of skipping it.
pub fn gpu() -> Option<Arc<cudarc::driver::CudaContext>> {
    match mrstack::cuda_context(0) {
        Ok(ctx) => Some(ctx),
        Err(e) if std::env::var_os("MRSTACK_REQUIRE_GPU").is_some_and(|v| v == "1") => {
            panic!("MRSTACK_REQUIRE_GPU=1 but no GPU: {e}")
        }
        Err(e) => {
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}

/// Test kernels: `fill` (out[i] = i*k + 1), `scale` (out[i] = 2*in[i] + 7), `increment`.
pub const KERNELS: &str = r#"
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

pub fn kernel(ctx: &Arc<CudaContext>, name: &str) -> CudaFunction {
    let ptx = cudarc::nvrtc::compile_ptx(KERNELS).expect("NVRTC compiles the test kernels");
    ctx.load_module(ptx)
        .expect("module loads")
        .load_function(name)
        .expect("function exists")
}

pub fn expected_fill(n: usize, k: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(k) + 1).collect()
}

/// Fills `v` on its stream with the `fill` kernel and checks every value on the host.
pub fn fill_and_check<R>(ctx: &Arc<CudaContext>, v: &mut DeviceVec<u32, R>, k: u32)
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
