//! Advisory locks on whole files or directories (`flock` on Linux), which keep two runs
//! from writing into one directory at once. Released when the file is closed, however the
//! process ends.

use std::fs::{File, TryLockError};

/// What a try for a lock found.
#[derive(Debug)]
pub enum TryLock {
    /// The lock is ours until the file is closed.
    Held,
    /// Another open file holds it in a way that excludes ours.
    Taken,
    /// The filesystem keeps no such locks (some cluster filesystems): nothing is guarded.
    Unsupported(std::io::Error),
}

/// Tries to lock `file` without waiting: `exclusive`, or shared with other shared locks.
pub fn try_lock(file: &File, exclusive: bool) -> TryLock {
    let tried = if exclusive {
        file.try_lock()
    } else {
        file.try_lock_shared()
    };
    match tried {
        Ok(()) => TryLock::Held,
        Err(TryLockError::WouldBlock) => TryLock::Taken,
        Err(TryLockError::Error(e)) => TryLock::Unsupported(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_lock_keeps_out_every_other_and_shared_ones_each_other_not() {
        let dir = tempfile::tempdir().unwrap();
        let open = || File::open(dir.path()).unwrap();
        let (first, second) = (open(), open());
        assert!(matches!(try_lock(&first, true), TryLock::Held));
        assert!(matches!(try_lock(&second, true), TryLock::Taken));
        assert!(matches!(try_lock(&second, false), TryLock::Taken));
        drop(first);
        assert!(matches!(try_lock(&second, false), TryLock::Held));
        let third = open();
        assert!(matches!(try_lock(&third, false), TryLock::Held));
        assert!(matches!(try_lock(&open(), true), TryLock::Taken));
    }
}
