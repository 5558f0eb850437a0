// Prefetch migrates managed memory; `Cuda` memory is device memory that cannot migrate.
use mrstack::prelude::*;

fn main() -> Result<(), AllocError> {
    let ctx = mrstack::cuda_context(0)?;
    let mr = resource_stack![Cuda::new(&ctx)?, Prefetch];
    let _ = mr;
    Ok(())
}
