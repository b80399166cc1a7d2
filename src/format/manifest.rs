//! The dataset manifest (`manifest.json`): what a dataset directory holds, how it was made
//! and from what. Written last, atomically: a directory without one is not a dataset.

use std::io::ErrorKind;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::checksum;
use super::lock::TryLock;
use super::records::ShardLayout;
use super::sensor_table::SensorTableEntry;
use super::shard::{ShardEntry, StorageTypes};
pub use super::{FORMAT, FORMAT_VERSION};
use crate::error::{Error, IoContext, Result};
use crate::source::layout::{meta_dir, meta_file, GEOMETRY_FILE, SPLITS};

/// The manifest's file name inside a dataset directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The directory in which an unfinished conversion keeps its progress, inside its output
/// directory; removed once the manifest is written.
pub const WORK_DIR: &str = ".work";

/// The file in which an unfinished `shardify copy` names what it copies, inside its
/// destination; a temp file's name, so it never passes for a dataset's. Removed once the
/// manifest is written.
pub const COPY_MARKER: &str = ".tmp.copy.json";

/// Conversion parameters that decide the output bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parameters {
    /// Seed of the global shuffle.
    pub seed: u64,
    /// Number of shuffle buckets; each non-empty bucket becomes one shard.
    pub bucket_count: u64,
    /// Target shard size in bytes, as asked for.
    pub shard_target_bytes: u64,
    /// Memory limit in bytes, as asked for (it can lower the shard size).
    pub memory_limit_bytes: u64,
    /// Whether narrowing that loses precision was allowed.
    pub lossy: bool,
    /// The layout the shards were written in (columns when absent: conversions from
    /// before the records layout).
    #[serde(default)]
    pub layout: ShardLayout,
}

/// One input file, identified by content rather than by time stamps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// The path as given to the converter.
    pub path: String,
    /// File size in bytes.
    pub bytes: u64,
    /// Rows (Parquet files only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rows: Option<u64>,
    /// Batch id (batch files only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub batch_id: Option<i64>,
    /// XXH3-64 of the Parquet footer, or of the whole file for the geometry CSV.
    pub fingerprint: String,
}

/// Lineage: every file the dataset was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sources {
    /// `batch_N.parquet` files, by batch id.
    pub batches: Vec<SourceFile>,
    /// Meta files.
    pub meta: Vec<SourceFile>,
    /// The sensor geometry CSV.
    pub geometry: SourceFile,
}

impl Sources {
    /// The same files by what they hold, their paths left out: where a requeued job or
    /// another node of a job array reads the inputs from may change, what they hold may
    /// not (their sizes, rows, batch ids and fingerprints).
    pub fn by_content(&self) -> Sources {
        let unplaced = |file: &SourceFile| SourceFile {
            path: String::new(),
            ..file.clone()
        };
        Sources {
            batches: self.batches.iter().map(unplaced).collect(),
            meta: self.meta.iter().map(unplaced).collect(),
            geometry: unplaced(&self.geometry),
        }
    }
}

/// How the data is laid out, in words and types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    /// Column widths chosen for this dataset.
    pub types: StorageTypes,
    /// How the shards store DOM- and pulse-level data (columns when absent: datasets
    /// written before records existed).
    #[serde(default)]
    pub layout: ShardLayout,
    /// The global event order.
    pub event_order: String,
    /// DOM order within an event.
    pub dom_order: String,
    /// Pulse order within a DOM.
    pub pulse_order: String,
}

impl Schema {
    /// The schema of datasets written by this version, with the given column widths.
    pub fn current(types: StorageTypes) -> Schema {
        Schema {
            types,
            layout: ShardLayout::Columns,
            event_order: "ascending xxh3_64(event_id as 8 LE bytes, seed); shards in bucket order"
                .into(),
            dom_order: "first hit time ascending, ties by sensor_id ascending".into(),
            pulse_order: "time ascending, ties in source row order".into(),
        }
    }
}

/// Counts over the whole dataset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Events.
    pub events: u64,
    /// DOMs.
    pub doms: u64,
    /// Pulses.
    pub pulses: u64,
    /// Bytes of all shards.
    pub bytes: u64,
}

impl Totals {
    /// The dataset's events' `length` summed: its pulses or its DOMs.
    pub fn of(&self, length: crate::sampler::EventLength) -> u64 {
        match length {
            crate::sampler::EventLength::Pulses => self.pulses,
            crate::sampler::EventLength::Doms => self.doms,
        }
    }
}

