//! `shardbench --quick` on the fixtures: the report's structure, and figures that are
//! positive and consistent with each other (no timing thresholds: those live in benches).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use serde_json::Value;
use shardify::batch::{ColumnsPasses, COLUMNS_PASSES_VAR};
use shardify::cores::available_cores;
use shardify::pipeline::default_prefetch;
use shardify::prefetch::{PrefetchLevel, PREFETCH_LEVEL_VAR};

/// `shardbench --quick` on `ds` with 32-event batches of 16-event blocks, its figures in
/// `json`, and `extra` arguments.
fn quick_shardbench(ds: &Path, json: &Path, extra: &[&str]) -> Output {
    quick_shardbench_in(ds, json, extra, None)
}

/// [`quick_shardbench`] with the variable `env` names set to its value, and
/// `SHARDIFY_PREFETCH_LEVEL` and `SHARDIFY_COLUMNS_PASSES` otherwise unset, whatever the
/// tests' environment holds.
fn quick_shardbench_in(
    ds: &Path,
    json: &Path,
    extra: &[&str],
    env: Option<(&str, &str)>,
) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shardbench"));
    command
        .env_remove(PREFETCH_LEVEL_VAR)
        .env_remove(COLUMNS_PASSES_VAR);
    if let Some((var, value)) = env {
        command.env(var, value);
    }
    command
        .arg(ds)
        .args([
            "--quick",
            "--batch-events",
            "32",
            "--block-events",
            "16",
            "--json",
        ])
        .arg(json)
        .args(extra)
        .output()
        .unwrap()
}

/// The fixture's train split converted (seed 1, 2 threads) into a temporary directory,
/// and the dataset's path there.
fn converted_fixture() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds");
    convert_all(&fixture(), "train", &ds, &options(1, 2)).unwrap();
    (dir, ds)
}

