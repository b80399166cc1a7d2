//! `shardify copy`: a dataset copied whole and byte for byte, or refused or undone with
//! nothing left that looks like a dataset.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use shardify::convert::Silent;
use shardify::dataset::copy::copy_dataset;
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::error::Error;
use shardify::format::{Manifest, ShardLayout, ShardProblem};

/// The fixture converted into `dir/ds`.
fn fixture_ds(dir: &Path) -> PathBuf {
    let ds = dir.join("ds");
    convert_all(&fixture(), "train", &ds, &options(3, 2)).unwrap();
    ds
}

/// A new directory `path` holding one file, `name`, of `bytes`.
fn directory_holding(path: PathBuf, name: &str, bytes: &[u8]) -> PathBuf {
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join(name), bytes).unwrap();
    path
}

/// The path of the dataset's first shard.
fn first_shard(ds: &Path) -> PathBuf {
    ds.join(&Manifest::read(ds).unwrap().shards[0].file)
}

#[test]
fn a_copy_holds_every_file_byte_for_byte_and_reads_the_same_events() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    // A file the manifest does not list stays behind.
    std::fs::write(ds.join("notes.txt"), b"mine").unwrap();
    let mut original = dir_files(&ds);
    original.remove("notes.txt");

    let copy = dir.path().join("nested/copy");
    let report = copy_dataset(&ds, &copy, None, &Silent).unwrap();

    let copied = dir_files(&copy);
    assert_eq!(
        copied.keys().collect::<Vec<_>>(),
        original.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &original {
        assert!(copied[name] == *bytes, "{name} differs");
    }
    let manifest = Manifest::read(&ds).unwrap();
    assert_eq!(report.shards, manifest.shards.len());
    let total: usize = original.values().map(Vec::len).sum();
    assert_eq!(report.bytes, total as u64);
    Dataset::open(&copy, ChecksumPolicy::Full).unwrap();
    assert_eq!(dump_lines(&copy), dump_lines(&ds));
}

#[test]
fn a_destination_that_holds_anything_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let taken = directory_holding(dir.path().join("taken"), "results.csv", b"precious");
    match copy_dataset(&ds, &taken, None, &Silent) {
        Err(Error::NotEmpty { path, holds }) => {
            assert_eq!((path, holds.as_str()), (taken.clone(), "results.csv"))
        }
        other => panic!("expected a not-empty error, got {other:?}"),
    }
    let left = dir_files(&taken);
    assert_eq!(left.len(), 1);
    assert_eq!(left["results.csv"], b"precious");

    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        copy_dataset(&ds, &file, None, &Silent),
        Err(Error::Layout { path, .. }) if path == file
    ));
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn an_empty_destination_or_one_with_a_stopped_copys_temp_files_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let temp = ".tmp.shard_00000.safetensors.1.0";
    let empty = directory_holding(dir.path().join("empty"), temp, b"half");
    // A stopped copy is no dataset, and opening it says why.
    let why = why_no_dataset(&empty);
    assert!(why.contains(&format!("dataset files ({temp})")), "{why}");
    assert!(why.contains("did not finish"), "{why}");
    copy_dataset(&ds, &empty, None, &Silent).unwrap();
    assert_eq!(dump_lines(&empty), dump_lines(&ds));
}

#[test]
fn a_damaged_source_shard_fails_naming_it_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let shard = first_shard(&ds);
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();

    // A destination the copy creates is removed again, with the parents it created.
    let created = dir.path().join("new/created");
    match copy_dataset(&ds, &created, None, &Silent) {
        Err(Error::Checksum { path, .. }) => assert_eq!(path, shard),
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(!dir.path().join("new").exists());
    assert!(dir.path().exists());
    // One that existed stays, empty.
    let existing = dir.path().join("existing");
    std::fs::create_dir(&existing).unwrap();
    assert!(matches!(
        copy_dataset(&ds, &existing, None, &Silent),
        Err(Error::Checksum { .. })
    ));
    assert_eq!(std::fs::read_dir(&existing).unwrap().count(), 0);
}

