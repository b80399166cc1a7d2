//! Finding the input files of a Kaggle-layout directory, or taking them as given.
//!
//! ```text
//! ROOT/train/batch_1.parquet ...   pulses, one file per batch id
//! ROOT/train_meta.parquet          or ROOT/train_meta/*.parquet (one meta file per batch)
//! ROOT/sensor_geometry.csv
//! ```
//! (`test` in place of `train` for the test split.)

use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

/// One `batch_N.parquet` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInput {
    /// `N` from the file name; the meta table's `batch_id`.
    pub batch_id: i64,
    /// Where it is.
    pub path: PathBuf,
}

/// Every file one conversion reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSet {
    /// Pulse files, sorted by batch id (ids are unique).
    pub batches: Vec<BatchInput>,
    /// Meta files; each may describe any batches.
    pub meta: Vec<PathBuf>,
    /// `sensor_geometry.csv`.
    pub geometry: PathBuf,
}

/// The splits a Kaggle directory can hold.
pub const SPLITS: [&str; 2] = ["train", "test"];

/// The sensor geometry's file in a Kaggle directory.
pub const GEOMETRY_FILE: &str = "sensor_geometry.csv";

/// Split `split`'s meta table as one file: `train_meta.parquet`.
pub fn meta_file(split: &str) -> String {
    format!("{split}_meta.parquet")
}

/// Split `split`'s meta table as one file per batch, in this directory: `train_meta`.
pub fn meta_dir(split: &str) -> String {
    format!("{split}_meta")
}

impl InputSet {
    /// Discovers the files of `split` (or of the only split present) under `root`.
    pub fn discover(root: &Path, split: Option<&str>) -> Result<InputSet> {
        let layout_err = |problem: String| Error::Layout {
            path: root.to_path_buf(),
            problem,
        };
        if !root.is_dir() {
            return Err(layout_err("is not a directory".into()));
        }
        let split = match split {
            Some(s) => s.to_string(),
            None => {
                let present: Vec<&str> = SPLITS
                    .iter()
                    .copied()
                    .filter(|s| root.join(s).is_dir())
                    .collect();
                match present.as_slice() {
                    [one] => one.to_string(),
                    [] => {
                        return Err(layout_err(
                            "no train/ or test/ directory of batch_N.parquet files".into(),
                        ))
                    }
                    _ => {
                        return Err(layout_err(
                            "holds both train/ and test/: choose one with --split".into(),
                        ))
                    }
                }
            }
        };
        let batch_dir = root.join(&split);
        let mut batches = Vec::new();
        for path in list_files(&batch_dir)? {
            match batch_id_of(&path) {
                Some(batch_id) => batches.push(BatchInput { batch_id, path }),
                // Other files (notes, a checksum list) are no concern of the conversion; a
                // Parquet file is likely data the user meant, so it is named.
                None if path.extension().is_some_and(|e| e == "parquet") => tracing::warn!(
                    "{}: not converted: a batch file is named batch_N.parquet, N its batch id \
                     in the meta (0 or more)",
                    path.display()
                ),
                None => {}
            }
        }
        if batches.is_empty() {
            return Err(Error::Layout {
                path: batch_dir,
                problem: "no batch_N.parquet files".into(),
            });
        }
        let single = root.join(meta_file(&split));
        let per_batch_dir = root.join(meta_dir(&split));
        let meta = if single.is_file() {
            vec![single]
        } else if per_batch_dir.is_dir() {
            list_files(&per_batch_dir)?
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
                .collect()
        } else {
            Vec::new()
        };
        if meta.is_empty() {
            return Err(layout_err(format!(
                "no meta file: expected {split}_meta.parquet or {split}_meta/*.parquet"
            )));
        }
        Self::from_paths(
            batches.into_iter().map(|b| b.path).collect(),
            meta,
            root.join(GEOMETRY_FILE),
        )
    }

    /// Takes explicit paths; batch ids come from the `batch_N.parquet` file names. Every
    /// path is made canonical (absolute, its directories' symlinks resolved; the file name
    /// kept, since it carries the batch id), so the working directory and the spelling of a
    /// path never change a plan or a manifest.
    pub fn from_paths(
        batch_paths: Vec<PathBuf>,
        meta: Vec<PathBuf>,
        geometry: PathBuf,
    ) -> Result<InputSet> {
        for path in batch_paths
            .iter()
            .chain(&meta)
            .chain(std::iter::once(&geometry))
        {
            if !path.is_file() {
                return Err(Error::Layout {
                    path: path.clone(),
                    problem: "file not found".into(),
                });
            }
        }
        let batch_paths = canonical_all(batch_paths)?;
        let meta = canonical_all(meta)?;
        let geometry = canonical(&geometry)?;
        let mut batches = Vec::with_capacity(batch_paths.len());
        for path in batch_paths {
            let batch_id = batch_id_of(&path).ok_or_else(|| Error::Layout {
                path: path.clone(),
                problem: "batch file name must be batch_N.parquet (N is the meta's batch_id)"
                    .into(),
            })?;
            batches.push(BatchInput { batch_id, path });
        }
        batches.sort_by_key(|b| b.batch_id);
        if let Some(w) = batches.windows(2).find(|w| w[0].batch_id == w[1].batch_id) {
            return Err(Error::Layout {
                path: w[1].path.clone(),
                problem: format!(
                    "batch id {} also given as {}",
                    w[1].batch_id,
                    w[0].path.display()
                ),
            });
        }
        if batches.is_empty() {
            return Err(Error::config("inputs", "no batch files given"));
        }
        if meta.is_empty() {
            return Err(Error::config("inputs", "no meta files given"));
        }
        Ok(InputSet {
            batches,
            meta,
            geometry,
        })
    }
}

/// `path` absolute, with its directory's symlinks and `..` resolved and its file name kept.
fn canonical(path: &Path) -> Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| Error::Layout {
        path: path.to_path_buf(),
        problem: "not a file name".into(),
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok(std::fs::canonicalize(parent).at(parent)?.join(name))
}

fn canonical_all(paths: Vec<PathBuf>) -> Result<Vec<PathBuf>> {
    paths.iter().map(|p| canonical(p)).collect()
}

/// `Some(N)` for a file named `batch_N.parquet`.
pub fn batch_id_of(path: &Path) -> Option<i64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_prefix("batch_")?.strip_suffix(".parquet")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The regular files in `dir`, sorted by name.
fn list_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).at(dir)? {
        let path = entry.at(dir)?.path();
        if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_come_from_strict_names() {
        assert_eq!(batch_id_of(Path::new("a/batch_661.parquet")), Some(661));
        assert_eq!(batch_id_of(Path::new("batch_1_meta.parquet")), None);
        assert_eq!(batch_id_of(Path::new("batch_.parquet")), None);
        assert_eq!(batch_id_of(Path::new("batch_-1.parquet")), None);
    }
}
