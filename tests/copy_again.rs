//! `shardify copy` run again into the same destination: a finished copy is kept as it is, a
//! stopped one is finished keeping the files it checked, copies at once make one copy, and
//! a destination holding anything else is refused and left as it was.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use shardify::convert::{Progress, Silent};
use shardify::dataset::copy::{
    copy_dataset, copy_dataset_with, CopyOptions, CopyOutcome, CopyReport,
};
use shardify::error::Error;
use shardify::format::manifest::COPY_MARKER;
use shardify::format::{Manifest, ShardLayout};

/// The fixture converted with `seed` into `dir/name`.
fn converted(dir: &Path, name: &str, seed: u64) -> PathBuf {
    let ds = dir.join(name);
    convert_all(&fixture(), "train", &ds, &options(seed, 2)).unwrap();
    ds
}

/// Each file's inode and modification time: what a file written again changes.
fn file_stamps(dir: &Path) -> BTreeMap<String, (u64, i64, i64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let m = entry.metadata().unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, (m.ino(), m.mtime(), m.mtime_nsec()))
        })
        .collect()
}

/// A progress that panics once every file is copied, before the manifest is written:
/// the copy stops there as a killed process would.
struct StoppedBeforeTheManifest;

impl Progress for StoppedBeforeTheManifest {
    fn begin(&self, _: &'static str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn end(&self) {
        panic!("the copy is stopped here");
    }
}

/// Copies `ds` into `to` in `layout` and stops it before its manifest; checks that what
/// is left is a stopped copy.
fn stopped_copy(ds: &Path, to: &Path, layout: Option<ShardLayout>) {
    let stopped = catch_unwind(AssertUnwindSafe(|| {
        copy_dataset(ds, to, layout, &StoppedBeforeTheManifest)
    }));
    assert!(stopped.is_err(), "the copy was not stopped");
    assert!(to.join(COPY_MARKER).exists());
    assert!(!to.join("manifest.json").exists());
    assert!(why_no_dataset(to).contains("a copy that did not finish"));
}

/// The fixture converted into `dir/ds`, and its copy into `dir/copy` stopped before its
/// manifest: (the temp dir, the dataset, the copy).
fn a_stopped_copy_of_the_fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ds = converted(dir.path(), "ds", 3);
    let copy = dir.path().join("copy");
    stopped_copy(&ds, &copy, None);
    (dir, ds, copy)
}

/// The names of the dataset's shards and sensor table.
fn data_files(ds: &Path) -> Vec<String> {
    let manifest = Manifest::read(ds).unwrap();
    let files = manifest.data_files().map(|f| f.file.to_string());
    files.collect()
}

/// Checks that `copy` holds `ds`'s files byte for byte and nothing else.
fn assert_same_files(copy: &Path, ds: &Path) {
    let (copied, original) = (dir_files(copy), dir_files(ds));
    assert_eq!(
        copied.keys().collect::<Vec<_>>(),
        original.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &original {
        assert!(copied[name] == *bytes, "{name} differs");
    }
}

#[test]
fn the_same_copy_again_finds_it_there_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ds = converted(dir.path(), "ds", 3);
    let copy = dir.path().join("copy");
    let first = copy_dataset(&ds, &copy, None, &Silent).unwrap();
    assert_eq!(first.outcome, CopyOutcome::Copied);
    assert_eq!((first.written, first.kept), (first.bytes, 0));
    let stamps = file_stamps(&copy);

    let again = copy_dataset(&ds, &copy, None, &Silent).unwrap();
    let files = data_files(&ds).len();
    assert_eq!(again.outcome, CopyOutcome::Present);
    assert_eq!(
        (again.shards, again.bytes, again.written, again.kept),
        (first.shards, first.bytes, 0, files)
    );
    assert_eq!(file_stamps(&copy), stamps, "a file was written again");
    assert_same_files(&copy, &ds);

    // The source is its own copy, in its own layout.
    let itself = copy_dataset(&ds, &ds, Some(ShardLayout::Columns), &Silent).unwrap();
    assert_eq!((itself.outcome, itself.written), (CopyOutcome::Present, 0));
    // A records copy run again is there too.
    let records = dir.path().join("records");
    copy_dataset(&ds, &records, Some(ShardLayout::Records), &Silent).unwrap();
    let stamps = file_stamps(&records);
    let again = copy_dataset(&ds, &records, Some(ShardLayout::Records), &Silent).unwrap();
    assert_eq!(again.outcome, CopyOutcome::Present);
    assert_eq!(file_stamps(&records), stamps);
}

