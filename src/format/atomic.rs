//! Atomic file creation: write a hidden temp file beside the target, fsync, rename, fsync
//! the directory. A reader sees the whole file or none; a temp file left by a crash never
//! has a final name, so it is never mistaken for output.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, IoContext, Result};

/// The prefix of every temp file this crate writes.
pub const TEMP_PREFIX: &str = ".tmp.";

/// Whether a file name is one of our temp files.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

fn temp_path_for(target: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = target
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("file");
    let unique = format!(
        "{TEMP_PREFIX}{name}.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    target.with_file_name(unique)
}

/// Creates `target` atomically from what `write` puts into the writer it is given.
pub fn write_atomic<T>(
    target: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<T>,
) -> Result<T> {
    let temp = temp_path_for(target);
    let result = (|| {
        let file = File::create(&temp).at(&temp)?;
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        let value = write(&mut writer)?;
        let file = writer
            .into_inner()
            .map_err(|e| Error::io(&temp, e.into_error()))?;
        file.sync_all().at(&temp)?;
        std::fs::rename(&temp, target).at(target)?;
        sync_dir(target.parent().unwrap_or(Path::new(".")))?;
        Ok(value)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Creates `target` atomically with `bytes`.
pub fn write_bytes_atomic(target: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic(target, |w| w.write_all(bytes).at(target))
}

/// Makes a rename inside `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x.bin");
        let r: Result<()> = write_atomic(&target, |w| {
            w.write_all(b"partial").unwrap();
            Err(Error::Config("boom".into()))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        write_bytes_atomic(&target, b"whole").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
