//! A copy's destination: locked for the copy's whole run, then asked what it holds before
//! anything is written into it, so that running the same copy again (a requeued job, every
//! rank of a node at once) finds the copy made, finishes a stopped one, or waits for one
//! under way, and never writes over what it did not make.

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Finished;
use crate::error::{Error, IoContext, Result};
use crate::format::atomic::{is_temp_name, write_bytes_atomic};
use crate::format::lock::{try_lock, TryLock};
use crate::format::manifest::{DataFile, COPY_MARKER};
use crate::format::space::check_space;
use crate::format::{Manifest, ShardEntry, ShardLayout, MANIFEST_FILE};

/// What a copy makes: a dataset's events in a layout. A stopped copy's destination keeps
/// it in [`COPY_MARKER`], so that the copy run again knows the files there as its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct CopyOf {
    /// The source's [`Manifest::order_identity`], hex.
    pub identity: String,
    /// The copy's layout.
    pub layout: ShardLayout,
    /// The source directory, for people reading the file.
    pub source: PathBuf,
}

impl CopyOf {
    /// A copy of `manifest`'s dataset, read from `source`, in `layout`.
    pub fn new(manifest: &Manifest, source: &Path, layout: ShardLayout) -> CopyOf {
        CopyOf {
            identity: manifest.identity(),
            layout,
            source: source.to_path_buf(),
        }
    }
}

/// What a locked destination holds.
#[derive(Debug)]
pub(super) enum Holds {
    /// Nothing (temp files of stopped runs at most): the copy starts afresh.
    Nothing,
    /// A stopped copy of the same dataset in the same layout: the files it finished are
    /// the copy's own.
    StoppedCopy,
    /// The whole copy, finished by an earlier or concurrent run: every file its manifest
    /// lists at its size.
    Copy(Finished),
    /// The whole copy, finished, to be checked file by file: its manifest's shards.
    CopyToCheck(Vec<ShardEntry>),
}

/// A copy's destination directory, locked against every other copy until dropped.
#[derive(Debug)]
pub(super) struct Destination {
    path: PathBuf,
    /// The topmost directory this copy created for it, if any.
    created: Option<PathBuf>,
    /// The open directory whose lock is held (`None` where the filesystem keeps no locks).
    _lock: Option<File>,
}

impl Destination {
    /// Creates `path` if it is missing and locks it, waiting while another copy holds it
    /// (saying so once): that copy ends with the dataset there or with nothing there, and
    /// this one then sees which.
    pub fn lock(path: &Path) -> Result<Destination> {
        loop {
            let created = create(path)?;
            let lock = match File::open(path) {
                Ok(dir) => lock_waiting(path, dir)?,
                Err(e) => {
                    tracing::warn!(
                        "{}: cannot open the directory to lock it ({e}); other copies into \
                         it are not kept out",
                        path.display()
                    );
                    None
                }
            };
            // A copy that failed while this one waited removed the directory it had
            // created: lock the one at `path` now.
            if lock.as_ref().is_none_or(|dir| still_at(path, dir)) {
                return Ok(Destination {
                    path: path.to_path_buf(),
                    created,
                    _lock: lock,
                });
            }
        }
    }

