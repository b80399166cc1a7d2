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
        hex(self.0.digest())
    }

    /// The digest so far, as a number.
    pub fn value(&self) -> u64 {
        self.0.digest()
    }
}

/// The checksum of a byte slice, as hex.
pub fn of_bytes(bytes: &[u8]) -> String {
    hex(value_of_bytes(bytes))
}

/// A checksum (or any 64-bit digest) as the project writes it: 16 lowercase hex digits.
pub fn hex(value: u64) -> String {
    format!("{value:016x}")
}

/// The checksum of a byte slice, as a number: for records kept in memory by the thousand
/// (a hex `String` costs a heap allocation and 40 bytes more each), written as hex by
/// [`hex_u64`].
pub fn value_of_bytes(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Serde for a checksum held as a `u64` and written as its 16 hex digits (`#[serde(with =
/// "checksum::hex_u64")]`): the same text as [`of_bytes`] writes.
pub mod hex_u64 {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    /// Writes `value` as 16 lowercase hex digits.
    pub fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::hex(*value))
    }

    /// Reads 16 hex digits.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = <&str>::deserialize(deserializer)?;
        let value = (text.len() == 16).then(|| u64::from_str_radix(text, 16).ok());
        value
            .flatten()
            .ok_or_else(|| D::Error::custom(format!("checksum '{text}' is not 16 hex digits")))
    }
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
