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
//! stopped before that has no manifest and no dataset opens it. On an error that the same
//! copy run again may get past (the operating system's), or in a run that finished a
//! stopped copy, what it made stays as a stopped copy; on any other, the files this copy
//! made are removed again.
//!
//! The same copy run again is cheap and safe (`destination.rs`): a destination locked by
//! another copy is waited for; one that holds the finished copy is kept as it is; a copy
//! stopped partway (a killed process, a preempted job) is finished, keeping each file it
//! copied whose size and checksum match the source's; with [`CopyOptions::check`] a
//! finished copy is read file by file and what differs is copied again. A destination that
//! holds anything else is refused and left as it was.
//!
//! With another layout than the source's ([`ShardLayout`]), each shard is written again in
//! that layout instead of copied ([`crate::convert::relayout`]): read through the source's
//! checked views, written in the same aligned chunks, then opened and validated in full
//! before the manifest (the source's, with the new layout and the new files' sizes and
//! checksums) names it. Each shard written leaves its entry beside it, so that a stopped
//! copy of that kind, run again, keeps the shards that still match their entries.

mod destination;

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use self::destination::{CopyOf, Destination, Holds, COPY_STATE_PREFIX};
use super::{ChecksumPolicy, Dataset, FirstRead, Shard};
use crate::convert::relayout::write_view;
use crate::convert::Progress;
use crate::error::{Error, IoContext, Result};
use crate::format::atomic::{sync_dir, sync_file, write_atomic, write_bytes_atomic, Durability};
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
    /// The dataset's shards (with them come the sensor table and the manifest).
    pub shards: usize,
    /// The bytes of all the dataset's files, the manifest's included.
    pub bytes: u64,
    /// The bytes this run wrote: `bytes` for a whole copy, less for a resumed one, 0 where
    /// the copy was there already.
    pub written: u64,
    /// The files (shards and the sensor table) left as this run found them: those a
    /// stopped copy had finished, or all of them where the copy was there already.
    pub kept: usize,
    /// What the destination held, and so what this run did.
    pub outcome: CopyOutcome,
    /// Wall time.
    pub seconds: f64,
}

/// What a [`copy_dataset`] run found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyOutcome {
    /// Copied every file.
    Copied,
    /// Finished a stopped copy, keeping the files it had copied (size and checksum
    /// checked).
    Resumed,
    /// The destination held the finished copy already: nothing written.
    Present,
    /// The destination held the finished copy, checked file by file
    /// ([`CopyOptions::check`]): the files that differed were copied again.
    Repaired,
}

/// How [`copy_dataset_with`] copies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyOptions {
    /// The copy's layout (`None`: the source's).
    pub layout: Option<ShardLayout>,
    /// With a finished copy in the destination, read every file and compare it with the
    /// manifest's checksum, copying again the ones that differ or are missing; without it
    /// a finished copy is checked by its files' sizes only, which is instant.
    pub check: bool,
}

impl CopyOutcome {
    /// Its name in Python's report and in JSON: `copied`, `resumed`, `present` or
    /// `repaired`.
    pub fn name(self) -> &'static str {
        match self {
            CopyOutcome::Copied => "copied",
            CopyOutcome::Resumed => "resumed",
            CopyOutcome::Present => "present",
            CopyOutcome::Repaired => "repaired",
        }
    }
}

/// Copies the dataset in `source` to `destination`: every file the manifest lists, each
/// checked against its recorded size and checksum, then the manifest itself, byte for
/// byte; or, with a `layout` other than the source's, its shards written again in that
/// layout (see the module's documentation). `destination` must be missing, empty, or hold
/// this copy finished (nothing is written) or stopped (it is finished); anything else is
/// [`Error::NotEmpty`] and left as it was. Another copy into `destination` is waited for.
/// A copy that fails leaves a stopped copy where the same copy run again may finish it (an
/// [`Error::Io`], or a run that had found a stopped copy), else removes what it made.
/// Files are copied in parallel on rayon's pool; `progress` hears of phase `"copy"`, one
/// unit per file (with its pulses). Files in `source` the manifest does not list are not
/// copied.
pub fn copy_dataset(
    source: &Path,
    destination: &Path,
    layout: Option<ShardLayout>,
    progress: &dyn Progress,
) -> Result<CopyReport> {
    let options = CopyOptions {
        layout,
        check: false,
    };
    copy_dataset_with(source, destination, &options, progress)
}

