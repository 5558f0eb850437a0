// Outside resource_stack!, a Result where a resource goes names the missing `?` too.
use mrstack::prelude::*;
use mrstack::adaptor::Statistics;

fn main() -> Result<(), AllocError> {
    let ctx = mrstack::cuda_context(0)?;
    let _mr = Statistics::new(Cuda::new(&ctx));
    Ok(())
}