#[test]
fn a_truncated_source_shard_fails_with_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let shard = first_shard(&ds);
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let copy = dir.path().join("copy");
    match copy_dataset(&ds, &copy, None, &Silent) {
        Err(Error::Shard {
            path,
            problem: ShardProblem::Size { found, expected },
        }) => {
            assert_eq!(path, shard);
            assert_eq!(
                (found, expected),
                (bytes.len() as u64 - 100, bytes.len() as u64)
            );
        }
        other => panic!("expected a size error, got {other:?}"),
    }
    assert!(!copy.exists());
}

#[test]
fn a_directory_without_a_manifest_is_not_copied() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy");
    match copy_dataset(dir.path(), &copy, None, &Silent) {
        Err(Error::Io { path, .. }) => assert_eq!(path, dir.path().join("manifest.json")),
        other => panic!("expected an I/O error on the manifest, got {other:?}"),
    }
    assert!(!copy.exists());
}

#[test]
fn the_command_copies_and_reports_or_fails_with_the_files_name() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let copy = dir.path().join("copy");
    let run = |to: &Path| {
        Command::new(env!("CARGO_BIN_EXE_shardify"))
            .args(["copy", &ds.display().to_string(), &to.display().to_string()])
            .output()
            .unwrap()
    };
    let ok = run(&copy);
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(out.contains("checksums match"), "{out}");
    assert_eq!(dump_lines(&copy), dump_lines(&ds));

    let taken = directory_holding(dir.path().join("taken"), "results.csv", b"precious");
    let refused = run(&taken);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains(&taken.display().to_string()) && err.contains("is not empty"),
        "{err}"
    );
}

#[test]
fn a_records_copy_verifies_reads_the_same_events_and_copies_back_to_the_same_files() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let records = dir.path().join("records");
    let report = copy_dataset(&ds, &records, Some(ShardLayout::Records), &Silent).unwrap();
    let manifest = Manifest::read(&records).unwrap();
    assert_eq!(manifest.schema.layout, ShardLayout::Records);
    assert_eq!(report.shards, manifest.shards.len());
    let total: usize = dir_files(&records).values().map(Vec::len).sum();
    assert_eq!(report.bytes, total as u64);
    let source = Manifest::read(&ds).unwrap();
    assert_eq!(manifest.totals.events, source.totals.events);
    assert_eq!(manifest.totals.pulses, source.totals.pulses);
    for (r, c) in manifest.shards.iter().zip(&source.shards) {
        assert_eq!(
            (&r.file, r.events, r.doms, r.pulses),
            (&c.file, c.events, c.doms, c.pulses)
        );
    }
    // Every shard holds records, not columns.
    let opened = Dataset::open(&records, ChecksumPolicy::Full).unwrap();
    for i in 0..opened.shard_count() {
        let tensors = &opened.shard(i).unwrap().header().tensors;
        assert!(tensors.contains_key("event_records") && !tensors.contains_key("pulse_time"));
    }
    // The same events, pulse for pulse, as the source files and the columns dataset.
    let inputs = shardify::source::InputSet::discover(&fixture(), Some("train")).unwrap();
    let verified = shardify::dataset::verify::verify(&records, Some(&inputs)).unwrap();
    assert!(verified.ok(), "{:?}", verified.problems);
    assert_eq!(verified.source_events, Some(source.totals.events));
    assert_eq!(dump_lines(&records), dump_lines(&ds));
    let inspect = |dir: &Path| {
        let dataset = Dataset::open(dir, ChecksumPolicy::Off).unwrap();
        let i = shardify::dataset::inspect::inspect(&dataset).unwrap();
        format!(
            "{:?}",
            (i.pulses_per_event, i.doms_per_event, i.pulses_per_dom)
        )
    };
    assert_eq!(inspect(&records), inspect(&ds));

    // Back to columns: the very files `convert` wrote, the manifest among them.
    let back = dir.path().join("back");
    copy_dataset(&records, &back, Some(ShardLayout::Columns), &Silent).unwrap();
    assert!(
        dir_files(&back) == dir_files(&ds),
        "columns -> records -> columns changed bytes"
    );
    // A copy in the source's own layout is a plain copy.
    let same = dir.path().join("same");
    copy_dataset(&records, &same, Some(ShardLayout::Records), &Silent).unwrap();
    assert!(dir_files(&same) == dir_files(&records));
}