/// One of a dataset's files besides its manifest, as the manifest records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFile<'a> {
    /// Its name inside the dataset directory.
    pub file: &'a str,
    /// Its size.
    pub bytes: u64,
    /// XXH3-64 of the whole file, hex.
    pub xxh3: &'a str,
    /// The pulses it holds (0 for the sensor table).
    pub pulses: u64,
}

/// The manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// Parameters of the conversion.
    pub parameters: Parameters,
    /// Layout and types.
    pub schema: Schema,
    /// Totals.
    pub totals: Totals,
    /// Shards in global order.
    pub shards: Vec<ShardEntry>,
    /// The sensor table (positions by sensor id), stored once for all shards.
    pub sensor_table: SensorTableEntry,
    /// Lineage.
    pub sources: Sources,
}

impl Manifest {
    /// Reads and checks `dir/manifest.json`.
    ///
    /// A directory without a manifest is a not-found [`Error::Io`] that says what the
    /// directory holds instead: nothing at all, an unfinished conversion (run it again to
    /// finish it), a copy under way (wait for it) or stopped (run it again), the files of
    /// an unfinished copy, or no dataset.
    pub fn read(dir: &Path) -> Result<Manifest> {
        Manifest::read_with_bytes(dir).map(|(manifest, _)| manifest)
    }

    /// [`Manifest::read`], with the file's bytes as read.
    pub fn read_with_bytes(dir: &Path) -> Result<(Manifest, Vec<u8>)> {
        let path = dir.join(MANIFEST_FILE);
        let text = match std::fs::read(&path) {
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                return Err(no_manifest(dir));
            }
            read => read.at(&path)?,
        };
        Ok((Manifest::parse(&path, &text)?, text))
    }

    /// Parses and checks `text`, the contents of the manifest at `path` (named in errors).
    pub fn parse(path: &Path, text: &[u8]) -> Result<Manifest> {
        let path = path.to_path_buf();
        let not_ours =
            |e: serde_json::Error| Error::manifest(&path, format!("not a shardify manifest: {e}"));
        // The version first: an older manifest has other fields, and saying which version
        // it is helps more than naming a missing field.
        let value: serde_json::Value = serde_json::from_slice(text).map_err(not_ours)?;
        let format = value.get("format").and_then(|v| v.as_str());
        let version = value.get("format_version").and_then(|v| v.as_u64());
        if format != Some(FORMAT) || version != Some(FORMAT_VERSION.into()) {
            return Err(Error::FormatVersion {
                path,
                found: match (format, version) {
                    (Some(f), Some(v)) => format!("{f} version {v}"),
                    _ => "no shardify format version".into(),
                },
            });
        }
        let manifest: Manifest = serde_json::from_value(value).map_err(not_ours)?;
        for DataFile { file, .. } in manifest.data_files() {
            if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                return Err(Error::manifest(
                    &path,
                    format!("file name {file:?} is not a plain file name"),
                ));
            }
        }
        manifest.check_counts(&path)?;
        Ok(manifest)
    }

    /// Whether the counts agree with each other: each shard's events, DOMs, pulses and
    /// bytes in that order at most (no event without a DOM, no DOM without a pulse, no pulse
    /// without a byte of its file), and the totals their sums. A loader plans from these
    /// counts before it opens a shard (which compares them with what it holds): a damaged
    /// count must not reach it (a shard said to hold 2^63 events had `shardify order` ask
    /// for 2^59 bytes and abort).
    fn check_counts(&self, path: &Path) -> Result<()> {
        let mut sums = [0u64; 4];
        for shard in &self.shards {
            let counts = [shard.events, shard.doms, shard.pulses, shard.bytes];
            if counts.windows(2).any(|pair| pair[0] > pair[1]) {
                return Err(Error::manifest(
                    path,
                    format!(
                        "shard {}: {} events, {} DOMs, {} pulses in {} bytes cannot be (each \
                         at most the next)",
                        shard.file, shard.events, shard.doms, shard.pulses, shard.bytes
                    ),
                ));
            }
            for (sum, count) in sums.iter_mut().zip(counts) {
                *sum = sum.saturating_add(count);
            }
        }
        let totals = &self.totals;
        let said = [totals.events, totals.doms, totals.pulses, totals.bytes];
        if sums != said {
            return Err(Error::manifest(
                path,
                format!(
                    "the totals (events, DOMs, pulses, bytes) say {said:?}, the shards add up to \
                     {sums:?}"
                ),
            ));
        }
        Ok(())
    }

    /// The dataset's files besides the manifest, as it records them: the shards in order,
    /// then the sensor table.
    pub fn data_files(&self) -> impl Iterator<Item = DataFile<'_>> {
        let shards = self.shards.iter().map(|s| DataFile {
            file: &s.file,
            bytes: s.bytes,
            xxh3: &s.xxh3,
            pulses: s.pulses,
        });
        let table = &self.sensor_table;
        shards.chain([DataFile {
            file: &table.file,
            bytes: table.bytes,
            xxh3: &table.xxh3,
            pulses: 0,
        }])
    }

    /// What decides which event sits where in the dataset and what it holds, as XXH3-64:
    /// the conversion's seed, buckets and precision, its sources' contents (sizes, rows,
    /// batch ids and fingerprints, not their paths) and every shard's counts. The same for
    /// a copy at any path and in either layout, which deliver the same batches; another
    /// for another conversion, source or shard size.
    pub fn order_identity(&self) -> u64 {
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        let parameters = &self.parameters;
        for n in [parameters.seed, parameters.bucket_count] {
            hash.update(&n.to_le_bytes());
        }
        hash.update(&[u8::from(parameters.lossy)]);
        let sources = &self.sources;
        let files = sources.batches.iter().chain(&sources.meta);
        for file in files.chain([&sources.geometry]) {
            let rows = file.rows.unwrap_or(u64::MAX);
            let batch = file.batch_id.unwrap_or(i64::MIN) as u64;
            for n in [file.bytes, rows, batch] {
                hash.update(&n.to_le_bytes());
            }
            hash.update(&(file.fingerprint.len() as u64).to_le_bytes());
            hash.update(file.fingerprint.as_bytes());
        }
        for shard in &self.shards {
            for n in [shard.events, shard.doms, shard.pulses] {
                hash.update(&n.to_le_bytes());
            }
        }
        hash.digest()
    }

    /// [`Manifest::order_identity`] as 16 hex digits: what `shardify inspect` prints, a
    /// loader's saved state records for a whole dataset, and a copy's marker names.
    pub fn identity(&self) -> String {
        checksum::hex(self.order_identity())
    }

    /// Writes `dir/manifest.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        super::atomic::write_bytes_atomic(&dir.join(MANIFEST_FILE), &self.to_bytes())
    }

    /// The manifest as [`Manifest::write`] writes it: pretty JSON and a newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut text = serde_json::to_vec_pretty(self).expect("manifest serialises");
        text.push(b'\n');
        text
    }
}