    /// The destination directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the destination holds, for a copy making `copy` of the files `listed`; an
    /// error where it holds anything else, which the copy leaves as it is.
    /// With `check`, a finished copy is [`Holds::CopyToCheck`], whatever its files' sizes.
    pub fn holds(&self, copy: &CopyOf, listed: &[DataFile], check: bool) -> Result<Holds> {
        let mut names = Vec::new();
        let mut marked = false;
        for entry in std::fs::read_dir(&self.path).at(&self.path)? {
            let name = entry.at(&self.path)?.file_name();
            let name = name.to_string_lossy().into_owned();
            if name == COPY_MARKER {
                marked = true;
            } else if !is_temp_name(&name) {
                names.push(name);
            }
        }
        names.sort();
        if names.iter().any(|name| name == MANIFEST_FILE) {
            return self.finished_copy(copy, check);
        }
        let Some(first) = names.first() else {
            return Ok(Holds::Nothing);
        };
        let refused = |holds: String| Error::NotEmpty {
            path: self.path.clone(),
            holds,
        };
        if !marked {
            return Err(refused(first.clone()));
        }
        let marker = self.path.join(COPY_MARKER);
        let stopped: CopyOf = std::fs::read(&marker)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| refused(format!("{first}, and a damaged {COPY_MARKER}")))?;
        if stopped.identity != copy.identity || stopped.layout != copy.layout {
            return Err(refused(format!(
                "a stopped copy of another dataset or layout: {} in the {} layout, from {}; \
                 this copy makes {} in the {} layout",
                stopped.identity,
                stopped.layout.name(),
                stopped.source.display(),
                copy.identity,
                copy.layout.name()
            )));
        }
        match names
            .iter()
            .find(|name| !listed.iter().any(|f| f.file == *name))
        {
            Some(foreign) => Err(refused(foreign.clone())),
            None => Ok(Holds::StoppedCopy),
        }
    }

    /// The destination's manifest if it is `copy`'s result with every file it lists at
    /// its size (or, to `check`, at any); an error that says what it holds instead.
    fn finished_copy(&self, copy: &CopyOf, check: bool) -> Result<Holds> {
        let manifest = Manifest::read(&self.path)?;
        let identity = manifest.identity();
        if identity != copy.identity || manifest.schema.layout != copy.layout {
            let held = manifest.schema.layout.name();
            let holds = if identity == copy.identity {
                format!(
                    "this dataset in the {held} layout, where this copy writes the {} \
                     layout: copy into another directory",
                    copy.layout.name()
                )
            } else {
                format!(
                    "another dataset: {identity} ({} events, seed {}), where this copy makes \
                     {}",
                    manifest.totals.events, manifest.parameters.seed, copy.identity
                )
            };
            return Err(Error::NotEmpty {
                path: self.path.clone(),
                holds,
            });
        }
        if check {
            return Ok(Holds::CopyToCheck(manifest.shards));
        }
        let manifest_path = self.path.join(MANIFEST_FILE);
        let mut bytes = std::fs::metadata(&manifest_path).at(&manifest_path)?.len();
        for file in manifest.data_files() {
            bytes += file.bytes;
            let path = self.path.join(file.file);
            let found = std::fs::metadata(&path).map(|m| m.len()).ok();
            if found != Some(file.bytes) {
                let found = found.map_or("missing".to_string(), |n| format!("{n} bytes"));
                return Err(Error::Layout {
                    path: self.path.clone(),
                    problem: format!(
                        "holds this copy's manifest, but {} is {found} where the manifest \
                         says {} bytes: changed since it was copied? Copy again with \
                         --check (Python: check=True), which copies what differs",
                        file.file, file.bytes
                    ),
                });
            }
        }
        Ok(Holds::Copy(Finished {
            shards: manifest.shards.len(),
            bytes,
            kept: manifest.data_files().count(),
            written: 0,
        }))
    }

    /// Records, before any file is copied, that the files named in the manifest are
    /// `copy`'s own ([`COPY_MARKER`]).
    pub fn mark(&self, copy: &CopyOf) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(copy).expect("a copy's marker serialises");
        write_bytes_atomic(&self.path.join(COPY_MARKER), &bytes)
    }

    /// Removes the temp files of this and earlier runs (the marker among them), once the
    /// manifest is written; what cannot be removed is left, harmless.
    pub fn clean_up(&self) {
        self.remove_temp_files(|_| false);
    }

    /// Removes the temp files in the destination but those `keep` names; what cannot be
    /// removed is left, harmless.
    fn remove_temp_files(&self, keep: impl Fn(&str) -> bool) {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if is_temp_name(&name) && !keep(&name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Refuses with [`Error::NoSpace`] a copy of `files` and a manifest of
    /// `manifest_bytes` that the destination's filesystem cannot hold, counting the files
    /// already there at their sizes as written (a stopped copy's). In another layout a
    /// shard's size differs by a few percent: this is an estimate, which an unlucky copy
    /// may still meet as an error at its end.
    pub fn check_space(&self, files: &[DataFile], manifest_bytes: u64) -> Result<()> {
        let present = |file: &DataFile| {
            std::fs::metadata(self.path.join(file.file)).is_ok_and(|m| m.len() == file.bytes)
        };
        let needed: u64 = files
            .iter()
            .filter(|file| !present(file))
            .map(|file| file.bytes)
            .sum();
        check_space(&self.path, needed + manifest_bytes, "the copy")
    }

    /// What a failed run leaves where the same copy run again can finish it: a stopped
    /// copy, its marker and records, and every file it finished (each whole: renamed into
    /// place after its copy); only the temp files of writes in flight are removed.
    /// Returns whether there is such a copy (it was marked); where there is none, nothing
    /// is touched.
    pub fn leave_stopped(&self) -> bool {
        if !self.path.join(COPY_MARKER).exists() {
            return false;
        }
        self.remove_temp_files(is_copy_state);
        true
    }

    /// Removes the directories this copy created, while they are empty: what a copy
    /// refused before writing anything leaves.
    pub fn remove_created(&self) {
        let Some(topmost) = &self.created else { return };
        for dir in self.path.ancestors() {
            // `remove_dir` removes only empty directories: nothing the copy did not make.
            if std::fs::remove_dir(dir).is_err() || dir == topmost {
                return;
            }
        }
    }

    /// Removes what a failed copy made: the files it lists (no other run's: the
    /// destination held none of their names but a stopped run of this copy's), its temp
    /// files, and the directories it created; nothing once a manifest names the files.
    pub fn undo(&self, files: &[DataFile]) {
        // A manifest is renamed in after every file: whoever wrote it (this copy, whose
        // last sync then failed, or another one on a filesystem without locks), the files
        // it names are whole and stay.
        if self.path.join(MANIFEST_FILE).exists() {
            return;
        }
        for file in files {
            let _ = std::fs::remove_file(self.path.join(file.file));
        }
        self.clean_up();
        self.remove_created();
    }
}

/// How the names of a stopped copy's own state start: its marker ([`COPY_MARKER`]) and
/// the record of each shard it wrote in another layout (`.tmp.copy.<shard>.json`), temp
/// names that the finished copy removes.
pub(super) const COPY_STATE_PREFIX: &str = ".tmp.copy.";

/// Whether `name` is a stopped copy's own state ([`COPY_STATE_PREFIX`]).
fn is_copy_state(name: &str) -> bool {
    name.starts_with(COPY_STATE_PREFIX)
}

/// Creates `path` (and its missing parents) unless it is a directory already; returns the
/// topmost directory it created, if any.
fn create(path: &Path) -> Result<Option<PathBuf>> {
    if path.is_dir() {
        return Ok(None);
    }
    if path.exists() {
        return Err(Error::Layout {
            path: path.to_path_buf(),
            problem: "the destination exists and is not a directory".into(),
        });
    }
    let topmost = path
        .ancestors()
        .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
        .last()
        .map(Path::to_path_buf);
    std::fs::create_dir_all(path).at(path)?;
    Ok(topmost)
}

/// Locks the open directory `dir` (at `path`), waiting while another copy holds it.
fn lock_waiting(path: &Path, dir: File) -> Result<Option<File>> {
    match try_lock(&dir, true) {
        TryLock::Held => Ok(Some(dir)),
        TryLock::Taken => {
            tracing::warn!(
                "{}: another `shardify copy` is writing into it; waiting for it to end",
                path.display()
            );
            dir.lock().at(path)?;
            Ok(Some(dir))
        }
        TryLock::Unsupported(e) => {
            tracing::warn!(
                "{}: cannot lock ({e}); other copies into it are not kept out",
                path.display()
            );
            Ok(None)
        }
    }
}

/// Whether the open directory `dir` is still the one at `path`.
fn still_at(path: &Path, dir: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), dir.metadata()) {
        (Ok(now), Ok(locked)) => (now.dev(), now.ino()) == (locked.dev(), locked.ino()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_copy_removes_its_files_unless_a_manifest_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("made/copy");
        let destination = Destination::lock(&path).unwrap();
        let file = DataFile {
            file: "shard_00000.safetensors",
            bytes: 1,
            xxh3: "0",
            pulses: 0,
        };
        let write = |name: &str| std::fs::write(path.join(name), b"x").unwrap();
        write(file.file);
        write(MANIFEST_FILE);
        destination.undo(&[file]);
        assert!(path.join(file.file).exists() && path.join(MANIFEST_FILE).exists());

        std::fs::remove_file(path.join(MANIFEST_FILE)).unwrap();
        write(COPY_MARKER);
        destination.undo(&[file]);
        // The files, the marker and the directories this copy created are gone.
        assert!(!dir.path().join("made").exists());
    }

    #[test]
    fn a_stopped_copy_keeps_its_state_and_whole_files_but_no_write_in_flight() {
        assert!(COPY_MARKER.starts_with(COPY_STATE_PREFIX) && is_temp_name(COPY_MARKER));
        let dir = tempfile::tempdir().unwrap();
        let destination = Destination::lock(dir.path()).unwrap();
        let write = |name: &str| std::fs::write(dir.path().join(name), b"x").unwrap();
        write("shard_00000.safetensors");
        write(".tmp.shard_00001.safetensors.123.0");
        assert!(
            !destination.leave_stopped(),
            "unmarked: nothing of a copy's to leave"
        );
        assert!(dir
            .path()
            .join(".tmp.shard_00001.safetensors.123.0")
            .exists());
        write(COPY_MARKER);
        write(".tmp.copy.shard_00002.safetensors.json");
        assert!(destination.leave_stopped());
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".tmp.copy.json",
                ".tmp.copy.shard_00002.safetensors.json",
                "shard_00000.safetensors"
            ]
        );
    }
}
