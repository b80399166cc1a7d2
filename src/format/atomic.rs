//! Atomic file creation: write a hidden temp file beside the target, fsync, rename, fsync
//! the directory. A reader sees the whole file or none; a temp file left by a crash never
//! has a final name, so it is never mistaken for output.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{IoContext, Result};
use crate::format::chunked::{ChunkedWriter, MAPPED_FILE_CHUNK, READ_ONCE_CHUNK};

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

/// When the data of a new file must be on stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Before `write_atomic` returns (fsync of the file and its directory).
    Now,
    /// Later: the caller syncs it (or checks its checksum before trusting it after a crash).
    /// The rename is still atomic, so a reader never sees a partial file under its name.
    /// Writeback is started at once, so the caller's final sync has little left to wait for.
    Deferred,
    /// Never: a temporary file whose contents are checksummed; the kernel may drop it
    /// before it reaches the disk at all.
    Temporary,
}

/// Creates `target` atomically from what `write` puts into the writer it is given: in
/// aligned chunks of [`MAPPED_FILE_CHUNK`] (huge pages in the page cache, for the files
/// readers map), of [`READ_ONCE_CHUNK`] for a [`Durability::Temporary`] file.
///
/// Its errors name `target`, not the temp file: that is removed when the write fails, and
/// the file the user needs to hear of (a full disk, a quota) is the one being written.
pub fn write_atomic<T>(
    target: &Path,
    durability: Durability,
    write: impl FnOnce(&mut ChunkedWriter<File>) -> Result<T>,
) -> Result<T> {
    let temp = temp_path_for(target);
    let chunk = match durability {
        Durability::Temporary => READ_ONCE_CHUNK,
        Durability::Now | Durability::Deferred => MAPPED_FILE_CHUNK,
    };
    let result = (|| {
        let file = File::create(&temp).at(target)?;
        let mut writer = ChunkedWriter::new(file, chunk);
        let value = write(&mut writer)?;
        let file = writer.finish().at(target)?;
        match durability {
            Durability::Now => file.sync_all().at(target)?,
            Durability::Deferred => start_writeback(&file),
            Durability::Temporary => {}
        }
        std::fs::rename(&temp, target).at(target)?;
        if durability == Durability::Now {
            sync_dir(directory_of(target))?;
        }
        Ok(value)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// The directory `path` is in: `.` for a bare file name (whose `parent()` is empty).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Creates `target` atomically and durably with `bytes`.
pub fn write_bytes_atomic(target: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic(target, Durability::Now, |w| w.write_all(bytes).at(target))
}

/// Puts the data of an existing file on stable storage.
pub fn sync_file(path: &Path) -> Result<()> {
    File::open(path).and_then(|f| f.sync_all()).at(path)
}

/// Asks the kernel to start writing `file` back now, without waiting (a hint: failures are
/// caught by the later fsync). Linux only; elsewhere the later fsync does all the work.
fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: the descriptor is open for the duration of the call; the call only
        // schedules writeback of the file's dirty pages and touches no memory of ours.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// The name of an entry of `dir` that `ours` does not accept, if any (to refuse writing
/// into a directory that holds something else).
pub fn entry_other_than(dir: &Path, ours: impl Fn(&str) -> bool) -> Result<Option<String>> {
    for entry in std::fs::read_dir(dir).at(dir)? {
        let name = entry.at(dir)?.file_name().to_string_lossy().into_owned();
        if !ours(&name) {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// Makes a rename inside `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn a_bare_file_name_is_in_the_current_directory() {
        assert_eq!(directory_of(Path::new("state.json")), Path::new("."));
        assert_eq!(directory_of(Path::new("./state.json")), Path::new("."));
        assert_eq!(directory_of(Path::new("a/b/state.json")), Path::new("a/b"));
        assert_eq!(directory_of(Path::new("/state.json")), Path::new("/"));
    }

    #[test]
    fn failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x.bin");
        let r: Result<()> = write_atomic(&target, Durability::Now, |w| {
            w.write_all(b"partial").unwrap();
            Err(Error::config("test", "boom"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        write_bytes_atomic(&target, b"whole").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
