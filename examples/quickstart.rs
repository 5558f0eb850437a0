//! Builds a resource stack with `resource_stack!` and, with a GPU, round-trips data through a
//! kernel; without one, says so and shows the stack on the simulated upstream.
//!
//! Run: `cargo run --release --example quickstart`

use cudarc::driver::{LaunchConfig, PushKernelArg};
use mrstack::prelude::*;

const SQUARE: &str = r#"
extern "C" __global__ void square(float* v, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = v[i] * v[i];
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match mrstack::cuda_context(0) {
        Ok(ctx) => on_gpu(&ctx),
        Err(e) => {
            println!("no GPU here ({e}); showing the stack on a simulated device instead");
            on_simulated()
        }
    }
}

fn on_gpu(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
) -> Result<(), Box<dyn std::error::Error>> {
    let stream = ctx.default_stream();
    let mr = resource_stack![Cuda::new(ctx)?];
    println!("GPU: {}", ctx.name()?);

    let host: Vec<f32> = (0..1_000_000).map(|i| i as f32 * 0.001).collect();
    let mut v = DeviceVec::from_slice(&host, &mr, &stream)?;
    let module = ctx.load_module(cudarc::nvrtc::compile_ptx(SQUARE)?)?;
    let square = module.load_function("square")?;
    let n = v.len() as u32;
    // SAFETY: `square` takes (float*, unsigned) and touches indices < n of a buffer of n floats.
    unsafe {
        stream
            .launch_builder(&square)
            .arg(&mut v)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))?;
    }
    let back = v.to_vec()?;
    let wrong = host
        .iter()
        .zip(&back)
        .filter(|(x, y)| **y != **x * **x)
        .count();
    println!(
        "squared {} floats on the GPU through {}: {wrong} wrong",
        back.len(),
        mr.name()
    );
    if wrong > 0 {
        return Err("the kernel's results differ from the host's".into());
    }
    Ok(())
}

fn on_simulated() -> Result<(), Box<dyn std::error::Error>> {
    let device = Simulated::new(8 << 30);
    let mr = resource_stack![&device];
    let sizes = [4 << 20, 1000, 256 << 10];
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&s| mr.allocate(s, 256, StreamRef::DEFAULT).map(|p| (p, s)))
        .collect::<Result<_, _>>()?;
    for (p, s) in &blocks {
        println!("  {s:>8} bytes at {:#x}", p.as_ptr() as usize);
    }
    println!(
        "{} live allocations, {} bytes in use of {}",
        device.live(),
        device.in_use(),
        device.capacity()
    );
    for (p, s) in blocks {
        // SAFETY: each block came from `mr` with this size and alignment.
        unsafe { mr.deallocate(p, s, 256, StreamRef::DEFAULT) };
    }
    println!("after freeing: {} bytes in use", device.in_use());
    Ok(())
}