/// [`copy_dataset`] with every option: `options.check` reads a finished copy in
/// `destination` file by file and repairs it.
pub fn copy_dataset_with(
    source: &Path,
    destination: &Path,
    options: &CopyOptions,
    progress: &dyn Progress,
) -> Result<CopyReport> {
    let started = Instant::now();
    let layout = options.layout;
    let (manifest, manifest_bytes) = Manifest::read_with_bytes(source)?;
    let copy = CopyOf::new(&manifest, source, layout.unwrap_or(manifest.schema.layout));
    // The source opened only to write shards again in another layout: each checked
    // (checksum, then structure) as it is first read.
    let relayout = if copy.layout != manifest.schema.layout {
        Some((Dataset::open(source, ChecksumPolicy::Lazy)?, copy.layout))
    } else {
        None
    };
    let files: Vec<DataFile> = manifest.data_files().collect();
    let destination = Destination::lock(destination)?;
    let report = |done: Finished, outcome| CopyReport {
        shards: done.shards,
        bytes: done.bytes,
        written: done.written,
        kept: done.kept,
        outcome,
        seconds: started.elapsed().as_secs_f64(),
    };
    let (outcome, known) = match destination.holds(&copy, &files, options.check)? {
        Holds::Copy(present) => {
            destination.clean_up();
            return Ok(report(present, CopyOutcome::Present));
        }
        Holds::CopyToCheck(shards) => (CopyOutcome::Repaired, shards),
        Holds::StoppedCopy => (CopyOutcome::Resumed, Vec::new()),
        Holds::Nothing => (CopyOutcome::Copied, Vec::new()),
    };
    if let Err(e) = destination.check_space(&files, manifest_bytes.len() as u64) {
        destination.remove_created();
        return Err(e);
    }
    let copied = destination.mark(&copy).and_then(|()| {
        let run = CopyRun {
            source,
            destination: destination.path(),
            relayout: relayout
                .as_ref()
                .map(|(dataset, layout)| (dataset, *layout)),
            keep_copied: outcome != CopyOutcome::Copied,
            known: &known,
            progress,
        };
        run.copy_all(&manifest, manifest_bytes, &files)
    });
    let done = match copied {
        Ok(done) => done,
        Err(e) => {
            fail(&destination, &files, outcome, &e);
            return Err(e);
        }
    };
    destination.clean_up();
    let outcome = match outcome {
        CopyOutcome::Repaired if done.written == 0 => CopyOutcome::Present,
        outcome => outcome,
    };
    Ok(report(done, outcome))
}

/// Leaves what a run that ended with `error` made: a run that had found a stopped copy
/// (`outcome` [`CopyOutcome::Resumed`]) leaves it stopped, with the files it finished too,
/// and so does one that an operating-system error ended (a read or write that failed, a
/// disk full past the estimate: the same copy run again may get past it, and keeps what
/// was done); a fresh run that the source's data ended (a checksum, a shard's structure)
/// removes what it made. A finished copy's repair keeps every file its manifest names.
fn fail(destination: &Destination, files: &[DataFile], outcome: CopyOutcome, error: &Error) {
    let may_pass = matches!(error, Error::Io { .. });
    let leave = match outcome {
        CopyOutcome::Resumed => true,
        CopyOutcome::Copied => may_pass,
        CopyOutcome::Repaired | CopyOutcome::Present => false,
    };
    if leave && destination.leave_stopped() {
        tracing::warn!(
            "{}: the copy stopped at an error; the files it finished stay, and the same copy \
             run again keeps them and finishes it (remove the directory to start over)",
            destination.path().display()
        );
    } else {
        destination.undo(files);
    }
}

/// A finished copy's files: its shards, the bytes of all its files (the manifest's
/// included), the files a run kept as it found them and the bytes it wrote.
#[derive(Debug)]
struct Finished {
    shards: usize,
    bytes: u64,
    kept: usize,
    written: u64,
}

/// One run's copy of a dataset's files into a locked destination.
struct CopyRun<'a> {
    source: &'a Path,
    destination: &'a Path,
    /// For a copy in another layout: the source opened, and that layout.
    relayout: Option<(&'a Dataset, ShardLayout)>,
    /// Whether the files a stopped run copied, or wrote in another layout, are kept where
    /// their size and checksum match.
    keep_copied: bool,
    /// The entries of shards written in another layout that a finished copy's manifest
    /// names (the ones a stopped copy wrote are recorded beside them).
    known: &'a [ShardEntry],
    progress: &'a dyn Progress,
}

/// What a file's copy did.
enum FileCopy {
    /// Copied byte for byte (its size).
    Copied(u64),
    /// Written again in another layout: its manifest entry.
    Written(ShardEntry),
    /// Kept as a stopped run copied it, or wrote it in another layout (its entry).
    Kept(Option<ShardEntry>),
}

