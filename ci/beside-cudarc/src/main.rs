//! A program with its own cudarc (CUDA 12.6 bindings) and mrstack: the two name one cudarc, so
//! mrstack containers go to the program's cudarc calls and back.

use cudarc::driver::CudaStream;
use mrstack::prelude::*;
use std::sync::Arc;

/// The program's own stream type is mrstack's.
fn same_stream(s: &Arc<CudaStream>) -> &Arc<mrstack::cudarc::driver::CudaStream> {
    s
}

/// A library function over any resource whose memory kernels can read.
fn upload<'a, R>(
    mr: &'a R,
    data: &[f32],
    stream: &Arc<CudaStream>,
) -> Result<DeviceVec<f32, &'a R>, AllocError>
where
    R: MemoryResource + Accessible<DeviceAccessible>,
{
    DeviceVec::from_slice(data, mr, stream)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Without a driver (CI), say so and stop: there this program exists to be built.
    let ctx = match mrstack::cuda_context(0) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("built; not run: {e}");
            return Ok(());
        }
    };
    let stream = same_stream(&ctx.default_stream()).clone();
    let mr = resource_stack![Cuda::new(&ctx)?, Pool { initial: 1 MiB }];
    let v = upload(&mr, &[1.0, 2.0, 3.0], &stream)?;
    let back: Vec<f32> = stream.clone_dtoh(&v)?;
    assert_eq!(back, [1.0, 2.0, 3.0]);
    println!("mrstack beside the program's cudarc (CUDA 12.6 bindings): values round-trip");
    Ok(())
}
