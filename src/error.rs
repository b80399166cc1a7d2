//! The one error type of the library: every variant names the file and, where it
//! applies, the row, event or field that is wrong.

use std::path::{Path, PathBuf};

/// A library result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while reading input, converting or reading shards.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system error on a named file or directory.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A Parquet file could not be decoded (truncated, corrupt, unsupported codec).
    #[error("{path}: not a readable Parquet file: {source}")]
    Parquet {
        /// The Parquet file.
        path: PathBuf,
        /// The decoder's error.
        source: parquet::errors::ParquetError,
    },
    /// A Parquet file could not be encoded while it was written (an operating-system error
    /// while writing it, a full disk among them, is [`Error::Io`]).
    #[error("{path}: writing Parquet: {source}")]
    ParquetWrite {
        /// The Parquet file.
        path: PathBuf,
        /// The encoder's error.
        source: parquet::errors::ParquetError,
    },
    /// A required column is missing from a file.
    #[error("{path}: missing column `{column}`")]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column that was expected.
        column: &'static str,
    },
    /// A column has a type that cannot hold what the schema requires.
    #[error("{path}: column `{column}` has type {found}, expected {expected}")]
    ColumnType {
        /// The file.
        path: PathBuf,
        /// The column.
        column: &'static str,
        /// The Parquet type found (physical type and annotation).
        found: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A value in a file breaks a rule of the input schema.
    #[error("{path}: row {row}, column `{column}`: {problem}")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// Zero-based row within the file.
        row: u64,
        /// The column.
        column: &'static str,
        /// What is wrong, with the value.
        problem: String,
    },
    /// The meta table and a batch file disagree.
    #[error("{meta}: batch {batch_id} ({batch_file}): {problem}")]
    Meta {
        /// The meta file (or files) consulted.
        meta: PathBuf,
        /// The batch file it describes.
        batch_file: PathBuf,
        /// The batch id.
        batch_id: i64,
        /// What is wrong, naming the event and rows.
        problem: String,
    },
    /// The same event id appears twice in the input.
    #[error("event {event_id} appears twice: in {first} (row {first_row}) and in {second} (row {second_row})")]
    DuplicateEvent {
        /// The event id.
        event_id: i64,
        /// One file holding it.
        first: PathBuf,
        /// Its first row there.
        first_row: u64,
        /// The other file holding it.
        second: PathBuf,
        /// Its first row there.
        second_row: u64,
    },
    /// The sensor geometry file is malformed.
    #[error("{path}: line {line}: {problem}")]
    Geometry {
        /// The CSV file.
        path: PathBuf,
        /// One-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// The input directory does not have the expected layout.
    #[error("{path}: {problem}")]
    Layout {
        /// The directory or file.
        path: PathBuf,
        /// What is missing or ambiguous.
        problem: String,
    },
    /// An output directory that already holds something (`holds`: one of its entries):
    /// nothing is written into it.
    #[error("{path}: output directory is not empty (holds {holds}); refusing to write into it")]
    NotEmpty {
        /// The output directory.
        path: PathBuf,
        /// The name of an entry it holds.
        holds: String,
    },
    /// Another conversion is writing into the output directory: a whole conversion, its
    /// plan and its finalize each write alone; only a job array's scatter and gather tasks
    /// share it.
    #[error("{path}: another `shardify convert` is writing into this directory (a whole conversion, its plan and its finalize phase each need it alone; a job array's scatter and gather tasks share it): wait for it to end, or stop it and run this again")]
    Busy {
        /// The output directory.
        path: PathBuf,
    },
    /// A shard file (or the sensor table) is malformed or does not match the manifest.
    #[error("shard {path}: {problem}")]
    Shard {
        /// The shard file.
        path: PathBuf,
        /// What is wrong.
        problem: crate::format::ShardProblem,
    },
    /// A dataset written in another format version than this crate reads.
    #[error("{path}: the dataset is {found}; this shardify reads {} version {}: convert the source again with `shardify convert`", crate::format::FORMAT, crate::format::FORMAT_VERSION)]
    FormatVersion {
        /// The manifest.
        path: PathBuf,
        /// The format and version found.
        found: String,
    },
    /// A manifest, plan or work file is malformed or does not match.
    #[error("{path}: {problem}")]
    Manifest {
        /// The JSON file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A file's contents do not match its recorded checksum.
    #[error("{path}: checksum mismatch (manifest says {expected}, file has {found})")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The recorded checksum.
        expected: String,
        /// The checksum computed now.
        found: String,
    },
    /// A spill file of an unfinished conversion is damaged.
    #[error("spill file {path}: {problem}")]
    Spill {
        /// The spill file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The output's filesystem cannot hold what a conversion or copy will write.
    #[error("{path}: {what} needs about {needed} bytes more ({}) but the filesystem has {available} free ({}); free some space or write elsewhere", in_units(*needed), in_units(*available))]
    NoSpace {
        /// The output directory.
        path: PathBuf,
        /// The writer and what it writes ("the conversion (spill files and shards)",
        /// "the copy").
        what: String,
        /// Estimated bytes still to be written.
        needed: u64,
        /// Bytes free for this user.
        available: u64,
    },
    /// A setting that cannot work, named so a caller can tell which.
    #[error("invalid {field}: {problem}")]
    Config {
        /// The setting: `workers`, `device_buffers`, `shard_size`, `rank`, ...
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A CUDA device could not be used: no driver, no such device, or a driver call failed.
    #[error("CUDA: {0}")]
    Device(String),
    /// A host-to-device copy failed after it was queued, and its completion could not be
    /// confirmed: the copy may still read its source and write its destination, so both
    /// are kept (leaked) rather than reused.
    #[error(
        "CUDA: {0} (after the copy was queued: its source and device buffer are kept, not reused)"
    )]
    CopyInFlight(String),
}

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// Wraps a Parquet error with the file it concerns.
    pub fn parquet(path: impl AsRef<Path>, source: parquet::errors::ParquetError) -> Self {
        Error::Parquet {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// An error of the Parquet writer writing `path`: [`Error::Io`] where it is the
    /// operating system's (the writer passes those on wrapped), else [`Error::ParquetWrite`].
    pub fn parquet_write(path: impl AsRef<Path>, source: parquet::errors::ParquetError) -> Self {
        let path = path.as_ref().to_path_buf();
        match source {
            parquet::errors::ParquetError::External(e) => match e.downcast::<std::io::Error>() {
                Ok(io) => Error::Io { path, source: *io },
                Err(e) => Error::ParquetWrite {
                    path,
                    source: parquet::errors::ParquetError::External(e),
                },
            },
            source => Error::ParquetWrite { path, source },
        }
    }

    /// A malformed shard.
    pub fn shard(path: impl AsRef<Path>, problem: impl Into<crate::format::ShardProblem>) -> Self {
        Error::Shard {
            path: path.as_ref().to_path_buf(),
            problem: problem.into(),
        }
    }

    /// A setting that cannot work.
    pub fn config(field: &'static str, problem: impl Into<String>) -> Self {
        Error::Config {
            field,
            problem: problem.into(),
        }
    }

    /// A malformed or mismatching manifest/plan/work file.
    pub fn manifest(path: impl AsRef<Path>, problem: impl Into<String>) -> Self {
        Error::Manifest {
            path: path.as_ref().to_path_buf(),
            problem: problem.into(),
        }
    }
}

/// `error` and its causes as one line, each cause once: a message that already quotes its
/// cause (as [`Error::Io`] does) does not repeat it.
pub fn chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let line = c.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = c.source();
    }
    text
}

/// Adds the path to an `std::io::Result`.
pub(crate) trait IoContext<T> {
    /// Attaches `path` to the error.
    fn at(self, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &Path) -> Result<T> {
        self.map_err(|e| Error::io(path, e))
    }
}

/// `bytes` in the largest decimal unit that keeps a whole number in front: "65.5 kB",
/// "1.2 TB".
fn in_units(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_names_each_cause_once() {
        let full = std::io::Error::from_raw_os_error(28);
        let error = Error::io("out/shard_00001.safetensors", full);
        let text = chain_text(&error);
        assert_eq!(text.matches("os error 28").count(), 1, "{text}");
        assert!(text.starts_with("out/shard_00001.safetensors: "), "{text}");
    }

    #[test]
    fn sizes_read_in_the_largest_unit_that_keeps_a_whole_number() {
        let read: Vec<String> = [0, 999, 65_536, 1_500_000, 562_400_000_000, u64::MAX]
            .into_iter()
            .map(in_units)
            .collect();
        let expected = [
            "0 B",
            "999 B",
            "65.5 kB",
            "1.5 MB",
            "562.4 GB",
            "18446.7 PB",
        ];
        assert_eq!(read, expected);
    }
}
