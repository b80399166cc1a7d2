//! Free space on the filesystem a command writes to, checked before it writes, so that a
//! run that cannot finish says so at once instead of failing hours in.

use std::path::Path;

use crate::error::{Error, Result};

/// Refuses with [`Error::NoSpace`] when the filesystem of `path` has less than `needed`
/// bytes free for this user; `what` names the writer and what it writes, for the message.
/// A filesystem whose free space cannot be read passes.
pub fn check_space(path: &Path, needed: u64, what: &str) -> Result<()> {
    match free_bytes(path) {
        Some(available) if available < needed => Err(Error::NoSpace {
            path: path.to_path_buf(),
            what: what.to_string(),
            needed,
            available,
        }),
        _ => Ok(()),
    }
}

/// Bytes free for an unprivileged user in the filesystem of `path` (of its nearest existing
/// ancestor when it does not exist yet).
#[cfg(unix)]
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let absolute = std::path::absolute(path).ok()?;
    let path = absolute.ancestors().find(|p| p.exists())?;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string and `stats` points to writable memory of
    // the right type, which statvfs fills when it returns 0.
    let stats = unsafe {
        if libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return None;
        }
        stats.assume_init()
    };
    Some((stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

/// Free space is not checked on this platform.
#[cfg(not(unix))]
pub fn free_bytes(_: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_the_filesystem_holds_is_refused_naming_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(&dir.path().join("not/yet")).unwrap();
        assert!(free > 0);
        check_space(dir.path(), 1, "the copy").unwrap();
        match check_space(dir.path(), u64::MAX, "the copy") {
            Err(Error::NoSpace {
                path,
                what,
                needed,
                available,
            }) => {
                assert_eq!((path.as_path(), what.as_str()), (dir.path(), "the copy"));
                assert_eq!(needed, u64::MAX);
                assert!(available > 0 && available < u64::MAX);
            }
            other => panic!("expected NoSpace, got {other:?}"),
        }
    }
}
