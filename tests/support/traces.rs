//! The trace fixture of this repository: the ResNet-50 training log the tests and benches replay.

use std::path::{Path, PathBuf};

/// The ResNet-50 training trace this project measures with (RMM's log of a real training run,
/// `data/traces/resnet50_train.csv.gz` in the repository): `$MRSTACK_TRACES/resnet50_train.csv.gz`
/// where that variable is set, else `data/traces/` of the source tree (beside the package's
/// manifest, or one level above it for the `cli` package), else `data/traces/` of the
/// working directory (a GPU machine that runs the test binaries from a copy of the repository,
/// where the source tree's path does not exist).
pub(crate) fn resnet50_path() -> PathBuf {
    let dir = std::env::var_os("MRSTACK_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let package = Path::new(env!("CARGO_MANIFEST_DIR"));
            [package.join("data/traces"), package.join("../data/traces")]
                .into_iter()
                .find(|source| source.is_dir())
                .unwrap_or_else(|| PathBuf::from("data/traces"))
        });
    dir.join("resnet50_train.csv.gz")
}