/// Whether a `shardify copy` holds the lock on `dir` now. Asked with a shared lock, let
/// go at once: a copy that starts meanwhile waits for it, never fails.
fn copy_under_way(dir: &Path) -> bool {
    std::fs::File::open(dir)
        .is_ok_and(|opened| matches!(super::lock::try_lock(&opened, false), TryLock::Taken))
}

/// Whether a directory entry named `name` is part of the Kaggle layout's input: its
/// geometry, or a meta table (one file, or a directory of one per batch).
fn is_kaggle_input(name: &str) -> bool {
    name == GEOMETRY_FILE
        || SPLITS
            .iter()
            .any(|split| name == meta_dir(split) || name == meta_file(split))
}

/// The not-found error for a directory `dir` without a manifest, saying what it holds
/// instead and what to do (a not-a-directory error where `dir` is a file).
fn no_manifest(dir: &Path) -> Error {
    let not_found =
        |path: &Path, text: String| Error::io(path, std::io::Error::new(ErrorKind::NotFound, text));
    let entries: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect(),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return not_found(dir, "no such dataset directory".into());
        }
        Err(e) if e.kind() == ErrorKind::NotADirectory => {
            let text = "not a directory: a dataset is the directory `shardify convert` or \
                        `shardify copy` wrote";
            return Error::io(dir, std::io::Error::new(e.kind(), text));
        }
        Err(e) => return Error::io(dir, e),
    };
    let path = dir.join(MANIFEST_FILE);
    let shown = dir.display();
    let holds = |file: &str| entries.iter().any(|name| name == file);
    let text = if holds(WORK_DIR) {
        format!(
            "not written yet: {shown} holds an unfinished conversion (its {WORK_DIR} \
             directory; the manifest is written last). Run the same `shardify convert` \
             again: it resumes where it stopped"
        )
    } else if holds(COPY_MARKER) && copy_under_way(dir) {
        format!(
            "not written yet: a `shardify copy` is writing {shown} now (it holds the \
             directory's lock; the manifest is written last). Wait for it to end: \
             `shardify copy` or `shardify.copy_dataset` run with the same arguments waits for \
             it and returns once the copy is there"
        )
    } else if holds(COPY_MARKER) {
        format!(
            "not written yet: {shown} holds a copy that did not finish (its {COPY_MARKER}; \
             the manifest is written last). Run the same `shardify copy` again: it keeps \
             the files already copied and checked"
        )
    } else if let Some(data) = entries
        .iter()
        .find(|name| name.ends_with(".safetensors") || super::atomic::is_temp_name(name))
    {
        format!(
            "missing, though {shown} holds dataset files ({data}): a copy or conversion \
             that did not finish (the manifest is written last). Remove the directory and \
             copy or convert again"
        )
    } else if let Some(input) = entries.iter().find(|name| is_kaggle_input(name)) {
        format!(
            "not found: {shown} holds Parquet input in the Kaggle layout ({input}), not a \
             converted dataset. Convert it first, `shardify convert {shown} OUT`, and open OUT"
        )
    } else {
        format!("not found; {shown} holds no shardify dataset")
    };
    not_found(&path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path and text of the not-found error reading `dir`'s manifest gives.
    fn not_found(dir: &Path) -> (std::path::PathBuf, String) {
        match Manifest::read(dir) {
            Err(Error::Io { path, source }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "{source}");
                (path, source.to_string())
            }
            other => panic!("expected a not-found error, got {other:?}"),
        }
    }

    #[test]
    fn a_directory_without_a_manifest_is_not_found_saying_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert_eq!(
            not_found(&missing),
            (missing.clone(), "no such dataset directory".into())
        );

        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        match Manifest::read(&file) {
            Err(Error::Io { path, source }) => {
                assert_eq!(path, file);
                assert_eq!(source.kind(), std::io::ErrorKind::NotADirectory);
                assert!(source
                    .to_string()
                    .starts_with("not a directory: a dataset is"));
            }
            other => panic!("expected not-a-directory, got {other:?}"),
        }
        std::fs::remove_file(&file).unwrap();

        let (path, text) = not_found(dir.path());
        assert_eq!(path, dir.path().join(MANIFEST_FILE));
        assert!(text.contains("holds no shardify dataset"), "{text}");

        // The source, given where its conversion was meant.
        let source = dir.path().join("kaggle");
        std::fs::create_dir(&source).unwrap();
        for (name, shown) in [
            ("train", None),
            ("test_meta", Some("test_meta")),
            ("sensor_geometry.csv", Some("sensor_geometry.csv")),
        ] {
            std::fs::write(source.join(name), b"x").unwrap();
            let (_, text) = not_found(&source);
            match shown {
                None => assert!(text.contains("holds no shardify dataset"), "{text}"),
                Some(shown) => assert_eq!(
                    text,
                    format!(
                        "not found: {0} holds Parquet input in the Kaggle layout ({shown}), \
                         not a converted dataset. Convert it first, `shardify convert {0} OUT`, \
                         and open OUT",
                        source.display()
                    )
                ),
            }
            std::fs::remove_file(source.join(name)).unwrap();
        }

        std::fs::write(dir.path().join("shard_00003.safetensors"), b"x").unwrap();
        let (_, text) = not_found(dir.path());
        assert!(
            text.contains("dataset files (shard_00003.safetensors)"),
            "{text}"
        );
        assert!(text.contains("Remove the directory"), "{text}");

        std::fs::write(dir.path().join(COPY_MARKER), b"{}").unwrap();
        let (_, text) = not_found(dir.path());
        assert!(text.contains("a copy that did not finish"), "{text}");
        assert!(
            text.contains("Run the same `shardify copy` again"),
            "{text}"
        );
        // The same files while a copy holds the directory's lock.
        let copying = std::fs::File::open(dir.path()).unwrap();
        copying.try_lock().unwrap();
        let (_, text) = not_found(dir.path());
        assert!(text.contains("a `shardify copy` is writing"), "{text}");
        assert!(text.contains("waits for it"), "{text}");
        drop(copying);

        std::fs::create_dir(dir.path().join(WORK_DIR)).unwrap();
        let (_, text) = not_found(dir.path());
        assert!(text.contains("an unfinished conversion"), "{text}");
        assert!(text.contains("resumes where it stopped"), "{text}");
    }
}
