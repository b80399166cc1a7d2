//! What planning an epoch costs a resident loader: the sampler's order alone, and the whole
//! plan (order plus every batch's DOM and pulse counts, read from the shards' offsets), per
//! window size, in one run.
//!
//! `cargo bench --bench plan -- [DATASET] [--events N] [--batch B] [--windows 16,0] [--runs R]`
//!
//! Without DATASET, converts a generated dataset of N events with the real statistics once
//! (kept under target/bench-data, or `SHARDIFY_BENCH_DATA`). Window `0` means one window
//! over the whole dataset: the complete shuffle a resident loader can afford. Prints, per
//! window, the median of R runs: the sampler's order alone (seconds, nanoseconds per
//! event), then the whole plan (seconds, nanoseconds per event, microseconds per batch) and
//! the plan's bytes (what a resident loader uploads to the device once per epoch).
//!
//! Then, per window, what starting an epoch costs a streaming rank under a budget (tokens
//! grouped by pulses, and pulses capped at 256), rank 0 of 8: the time to its first
//! batch with `drop_last` off and on (medians of R runs). `drop_last` must not wait for
//! the epoch's batches to be counted. Beside them, the heap the sampler took to its first
//! batch, at its peak and still held after it, in bytes per event of the dataset (a
//! counting allocator: a window over the whole dataset holds every event's place).
//!
//! Last, per window and budget, a whole epoch under the budget, rank 0 of 8: its batches
//! planned (what the loader's threads plan) and counted (what `len()` asks: every rank's
//! batches, a pass over the epoch's order), in nanoseconds an event of the dataset.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use shardify::bench::{data, median};
use shardify::dataset::{ChecksumPolicy, Dataset, DatasetSizes, View};
use shardify::resident::plan_epoch;
use shardify::sampler::{
    rank_batch_count, Batching, EpochBatches, LengthGrouping, SamplerConfig, SamplerState,
};

/// The system allocator, counting the bytes allocated now and at their peak.
struct Counting;

static HEAP_NOW: AtomicUsize = AtomicUsize::new(0);
static HEAP_PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = HEAP_NOW.fetch_add(bytes, Relaxed) + bytes;
    HEAP_PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call is passed to the system allocator unchanged; the counters are only
// updated beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP_NOW.fetch_sub(layout.size(), Relaxed);
        // SAFETY: `ptr` came from this allocator (the system's) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match new_size.checked_sub(layout.size()) {
            Some(more) => grew(more),
            None => {
                HEAP_NOW.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        // SAFETY: as `GlobalAlloc::realloc` requires of its caller.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `run` allocated on the heap: its peak and what it still held when it returned,
/// above what was allocated before it, in bytes.
fn heap_of<T>(run: impl FnOnce() -> T) -> (T, usize, usize) {
    let before = HEAP_NOW.load(Relaxed);
    HEAP_PEAK.store(before, Relaxed);
    let value = run();
    let after = HEAP_NOW.load(Relaxed);
    (
        value,
        HEAP_PEAK.load(Relaxed) - before,
        after.saturating_sub(before),
    )
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn number(name: &str, default: u64) -> u64 {
    arg(name).map_or(default, |v| v.parse().expect("a number"))
}

/// The positional dataset directory, if given (cargo bench adds `--bench`).
fn dataset_dir() -> Option<PathBuf> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--bench" => i += 1,
            flag if flag.starts_with("--") => i += 2,
            path => return Some(PathBuf::from(path)),
        }
    }
    None
}