impl CopyRun<'_> {
    /// Copies (or keeps, or writes again) every file, syncs them, then writes the
    /// manifest: the source's `manifest_bytes`, or for another layout its manifest with the
    /// new shards (left as it is where the destination holds the same bytes). Returns what
    /// the destination holds then, with the files kept and the bytes written.
    fn copy_all(
        &self,
        manifest: &Manifest,
        mut manifest_bytes: Vec<u8>,
        files: &[DataFile],
    ) -> Result<Finished> {
        self.progress.begin("copy", files.len() as u64);
        let copied = files
            .par_iter()
            .enumerate()
            .map(|(i, file)| {
                let done = self.copy_one(i, file);
                self.progress.advance(file.pulses);
                done
            })
            .collect::<Result<Vec<FileCopy>>>();
        self.progress.end();
        let copied = copied?;
        let mut written_manifest = manifest.clone();
        if let Some((_, layout)) = self.relayout {
            written_manifest.schema.layout = layout;
            written_manifest.shards = copied
                .iter()
                .filter_map(|c| match c {
                    FileCopy::Written(entry) | FileCopy::Kept(Some(entry)) => Some(entry.clone()),
                    _ => None,
                })
                .collect();
            written_manifest.totals.bytes = written_manifest.shards.iter().map(|s| s.bytes).sum();
            manifest_bytes = written_manifest.to_bytes();
        }
        let kept = copied
            .iter()
            .filter(|c| matches!(c, FileCopy::Kept(_)))
            .count();
        let written: u64 = copied
            .iter()
            .map(|c| match c {
                FileCopy::Copied(bytes) => *bytes,
                FileCopy::Written(entry) => entry.bytes,
                FileCopy::Kept(_) => 0,
            })
            .sum();
        // The copies were not synced one by one: sync them all before the manifest
        // declares the dataset complete, as `convert` does.
        files
            .par_iter()
            .map(|f| sync_file(&self.destination.join(f.file)))
            .collect::<Result<Vec<()>>>()?;
        sync_dir(self.destination)?;
        let manifest_path = self.destination.join(MANIFEST_FILE);
        let manifest_len = manifest_bytes.len() as u64;
        // A checked copy's manifest, the same bytes, is left as it is.
        let unchanged = std::fs::read(&manifest_path).is_ok_and(|held| held == manifest_bytes);
        if !unchanged {
            write_bytes_atomic(&manifest_path, &manifest_bytes)?;
        }
        Ok(Finished {
            shards: written_manifest.shards.len(),
            bytes: written_manifest.data_files().map(|f| f.bytes).sum::<u64>() + manifest_len,
            kept,
            written: written + if unchanged { 0 } else { manifest_len },
        })
    }

    /// Copies file `i` of the manifest's, `file`, or keeps a stopped run's copy of it.
    fn copy_one(&self, i: usize, file: &DataFile) -> Result<FileCopy> {
        if let Some((dataset, layout)) = self.relayout {
            if i < dataset.shard_count() {
                return self.write_again(dataset, i, file, layout);
            }
        }
        if self.keep_copied && holds_whole(self.destination, file.file, file.bytes, file.xxh3)? {
            return Ok(FileCopy::Kept(None));
        }
        copy_file(self.source, self.destination, file)?;
        Ok(FileCopy::Copied(file.bytes))
    }

    /// Writes shard `i` (`file`) again in `layout`, or keeps the one a stopped run wrote:
    /// each shard written leaves its manifest entry beside it ([`written_record`]), and a
    /// shard that still matches its entry's size and checksum is the one written then.
    fn write_again(
        &self,
        dataset: &Dataset,
        i: usize,
        file: &DataFile,
        layout: ShardLayout,
    ) -> Result<FileCopy> {
        let record = written_record(self.destination, file.file);
        if self.keep_copied {
            let recorded: Option<ShardEntry> = std::fs::read(&record)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .or_else(|| self.known.iter().find(|e| e.file == file.file).cloned());
            if let Some(entry) = recorded.filter(|entry| entry.file == file.file) {
                if holds_whole(self.destination, &entry.file, entry.bytes, &entry.xxh3)? {
                    return Ok(FileCopy::Kept(Some(entry)));
                }
            }
        }
        let entry = write_shard_as(dataset, i, self.destination, layout)?;
        let recorded = serde_json::to_vec(&entry).expect("a shard entry serialises");
        write_bytes_atomic(&record, &recorded)?;
        Ok(FileCopy::Written(entry))
    }
}

/// Where a copy into another layout records the manifest entry of shard `name` once it
/// is written: a temp file's name, removed with the others when the copy is finished.
fn written_record(destination: &Path, name: &str) -> std::path::PathBuf {
    destination.join(format!("{COPY_STATE_PREFIX}{name}.json"))
}

/// Whether `destination` holds file `name` at `bytes` and checksum `xxh3`, as a stopped
/// copy left it.
fn holds_whole(destination: &Path, name: &str, bytes: u64, xxh3: &str) -> Result<bool> {
    let path = destination.join(name);
    match std::fs::metadata(&path) {
        Ok(m) if m.len() == bytes => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(&path, e)),
    }
    Ok(checksum::of_file(&path)? == xxh3)
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
