// A leaf constructor that returns a Result, given without its `?`: one error, at the leaf, that
// says so (the layers and the uses of the stack below report nothing more).
use mrstack::prelude::*;

fn main() -> Result<(), AllocError> {
    let ctx = mrstack::cuda_context(0)?;
    let stream = ctx.default_stream();
    let mr = resource_stack![
        Cuda::new(&ctx),
        Pool { initial: 1 GiB },
        Binning { min: 256 B, max: 1 MiB },
        Statistics,
    ];
    let v = DeviceVec::<f32, _>::zeroed(1024, &mr, &stream)?;
    println!("{} {}", v.len(), mr.stats());
    Ok(())
}
