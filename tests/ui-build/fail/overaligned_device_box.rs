// A value aligned to 512 bytes in a DeviceBox on `Cuda`, which guarantees 256.
use mrstack::prelude::*;

#[repr(C, align(512))]
#[derive(Clone, Copy, Default)]
struct Wide(f32);

// SAFETY: a plain f32 with padding, valid for any bit pattern.
unsafe impl cudarc::driver::DeviceRepr for Wide {}

fn main() -> Result<(), AllocError> {
    let ctx = mrstack::cuda_context(0)?;
    let stream = ctx.default_stream();
    let b = DeviceBox::new(Wide(1.0), Cuda::new(&ctx)?, &stream)?;
    let _ = b;
    Ok(())
}
