//! `shardify copy`: a dataset copied to another directory (a node's local disk before a
//! training job), checked on the way and laid out in the page cache as `convert` lays it.
//!
//! Why not `cp`: the loader reads shards through memory maps at random, which goes faster
//! when the page cache holds them in huge pages (one TLB entry per 2 MiB). A filesystem
//! that caches files in large folios gives a file huge pages where it was written in
//! aligned 2 MiB pieces, as `convert` writes shards ([`crate::format::chunked`]); `cp`
//! copies in the kernel or in smaller pieces. Measured on ext4 (kernel 6.18): `cp`'s copy
//! 0% mapped in huge pages, this copy 99%, and the loader 9-15% faster at window 64 on it
//! (docs/results.md, "Copies in huge pages").
//!
//! Each file is read once: its XXH3 is computed on the way and compared with the manifest's
//! before the copy gets its name, so a damaged source never becomes a copy that looks
//! valid. The manifest is written last, once every file is on stable storage: a copy
//! stopped before that has no manifest and no dataset opens it. On an error, the files
//! this copy made are removed again.
//!
//! With another layout than the source's ([`ShardLayout`]), each shard is written again in
//! that layout instead of copied ([`crate::convert::relayout`]): read through the source's
//! checked views, written in the same aligned chunks, then opened and validated in full
//! before the manifest (the source's, with the new layout and the new files' sizes and
//! checksums) names it.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;

use super::{ChecksumPolicy, Dataset, FirstRead, Shard};
use crate::convert::relayout::write_view;
use crate::convert::Progress;
use crate::error::{Error, IoContext, Result};
use crate::format::atomic::{
    entry_other_than, is_temp_name, sync_dir, sync_file, write_atomic, write_bytes_atomic,
    Durability,
};
use crate::format::checksum::{self, Checksum};
use crate::format::chunked::MAPPED_FILE_CHUNK;
use crate::format::manifest::DataFile;
use crate::format::{Manifest, ShardEntry, ShardLayout, ShardProblem, MANIFEST_FILE};

/// Bytes read from the source at a time, per file copied at once: whole chunks of the
/// copy.
const READ_BUFFER: usize = 4 * MAPPED_FILE_CHUNK;

/// What [`copy_dataset`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyReport {
    /// Shards copied (and with them the sensor table and the manifest).
    pub shards: usize,
    /// The bytes of all files copied, the manifest's included.
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

