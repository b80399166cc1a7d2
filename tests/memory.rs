//! Conversions whose peak memory is measured, each alone: in a test binary of their own
//! (cargo runs one test binary at a time) and one at a time in it (`ALONE`). Beside the
//! other command-line tests' conversions (the harness runs two tests at once), the first
//! one's peak ranged from 49 to 70 MiB against its 64 MiB limit, its anonymous memory
//! growing with the threads' timing (2026-11-29; the file-backed part stayed at 8.7 MiB).
//! What a conversion alone holds is what these tests check; how far contention moves it is
//! an open question about the converter, not these tests' subject.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use common::*;
use serde_json::Value;

/// Held by each test here for its whole run: its conversion is the only one.
static ALONE: Mutex<()> = Mutex::new(());

/// Takes [`ALONE`] (a test that failed while holding it leaves it usable).
fn alone() -> MutexGuard<'static, ()> {
    ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn peak_memory_stays_within_the_limit_on_a_dataset_several_times_larger() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let src = synthetic_source(dir.path(), 100_000, 4, 3);
    let out = dir.path().join("out");
    let summary = dir.path().join("summary.json");
    let limit: u64 = 64 << 20;
    let run = convert_within_64_mib(&src, &out, &summary, &[]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let peak = summary_peak_memory(&summary);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let figures: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    let table = std::fs::metadata(out.join("geometry.safetensors"))
        .unwrap()
        .len();
    assert_eq!(
        figures["output_bytes"].as_u64().unwrap(),
        manifest["totals"]["bytes"].as_u64().unwrap() + table
    );
    // Spill records: 13 bytes per pulse (narrowed) and 56 per event at the least.
    assert!(
        figures["spill_bytes"].as_u64().unwrap()
            >= 13 * manifest["totals"]["pulses"].as_u64().unwrap(),
        "{figures}"
    );
    let output_bytes = manifest["totals"]["bytes"].as_u64().unwrap();
    // Decoded, a pulse is 27 bytes (sensor_id, time, charge, auxiliary, event_id).
    let decoded_bytes = manifest["totals"]["pulses"].as_u64().unwrap() * 27;
    assert!(
        output_bytes > limit && decoded_bytes > 2 * limit,
        "the dataset ({output_bytes} bytes, {decoded_bytes} decoded) is several times the limit"
    );
    assert!(
        peak <= limit,
        "peak RSS {peak} bytes over the {limit}-byte limit"
    );
}

/// A generated Kaggle-layout source (the real statistics) of `events` in `files` batch
/// files, under `dir`.
fn synthetic_source(dir: &std::path::Path, events: u64, files: u32, seed: u64) -> PathBuf {
    let src = dir.join("src");
    shardify::synth::write_dataset(
        &src,
        &shardify::synth::SynthOptions {
            events,
            files,
            seed,
            ..Default::default()
        },
    )
    .unwrap();
    src
}

/// Converts `src` into `out` on 2 threads under a 64 MiB limit, with its figures in
/// `summary` and `extra` arguments.
fn convert_within_64_mib(
    src: &std::path::Path,
    out: &std::path::Path,
    summary: &std::path::Path,
    extra: &[&str],
) -> Output {
    convert_within(src, out, summary, ("64MiB", "2"), extra)
}

/// Converts `src` into `out` on `threads` threads under `limit`, with its figures in
/// `summary` and `extra` arguments.
fn convert_within(
    src: &std::path::Path,
    out: &std::path::Path,
    summary: &std::path::Path,
    (limit, threads): (&str, &str),
    extra: &[&str],
) -> Output {
    let paths = [src, out].map(|p| p.to_str().unwrap());
    let mut args = vec!["convert", paths[0], paths[1], "--threads", threads];
    args.extend([
        "--memory-limit",
        limit,
        "--summary",
        summary.to_str().unwrap(),
    ]);
    args.extend(extra);
    shardify(&args)
}

