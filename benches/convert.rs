//! Conversion throughput against a bare Parquet decode of the same files, in one run, and
//! the converter's peak RSS against its `--memory-limit`.
//!
//! `cargo bench --bench convert -- [--events N] [--files F] [--threads T] [--memory-limit MiB] [--runs R]`
//!
//! Built once (`cargo bench --bench convert --no-run`), the binary also runs on a machine
//! without the build tree: `SHARDIFY_BIN` names the `shardify` binary and
//! `SHARDIFY_BENCH_DATA` the directory for generated inputs.
//!
//! Both figures are input pulses per second with warm page cache, medians over the runs,
//! taken alternately so that machine noise hits both alike.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rayon::prelude::*;
use shardify::bench::median;
use shardify::source::batch::{DECODE_BATCH_ROWS, PULSE_COLUMNS};
use shardify::source::columns::ParquetSource;

struct Args {
    events: u64,
    files: u32,
    threads: usize,
    memory_limit_mib: u64,
    runs: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        events: 1_000_000,
        files: 8,
        threads: 2,
        memory_limit_mib: 1024,
        runs: 3,
    };
    let raw: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
                .parse::<u64>()
                .expect("a number")
        };
        match flag.as_str() {
            "--events" => args.events = value(),
            "--files" => args.files = value() as u32,
            "--threads" => args.threads = value() as usize,
            "--memory-limit" => args.memory_limit_mib = value(),
            "--runs" => args.runs = value() as usize,
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

fn batch_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("train"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Reads every byte of the input so the page cache is warm.
fn warm(root: &Path) {
    for f in batch_files(root) {
        std::hint::black_box(std::fs::read(f).unwrap());
    }
}

/// The bare decode: the five pulse columns of every file read as the converter reads them
/// (canonical `i64`, `f64` and `bool` columns), nothing else.
fn bare_decode(files: &[PathBuf], pool: &rayon::ThreadPool) -> (u64, f64) {
    let started = Instant::now();
    let rows: u64 = pool.install(|| {
        files
            .par_iter()
            .map(|f| {
                let reader = ParquetSource::open(f)
                    .unwrap()
                    .read(&PULSE_COLUMNS, None, DECODE_BATCH_ROWS)
                    .unwrap();
                reader.map(|c| c.unwrap().len as u64).sum::<u64>()
            })
            .sum()
    });
    (rows, started.elapsed().as_secs_f64())
}

/// What one conversion did.
struct ConvertRun {
    seconds: f64,
    /// Peak memory it reported (`VmHWM`: `ru_maxrss` of a child would include this
    /// process's memory from before exec).
    peak_bytes: u64,
    /// Bytes it wrote: spill files and the dataset.
    written_bytes: u64,
}

/// Runs `shardify convert` as a child.
fn convert_once(input: &Path, out: &Path, args: &Args) -> ConvertRun {
    let _ = std::fs::remove_dir_all(out);
    let summary_path = out.with_extension("summary.json");
    let started = Instant::now();
    // SHARDIFY_BIN: run the bench binary on a machine without the build tree.
    let shardify = std::env::var_os("SHARDIFY_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_shardify")),
        PathBuf::from,
    );
    let output = Command::new(shardify)
        .args([
            "convert",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "--seed",
            "1",
            "--summary",
            summary_path.to_str().unwrap(),
        ])
        .args([
            "--threads",
            &args.threads.to_string(),
            "--memory-limit",
            &format!("{}MiB", args.memory_limit_mib),
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "convert failed: {stdout}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary_path).unwrap()).unwrap();
    let figure = |key: &str| {
        summary[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {summary}"))
    };
    ConvertRun {
        seconds,
        peak_bytes: figure("peak_memory_bytes"),
        written_bytes: figure("spill_bytes") + figure("output_bytes"),
    }
}

/// The floor set by the disk: writing `bytes` (what the conversion wrote: spill files and
/// the dataset) and fsyncing them.
fn durable_write_seconds(dir: &Path, bytes: u64) -> f64 {
    use std::io::Write;
    let path = dir.join(format!("shardify-write-floor-{}", std::process::id()));
    let block = vec![0x5Au8; 8 << 20];
    let started = Instant::now();
    let mut file = std::fs::File::create(&path).unwrap();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    file.sync_all().unwrap();
    let secs = started.elapsed().as_secs_f64();
    std::fs::remove_file(&path).unwrap();
    secs
}

fn main() {
    let args = parse_args();
    // SHARDIFY_BENCH_DATA: where generated inputs are kept (default target/bench-data).
    let data =
        shardify::bench::data::source(&shardify::bench::data::root(), args.events, args.files)
            .unwrap();
    let files = batch_files(&data);
    let input_bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .unwrap();
    let out = std::env::temp_dir().join(format!("shardify-convert-bench-{}", std::process::id()));
    let (mut decode, mut convert, mut rss, mut floor) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut pulses = 0;
    for run in 0..args.runs {
        warm(&data);
        let (rows, secs) = bare_decode(&files, &pool);
        pulses = rows;
        decode.push(rows as f64 / secs);
        warm(&data);
        let c = convert_once(&data, &out, &args);
        convert.push(rows as f64 / c.seconds);
        rss.push(c.peak_bytes as f64);
        floor.push(rows as f64 / durable_write_seconds(&std::env::temp_dir(), c.written_bytes));
        eprintln!(
            "run {run}: decode {:.1} M pulses/s, convert {:.1} M pulses/s ({:.2} s), disk floor {:.1} M pulses/s ({:.0} MiB written), peak RSS {:.0} MiB",
            decode[run] / 1e6,
            convert[run] / 1e6,
            c.seconds,
            floor[run] / 1e6,
            c.written_bytes as f64 / (1 << 20) as f64,
            c.peak_bytes as f64 / (1 << 20) as f64
        );
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    let (d, c, w) = (median(&decode), median(&convert), median(&floor));
    let peak = rss.iter().cloned().fold(0.0, f64::max);
    let limit = (args.memory_limit_mib << 20) as f64;
    println!(
        "input              {} events, {pulses} pulses, {} files, {:.0} MiB Parquet",
        args.events,
        files.len(),
        input_bytes as f64 / 1048576.0
    );
    println!(
        "output             {} shards, {:.0} MiB",
        manifest["shards"].as_array().unwrap().len(),
        manifest["totals"]["bytes"].as_f64().unwrap() / 1048576.0
    );
    println!("threads            {}", args.threads);
    println!(
        "bare decode        {:.2} M pulses/s (median of {})",
        d / 1e6,
        args.runs
    );
    println!(
        "convert            {:.2} M pulses/s (median of {})",
        c / 1e6,
        args.runs
    );
    println!("convert / decode   {:.2}", c / d);
    println!("disk floor         {:.2} M pulses/s: writing and fsyncing as many bytes as the conversion wrote, spill files and shards (median of {})", w / 1e6, args.runs);
    println!(
        "convert / floor    {:.2} (the conversion takes {:.2}x the disk floor's time)",
        c / w,
        w / c
    );
    println!(
        "peak RSS           {:.0} MiB of a {:.0} MiB limit ({:.0}%)",
        peak / 1048576.0,
        limit / 1048576.0,
        100.0 * peak / limit
    );
}
