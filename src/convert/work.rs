//! The work directory of an unfinished conversion (`OUT/.work`) and the output directory's
//! file names. Every file here is written atomically; its existence marks a finished unit.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, IoContext, Result};
use crate::format::atomic::{entry_other_than, is_temp_name, write_bytes_atomic};
use crate::format::lock::{try_lock, TryLock};
use crate::format::manifest::WORK_DIR;
use crate::format::MANIFEST_FILE;

/// Paths of one conversion's output and work files.
#[derive(Debug, Clone)]
pub struct WorkDir {
    out: PathBuf,
}

impl WorkDir {
    /// The work layout under output directory `out`.
    pub fn new(out: &Path) -> WorkDir {
        WorkDir {
            out: out.to_path_buf(),
        }
    }

    /// The output (dataset) directory.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// `OUT/.work`.
    pub fn root(&self) -> PathBuf {
        self.out.join(WORK_DIR)
    }

    /// The stored plan.
    pub fn plan_file(&self) -> PathBuf {
        self.root().join("plan.json")
    }

    /// The meta table split by batch (see `meta_split`).
    pub fn meta_split_dir(&self) -> PathBuf {
        self.root().join("meta")
    }

    /// The spill file of a batch.
    pub fn spill_file(&self, batch_id: i64) -> PathBuf {
        self.root()
            .join("spill")
            .join(format!("batch_{batch_id}.spill"))
    }

    /// The chunk table of a batch's spill file (see `chunk_table`).
    pub fn chunk_table(&self, batch_id: i64) -> PathBuf {
        self.root()
            .join("spill")
            .join(format!("batch_{batch_id}.chunks"))
    }

    /// The index of a batch's spill file; its existence marks the scatter unit done.
    pub fn spill_index(&self, batch_id: i64) -> PathBuf {
        self.root()
            .join("spill")
            .join(format!("batch_{batch_id}.json"))
    }

    /// The record of a gathered bucket; its existence marks the gather unit done.
    pub fn bucket_record(&self, bucket: u64) -> PathBuf {
        self.root()
            .join("buckets")
            .join(format!("bucket_{bucket:05}.json"))
    }

    /// The shard file name of a bucket.
    pub fn shard_name(bucket: u64) -> String {
        format!("shard_{bucket:05}.safetensors")
    }

    /// Creates the directories, refusing an output directory that holds anything else.
    pub fn prepare(&self) -> Result<()> {
        if self.out.exists() && !self.plan_file().exists() {
            let ours = |name: &str| name == WORK_DIR || is_temp_name(name);
            if let Some(holds) = entry_other_than(&self.out, ours)? {
                return Err(Error::NotEmpty {
                    path: self.out.clone(),
                    holds,
                });
            }
        }
        for dir in [self.root().join("spill"), self.root().join("buckets")] {
            std::fs::create_dir_all(&dir).at(&dir)?;
        }
        Ok(())
    }

    /// Whether `OUT/manifest.json` exists.
    pub fn is_finished(&self) -> bool {
        self.out.join(MANIFEST_FILE).exists()
    }

    /// Reads a JSON work file.
    pub fn read_json<T: DeserializeOwned>(&self, path: &Path) -> Result<T> {
        let bytes = std::fs::read(path).at(path)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::manifest(path, format!("damaged work file: {e}")))
    }

    /// Writes a JSON work file atomically.
    pub fn write_json<T: Serialize>(&self, path: &Path, value: &T) -> Result<()> {
        write_bytes_atomic(
            path,
            &serde_json::to_vec_pretty(value).expect("work file serialises"),
        )
    }

    /// Removes the work directory and any temp file left in the output directory. What
    /// another run removes meanwhile (two runs that both found the dataset finished) is
    /// not an error.
    pub fn clean_up(&self) -> Result<()> {
        let gone = |result: std::io::Result<()>, path: &Path| match result {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other.at(path),
        };
        let root = self.root();
        gone(std::fs::remove_dir_all(&root), &root)?;
        for entry in std::fs::read_dir(&self.out).at(&self.out)? {
            let entry = entry.at(&self.out)?;
            if is_temp_name(&entry.file_name().to_string_lossy()) {
                let path = entry.path();
                gone(std::fs::remove_file(&path), &path)?;
            }
        }
        Ok(())
    }

    /// Locks the work directory (it must exist: [`WorkDir::prepare`]) for this run, until
    /// the lock is dropped: `alone` for a run that writes alone, else shared with the other
    /// tasks of a job array. Another run holding it in a way that excludes this one is
    /// [`Error::Busy`]. A filesystem without locks (some cluster filesystems) leaves the
    /// run unguarded, as before locks existed: its units are still written atomically.
    pub fn lock(&self, alone: bool) -> Result<WorkLock> {
        let path = self.root().join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .at(&path)?;
        match try_lock(&file, alone) {
            TryLock::Held => {}
            TryLock::Taken => {
                return Err(Error::Busy {
                    path: self.out.clone(),
                })
            }
            TryLock::Unsupported(e) => {
                tracing::warn!(
                    "{}: cannot lock ({e}); other conversions into {} are not kept out",
                    path.display(),
                    self.out.display()
                );
            }
        }
        Ok(WorkLock { _file: file })
    }
}

/// The file in the work directory that [`WorkDir::lock`] locks.
const LOCK_FILE: &str = "lock";

/// A run's lock on a work directory ([`WorkDir::lock`]), released when dropped (or when the
/// process ends, however it ends).
#[derive(Debug)]
pub struct WorkLock {
    _file: std::fs::File,
}