#[test]
fn peak_memory_stays_within_the_limit_where_many_buckets_of_uneven_size_share_it() {
    // 1M events with the real statistics (heavy-tailed, so buckets differ: under 64 MiB
    // they held 108k to 323k pulses): under 512 MiB the converter peaked at 557-573 MiB
    // while its gather's reused buffers kept the largest bucket's memory (or twice it) and
    // its spill indexes held a heap string per chunk, none of it counted by a lease;
    // 442-447 MiB since.
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let src = synthetic_source(dir.path(), 1_000_000, 8, 5);
    let (out, summary) = (dir.path().join("out"), dir.path().join("summary.json"));
    let run = convert_within(&src, &out, &summary, ("512MiB", "2"), &[]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let figures: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    // Many buckets, each gathered by units that reuse one another's buffers.
    let gathered = figures["units_run"]
        .as_array()
        .and_then(|units| units.iter().find(|u| u[0] == "gather"))
        .and_then(|u| u[1].as_u64());
    assert!(gathered.is_some_and(|b| b > 40), "{figures}");
    let peak = summary_peak_memory(&summary);
    assert!(
        peak <= 512 << 20,
        "peak RSS {peak} bytes over the 512 MiB limit"
    );
    // Many threads: each one's allocator arena kept what it freed (glibc's mmap threshold
    // rose to 32 MiB, its trim threshold to 64 MiB), 265.6-330.4 MiB under 256 MiB with
    // 16 threads; 202.2 with the threshold fixed. The same run hung once in about ten
    // before its units ran one per thread (a unit started beneath another on the same
    // thread, waiting for the memory the one beneath it held).
    let (out, summary) = (dir.path().join("out16"), dir.path().join("summary16.json"));
    let run = convert_within(&src, &out, &summary, ("256MiB", "16"), &[]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let peak = summary_peak_memory(&summary);
    assert!(
        peak <= 256 << 20,
        "16 threads: peak RSS {peak} bytes over the 256 MiB limit"
    );
    // A node's worth of threads under a small limit, each with an allocator arena of its
    // own, as glibc gives them on a machine of 8 cores or more (8 arenas a core): their
    // stacks and arenas, counted in no lease, took the peak to 72.7-74.0 MiB. Now the
    // threads' memory is set aside, and where it would take half the working memory the
    // conversion runs on fewer threads, saying so.
    let (out, summary) = (dir.path().join("out64"), dir.path().join("summary64.json"));
    let run = Command::new(env!("CARGO_BIN_EXE_shardify"))
        .args(["convert", path(&src), path(&out), "--threads", "64"])
        .args(["--memory-limit", "64MiB", "--summary", path(&summary)])
        .env("MALLOC_ARENA_MAX", "64")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stderr).contains("running on 32 of the 64 threads asked for"),
        "{}",
        text(&run.stderr)
    );
    let peak = summary_peak_memory(&summary);
    assert!(
        peak <= 64 << 20,
        "64 threads: peak RSS {peak} bytes over the 64 MiB limit"
    );
}

#[test]
fn many_buckets_under_a_small_limit_convert_within_it() {
    // 20k events in one file with 8 KiB shards: 4.7k buckets, each reached by the file.
    // With a buffer per bucket of at least 16 KiB, a scatter unit took about 72 MiB for
    // them alone, and such conversions went past their limit (1M events under 64 MiB
    // with 256 KiB shards peaked at 155.9 MiB), then were refused; the gather held every
    // chunk's entry besides. Now a unit's one buffer holds what its memory allows, sorted
    // by bucket when full, and the gather reads each bucket's entries from the chunk
    // tables.
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let src = synthetic_source(dir.path(), 20_000, 1, 3);
    let (out, summary) = (dir.path().join("out"), dir.path().join("summary.json"));
    let run = convert_within_64_mib(&src, &out, &summary, &["--shard-size", "8KiB"]);
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");
    let peak = summary_peak_memory(&summary);
    assert!(
        peak <= 64 << 20,
        "peak RSS {peak} bytes over the 64 MiB limit"
    );
    let manifest = shardify::format::Manifest::read(&out).unwrap();
    assert!(
        manifest.parameters.bucket_count > 4000,
        "{}",
        manifest.parameters.bucket_count
    );
    assert_eq!(manifest.totals.events, 20_000);
    // Every event where it belongs, once.
    let verified = shardify(&["verify", path(&out), "--against", path(&src)]);
    assert!(verified.status.success(), "{}", text(&verified.stderr));
}