/// Copies the dataset in `source` to `destination`, which must not exist or be an empty
/// directory: every file the manifest lists, each checked against its recorded size and
/// checksum, then the manifest itself, byte for byte; or, with a `layout` other than the
/// source's, its shards written again in that layout (see the module's documentation).
/// Files are copied in parallel on rayon's pool; `progress` hears of phase `"copy"`, one
/// unit per file (with its pulses). Files in `source` the manifest does not list are not
/// copied.
pub fn copy_dataset(
    source: &Path,
    destination: &Path,
    layout: Option<ShardLayout>,
    progress: &dyn Progress,
) -> Result<CopyReport> {
    let started = Instant::now();
    let manifest_path = source.join(MANIFEST_FILE);
    let mut manifest_bytes = std::fs::read(&manifest_path).at(&manifest_path)?;
    let manifest = Manifest::parse(&manifest_path, &manifest_bytes)?;
    let relayout = layout.filter(|&l| l != manifest.schema.layout);
    // Opened only to write shards again: each checked (checksum, then structure) as it is
    // first read.
    let dataset = relayout
        .map(|_| Dataset::open(source, ChecksumPolicy::Lazy))
        .transpose()?;
    let created = prepare_destination(destination)?;
    let files: Vec<DataFile> = manifest.data_files().collect();
    progress.begin("copy", files.len() as u64);
    let mut file_bytes: u64 = files.iter().map(|f| f.bytes).sum();
    let copied = files
        .par_iter()
        .enumerate()
        .map(|(i, file)| {
            let entry = match (&dataset, relayout) {
                (Some(dataset), Some(layout)) if i < dataset.shard_count() => {
                    Some(write_shard_as(dataset, i, destination, layout)?)
                }
                _ => {
                    copy_file(source, destination, file)?;
                    None
                }
            };
            progress.advance(file.pulses);
            Ok(entry)
        })
        .collect::<Result<Vec<Option<ShardEntry>>>>()
        .and_then(|entries| {
            if let Some(layout) = relayout {
                let mut relaid = manifest.clone();
                relaid.schema.layout = layout;
                relaid.shards = entries.into_iter().flatten().collect();
                relaid.totals.bytes = relaid.shards.iter().map(|s| s.bytes).sum();
                manifest_bytes = relaid.to_bytes();
                file_bytes = relaid.totals.bytes + relaid.sensor_table.bytes;
            }
            // The copies were not synced one by one: sync them all before the manifest
            // declares the dataset complete, as `convert` does.
            files
                .par_iter()
                .map(|f| sync_file(&destination.join(f.file)))
                .collect::<Result<Vec<()>>>()?;
            sync_dir(destination)?;
            write_bytes_atomic(&destination.join(MANIFEST_FILE), &manifest_bytes)
        });
    progress.end();
    if let Err(e) = copied {
        remove_copies(destination, &files, created);
        return Err(e);
    }
    Ok(CopyReport {
        shards: manifest.shards.len(),
        bytes: file_bytes + manifest_bytes.len() as u64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Makes sure `destination` is an empty directory; returns the topmost directory it
/// created for it (`destination` or one of its parents), if any.
fn prepare_destination(destination: &Path) -> Result<Option<PathBuf>> {
    if !destination.exists() {
        let topmost = destination
            .ancestors()
            .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
            .last()
            .map(Path::to_path_buf);
        std::fs::create_dir_all(destination).at(destination)?;
        return Ok(topmost);
    }
    if !destination.is_dir() {
        return Err(Error::Layout {
            path: destination.to_path_buf(),
            problem: "the destination exists and is not a directory".into(),
        });
    }
    // Temp files are a stopped copy's; they never have a final name, so they are harmless.
    if let Some(holds) = entry_other_than(destination, is_temp_name)? {
        return Err(Error::NotEmpty {
            path: destination.to_path_buf(),
            holds,
        });
    }
    Ok(None)
}

/// Copies `file` from `source` into `destination` in aligned chunks, checking its size and
/// checksum before it gets its name.
fn copy_file(source: &Path, destination: &Path, file: &DataFile) -> Result<()> {
    let from = source.join(file.file);
    let mut input = File::open(&from).at(&from)?;
    let mut hasher = Checksum::new();
    let mut buffer = vec![0u8; READ_BUFFER];
    let target = destination.join(file.file);
    write_atomic(&target, Durability::Deferred, |out| {
        let mut bytes = 0u64;
        loop {
            let n = match input.read(&mut buffer) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                read => read.at(&from)?,
            };
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            out.write_all(&buffer[..n]).at(&target)?;
            bytes += n as u64;
        }
        if bytes != file.bytes {
            return Err(Error::shard(
                &from,
                ShardProblem::Size {
                    found: bytes,
                    expected: file.bytes,
                },
            ));
        }
        checksum::check(&from, hasher.hex(), file.xxh3)
    })
}

/// Writes shard `i` of `dataset` into `destination` in `layout`, then opens the written
/// file and validates it in full; returns its manifest entry.
fn write_shard_as(
    dataset: &Dataset,
    i: usize,
    destination: &Path,
    layout: ShardLayout,
) -> Result<ShardEntry> {
    let shard = dataset.shard(i)?;
    let columns = shard.columns()?;
    let entry = &dataset.manifest().shards[i];
    let target = destination.join(&entry.file);
    let written = write_view(&target, &columns.view(), &shard.header().metadata, layout)?;
    let rows = dataset.sensor_table().rows();
    Shard::open(&target, &written, rows, layout, FirstRead::Structure)?;
    Ok(written)
}

/// Removes what a failed copy made: its files (the destination held none of their names
/// before), and the directories it created, up to `created`.
fn remove_copies(destination: &Path, files: &[DataFile], created: Option<PathBuf>) {
    for file in files {
        let _ = std::fs::remove_file(destination.join(file.file));
    }
    let Some(topmost) = created else { return };
    for dir in destination.ancestors() {
        // `remove_dir` removes only empty directories: nothing the copy did not make.
        if std::fs::remove_dir(dir).is_err() || dir == topmost {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `len` pseudo-random bytes at `dir/name`.
    fn random_file(dir: &Path, name: &str, len: usize) -> Vec<u8> {
        let mut rng = crate::rng::Rng::new(len as u64);
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        std::fs::write(dir.join(name), &bytes).unwrap();
        bytes
    }

    #[test]
    fn a_file_of_several_reads_is_copied_whole_and_checked() {
        let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // Several reads, and a last chunk that is not whole.
        let len = 2 * READ_BUFFER + MAPPED_FILE_CHUNK + 12_345;
        let bytes = random_file(src.path(), "f", len);
        let xxh3 = checksum::of_bytes(&bytes);
        let file = DataFile {
            file: "f",
            bytes: len as u64,
            xxh3: &xxh3,
            pulses: 0,
        };
        copy_file(src.path(), dst.path(), &file).unwrap();
        assert!(std::fs::read(dst.path().join("f")).unwrap() == bytes);

        // The same file against another checksum or size: an error, and no file.
        let other = dst.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let wrong_sum = DataFile {
            xxh3: "0000000000000000",
            ..file
        };
        assert!(matches!(
            copy_file(src.path(), &other, &wrong_sum),
            Err(Error::Checksum { found, .. }) if found == xxh3
        ));
        let wrong_size = DataFile {
            bytes: len as u64 + 1,
            ..file
        };
        assert!(matches!(
            copy_file(src.path(), &other, &wrong_size),
            Err(Error::Shard {
                problem: ShardProblem::Size { found, .. },
                ..
            }) if found == len as u64
        ));
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
    }
}
