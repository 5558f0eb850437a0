//! The trace fixture of this repository: the ResNet-50 training log the tests and benches replay.

use std::path::{Path, PathBuf};

/// The ResNet-50 training trace this project measures with (an RMM log of a real run on an H100):
/// `$MRSTACK_TRACES/resnet50_train.csv.gz` where that variable is set (a GPU machine that gets the
/// file beside the test binaries), else `shared/traces/` beside the repository.
pub(crate) fn resnet50_path() -> PathBuf {
    let dir = std::env::var_os("MRSTACK_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces"));
    dir.join("resnet50_train.csv.gz")
}
