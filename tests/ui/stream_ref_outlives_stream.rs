// A StreamRef borrows its stream: it cannot reach a resource (and the driver) after the stream is
// dropped.
use mrstack::prelude::*;

fn main() {
    let ctx = mrstack::cuda_context(0).unwrap();
    let mr = CudaAsync::new(&ctx).unwrap();
    let stream = {
        let s = ctx.new_stream().unwrap();
        StreamRef::from(&s)
    };
    let _ = mr.allocate(256, 256, stream);
}