#[test]
fn a_stopped_copy_is_finished_keeping_the_files_it_checked() {
    let (_dir, ds, copy) = a_stopped_copy_of_the_fixture();
    // Since the stop: one file damaged (same size), one gone, a temp file of a copy
    // stopped in the middle of a file.
    let files = data_files(&ds);
    assert!(files.len() >= 3, "{files:?}");
    flip_last_byte(&copy.join(&files[0]));
    std::fs::remove_file(copy.join(&files[1])).unwrap();
    std::fs::write(copy.join(format!(".tmp.{}.1.0", files[1])), b"half").unwrap();
    let kept = file_stamps(&copy)[&files[2]];

    let report = copy_dataset(&ds, &copy, None, &Silent).unwrap();
    assert_eq!(report.outcome, CopyOutcome::Resumed);
    assert_eq!(report.kept, files.len() - 2);
    let size = |name: &str| std::fs::metadata(ds.join(name)).unwrap().len();
    let manifest = std::fs::metadata(ds.join("manifest.json")).unwrap().len();
    assert_eq!(report.written, size(&files[0]) + size(&files[1]) + manifest);
    assert_eq!(
        file_stamps(&copy)[&files[2]],
        kept,
        "a checked file was copied again"
    );
    // Every file as the source's, and no temp file or marker left.
    assert_same_files(&copy, &ds);
    assert_eq!(dump_lines(&copy), dump_lines(&ds));
}

#[test]
fn a_stopped_copy_in_another_layout_is_finished_in_it_and_refused_in_another() {
    let dir = tempfile::tempdir().unwrap();
    let ds = converted(dir.path(), "ds", 3);
    let records = dir.path().join("records");
    stopped_copy(&ds, &records, Some(ShardLayout::Records));
    let before = dir_files(&records);

    // The same dataset in the other layout is another copy: refused, nothing touched.
    match copy_dataset(&ds, &records, None, &Silent) {
        Err(Error::NotEmpty { path, holds }) => {
            assert_eq!(path, records);
            assert!(
                holds.contains("a stopped copy of another dataset or layout"),
                "{holds}"
            );
            assert!(holds.contains("in the records layout"), "{holds}");
        }
        other => panic!("expected a not-empty error, got {other:?}"),
    }
    assert!(dir_files(&records) == before);

    // In its own layout it is finished, keeping each shard that still matches the entry
    // recorded when it was written: not one damaged since (same size), nor one whose entry
    // is gone.
    let files = data_files(&ds);
    assert!(files.len() >= 4, "{files:?}");
    let record = |name: &str| records.join(format!(".tmp.copy.{name}.json"));
    for name in &files[..files.len() - 1] {
        assert!(record(name).exists(), "no entry recorded for {name}");
    }
    flip_last_byte(&records.join(&files[0]));
    std::fs::remove_file(record(&files[1])).unwrap();
    let kept = file_stamps(&records)[&files[2]];
    let report = copy_dataset(&ds, &records, Some(ShardLayout::Records), &Silent).unwrap();
    assert_eq!(
        (report.outcome, report.kept),
        (CopyOutcome::Resumed, files.len() - 2)
    );
    assert_eq!(
        file_stamps(&records)[&files[2]],
        kept,
        "a kept shard was written again"
    );
    let whole = dir.path().join("whole");
    copy_dataset(&ds, &whole, Some(ShardLayout::Records), &Silent).unwrap();
    assert_same_files(&records, &whole);
}

