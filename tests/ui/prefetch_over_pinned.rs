// Pinned memory is host and device accessible, but not managed: it cannot be prefetched.
use mrstack::prelude::*;

fn main() -> Result<(), AllocError> {
    let ctx = mrstack::cuda_context(0)?;
    let mr = resource_stack![Pinned::new(&ctx)?, Prefetch { device: 0 }];
    let _ = mr;
    Ok(())
}
