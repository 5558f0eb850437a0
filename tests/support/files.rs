//! Scratch files for tests that read logs from disk (the host tests and the command's tests include it).

use std::io::Write;
use std::path::{Path, PathBuf};

/// A scratch file unique to this test process, its `prefix` and `name`, removed when dropped.
pub(crate) struct TempFile(PathBuf);

impl TempFile {
    pub(crate) fn new(prefix: &str, name: &str, bytes: &[u8]) -> Self {
        let file = format!("{prefix}-{}-{name}", std::process::id());
        let path = std::env::temp_dir().join(file);
        std::fs::write(&path, bytes).unwrap();
        TempFile(path)
    }

    #[allow(dead_code)] // the host tests pass paths, the command's tests text
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// The path as text, for command lines.
    #[allow(dead_code)] // the host tests pass paths, the command's tests text
    pub(crate) fn text(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `bytes` gzip-compressed, as `.csv.gz` logs are.
pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}
