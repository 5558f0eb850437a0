// The fix for tests/ui-build/fail/overaligned_device_box.rs: a stack that guarantees 512 bytes.
use mrstack::prelude::*;
use typenum::U512;

#[repr(C, align(512))]
#[derive(Clone, Copy, Default, PartialEq, Debug)]
struct Wide(f32);

// SAFETY: a plain f32 with padding, valid for any bit pattern.
unsafe impl cudarc::driver::DeviceRepr for Wide {}

fn main() -> Result<(), AllocError> {
    let Ok(ctx) = mrstack::cuda_context(0) else {
        return Ok(()); // compiling is the test; without a GPU there is nothing to run
    };
    let stream = ctx.default_stream();
    let mr = resource_stack![Cuda::new(&ctx)?, Aligned<U512>];
    let b = DeviceBox::new(Wide(1.0), &mr, &stream)?;
    assert_eq!(b.device_address() % 512, 0);
    assert_eq!(b.get()?, Wide(1.0));
    Ok(())
}