#[test]
fn a_damaged_record_is_refused_naming_its_shard_and_event() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let records = dir.path().join("records");
    copy_dataset(&ds, &records, Some(ShardLayout::Records), &Silent).unwrap();
    let shard = first_shard(&records);
    // The first record's first byte: the low byte of event 0's id.
    let header = shardify::format::safetensors::parse(&std::fs::read(&shard).unwrap()).unwrap();
    let at = header.tensors["event_records"].range.start;
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[at] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();

    // Checksummed, the file is refused by its checksum; unchecked, by its structure.
    let checked = Dataset::open(&records, ChecksumPolicy::Full).err().unwrap();
    assert!(
        matches!(&checked, Error::Checksum { path, .. } if *path == shard),
        "{checked}"
    );
    let unchecked = Dataset::open(&records, ChecksumPolicy::Off).unwrap();
    match unchecked.shard(0).err().unwrap() {
        Error::Shard {
            path,
            problem: ShardProblem::Record { event: 0, problem },
        } => assert_eq!((path, problem), (shard, "its id differs from event_id")),
        other => panic!("expected a record problem, got {other}"),
    }
}

#[test]
fn the_command_copies_in_a_layout_and_refuses_an_unknown_one() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let run = |to: &Path, layout: &str| {
        Command::new(env!("CARGO_BIN_EXE_shardify"))
            .args(["copy", &ds.display().to_string(), &to.display().to_string()])
            .args(["--layout", layout])
            .output()
            .unwrap()
    };
    let records = dir.path().join("records");
    let ok = run(&records, "records");
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(out.contains("(records layout)"), "{out}");
    let inspect = Command::new(env!("CARGO_BIN_EXE_shardify"))
        .args(["inspect", &records.display().to_string()])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&inspect.stdout);
    assert!(printed.contains("layout       records"), "{printed}");
    assert_eq!(
        Manifest::read(&records).unwrap().schema.layout,
        ShardLayout::Records
    );
    assert_eq!(dump_lines(&records), dump_lines(&ds));

    let other = dir.path().join("other");
    let refused = run(&other, "rows");
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("rows"));
    assert!(!other.exists());
}

#[test]
fn converting_to_records_writes_the_shards_a_records_copy_holds() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    let copied = dir.path().join("copied");
    copy_dataset(&ds, &copied, Some(ShardLayout::Records), &Silent).unwrap();
    let converted = dir.path().join("converted");
    let records = shardify::convert::ConvertOptions {
        layout: ShardLayout::Records,
        ..options(3, 2)
    };
    convert_all(&fixture(), "train", &converted, &records).unwrap();

    // The same files (no temp file left), the same shards byte for byte; the manifests
    // differ in the conversion's parameters alone.
    let (mut a, mut b) = (dir_files(&copied), dir_files(&converted));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let (ma, mb) = (
        a.remove("manifest.json").unwrap(),
        b.remove("manifest.json").unwrap(),
    );
    assert!(a == b, "the shards differ");
    let parse = |bytes: &[u8]| Manifest::parse(Path::new("manifest.json"), bytes).unwrap();
    let (mut ma, mb) = (parse(&ma), parse(&mb));
    assert_eq!(
        (ma.parameters.layout, mb.parameters.layout),
        (ShardLayout::Columns, ShardLayout::Records)
    );
    ma.parameters.layout = ShardLayout::Records;
    assert_eq!(ma, mb);
    assert_eq!(mb.schema.layout, ShardLayout::Records);
}

#[test]
fn a_copy_the_destination_cannot_hold_is_refused_before_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_ds(dir.path());
    // A source that says its first shard is an exabyte.
    let huge: u64 = 1 << 60;
    edit_manifest(&ds, |m| {
        let bytes = &mut m["shards"][0]["bytes"];
        let was = bytes.as_u64().unwrap();
        *bytes = huge.into();
        let total = &mut m["totals"]["bytes"];
        *total = (total.as_u64().unwrap() - was + huge).into();
    });
    let copy = dir.path().join("new/copy");
    match copy_dataset(&ds, &copy, None, &Silent) {
        Err(Error::NoSpace {
            path, what, needed, ..
        }) => {
            assert_eq!((path, what.as_str()), (copy.clone(), "the copy"));
            assert!(needed > huge, "{needed}");
        }
        other => panic!("expected a no-space error, got {other:?}"),
    }
    // Refused before anything was written: not even the directories are left.
    assert!(!dir.path().join("new").exists());
}
