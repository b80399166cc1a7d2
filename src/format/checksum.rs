//! The one checksum of the project: XXH3-64, written as 16 lowercase hex digits.

use std::io::Read;
use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

use crate::error::{IoContext, Result};

/// Incremental XXH3-64.
#[derive(Default, Clone)]
pub struct Checksum(Xxh3);

impl Checksum {
    /// A fresh hasher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest so far, as hex.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0.digest())
    }
}

/// The checksum of a byte slice, as hex.
pub fn of_bytes(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// Checks that `bytes` (the contents of `path`) have the recorded checksum `expected`.
pub fn verify(path: &Path, bytes: &[u8], expected: &str) -> Result<()> {
    check(path, of_bytes(bytes), expected)
}

/// Checks that `found`, the checksum of `path`'s contents (computed whole or streamed), is
/// the recorded `expected`.
pub fn check(path: &Path, found: String, expected: &str) -> Result<()> {
    if found != expected {
        return Err(crate::Error::Checksum {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            found,
        });
    }
    Ok(())
}

/// The checksum of a whole file, streamed, as hex.
pub fn of_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).at(path)?;
    let mut hasher = Checksum::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).at(path)?;
        if n == 0 {
            return Ok(hasher.hex());
        }
        hasher.update(&buf[..n]);
    }
}