fn main() {
    let dir = dataset_dir().unwrap_or_else(|| {
        data::converted(&data::root(), number("--events", 1_000_000), 8).unwrap()
    });
    let view = View::from(std::sync::Arc::new(
        Dataset::open(&dir, ChecksumPolicy::Off).unwrap(),
    ));
    let dataset = view.dataset();
    let events = dataset.manifest().totals.events as f64;
    let batch = number("--batch", 256) as usize;
    let runs = number("--runs", 3);
    let windows: Vec<usize> = arg("--windows")
        .unwrap_or_else(|| "16,0".into())
        .split(',')
        .map(|w| w.parse().expect("window sizes"))
        .collect();
    let start = SamplerState::start(0);
    println!(
        "{} events, {} shards, batches of {batch} (medians of {runs} runs)",
        events,
        dataset.shard_count()
    );
    println!("window         order s  order ns/event  plan s   ns/event  us/batch  plan MiB");
    let block = 256;
    let window_blocks = |window: usize| {
        if window == 0 {
            (events as usize).div_ceil(block)
        } else {
            window
        }
    };
    for &window in &windows {
        let window_blocks = window_blocks(window);
        let config = SamplerConfig {
            block_events: block,
            window_blocks,
            batching: Batching::Events(batch),
            ..SamplerConfig::default()
        };
        let mut order = Vec::new();
        let mut whole = Vec::new();
        let mut plan = None;
        for _ in 0..runs {
            let started = Instant::now();
            let sizes = DatasetSizes::without_read_ahead(&view);
            let batches = EpochBatches::new(&sizes, &config, start).count();
            order.push(started.elapsed().as_secs_f64());
            let started = Instant::now();
            let planned = plan_epoch(&view, &config, start).unwrap();
            whole.push(started.elapsed().as_secs_f64());
            assert_eq!(planned.batches(), batches);
            plan = Some(planned);
        }
        let plan = plan.expect("at least one run");
        let bytes = 8 * (plan.events.len() + 4 * plan.batches() + 1);
        let (order, whole) = (median(&order), median(&whole));
        let name = if window == 0 {
            format!("all ({window_blocks})")
        } else {
            window.to_string()
        };
        println!(
            "{name:<14} {order:>7.3} {:>15.2} {whole:>7.3} {:>10.1} {:>9.2} {:>9.1}",
            order * 1e9 / events,
            whole * 1e9 / events,
            whole * 1e6 / plan.batches() as f64,
            bytes as f64 / (1 << 20) as f64
        );
    }
    println!(
        "\nfirst batch of rank 0 of 8    drop_last off ms   on ms   on / off  \
         heap peak B/event  held B/event"
    );
    let budgets = [
        (
            "max_tokens 65536, by pulses",
            Batching::Tokens {
                max_tokens: 65536,
                max_events: None,
                pad_to_multiple_of: None,
            },
            LengthGrouping::Pulses { cap: Some(256) },
        ),
        (
            "max_pulses 16384, cap 256",
            Batching::Pulses {
                max_pulses: 16384,
                max_events: None,
                pulse_cap: Some(256),
            },
            LengthGrouping::Off,
        ),
    ];
    // Rank 0 of 8 under a budget, in windows of `window_blocks`.
    let rank_0_of_8 = |window_blocks, batching, group_by_length| SamplerConfig {
        block_events: block,
        window_blocks,
        batching,
        group_by_length,
        rank: 0,
        world: 8,
        ..SamplerConfig::default()
    };
    for &window in &windows {
        for (name, batching, group_by_length) in budgets {
            let config = rank_0_of_8(window_blocks(window), batching, group_by_length);
            let first_batch = |drop_last: bool| {
                let config = SamplerConfig {
                    drop_last,
                    ..config.clone()
                };
                let times: Vec<f64> = (0..runs)
                    .map(|_| {
                        let started = Instant::now();
                        let sizes = DatasetSizes::without_read_ahead(&view);
                        let first = EpochBatches::new(&sizes, &config, start).next();
                        assert!(first.is_some(), "{name}: an epoch of no batch");
                        started.elapsed().as_secs_f64()
                    })
                    .collect();
                median(&times)
            };
            let (off, on) = (first_batch(false), first_batch(true));
            let sizes = DatasetSizes::without_read_ahead(&view);
            let (batches, peak, held) = heap_of(|| {
                let mut batches = EpochBatches::new(&sizes, &config, start);
                assert!(batches.next().is_some(), "{name}: an epoch of no batch");
                batches
            });
            drop(batches);
            println!(
                "window {window:<4} {name:<28} {:>9.2} {:>7.2} {:>9.2} {:>18.1} {:>13.1}",
                off * 1e3,
                on * 1e3,
                on / off,
                peak as f64 / events,
                held as f64 / events
            );
        }
    }
    println!("\na whole epoch of rank 0 of 8, ns/event       planned   counted (len)   batches");
    for &window in &windows {
        for (name, batching, group_by_length) in budgets {
            let config = rank_0_of_8(window_blocks(window), batching, group_by_length);
            let sizes = DatasetSizes::without_read_ahead(&view);
            let mut planned = Vec::new();
            let mut counted = Vec::new();
            let mut batches = 0;
            for _ in 0..runs {
                let started = Instant::now();
                batches = EpochBatches::new(&sizes, &config, start).count() as u64;
                planned.push(started.elapsed().as_secs_f64());
                let started = Instant::now();
                let count = rank_batch_count(&sizes, &config, 0, 0);
                counted.push(started.elapsed().as_secs_f64());
                assert_eq!(count, batches, "{name}: counted as planned");
            }
            println!(
                "window {window:<4} {name:<28} {:>9.2} {:>15.2} {batches:>9}",
                median(&planned) * 1e9 / events,
                median(&counted) * 1e9 / events,
            );
        }
    }
}
