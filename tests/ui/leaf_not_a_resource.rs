// A leaf that is not a memory resource (here the CUDA context itself): one error, at the leaf.
use mrstack::prelude::*;

fn main() -> Result<(), AllocError> {
    let ctx = mrstack::cuda_context(0)?;
    let mr = resource_stack![ctx, Pool { initial: 1 GiB }, Statistics];
    let _p = mr.allocate(1024, 256, StreamRef::DEFAULT)?;
    Ok(())
}