#[test]
fn a_destination_holding_another_dataset_or_layout_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let ds = converted(dir.path(), "ds", 3);
    let other = converted(dir.path(), "other", 4);
    let refused = |to: &Path, layout: Option<ShardLayout>| {
        let before = dir_files(to);
        let holds = match copy_dataset(&ds, to, layout, &Silent) {
            Err(Error::NotEmpty { path, holds }) if path == to => holds,
            other => panic!("expected a not-empty error, got {other:?}"),
        };
        assert!(dir_files(to) == before, "{} changed", to.display());
        holds
    };
    let holds = refused(&other, None);
    let identity = |ds: &Path| Manifest::read(ds).unwrap().identity();
    assert!(holds.contains("another dataset"), "{holds}");
    assert!(holds.contains(&identity(&other)), "{holds}");
    assert!(holds.contains(&identity(&ds)), "{holds}");
    assert!(holds.contains("seed 4"), "{holds}");
    let holds = refused(&ds, Some(ShardLayout::Records));
    assert!(
        holds.contains("this dataset in the columns layout"),
        "{holds}"
    );

    // A stopped copy of another dataset.
    let stopped = dir.path().join("stopped");
    stopped_copy(&other, &stopped, None);
    let holds = refused(&stopped, None);
    assert!(holds.contains(&identity(&other)), "{holds}");

    // A stopped copy's directory that holds a file the copy does not make.
    let mixed = dir.path().join("mixed");
    stopped_copy(&ds, &mixed, None);
    std::fs::write(mixed.join("notes.txt"), b"mine").unwrap();
    assert_eq!(refused(&mixed, None), "notes.txt");

    // A finished copy missing one of its files.
    let copy = dir.path().join("copy");
    copy_dataset(&ds, &copy, None, &Silent).unwrap();
    let files = data_files(&ds);
    std::fs::remove_file(copy.join(&files[0])).unwrap();
    match copy_dataset(&ds, &copy, None, &Silent) {
        Err(Error::Layout { path, problem }) => {
            assert_eq!(path, copy);
            assert!(
                problem.contains(&format!("{} is missing", files[0])),
                "{problem}"
            );
        }
        other => panic!("expected a layout error, got {other:?}"),
    }
}

/// Holds the lock a copy into `dir` takes, until dropped.
fn lock_as_a_copy_would(dir: &Path) -> std::fs::File {
    let lock = std::fs::File::open(dir).unwrap();
    lock.try_lock().unwrap();
    lock
}

