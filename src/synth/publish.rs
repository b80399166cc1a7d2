//! How a generated split reaches its place whole: written under a hidden staging
//! directory, moved in when done (batches first, meta last), never over anything there,
//! and what a stopped run left taken back by the next.

use std::path::{Path, PathBuf};

use super::geometry_csv;
use crate::error::{Error, IoContext, Result};
use crate::format::atomic::{entry_other_than, TEMP_PREFIX};
use crate::source::layout::{meta_dir, meta_file, GEOMETRY_FILE};

/// Where split `split` is written before it is moved under `root`: a hidden directory
/// beside it, with a temp name, so a run stopped part-way never leaves a dataset that reads
/// as whole (and the next run for the split takes it away).
pub fn staging_dir(root: &Path, split: &str) -> PathBuf {
    root.join(format!("{TEMP_PREFIX}gen.{split}"))
}

/// Fails, naming what is there, where writing split `split` under `root` would overwrite
/// anything: its batch directory and meta must be absent (or an empty directory), and a
/// geometry already there must be the one written (so a second split can be added to a
/// generated dataset, and nothing of a real one is ever replaced).
pub(super) fn check_nothing_overwritten(root: &Path, split: &str) -> Result<()> {
    let geometry = root.join(GEOMETRY_FILE);
    if geometry.exists() && std::fs::read(&geometry).at(&geometry)? != geometry_csv().as_bytes() {
        return Err(Error::NotEmpty {
            path: root.to_path_buf(),
            holds: format!("{GEOMETRY_FILE}, another geometry than the generated one"),
        });
    }
    for name in [split.to_string(), meta_dir(split), meta_file(split)] {
        let path = root.join(&name);
        let empty_dir = path.is_dir() && entry_other_than(&path, |_| false)?.is_none();
        if path.symlink_metadata().is_ok() && !empty_dir {
            return Err(Error::NotEmpty {
                path: root.to_path_buf(),
                holds: name,
            });
        }
    }
    Ok(())
}

/// Where a split's two parts (its batch directory and its meta) lie, staged and in place.
pub(super) struct SplitPaths {
    /// The staging directory ([`staging_dir`]).
    pub(super) staging: PathBuf,
    batches: PathBuf,
    batches_staged: PathBuf,
    meta: PathBuf,
    meta_staged: PathBuf,
}

impl SplitPaths {
    /// Split `split`'s paths under `root`, its meta one file or (`meta_per_batch`) a
    /// directory of one file per batch.
    pub(super) fn new(root: &Path, split: &str, meta_per_batch: bool) -> SplitPaths {
        let staging = staging_dir(root, split);
        let meta = match meta_per_batch {
            true => meta_dir(split),
            false => meta_file(split),
        };
        SplitPaths {
            batches: root.join(split),
            batches_staged: staging.join(split),
            meta: root.join(&meta),
            meta_staged: staging.join(&meta),
            staging,
        }
    }

    /// Where a run was stopped between [`SplitPaths::publish`]'s two moves (its batch
    /// directory in place, its meta still staged), moves the batch directory back under
    /// the staging directory, to go with it: those batches were never published (discovery
    /// refuses a split without its meta). Only a staging directory holding the meta and no
    /// batch directory is such a run's, as a finished [`super::write_split`] writes the
    /// batch directory first and the meta last; anything else stays untouched.
    pub(super) fn take_back_unpublished(&self) -> Result<()> {
        let stopped = self.meta_staged.symlink_metadata().is_ok()
            && self.batches_staged.symlink_metadata().is_err()
            && self.meta.symlink_metadata().is_err()
            && self.batches.is_dir();
        if stopped {
            std::fs::rename(&self.batches, &self.batches_staged).at(&self.batches)?;
        }
        Ok(())
    }

    /// Moves the split, written whole under the staging directory, into place (an empty
    /// directory of the same name there is replaced): the batch directory, then the meta,
    /// then the staging directory goes. Where the meta cannot be moved, the batches go
    /// back under the staging directory, so no batches without their meta stay in the way
    /// of the next run.
    pub(super) fn publish(&self) -> Result<()> {
        std::fs::rename(&self.batches_staged, &self.batches).at(&self.batches)?;
        if let Err(e) = std::fs::rename(&self.meta_staged, &self.meta) {
            let _ = std::fs::rename(&self.batches, &self.batches_staged);
            return Err(Error::io(&self.meta, e));
        }
        std::fs::remove_dir(&self.staging).at(&self.staging)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{write_dataset, SynthOptions};

    /// A meta that cannot be put in place (a directory of its name) takes its batches back:
    /// nothing of the split is left, in place or staged, and the error names the meta.
    #[test]
    fn a_split_whose_meta_cannot_be_moved_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let blocking = root.join(meta_file("train"));
        std::fs::create_dir(&blocking).unwrap();
        let options = SynthOptions {
            events: 20,
            ..SynthOptions::default()
        };
        let failed = write_dataset(root, &options).unwrap_err();
        assert!(
            matches!(&failed, Error::Io { path, .. } if path == &blocking),
            "{failed}"
        );
        let mut left: Vec<_> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [GEOMETRY_FILE, &meta_file("train")]);
        assert_eq!(std::fs::read_dir(&blocking).unwrap().count(), 0);
    }
}