/// `path` as a command-line argument.
fn path(path: &std::path::Path) -> &str {
    path.to_str().unwrap()
}

/// The peak RSS a conversion recorded in its `--summary` file, in bytes.
fn summary_peak_memory(summary: &std::path::Path) -> u64 {
    let figures: Value = serde_json::from_slice(&std::fs::read(summary).unwrap()).unwrap();
    figures["peak_memory_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no peak memory in {figures}"))
}

#[test]
fn the_plan_splits_a_shared_meta_of_tens_of_millions_of_rows_within_the_limit() {
    let _alone = alone();
    use shardify::synth::{meta_columns, pulse_columns, write_geometry, write_parquet};
    use shardify::synth::{Codec, MetaTable, PulseTable};
    // As in the Kaggle originals: one meta file, one row group, for many batch files.
    let (rows, batches) = (20_000_000u64, 200u64);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("train")).unwrap();
    write_geometry(&src.join("sensor_geometry.csv")).unwrap();
    for b in 1..=batches {
        let path = src.join(format!("train/batch_{b}.parquet"));
        write_parquet(
            &path,
            &pulse_columns(&PulseTable::default()),
            Codec::Snappy,
            None,
        )
        .unwrap();
    }
    let meta_path = src.join("train_meta.parquet");
    let per_batch = rows / batches;
    // The one row group written column by column, a million values at a time.
    let schema = meta_columns(&MetaTable {
        labels: true,
        ..MetaTable::default()
    })
    .schema()
    .unwrap();
    let file = std::fs::File::create(&meta_path).unwrap();
    let properties = std::sync::Arc::new(parquet::file::properties::WriterProperties::default());
    let mut writer =
        parquet::file::writer::SerializedFileWriter::new(file, schema, properties).unwrap();
    let mut group = writer.next_row_group().unwrap();
    for column in 0..6 {
        let mut chunk = group.next_column().unwrap().unwrap();
        for start in (0..rows).step_by(1 << 20) {
            let rows = start..(start + (1 << 20)).min(rows);
            let levels = vec![1i16; (rows.end - rows.start) as usize];
            if column < 4 {
                let values: Vec<i64> = rows
                    .map(|i| {
                        let k = (i % per_batch) as i64;
                        [(i / per_batch) as i64 + 1, i as i64, 5 * k, 5 * k + 4][column]
                    })
                    .collect();
                let ints = chunk.typed::<parquet::data_type::Int64Type>();
                ints.write_batch(&values, Some(&levels), None).unwrap();
            } else {
                let values = vec![[1.0, 0.5][column - 4]; levels.len()];
                let floats = chunk.typed::<parquet::data_type::DoubleType>();
                floats.write_batch(&values, Some(&levels), None).unwrap();
            }
        }
        chunk.close().unwrap();
    }
    group.close().unwrap();
    writer.close().unwrap();
    let out = dir.path().join("out");
    let summary = dir.path().join("summary.json");
    let run = convert_within_64_mib(&src, &out, &summary, &["--phase", "plan"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let split = out.join(".work/meta");
    let files = std::fs::read_dir(&split).unwrap().count();
    assert_eq!(files as u64, batches + 1, "a file per batch and the index");
    let one = std::fs::metadata(split.join("batch_7.meta")).unwrap().len();
    assert_eq!(one, per_batch * 40, "every row of batch 7, 40 bytes each");
    assert!(
        text(&run.stderr).contains(&format!("split meta: {}/{} done", 19, 20)),
        "progress while splitting: {}",
        text(&run.stderr)
    );
    let peak = summary_peak_memory(&summary);
    assert!(
        peak <= 64 << 20,
        "peak RSS {peak} bytes over the 64 MiB limit"
    );
}
