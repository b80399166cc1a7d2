//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use shardify::convert::{convert_in_one_go, ConvertOptions, Summary};
use shardify::dataset::{dump::dump, ChecksumPolicy, Dataset, View};
use shardify::pipeline::Loader;
use shardify::rng::Rng;
use shardify::source::batch::PULSE_COLUMNS;
use shardify::source::columns::ParquetSource;
use shardify::synth::{self, Codec, MetaTable, PulseTable, Table};

/// The `shardify` binary run with `args`, its status and output captured.
pub fn shardify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardify"))
        .args(args)
        .output()
        .unwrap()
}

/// Bytes of a command's output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The committed fixture directory.
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kaggle-mini")
}

/// Whether the tests run in CI (`CI=true`), where every input must be present and every
/// test that can run must run.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The real Kaggle sample beside the checkout, when present; in CI its absence is a
/// failure, not a skip.
pub fn kaggle_sample() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kaggle-sample");
    assert!(
        p.is_dir() || !in_ci(),
        "{} is missing: CI runs with ../shared beside the checkout",
        p.display()
    );
    p.is_dir().then_some(p)
}

/// Small shards and a small memory limit, so tests exercise many buckets.
pub fn options(seed: u64, threads: usize) -> ConvertOptions {
    ConvertOptions {
        seed,
        threads,
        memory_limit_bytes: 64 << 20,
        shard_target_bytes: 64 << 10,
        ..ConvertOptions::default()
    }
}

/// Converts split `split` of `input` into `out` with every phase.
pub fn convert_all(
    input: &Path,
    split: &str,
    out: &Path,
    options: &ConvertOptions,
) -> shardify::Result<Summary> {
    convert_in_one_go(input, Some(split), out, options)
}

/// The fixture's train split converted (seed `seed`, 2 threads) into `dir/ds` and opened
/// with `policy`.
pub fn fixture_dataset(dir: &Path, seed: u64, policy: ChecksumPolicy) -> Arc<Dataset> {
    let ds = dir.join("ds");
    convert_all(&fixture(), "train", &ds, &options(seed, 2)).unwrap();
    Arc::new(Dataset::open(&ds, policy).unwrap())
}

/// Writes a generated Kaggle-layout train split of `events` events in `files` files under
/// `root/src`; returns that directory and what was written.
pub fn synthetic_source(
    root: &Path,
    events: u64,
    files: u32,
    seed: u64,
) -> (PathBuf, synth::SynthSummary) {
    let src = root.join("src");
    let written = synth::write_dataset(
        &src,
        &synth::SynthOptions {
            events,
            files,
            seed,
            ..synth::SynthOptions::default()
        },
    )
    .unwrap();
    (src, written)
}

/// Every file below `dir` (relative name -> bytes).
pub fn dir_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                files.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// What opening `dir`, a directory without a manifest, says: the message of its not-found
/// error on `dir/manifest.json` (failing the test on any other outcome).
pub fn why_no_dataset(dir: &Path) -> String {
    match Dataset::open(dir, ChecksumPolicy::Lazy) {
        Err(shardify::Error::Io { path, source }) => {
            assert_eq!(path, dir.join("manifest.json"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            source.to_string()
        }
        Err(other) => panic!("expected a not-found error, got {other:?}"),
        Ok(_) => panic!("{} opened as a dataset", dir.display()),
    }
}

/// The dump of a dataset, one string per event.
pub fn dump_lines(dir: &Path) -> Vec<String> {
    let dataset = Dataset::open(dir, ChecksumPolicy::Full).unwrap();
    let mut out = Vec::new();
    dump(&dataset, None, &mut out).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Rewrites `dir/manifest.json` after `edit` changed it.
pub fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut manifest);
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
}

/// A generated batch (the simple profile: light and fast): its pulse and meta tables.
pub fn generated_batch(
    seed: u64,
    batch_id: i64,
    events: u64,
    next_event_id: &mut i64,
    labels: bool,
) -> (PulseTable, MetaTable) {
    synth::generate_batch(
        &mut Rng::new(seed),
        batch_id,
        events,
        next_event_id,
        labels,
        synth::Profile::Simple,
    )
}

/// Writes a Kaggle-layout train directory from tables: `batches` as
/// `train/batch_N.parquet`, `meta` as `train_meta.parquet`, and the synthetic geometry.
pub fn write_layout(root: &Path, batches: &[(i64, Table)], meta: &Table) {
    std::fs::create_dir_all(root.join("train")).unwrap();
    for (id, batch) in batches {
        synth::write_parquet(
            &root.join(format!("train/batch_{id}.parquet")),
            batch,
            Codec::Snappy,
            None,
        )
        .unwrap();
    }
    synth::write_parquet(&root.join("train_meta.parquet"), meta, Codec::Snappy, None).unwrap();
    synth::write_geometry(&root.join("sensor_geometry.csv")).unwrap();
}

/// The pulse columns of a batch file, as the converter reads them.
pub fn read_pulses(path: &Path) -> PulseTable {
    let source = ParquetSource::open(path).unwrap();
    let mut table = PulseTable::default();
    for columns in source.read(&PULSE_COLUMNS, None, 1000).unwrap() {
        let c = columns.unwrap();
        table.sensor_id.extend(c.int(0).iter().map(|&s| s as i16));
        table.time.extend_from_slice(c.int(1));
        table.charge.extend_from_slice(c.float(2));
        table.auxiliary.extend_from_slice(c.bool(3));
        table.event_id.extend_from_slice(c.int(4));
    }
    table
}

/// Flips every bit of the file's last byte: damaged, same size.
pub fn flip_last_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0xff;
    std::fs::write(path, &bytes).unwrap();
}

/// Damages `bytes` inside `within` one of three ways, drawn from `rng`: up to 9 bits flipped
/// anywhere in it, or a run of 1 to 32 bytes set to random values, or to zero.
pub fn damage(bytes: &mut [u8], within: std::ops::Range<usize>, rng: &mut Rng) {
    let span = (within.end - within.start) as u64;
    let at = within.start + rng.below(span - 32) as usize;
    let run = at..at + 1 + rng.below(32) as usize;
    match rng.below(3) {
        0 => {
            for _ in 0..=rng.below(8) {
                bytes[within.start + rng.below(span) as usize] ^= 1 << rng.below(8);
            }
        }
        1 => bytes[run]
            .iter_mut()
            .for_each(|b| *b = rng.below(256) as u8),
        _ => bytes[run].fill(0),
    }
}

/// The first error `loader` yields in its epoch, and whether it ended the iteration.
pub fn first_error(loader: Loader) -> (String, bool) {
    let results: Vec<_> = loader.collect();
    let err = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("an error")
        .to_string();
    (err, results.last().unwrap().is_err())
}

/// The fixture converted with `options(5, 2)` into `dir` (in shards of `shard_bytes`), the
/// two parts of its `split(0.03, 2)`, and the two of the larger part's `split(0.4, 3)`.
pub fn fixture_and_splits(dir: &Path, shard_bytes: u64) -> [View; 5] {
    let out = dir.join("ds");
    let mut options = options(5, 2);
    options.shard_target_bytes = shard_bytes;
    convert_all(&fixture(), "train", &out, &options).unwrap();
    let whole = View::from(Arc::new(Dataset::open(&out, ChecksumPolicy::Lazy).unwrap()));
    let (most, few) = whole.split(0.03, 2).unwrap();
    let (nested, inner) = most.split(0.4, 3).unwrap();
    [whole, most, few, nested, inner]
}