#[test]
fn copies_at_once_into_one_destination_make_one_copy() {
    let dir = tempfile::tempdir().unwrap();
    let ds = converted(dir.path(), "ds", 3);
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    // Every copy starts while the destination is locked, so all of them wait.
    let lock = lock_as_a_copy_would(&copy);
    let reports: Vec<CopyReport> = std::thread::scope(|scope| {
        let copies: Vec<_> = (0..3)
            .map(|_| scope.spawn(|| copy_dataset(&ds, &copy, None, &Silent).unwrap()))
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!copy.join("manifest.json").exists());
        drop(lock);
        copies.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let outcomes: Vec<CopyOutcome> = reports.iter().map(|r| r.outcome).collect();
    let copied = outcomes
        .iter()
        .filter(|&&o| o == CopyOutcome::Copied)
        .count();
    let present = outcomes
        .iter()
        .filter(|&&o| o == CopyOutcome::Present)
        .count();
    assert_eq!((copied, present), (1, 2), "{outcomes:?}");
    assert_same_files(&copy, &ds);
}

#[test]
fn the_command_waits_for_another_copy_then_finds_the_copy_there() {
    let dir = tempfile::tempdir().unwrap();
    let ds = converted(dir.path(), "ds", 3);
    let copy = dir.path().join("copy");
    let run = || {
        let args = [
            "copy",
            &ds.display().to_string(),
            &copy.display().to_string(),
        ];
        Command::new(env!("CARGO_BIN_EXE_shardify"))
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    std::fs::create_dir(&copy).unwrap();
    let lock = lock_as_a_copy_would(&copy);
    let mut waiting = run();
    let mut stderr = BufReader::new(waiting.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("waiting for it to end") {
        line.clear();
        let read = stderr.read_line(&mut line).unwrap();
        assert!(
            read > 0,
            "the copy ended without waiting: {:?}",
            waiting.wait()
        );
    }
    assert!(
        line.contains("WARN") && line.contains("another `shardify copy`"),
        "{line}"
    );
    assert!(!copy.join("manifest.json").exists());
    drop(lock);
    let done = waiting.wait_with_output().unwrap();
    assert!(done.status.success());
    assert!(String::from_utf8_lossy(&done.stdout).contains("checksums match"));
    assert_same_files(&copy, &ds);

    let again = run().wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success());
    assert!(
        out.contains("holds this copy") && out.contains("nothing copied"),
        "{out}"
    );
}

#[test]
fn the_command_finishes_a_stopped_copy_saying_what_it_kept() {
    let (_dir, ds, copy) = a_stopped_copy_of_the_fixture();
    let files = data_files(&ds);
    std::fs::remove_file(copy.join(&files[0])).unwrap();
    let done = Command::new(env!("CARGO_BIN_EXE_shardify"))
        .args([
            "copy",
            &ds.display().to_string(),
            &copy.display().to_string(),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let kept = format!("finishing a stopped copy: {} files kept", files.len() - 1);
    assert!(
        out.contains(&kept) && out.contains("checksums match"),
        "{out}"
    );
    assert_same_files(&copy, &ds);
}

/// A copy of `ds` into `to` in `layout`, with `check`.
fn copy_checked(ds: &Path, to: &Path, layout: Option<ShardLayout>) -> CopyReport {
    let options = CopyOptions {
        layout,
        check: true,
    };
    copy_dataset_with(ds, to, &options, &Silent).unwrap()
}

#[test]
fn a_finished_copy_checked_copies_again_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let ds = converted(dir.path(), "ds", 3);
    let copy = dir.path().join("copy");
    copy_dataset(&ds, &copy, None, &Silent).unwrap();
    let files = data_files(&ds);
    flip_last_byte(&copy.join(&files[0]));
    std::fs::remove_file(copy.join(&files[1])).unwrap();
    // By sizes alone, the missing file is seen and the way out named.
    match copy_dataset(&ds, &copy, None, &Silent) {
        Err(Error::Layout { problem, .. }) => assert!(problem.contains("--check"), "{problem}"),
        other => panic!("expected a layout error, got {other:?}"),
    }
    let stamps = file_stamps(&copy);
    let report = copy_checked(&ds, &copy, None);
    assert_eq!(
        (report.outcome, report.kept),
        (CopyOutcome::Repaired, files.len() - 2)
    );
    let size = |name: &str| std::fs::metadata(ds.join(name)).unwrap().len();
    assert_eq!(report.written, size(&files[0]) + size(&files[1]));
    let after = file_stamps(&copy);
    for name in [&files[2], &"manifest.json".to_string()] {
        assert_eq!(after[name], stamps[name], "{name} was written again");
    }
    assert_same_files(&copy, &ds);
    // Checked again: nothing differs, nothing written.
    let repaired = file_stamps(&copy);
    let again = copy_checked(&ds, &copy, None);
    assert_eq!((again.outcome, again.written), (CopyOutcome::Present, 0));
    assert_eq!(file_stamps(&copy), repaired);

    // A records copy is checked against its own manifest's checksums.
    let records = dir.path().join("records");
    copy_dataset(&ds, &records, Some(ShardLayout::Records), &Silent).unwrap();
    let whole = dir_files(&records);
    flip_last_byte(&records.join(&files[2]));
    let report = copy_checked(&ds, &records, Some(ShardLayout::Records));
    assert_eq!(
        (report.outcome, report.kept),
        (CopyOutcome::Repaired, files.len() - 1)
    );
    assert!(dir_files(&records) == whole);
}

/// A private copy of dataset `ds` at `to`, to damage as a source.
fn source_copy(ds: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for (name, bytes) in dir_files(ds) {
        std::fs::write(to.join(name), bytes).unwrap();
    }
    to.to_path_buf()
}

#[test]
fn a_copy_an_io_error_ends_stays_stopped_and_the_same_copy_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = converted(dir.path(), "ds", 3);
    let source = source_copy(&ds, &dir.path().join("source"));
    let files = data_files(&ds);
    // The third file cannot be opened (a link to nothing: a file the source's filesystem
    // lost for a while). One thread copies the files in order, so the two before it are
    // copied first.
    std::fs::remove_file(source.join(&files[2])).unwrap();
    std::os::unix::fs::symlink(dir.path().join("nowhere"), source.join(&files[2])).unwrap();
    let copy = dir.path().join("copy");
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let failed = one_thread.install(|| copy_dataset(&source, &copy, None, &Silent));
    match failed {
        Err(Error::Io { path, source: e }) => {
            assert_eq!(path, source.join(&files[2]));
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected the missing file's error, got {other:?}"),
    }
    // Left as a stopped copy: its marker and whole files, no manifest, no temp file.
    assert!(why_no_dataset(&copy).contains("a copy that did not finish"));
    let left: Vec<String> = file_stamps(&copy).into_keys().collect();
    assert!(
        left.contains(&files[0]) && left.contains(&files[1]),
        "{left:?}"
    );
    assert!(!left.contains(&files[2]), "{left:?}");
    let original = dir_files(&ds);
    let finished: Vec<&String> = left.iter().filter(|n| *n != COPY_MARKER).collect();
    for name in &finished {
        let bytes = std::fs::read(copy.join(name)).unwrap();
        assert!(original.get(*name) == Some(&bytes), "{name} is not whole");
    }

    std::fs::remove_file(source.join(&files[2])).unwrap();
    std::fs::write(source.join(&files[2]), &original[&files[2]]).unwrap();
    let resumed = copy_dataset(&source, &copy, None, &Silent).unwrap();
    assert_eq!(resumed.outcome, CopyOutcome::Resumed);
    assert_eq!(
        resumed.kept,
        finished.len(),
        "the files finished before the error"
    );
    assert_same_files(&copy, &ds);
    assert_eq!(dump_lines(&copy), dump_lines(&ds));
}

#[test]
fn a_resumed_copy_that_meets_a_damaged_source_leaves_the_stopped_copy_it_found() {
    let (dir, ds, copy) = a_stopped_copy_of_the_fixture();
    let files = data_files(&ds);
    let source = source_copy(&ds, &dir.path().join("source"));
    flip_last_byte(&source.join(&files[0]));
    std::fs::remove_file(copy.join(&files[0])).unwrap();
    // The files but the marker, which each run writes again (the same bytes).
    let stamps_of = |dir: &Path| {
        let mut stamps = file_stamps(dir);
        stamps.remove(COPY_MARKER).expect("the marker is there");
        stamps
    };
    let stamps = stamps_of(&copy);

    let failed = copy_dataset(&source, &copy, None, &Silent).unwrap_err();
    assert!(
        matches!(&failed, Error::Checksum { path, .. } if path.ends_with(&files[0])),
        "{failed:?}"
    );
    // What the stopped copy held is there as it was (it was all removed before).
    assert_eq!(stamps_of(&copy), stamps);
    assert!(why_no_dataset(&copy).contains("a copy that did not finish"));

    let resumed = copy_dataset(&ds, &copy, None, &Silent).unwrap();
    assert_eq!(resumed.outcome, CopyOutcome::Resumed);
    assert_eq!(resumed.kept, files.len() - 1);
    assert_same_files(&copy, &ds);
}
