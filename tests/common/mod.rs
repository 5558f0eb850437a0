//! Helpers shared by the integration tests (each test file is its own crate and includes this
//! module with `mod common;`).

use std::sync::Arc;

/// Device 0's context, or `None` (printing why) where there is no GPU. With
/// `MRSTACK_REQUIRE_GPU=1` a missing GPU fails the test instead of skipping it.
pub fn gpu() -> Option<Arc<cudarc::driver::CudaContext>> {
    match mrstack::cuda_context(0) {
        Ok(ctx) => Some(ctx),
        Err(e) if std::env::var_os("MRSTACK_REQUIRE_GPU").is_some_and(|v| v == "1") => {
            panic!("MRSTACK_REQUIRE_GPU=1 but no GPU: {e}")
        }
        Err(e) => {
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}