/// [`quick_shardbench`], checked to succeed: its table and its JSON report.
fn quick_report(ds: &Path, json: &Path, extra: &[&str]) -> (String, Value) {
    let out = quick_shardbench(ds, json, extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    (
        table,
        serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap(),
    )
}

#[test]
fn quick_report_is_complete_and_consistent() {
    let (dir, ds) = converted_fixture();
    let json = dir.path().join("report.json");
    let plot = dir.path().join("report.svg");
    let (table, r) = quick_report(&ds, &json, &["--plot", plot.to_str().unwrap()]);
    assert!(
        table.contains("naive random access")
            && table.contains("parquet block shuffle")
            && table.contains("mixing:"),
        "{table}"
    );
    for key in [
        "events_per_s",
        "pulses_per_s",
        "gb_per_s",
        "memcpy_gb_per_s",
        "memcpy_after_loaders_gb_per_s",
        "ratio_to_memcpy",
    ] {
        let v = r[key].as_f64().unwrap_or_else(|| panic!("{key} missing"));
        assert!(v.is_finite() && v > 0.0, "{key} = {v}");
    }
    assert!(r["machine"]["cpus"].as_u64().unwrap() >= 1);
    // The CPU is named as the kernel names it (where it does: Linux on x86 here), its
    // family and model numbers too (a VM's model name can hide which CPU it is), and its
    // last-level cache, as sysfs describes them.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        cpuinfo.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            (name.trim() == key).then(|| value.trim().to_string())
        })
    };
    if let Some(model) = field("model name") {
        assert_eq!(r["machine"]["cpu_model"].as_str(), Some(model.as_str()));
        assert!(table.contains(&format!("CPUs ({model}")), "{table}");
    }
    if let (Some(family), Some(model)) = (field("cpu family"), field("model")) {
        let signature = r["machine"]["cpu_signature"].as_str().unwrap();
        assert!(
            signature.contains(&format!(" family {family} model {model} stepping ")),
            "{signature}"
        );
        assert!(table.contains(&format!("; {signature}")), "{table}");
    }
    let llc = &r["machine"]["last_level_cache"];
    if std::path::Path::new("/sys/devices/system/cpu/cpu0/cache/index0").exists() {
        let level = llc["level"].as_u64().unwrap();
        assert!((1..=4).contains(&level), "{llc}");
        assert!(llc["bytes"].as_u64().unwrap() >= 4096, "{llc}");
        assert!(table.contains(&format!("; L{level} ")), "{table}");
    }
    assert!(r["shard_read_gb_per_s"].as_f64().unwrap() > 0.0);
    assert!(table.contains("stages: shard read"), "{table}");
    if cfg!(target_os = "linux") {
        // The kernel says how it maps the shards the read pass touched (its share in huge
        // pages depends on the kernel and filesystem, not on us).
        let huge = r["shard_huge_page_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&huge), "{huge}");
        let said = format!("{:.0}% of it mapped in huge pages", 100.0 * huge);
        assert!(table.contains(&said), "{table}");
    }
    let drift = format!(
        "{:.2} again after the shardify loaders",
        r["memcpy_after_loaders_gb_per_s"].as_f64().unwrap()
    );
    assert!(table.contains(&drift), "{table}");
    assert!(
        table.contains("window    1: delivered")
            && table.contains("of memcpy measured around its epochs (")
            && table.contains("; epoch by epoch over the memcpy just before and after each ")
            && table.contains("; copying the same events' pieces")
            && table
                .contains("; the same threads gathering the same batches without the pipeline ")
            && table.contains("first epoch (pool growing)")
            && table.contains("; waited")
            && table.contains("one thread gathers an event in")
            && table.contains("ns per DOM); into the pool's ")
            && table.contains(" buffers in turn ")
            && table.contains("(stores missing the cache")
            && table.contains("); reading its pieces alone")
            && table.contains("the workers outside the gather"),
        "one stage line per shardify loader: {table}"
    );
    // Each shardify row says how long a cache line took between two threads, before and
    // after its epochs (or that it could not be timed: one core, or a busy machine).
    for loader in r["loaders"].as_array().unwrap() {
        let shardify = loader["window"].is_u64();
        for key in [
            "cache_line_round_trip_ns_before",
            "cache_line_round_trip_ns_after",
        ] {
            let value = &loader[key];
            match value.as_f64() {
                Some(ns) => {
                    assert!(shardify, "{key} on a baseline");
                    assert!((5.0..1e6).contains(&ns), "{key} = {ns}");
                    assert!(table.contains(&format!("{ns:.0} ns ")), "{table}");
                }
                None => assert!(value.is_null(), "{key} = {value}"),
            }
        }
        // The placement follows from the two round trips, and the row's stage line says it.
        let (before, after) = (
            loader["cache_line_round_trip_ns_before"].as_f64(),
            loader["cache_line_round_trip_ns_after"].as_f64(),
        );
        if before.is_some() || after.is_some() {
            // Left out only when neither could be timed (a busy machine held a core for
            // 200 ms: seen in a CI run beside two builds).
            let said = " after); a cache line between two threads and back ";
            assert!(table.contains(said), "{table}");
        }
        let expected = match (before, after) {
            (Some(b), Some(a)) => match (b >= 200.0, a >= 200.0) {
                (false, false) => "shared",
                (true, true) => "split",
                _ => "changed",
            },
            _ => "",
        };
        let placement = loader["cache_placement"].as_str().unwrap_or_default();
        assert_eq!(placement, expected, "{loader}");
        if !placement.is_empty() {
            let words = match placement {
                "shared" => "a shared L3",
                "split" => "no shared L3",
                _ => "moved during the row",
            };
            assert!(table.contains(&format!(" after ({words}); ")), "{table}");
            assert!(
                table.contains("placement (a cache line between two threads"),
                "{table}"
            );
            assert!(table.contains(&format!("{words} at window")), "{table}");
        }
    }
    let device = r["machine"]["device"].as_str().unwrap();
    // The GPU stage is measured exactly when batches went to a GPU.
    assert_eq!(r["gpu"].is_null(), device.starts_with("cpu"), "{device}");
    if r["gpu"].is_null() {
        assert!(table.contains("no host-to-device stage"), "{table}");
    } else {
        assert!(r["gpu"]["pinned_h2d_gb_per_s"].as_f64().unwrap() > 0.0);
        assert!(table.contains("of pinned H2D"), "{table}");
    }
    let loaders = r["loaders"].as_array().unwrap();
    let shardify: Vec<&Value> = loaders.iter().filter(|l| l["window"].is_u64()).collect();
    assert_eq!(shardify.len(), 2, "windows 1 and 4 in quick mode");
    assert_eq!(loaders.len(), 4, "and two baselines");
    for l in loaders {
        let f = |k: &str| l[k].as_f64().unwrap();
        assert!(
            f("events_per_s") > 0.0 && f("pulses_per_s") > f("events_per_s"),
            "{l}"
        );
        let q = &l["quality"];
        assert!(q["file_mixing"].as_f64().unwrap() > 0.0);
        assert!((0.0..=1.0).contains(&q["pair_repeat"].as_f64().unwrap()));
        assert!((0.0..1.0).contains(&q["displacement"].as_f64().unwrap()));
        assert!(q["label_autocorrelation"].as_f64().unwrap().abs() <= 1.0);
    }
    // What two epochs of packed batches hold, from the dataset's counts and dtypes alone:
    // per event id and labels, per batch and event or DOM an I32 offset, per DOM its sensor
    // and position, per pulse time, charge and auxiliary.
    let m = shardify::format::Manifest::read(&ds).unwrap();
    let (t, types) = (&m.totals, &m.schema.types);
    let (events, doms, pulses) = (t.events as f64, t.doms as f64, t.pulses as f64);
    let size = |dtype: shardify::format::safetensors::Dtype| dtype.size() as f64;
    let batches = 300f64 / 32.0;
    let epoch_bytes = 24.0 * events
        + 4.0 * (events + batches.ceil())
        + 4.0 * (doms + batches.ceil())
        + doms * (size(types.sensor_id) + 3.0 * size(types.position))
        + pulses * (size(types.time) + size(types.charge) + 1.0);
    for l in &shardify {
        assert_eq!(l["events"], 600, "two whole epochs of 300 events");
        let delivered = l["gb_per_s"].as_f64().unwrap() * l["seconds"].as_f64().unwrap() * 1e9;
        assert!(
            (delivered / (2.0 * epoch_bytes) - 1.0).abs() < 1e-9,
            "{delivered} bytes delivered, two epochs hold {}",
            2.0 * epoch_bytes
        );
        // The bound measured around the row's epochs, and the ratio against their mean.
        let around = numbers(l, "memcpy_around_gb_per_s");
        assert!(around.len() == 2 && around.iter().all(|&v| v > 0.0), "{l}");
        let ratio = l["ratio_to_memcpy_around"].as_f64().unwrap();
        let expected = l["gb_per_s"].as_f64().unwrap() / ((around[0] + around[1]) / 2.0);
        assert!((ratio / expected - 1.0).abs() < 1e-9, "{l}");
        let wall = l["seconds"].as_f64().unwrap();
        assert!(l["wait_seconds"].as_f64().unwrap() <= wall + 1e-6);
        assert!(l["gather_seconds"].as_f64().unwrap() > 0.0);
        let gather_gb = l["gather_gb_per_s"].as_f64().unwrap();
        assert!(gather_gb > 0.0);
        // The same-run bound of the scattered copy: its time per epoch, the delivered rate
        // at that pace against memcpy, and the loader's pace against it.
        let copy_seconds = l["scattered_copy_seconds"].as_f64().unwrap();
        let epoch_seconds = wall / 2.0;
        assert!(copy_seconds > 0.0, "{l}");
        let ratio = l["ratio_to_scattered_copy"].as_f64().unwrap();
        assert!(
            (ratio * epoch_seconds / copy_seconds - 1.0).abs() < 1e-9,
            "{l}"
        );
        let bound = l["scattered_copy_bound_ratio_to_memcpy"].as_f64().unwrap();
        // Against the memcpy measured between the epochs (their median), which the paired
        // ratios divide by too, not the run's first memcpy.
        let between = numbers(l, "memcpy_between_epochs_gb_per_s");
        let at_pace = epoch_bytes / copy_seconds / 1e9 / shardify::bench::median(&between);
        assert!((bound / at_pace - 1.0).abs() < 1e-9, "{l}");
        // The bare gather: the same batches' delivered bytes at its pace against the same
        // memcpy, and the loader's pace against it.
        let bare_seconds = l["bare_gather_seconds"].as_f64().unwrap();
        assert!(bare_seconds > 0.0, "{l}");
        let bare = l["bare_gather_bound_ratio_to_memcpy"].as_f64().unwrap();
        let at_pace = epoch_bytes / bare_seconds / 1e9 / shardify::bench::median(&between);
        assert!((bare / at_pace - 1.0).abs() < 1e-9, "{l}");
        // One pass after each measured epoch, their median; the loader's pace against it
        // pass by pass over the epoch just before, the median.
        let passes = numbers(l, "bare_gather_pass_seconds");
        assert_eq!(passes.len(), 2, "{l}");
        assert_eq!(bare_seconds, shardify::bench::median(&passes), "{l}");
        let paired: Vec<f64> = numbers(l, "epoch_gb_per_s")
            .iter()
            .zip(&passes)
            .map(|(gb, pass)| pass / (epoch_bytes / gb / 1e9))
            .collect();
        let ratio = l["ratio_to_bare_gather"].as_f64().unwrap();
        assert!(
            (ratio / shardify::bench::median(&paired) - 1.0).abs() < 1e-9,
            "{l}"
        );
        // Stored bytes (the pieces) are fewer than delivered ones (positions added).
        let stored = l["scattered_copy_gb_per_s"].as_f64().unwrap() * copy_seconds * 1e9;
        assert!(
            stored > 0.0 && stored < epoch_bytes,
            "{stored} stored, {epoch_bytes} delivered"
        );
        assert!(l["first_epoch_events_per_s"].as_f64().unwrap() > 0.0);
        // Grown to the measured epochs' largest batch beforehand, the pool allocates
        // nothing while they are timed.
        assert_eq!(l["measured_epoch_allocations"], 0, "{l}");
        // One thread's gather of the first epoch's batches, split into its stages: the
        // parts add up to the whole, over every event and DOM of the epoch.
        let g = &l["gather_stages"];
        assert_eq!(g["batches"], batches.ceil() as u64, "{g}");
        assert_eq!(g["events"], 300, "{g}");
        assert_eq!(g["doms"], t.doms, "{g}");
        let part = |k: &str| g[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {g}"));
        let whole = part("gather_seconds");
        let parts = part("locate_seconds") + part("columns_seconds") + part("positions_seconds");
        assert!(whole > 0.0 && part("locate_seconds") > 0.0, "{g}");
        assert!(
            part("columns_seconds") >= 0.0 && part("positions_seconds") >= 0.0,
            "{g}"
        );
        // Equal, unless noise made a difference negative and it was counted as zero.
        assert!(parts >= whole - 1e-12, "{g}");
        assert!(part("read_floor_seconds") > 0.0, "{g}");
        // The same gather into the loader's staging buffers in turn: 2 workers, 4 batches
        // prefetched, 2 for the consumer, and on a GPU 2 device buffers plus the one the
        // uploader holds.
        assert!(part("rotated_gather_seconds") > 0.0, "{g}");
        let on_gpu = !r["gpu"].is_null();
        assert_eq!(g["rotation"], if on_gpu { 11 } else { 8 }, "{g}");
        // How much of those buffers the kernel maps in huge pages, as the loader's are
        // asked for: none where they are too small to be mapped (this dataset's batches).
        match g["rotation_huge_fraction"].as_f64() {
            Some(f) => {
                assert!((0.0..=1.0).contains(&f), "{g}");
                let said = format!(" buffers in turn ({:.0}% in huge pages) ", 100.0 * f);
                assert!(table.contains(&said), "{said} missing: {table}");
            }
            None => assert!(g["rotation_huge_fraction"].is_null(), "{g}"),
        }
        // The waiting thread's share of the gather (the loader's default lets it gather).
        let by_waiting = l["waiting_thread_gather_seconds"].as_f64().unwrap();
        let share = l["gathered_while_waiting_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{l}");
        assert!(
            by_waiting >= 0.0 && by_waiting <= l["gather_seconds"].as_f64().unwrap(),
            "{l}"
        );
        assert_eq!(share == 0.0, by_waiting == 0.0, "{l}");
        // The workers' time outside the gather, per batch, from the row's own figures.
        let worker_gather = l["gather_seconds"].as_f64().unwrap() - by_waiting;
        let outside = (2.0 * wall - worker_gather).max(0.0) / (2.0 * batches.ceil());
        let reported = l["outside_gather_seconds_per_batch"].as_f64().unwrap();
        assert!(
            (reported - outside).abs() <= 1e-9 * outside.max(1e-9),
            "{l}"
        );
        // The CPUs the loader kept busy: some, and no more than the process may use (a
        // little over, for the clocks' granularity on a short run).
        let busy = l["cpus_busy"].as_f64().unwrap();
        let cpus = r["machine"]["cpus"].as_f64().unwrap();
        assert!(busy > 0.0 && busy <= 1.1 * cpus, "{busy} of {cpus}: {l}");
        let said = format!("; {busy:.2} CPUs busy");
        assert!(table.contains(&said), "{said} missing: {table}");
        // The workers' time blocked for a staging buffer, per batch, as the stage line gives it.
        let buffer = l["buffer_wait_seconds_per_batch"].as_f64().unwrap();
        assert!(buffer >= 0.0, "{l}");
        // Then the time they waited for a gathering permit (the waiting thread gathering
        // in a worker's place).
        let permit = l["permit_wait_seconds_per_batch"].as_f64().unwrap();
        assert!(permit >= 0.0, "{l}");
        let said = format!(
            "(blocked for a free staging buffer {:.1} µs; waiting for a gathering permit \
             {:.1} µs; planning it ",
            buffer * 1e6,
            permit * 1e6
        );
        assert!(table.contains(&said), "{said} missing: {table}");
        // The sampler's share of it: the loader's threads' planning, per batch, as the
        // stage line gives it; then one epoch's batches planned by one thread alone.
        let in_loader = l["planning_in_loader_seconds_per_batch"].as_f64().unwrap();
        assert!(in_loader > 0.0, "the loader planned its batches: {l}");
        let p = &l["planning"];
        assert_eq!(p["batches"], batches.ceil() as u64, "{p}");
        assert_eq!(p["events"], 300, "{p}");
        assert!(p["seconds"].as_f64().unwrap() > 0.0, "{p}");
        let said = format!(
            "; planning it {:.1} µs, one thread alone {:.1} µs (",
            in_loader * 1e6,
            p["seconds"].as_f64().unwrap() / batches.ceil() * 1e6
        );
        assert!(table.contains(&said), "{said} missing: {table}");
    }
    assert_eq!(
        table.matches("; planning it ").count(),
        2,
        "the sampler's share named on each stage line: {table}"
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    for label in [
        "shardify, window 1",
        "shardify, window 4",
        "naive random access",
        "parquet block shuffle",
        "i.i.d.",
    ] {
        assert!(svg.contains(label), "{label} missing from the plot");
    }
    let png = Command::new(env!("CARGO_BIN_EXE_shardbench"))
        .args([ds.to_str().unwrap(), "--plot", "x.png"])
        .output()
        .unwrap();
    assert!(
        !png.status.success() && String::from_utf8_lossy(&png.stderr).contains("ending in .svg")
    );
    // The pre-shuffled shards mix source files as well as i.i.d. batches; one file at a time does not.
    let mixing = |name: &str| {
        loaders
            .iter()
            .find(|l| l["name"].as_str().unwrap().contains(name))
            .unwrap()["quality"]["file_mixing"]
            .as_f64()
            .unwrap()
    };
    assert!(
        mixing("block shuffle") < 0.5
            && shardify[1]["quality"]["file_mixing"].as_f64().unwrap() > 0.8
    );
}

#[test]
fn every_measured_epoch_is_paired_with_the_memcpy_just_before_and_after_it() {
    let (dir, ds) = converted_fixture();
    let json = dir.path().join("report.json");
    let (table, r) = quick_report(&ds, &json, &["--no-baselines", "--epochs", "3"]);
    let loaders = r["loaders"].as_array().unwrap();
    assert_eq!(loaders.len(), 2, "windows 1 and 4, no baselines");
    for l in loaders {
        assert_eq!(l["events"], 900, "three whole epochs of 300 events: {l}");
        let epochs = numbers(l, "epoch_gb_per_s");
        let between = numbers(l, "memcpy_between_epochs_gb_per_s");
        let paired = numbers(l, "paired_ratios_to_memcpy");
        assert_eq!(
            (epochs.len(), between.len(), paired.len()),
            (3, 4, 3),
            "{l}"
        );
        assert!(between.iter().chain(&epochs).all(|&v| v > 0.0), "{l}");
        // The first and the last memcpy bracket the row, as before.
        assert_eq!(
            numbers(l, "memcpy_around_gb_per_s"),
            [between[0], between[3]]
        );
        for (i, ratio) in paired.iter().enumerate() {
            let expected = epochs[i] / ((between[i] + between[i + 1]) / 2.0);
            assert!((ratio / expected - 1.0).abs() < 1e-9, "epoch {i}: {l}");
        }
        let mut sorted = paired.clone();
        sorted.sort_by(f64::total_cmp);
        let median = l["median_paired_ratio_to_memcpy"].as_f64().unwrap();
        assert_eq!(median, sorted[1], "{l}");
        // The row's rate is its three epochs' bytes over their seconds: between the
        // slowest epoch's rate and the fastest's.
        let gb = l["gb_per_s"].as_f64().unwrap();
        assert!(gb >= smallest(&epochs) * (1.0 - 1e-9), "{l}");
        assert!(gb <= largest(&epochs) * (1.0 + 1e-9), "{l}");
        // Per-batch figures count the batches of all three epochs.
        let batches = 3.0 * (300f64 / 32.0).ceil();
        let by_waiting = l["waiting_thread_gather_seconds"].as_f64().unwrap();
        let share = l["gathered_while_waiting_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{l}");
        let worker_gather = l["gather_seconds"].as_f64().unwrap() - by_waiting;
        let outside = (2.0 * l["seconds"].as_f64().unwrap() - worker_gather).max(0.0) / batches;
        let reported = l["outside_gather_seconds_per_batch"].as_f64().unwrap();
        assert!(
            (reported - outside).abs() <= 1e-9 * outside.max(1e-9),
            "{l}"
        );
        let said = format!(
            "epoch by epoch over the memcpy just before and after each {:.2}, {:.2}, {:.2} (median {median:.2})",
            paired[0], paired[1], paired[2]
        );
        assert!(table.contains(&said), "{said} missing: {table}");
    }
    // Shuffle quality compares two epochs: fewer are refused before anything runs.
    let one = quick_shardbench(&ds, &json, &["--no-baselines", "--epochs", "1"]);
    let stderr = String::from_utf8_lossy(&one.stderr);
    assert!(
        !one.status.success() && stderr.contains("--epochs"),
        "{stderr}"
    );
}

fn smallest(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The numbers of `l`'s list `key` (a missing list names the key and the row).
fn numbers(l: &Value, key: &str) -> Vec<f64> {
    l[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} missing: {l}"))
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

fn largest(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

#[test]
fn cold_report_measures_the_disk_bound_and_each_window_against_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds");
    let manifest = convert_all(&fixture(), "train", &ds, &options(1, 2))
        .unwrap()
        .manifest
        .unwrap();
    let run = |cold: bool| {
        let json = dir.path().join(format!("cold-{cold}.json"));
        let extra: &[&str] = if cold {
            &["--no-baselines", "--cold"]
        } else {
            &["--no-baselines"]
        };
        quick_report(&ds, &json, extra)
    };
    let (table, r) = run(true);
    let disk = r["cold_read_gb_per_s"].as_f64().unwrap();
    assert!(disk > 0.0, "{r}");
    assert!(
        table.contains("cold sequential read of the shards"),
        "{table}"
    );
    let loaders = r["loaders"].as_array().unwrap();
    assert_eq!(loaders.len(), 2, "windows 1 and 4, no baselines");
    for l in loaders {
        let epoch_seconds = l["seconds"].as_f64().unwrap() / 2.0;
        let shard_gb = manifest.totals.bytes as f64 / 1e9;
        let ratio = l["cold_ratio_to_disk"].as_f64().unwrap();
        assert!(
            (ratio - shard_gb / epoch_seconds / disk).abs() <= 1e-9 * ratio.max(1.0),
            "{l}"
        );
        assert_eq!(l["cold_events_per_s"], l["events_per_s"]);
        let window = l["window"].as_u64().unwrap();
        assert!(
            table.contains(&format!("window {window:>4}: ")) && table.contains("events/s cold"),
            "{table}"
        );
    }
    let (table, warm) = run(false);
    assert!(warm["cold_read_gb_per_s"].is_null() && !table.contains("events/s cold"));
    assert!(warm["loaders"][0]["cold_ratio_to_disk"].is_null());
}

#[test]
fn every_scheduling_policy_and_waiting_thread_setting_is_measured_in_one_run() {
    let (dir, ds) = converted_fixture();
    let json = dir.path().join("report.json");
    let args = [
        "--no-baselines",
        "--worker-scheduling",
        "batch,normal",
        "--consumer-gathers",
        "true,false",
    ];
    let (table, r) = quick_report(&ds, &json, &args);
    assert_eq!(
        r["worker_scheduling"],
        serde_json::json!(["batch", "normal"])
    );
    assert_eq!(r["consumer_gathers"], serde_json::json!([true, false]));
    let loaders = r["loaders"].as_array().unwrap();
    let rows: Vec<(String, u64)> = loaders
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                l["window"].as_u64().unwrap(),
            )
        })
        .collect();
    let names = [
        "shardify",
        "shardify (waiting thread sleeps)",
        "shardify (normal scheduling)",
        "shardify (normal scheduling, waiting thread sleeps)",
    ];
    let expected: Vec<(String, u64)> = names
        .iter()
        .flat_map(|n| [(n.to_string(), 1), (n.to_string(), 4)])
        .collect();
    assert_eq!(rows, expected);
    // The settings change the threads' timing, never the batches: the same order measured.
    for window in 0..2 {
        let first = &loaders[window];
        assert_eq!(first["events"], 600);
        for other in [2, 4, 6].map(|row| &loaders[row + window]) {
            assert_eq!(first["events"], other["events"]);
            assert_eq!(first["quality"], other["quality"]);
            assert_eq!(
                first["gather_stages"]["doms"],
                other["gather_stages"]["doms"]
            );
        }
    }
    // A waiting thread that sleeps gathers nothing.
    for row in [2, 3, 6, 7] {
        let l = &loaders[row];
        assert_eq!(l["gathered_while_waiting_fraction"], 0.0, "{l}");
        assert_eq!(l["waiting_thread_gather_seconds"], 0.0, "{l}");
    }
    assert!(
        table.contains("2 workers (batch, then normal scheduling; waiting thread gathers, then waiting thread sleeps)")
            && table.contains("window    4 (normal scheduling): delivered")
            && table.contains("window    4 (normal scheduling, waiting thread sleeps): delivered"),
        "{table}"
    );
    let refused = quick_shardbench(&ds, &json, &["--worker-scheduling", "fifo"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("worker_scheduling")
            && stderr.contains("fifo"),
        "{stderr}"
    );
}

#[test]
fn prefetch_sizes_the_loaders_staging_pool_and_never_changes_the_batches() {
    let (dir, ds) = converted_fixture();
    let json = dir.path().join("report.json");
    let (_, default) = quick_report(&ds, &json, &["--no-baselines"]);
    let (table, r) = quick_report(&ds, &json, &["--no-baselines", "--prefetch", "7"]);
    // Unless told, the loader's default: twice the workers that can run at once, at least 4
    // (16 for 8 workers on 8 cores or more; 4 on the 2-core CI machine).
    let (wide_table, wide) = quick_report(&ds, &json, &["--no-baselines", "--workers", "8"]);
    let wide_ahead = default_prefetch(8, available_cores());
    assert_eq!(default["prefetch"], 4);
    assert_eq!(r["prefetch"], 7);
    assert_eq!(wide["prefetch"], wide_ahead);
    assert!(table.contains("), 7 batches prepared ahead, "), "{table}");
    let said = format!("), {wide_ahead} batches prepared ahead, ");
    assert!(
        wide_table.contains(" 8 workers (") && wide_table.contains(&said),
        "{wide_table}"
    );
    // The pool the gather stage rotates through is the loader's: the workers, the batches
    // ahead, 2 for the consumer (and on a GPU 2 device buffers plus the uploader's).
    let on_gpu = !r["gpu"].is_null();
    let device = if on_gpu { 3 } else { 0 };
    let loaders = |r: &Value| r["loaders"].as_array().unwrap().clone();
    assert_eq!(loaders(&r).len(), 2, "windows 1 and 4, no baselines");
    for ((l, d), w) in loaders(&r)
        .iter()
        .zip(loaders(&default))
        .zip(loaders(&wide))
    {
        let rotation = |l: &Value| l["gather_stages"]["rotation"].as_u64().unwrap();
        assert_eq!(rotation(&d), 2 + 4 + 2 + device, "{d}");
        assert_eq!(rotation(l), 2 + 7 + 2 + device, "{l}");
        assert_eq!(rotation(&w), 8 + wide_ahead as u64 + 2 + device, "{w}");
        // The batches are the same: the settings change the threads' timing only.
        for other in [&d, &w] {
            assert_eq!(l["events"], other["events"]);
            assert_eq!(l["quality"], other["quality"]);
        }
    }
    let refused = quick_shardbench(&ds, &json, &["--prefetch", "0"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("--prefetch"),
        "{stderr}"
    );
}

/// A setting of the gather that shardbench takes from its flag, else its environment
/// variable, else the CPU, and reports on its second line and in its JSON.
struct GatherSetting<'a> {
    /// The flag, as `--prefetch-level`.
    flag: &'a str,
    /// The environment variable.
    var: &'a str,
    /// The report's JSON field.
    key: &'a str,
    /// The two values, as the flag takes them.
    values: [&'a str; 2],
    /// This CPU's value.
    machine: &'a str,
    /// A value neither takes.
    bad: &'a str,
    /// What the table's second line says of a value.
    said: &'a dyn Fn(&str) -> String,
    /// The other gather setting's JSON field and this CPU's value of it, which a run
    /// changing this one leaves alone.
    other_setting: (&'a str, &'a str),
}

/// Checks `setting` on `ds`: the flag beats the variable, which beats the CPU; each run
/// reports the value it used, in its JSON and on its second line; both values deliver the
/// same batches, with the other setting left at this CPU's value; a bad value is refused
/// from the flag and from the variable, naming where it came from.
fn check_gather_setting(ds: &Path, json: &Path, setting: &GatherSetting) {
    let GatherSetting {
        flag,
        var,
        key,
        values,
        machine,
        bad,
        said,
        other_setting: (other_key, other_machine),
    } = *setting;
    let other = values.into_iter().find(|v| *v != machine).unwrap();
    let run = |value: Option<&str>, env: Option<&str>| {
        let mut extra = vec!["--no-baselines"];
        extra.extend(value.map(|v| [flag, v]).into_iter().flatten());
        let (table, report) = succeeded_in(ds, json, &extra, env.map(|v| (var, v)));
        let used = report[key].as_str().unwrap().to_string();
        assert!(table.contains(&said(&used)), "{extra:?} {env:?}: {table}");
        (used, report)
    };
    let (default, _) = run(None, None);
    assert_eq!(default, machine, "this CPU's {key}");
    let given: Vec<_> = values.iter().map(|v| run(Some(v), None)).collect();
    for (value, (used, report)) in values.iter().zip(&given) {
        assert_eq!(used, value, "{flag} {value}");
        assert_eq!(
            report[other_key], other_machine,
            "{other_key} with {flag} {value}"
        );
    }
    // The variable decides when the flag is not given, and the flag beats it.
    assert_eq!(run(None, Some(other)).0, other, "{var}={other}");
    assert_eq!(
        run(Some(machine), Some(other)).0,
        machine,
        "{flag} over {var}"
    );
    // The same batches either way, and so the same order's figures.
    let loaders = |r: &Value| r["loaders"].as_array().unwrap().clone();
    for (a, b) in loaders(&given[0].1).iter().zip(loaders(&given[1].1)) {
        assert_eq!(a["events"], b["events"]);
        assert_eq!(a["quality"], b["quality"]);
    }
    let refused = quick_shardbench_in(ds, json, &["--no-baselines"], Some((var, bad)));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let quoted = format!("{bad:?}");
    assert!(
        !refused.status.success() && stderr.contains(var) && stderr.contains(&quoted),
        "{stderr}"
    );
    let refused = quick_shardbench(ds, json, &[flag, bad]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains(flag),
        "{stderr}"
    );
}

#[test]
fn the_prefetch_level_comes_from_the_flag_the_environment_or_the_cpu_and_is_reported() {
    let (dir, ds) = converted_fixture();
    let said = |level: &str| {
        let instruction = level.parse::<PrefetchLevel>().unwrap().instruction();
        let level = level.to_uppercase();
        format!(" batches prepared ahead, prefetching into {level} ({instruction}),")
    };
    let setting = GatherSetting {
        flag: "--prefetch-level",
        var: PREFETCH_LEVEL_VAR,
        key: "prefetch_level",
        values: ["l1", "l2"],
        machine: PrefetchLevel::for_this_machine().name(),
        bad: "l3",
        said: &said,
        other_setting: ("columns_passes", ColumnsPasses::for_this_machine().name()),
    };
    check_gather_setting(&ds, &dir.path().join("report.json"), &setting);
}

#[test]
fn the_columns_passes_come_from_the_flag_the_environment_or_the_cpu_and_are_reported() {
    let (dir, ds) = converted_fixture();
    let said = |passes: &str| match passes {
        "one" => ", columns shards copied in one pass\n".to_string(),
        _ => format!(", columns shards copied in {passes} passes\n"),
    };
    let setting = GatherSetting {
        flag: "--columns-passes",
        var: COLUMNS_PASSES_VAR,
        key: "columns_passes",
        values: ["one", "two"],
        machine: ColumnsPasses::for_this_machine().name(),
        bad: "three",
        said: &said,
        other_setting: ("prefetch_level", PrefetchLevel::for_this_machine().name()),
    };
    check_gather_setting(&ds, &dir.path().join("report.json"), &setting);
}

/// [`quick_shardbench_in`], checked to succeed: its table and its JSON report.
fn succeeded_in(
    ds: &Path,
    json: &Path,
    extra: &[&str],
    env: Option<(&str, &str)>,
) -> (String, Value) {
    let out = quick_shardbench_in(ds, json, extra, env);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{extra:?} {env:?}: {stderr}");
    let report: Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    (String::from_utf8_lossy(&out.stdout).to_string(), report)
}

/// Batches of 32 events from blocks of 16, `window` blocks at a time.
fn small_batches(seed: u64, window: usize) -> shardify::sampler::SamplerConfig {
    shardify::sampler::SamplerConfig {
        seed,
        block_events: 16,
        window_blocks: window,
        batching: shardify::sampler::Batching::Events(32),
        ..shardify::sampler::SamplerConfig::default()
    }
}

#[test]
fn gather_stages_split_the_gather_with_and_without_positions() {
    use shardify::bench::stages::{gather_stages, GatherWay};
    use shardify::dataset::{DatasetSizes, View};
    use shardify::sampler::{EpochBatches, SamplerState};
    let dir = tempfile::tempdir().unwrap();
    let dataset = fixture_dataset(dir.path(), 1, shardify::dataset::ChecksumPolicy::Full);
    let view: View = dataset.clone().into();
    let sizes = DatasetSizes::new(&view);
    let config = small_batches(0, 4);
    let mut plans: Vec<_> = EpochBatches::new(&sizes, &config, SamplerState::start(0)).collect();
    for plan in &mut plans {
        view.locate_plan(plan);
    }
    let m = dataset.manifest();
    let way = |level, passes| GatherWay { level, passes };
    let settings = [
        (true, 3, way(PrefetchLevel::L1, ColumnsPasses::One)),
        (false, 1, way(PrefetchLevel::L2, ColumnsPasses::Two)),
        (true, 0, way(PrefetchLevel::L2, ColumnsPasses::One)),
    ];
    for (positions, rotation, way) in settings {
        let g = gather_stages(&dataset, &plans, positions, rotation, way).unwrap();
        assert_eq!(
            (g.batches, g.events as u64, g.doms as u64),
            (plans.len(), m.totals.events, m.totals.doms)
        );
        assert_eq!(g.positions_seconds.is_some(), positions, "{g:?}");
        // At least one buffer, whatever was asked.
        assert_eq!(g.rotation, rotation.max(1), "{g:?}");
        assert!(
            g.gather_seconds > 0.0 && g.rotated_gather_seconds > 0.0 && g.read_floor_seconds > 0.0,
            "{g:?}"
        );
        let per_event = g.ns_per_event(g.gather_seconds);
        assert!(
            (per_event - g.gather_seconds * 1e9 / m.totals.events as f64).abs() < 1e-6,
            "{g:?}"
        );
    }
}

#[test]
fn each_pass_of_pieces_holds_what_that_gather_pass_reads_from_either_layout() {
    use shardify::bench::stages::{event_pieces, pass_pieces, shard_views, Pass};
    use shardify::dataset::copy::copy_dataset;
    use shardify::dataset::{ChecksumPolicy, Dataset};
    use shardify::format::{ShardLayout, StoredView};
    let dir = tempfile::tempdir().unwrap();
    let columns = fixture_dataset(dir.path(), 1, ChecksumPolicy::Full);
    let copy = dir.path().join("records");
    let source = columns.dir().to_path_buf();
    copy_dataset(
        &source,
        &copy,
        Some(ShardLayout::Records),
        &shardify::convert::Silent,
    )
    .unwrap();
    let records = Dataset::open(&copy, ChecksumPolicy::Full).unwrap();
    let (cv, rv) = (
        shard_views(&columns).unwrap(),
        shard_views(&records).unwrap(),
    );
    let mut events = 0;
    for (c, r) in cv.iter().zip(&rv) {
        let (StoredView::Columns(view), StoredView::Records(rec)) = (c, r) else {
            panic!("one dataset of each layout");
        };
        for i in 0..view.events() {
            let pieces = |v, pass| {
                let mut out = Vec::new();
                pass_pieces(v, i, pass, &mut out);
                out
            };
            let (first, second) = (pieces(c, Pass::DomLevel), pieces(c, Pass::PulseLevel));
            // The same events, taken apart: the columns' first pass holds the record's id,
            // labels and sensor ids, and DOM offsets of the same count; its second the
            // record's pulses.
            let record = rec.record(i);
            let [id, azimuth, zenith, sensors, offsets] = first[..] else {
                panic!("event {i}: {} pieces in the first pass", first.len());
            };
            assert_eq!([id, azimuth, zenith].concat(), record.header, "event {i}");
            assert_eq!(sensors, record.sensors, "event {i}");
            assert_eq!(offsets.len(), record.dom_ends.len(), "event {i}");
            let pulses = [record.times, record.charges, record.auxiliary];
            assert_eq!(second, pulses, "event {i}");
            // A record is read whole in the first pass.
            let whole = &rec.records[rec.record_bytes(i..i + 1)];
            assert_eq!(
                (pieces(r, Pass::DomLevel), pieces(r, Pass::PulseLevel)),
                (vec![whole], vec![]),
                "event {i}"
            );
            // All of an event's pieces: the first pass's, then the second's.
            let mut all = Vec::new();
            event_pieces(c, i, &mut all);
            assert_eq!(all, [first, second].concat(), "event {i}");
            events += 1;
        }
    }
    assert_eq!(events, columns.manifest().totals.events as usize);
}

#[test]
fn planning_counts_the_batches_and_events_the_loader_delivers() {
    use shardify::bench::stages::planning;
    use shardify::device::DeviceChoice;
    use shardify::pipeline::{Loader, LoaderConfig};
    use shardify::sampler::SamplerState;
    let dir = tempfile::tempdir().unwrap();
    let dataset = fixture_dataset(dir.path(), 1, shardify::dataset::ChecksumPolicy::Full);
    for (seed, window, epoch) in [(0, 1, 0), (3, 4, 1), (5, 64, 2)] {
        let sampler = small_batches(seed, window);
        let config = LoaderConfig {
            sampler: sampler.clone(),
            device: DeviceChoice::Cpu,
            ..LoaderConfig::default()
        };
        let loader = Loader::new(dataset.clone(), config, SamplerState::start(epoch)).unwrap();
        let shapes: Vec<usize> = loader.map(|b| b.unwrap().shape().events).collect();
        let p = planning(&dataset, &sampler, epoch).unwrap();
        assert_eq!(p.batches, shapes.len(), "window {window}");
        assert_eq!(p.events, shapes.iter().sum::<usize>(), "window {window}");
        assert!(p.seconds > 0.0 && p.ns_per_event() > 0.0, "{p:?}");
        assert!(
            (p.seconds_per_batch() * p.batches as f64 / p.seconds - 1.0).abs() < 1e-12,
            "{p:?}"
        );
    }
}

#[test]
fn the_bare_gather_gathers_every_batch_the_loader_delivers_once() {
    use shardify::bench::stages::{BareGather, GatherWay};
    use shardify::device::staging::{plain_allocator, StagingPool};
    use shardify::device::DeviceChoice;
    use shardify::pipeline::{Loader, LoaderConfig};
    use shardify::sampler::SamplerState;
    let dir = tempfile::tempdir().unwrap();
    let dataset = fixture_dataset(dir.path(), 1, shardify::dataset::ChecksumPolicy::Full);
    let way = |passes| GatherWay {
        level: PrefetchLevel::L2,
        passes,
    };
    let settings = [
        (1, true, 1, ColumnsPasses::One),
        (4, true, 2, ColumnsPasses::Two),
        (16, false, 3, ColumnsPasses::One),
    ];
    for (window, positions, threads, passes) in settings {
        let sampler = small_batches(7, window);
        let config = LoaderConfig {
            sampler: sampler.clone(),
            device: DeviceChoice::Cpu,
            dom_positions: positions,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(dataset.clone(), config, SamplerState::start(0)).unwrap();
        let (mut plans, mut bytes, mut largest) = (Vec::new(), 0, 0);
        for batch in loader.by_ref() {
            let batch = batch.unwrap();
            plans.push(batch.plan().clone());
            bytes += batch.sections().payload_bytes();
            largest = largest.max(batch.sections().total);
        }
        let delivered = (plans.len(), bytes);
        // In the loader's own buffers, grown to its largest batch, as shardbench runs it.
        let pool = loader.staging_pool().clone();
        drop(loader);
        pool.reserve(largest);
        let (allocations, free) = (pool.allocations(), pool.free().len());
        let mut bare = BareGather::new(&dataset, threads, positions, way(passes));
        for _ in 0..2 {
            let pass = bare.pass(&plans, &pool).unwrap();
            // Every batch once between the threads, the bytes the loader delivered.
            assert_eq!(
                (pass.batches, pass.bytes),
                delivered,
                "window {window}, {threads} threads"
            );
            assert!(pass.seconds > 0.0, "{pass:?}");
        }
        // In the pool's own buffers, each given back: none allocated, all free again.
        assert_eq!((pool.allocations(), pool.free().len()), (allocations, free));
        assert!(free > 0);
    }
    // Fewer free buffers than threads is an error, and so is a buffer too small.
    let small = StagingPool::new(1, 64, plain_allocator());
    let plans: Vec<_> = {
        let config = LoaderConfig {
            device: DeviceChoice::Cpu,
            ..LoaderConfig::default()
        };
        let loader = Loader::new(dataset.clone(), config, SamplerState::start(0)).unwrap();
        loader.map(|b| b.unwrap().plan().clone()).collect()
    };
    let mut bare = BareGather::new(&dataset, 2, true, way(ColumnsPasses::Two));
    let error = bare.pass(&plans, &small).unwrap_err().to_string();
    assert!(
        error.contains("a free staging buffer for each of its 2 threads"),
        "{error}"
    );
    let mut one = BareGather::new(&dataset, 1, true, way(ColumnsPasses::One));
    let error = one.pass(&plans, &small).unwrap_err().to_string();
    assert!(error.contains("too small"), "{error}");
    // The buffer went back: taken out, none is left.
    let taken: Vec<_> = small.free().try_iter().collect();
    assert_eq!(taken.len(), 1);
    let error = one.pass(&plans, &small).unwrap_err().to_string();
    assert!(
        error.contains("a free staging buffer for each of its 1 threads"),
        "{error}"
    );
}

#[test]
fn largest_batch_bytes_is_the_largest_batch_the_loader_delivers() {
    use shardify::bench::stages::largest_batch_bytes;
    use shardify::device::DeviceChoice;
    use shardify::pipeline::{Loader, LoaderConfig};
    use shardify::sampler::SamplerState;
    let dir = tempfile::tempdir().unwrap();
    let dataset = fixture_dataset(dir.path(), 1, shardify::dataset::ChecksumPolicy::Full);
    for (seed, window, positions) in [(0, 1, true), (3, 4, true), (5, 4, false)] {
        let sampler = small_batches(seed, window);
        let mut delivered = Vec::new();
        for epoch in [0, 1] {
            let config = LoaderConfig {
                sampler: sampler.clone(),
                device: DeviceChoice::Cpu,
                dom_positions: positions,
                ..LoaderConfig::default()
            };
            let loader = Loader::new(dataset.clone(), config, SamplerState::start(epoch)).unwrap();
            delivered.push(loader.map(|b| b.unwrap().sections().total).max().unwrap());
        }
        let both = largest_batch_bytes(&dataset, &sampler, positions, &[0, 1]).unwrap();
        assert_eq!(
            both,
            delivered[0].max(delivered[1]),
            "seed {seed}, window {window}"
        );
        let second = largest_batch_bytes(&dataset, &sampler, positions, &[1]).unwrap();
        assert_eq!(
            second, delivered[1],
            "seed {seed}, window {window}, epoch 1"
        );
    }
}

/// [`quick_shardbench`] of the fixture's 300 events under the budget `flags`, checked to
/// succeed and to warn that an epoch makes `batches`: its stderr, its table and its report.
fn budget_report(ds: &Path, json: &Path, flags: &[&str], batches: &str) -> (String, String, Value) {
    let out = quick_shardbench(ds, json, flags);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warning = format!("warning: 300 events make {batches} an epoch");
    assert!(stderr.contains(&warning), "{stderr}");
    let report = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    (stderr, text(&out.stdout), report)
}

/// A dataset too small to measure says so: no events is an error naming the directory,
/// a few batches an epoch or a window wider than the dataset a warning.
#[test]
fn a_dataset_too_small_to_measure_says_so() {
    let (dir, ds) = converted_fixture();
    let json = dir.path().join("report.json");
    let out = quick_shardbench(&ds, &json, &["--no-baselines"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: 300 events make 10 batches of 32 events an epoch"),
        "{stderr}"
    );
    // A token budget: the batches its tokens make, and the budget in the report.
    let tokens = [
        "--group-by-length",
        "64",
        "--max-tokens",
        "4096",
        "--no-baselines",
    ];
    let (_, table, report) = budget_report(&ds, &json, &tokens, "5 batches of about 4096 tokens");
    assert_eq!(report["batching"], "max_tokens 4096");
    assert!(
        table.contains("shardify: batches by max_tokens 4096, "),
        "{table}"
    );
    // A pulse budget: the batches its pulses make at most (uncapped), the budget in the
    // report, and every event once an epoch in the batches `shardify order` plans (not
    // --batch-events').
    let pulses = [
        "--max-pulses",
        "2000",
        "--pulse-cap",
        "64",
        "--no-baselines",
    ];
    let (stderr, _, report) =
        budget_report(&ds, &json, &pulses, "9 batches of at most 2000 pulses");
    assert_eq!(report["batching"], "max_pulses 2000, pulse_cap 64");
    for row in report["loaders"].as_array().unwrap() {
        let planning = &row["planning"];
        assert_eq!(planning["events"], 300, "{row}");
        let window = row["window"].to_string();
        let ds = ds.to_str().unwrap();
        let order = ["order", ds, "--window", &window, "--block-events", "16"];
        let order = shardify(&[&order[..], &pulses[..4]].concat());
        assert!(order.status.success(), "{}", text(&order.stderr));
        let planned = text(&order.stdout).lines().count();
        assert_eq!(planning["batches"], planned, "{row}");
        assert!(
            planned < 300 / 32,
            "the budget's batches, not 32 events each: {planned}"
        );
        assert_eq!(row["events"], 600, "two whole epochs: {row}");
    }
    // --quick measures windows 1 and 4: 4 blocks of 16 events are within the 300.
    assert!(!stderr.contains("covers"), "{stderr}");
    let wide = Command::new(env!("CARGO_BIN_EXE_shardbench"))
        .arg(&ds)
        .args(["--no-baselines", "--windows", "1,64", "--epochs", "2"])
        .args(["--batch-events", "8", "--block-events", "16"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&wide.stderr);
    assert!(wide.status.success(), "{stderr}");
    assert!(
        stderr.contains("window 64 covers 1024 events (16 per block), more than the dataset's 300"),
        "{stderr}"
    );

    let empty_source = dir.path().join("empty-source");
    let nothing = shardify::synth::SynthOptions {
        events: 0,
        files: 1,
        ..Default::default()
    };
    shardify::synth::write_dataset(&empty_source, &nothing).unwrap();
    let empty = dir.path().join("empty");
    convert_all(&empty_source, "train", &empty, &options(1, 1)).unwrap();
    let refused = quick_shardbench(&empty, &json, &["--no-baselines"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: holds no events, so there is nothing to measure",
            empty.display()
        )),
        "{stderr}"
    );
}
