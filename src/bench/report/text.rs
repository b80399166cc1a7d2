//! The report as a table for people: a row per loader and baseline, then each loader's
//! stages against their bounds, the placement of the run's threads, and notes.

use super::{waiting_thread, LoaderFigures, Report};
use crate::batch::ColumnsPasses;
use crate::bench::hand_off::{CachePlacement, SPLIT_ROUND_TRIP_NS};
use crate::bench::quality::PADDED_FILL_CUT;
use crate::bench::stages::GatherStages;

/// Seconds for a reader: s, ms or µs.
fn duration(seconds: f64) -> String {
    match seconds {
        s if s >= 1.0 => format!("{s:.2} s"),
        s if s >= 1e-3 => format!("{:.1} ms", s * 1e3),
        s => format!("{:.0} µs", s * 1e6),
    }
}

/// One shardify loader's stages: gather, host-to-device copy, consumer waiting, each
/// against its bound; empty for the baselines.
fn stage_line(l: &LoaderFigures) -> String {
    let (Some(gather_s), Some(gather_gb), Some(gather_ratio), Some(wait_s)) = (
        l.gather_seconds,
        l.gather_gb_per_s,
        l.gather_ratio_to_memcpy,
        l.wait_seconds,
    ) else {
        return String::new();
    };
    let policy = l.name.strip_prefix("shardify").unwrap_or(&l.name);
    let around = match (l.memcpy_around_gb_per_s, l.ratio_to_memcpy_around) {
        (Some([before, after]), Some(r)) => format!(
            "delivered {r:.2} of memcpy measured around its epochs ({before:.2} GB/s before, {after:.2} after); "
        ),
        _ => String::new(),
    };
    let round_trip = |ns: Option<f64>| ns.map_or("untimed".to_string(), |ns| format!("{ns:.0} ns"));
    let hand_off = match (
        l.cache_line_round_trip_ns_before,
        l.cache_line_round_trip_ns_after,
    ) {
        (None, None) => String::new(),
        (before, after) => format!(
            "a cache line between two threads and back {} before, {} after{}; ",
            round_trip(before),
            round_trip(after),
            l.cache_placement
                .map(|p| format!(" ({})", p.describe()))
                .unwrap_or_default()
        ),
    };
    let paired = match (&l.paired_ratios_to_memcpy, l.median_paired_ratio_to_memcpy) {
        (Some(ratios), Some(median)) => format!(
            "epoch by epoch over the memcpy just before and after each {} (median {median:.2}); ",
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => String::new(),
    };
    let mut out = format!(
        "  window {:>4}{policy}: {around}{hand_off}{paired}gather {} (all threads) = {gather_gb:.2} GB/s = {gather_ratio:.2} of memcpy between the epochs",
        l.window.unwrap_or(0),
        duration(gather_s)
    );
    if let (Some(share), Some(s)) = (
        l.gathered_while_waiting_fraction,
        l.waiting_thread_gather_seconds,
    ) {
        if share > 0.0 {
            out += &format!(
                ", of which the waiting thread {} ({:.0}% of the batches)",
                duration(s),
                100.0 * share
            );
        }
    }
    let bounds = [
        (
            "copying the same events' pieces",
            "delivered at that pace = ",
            l.scattered_copy_seconds,
            l.scattered_copy_bound_ratio_to_memcpy,
            l.ratio_to_scattered_copy,
        ),
        (
            "the same threads gathering the same batches without the pipeline",
            "",
            l.bare_gather_seconds,
            l.bare_gather_bound_ratio_to_memcpy,
            l.ratio_to_bare_gather,
        ),
    ];
    for (what, delivered, seconds, bound, r) in bounds {
        if let (Some(s), Some(bound), Some(r)) = (seconds, bound, r) {
            out += &format!(
                "; {what} {} per epoch (bound: {delivered}{bound:.2} of memcpy between the epochs), the loader at {r:.2} of that pace",
                duration(s)
            );
        }
    }
    if let Some(first) = l.first_epoch_events_per_s {
        out += &format!("; first epoch (pool growing) {:.2}M events/s", first / 1e6);
    }
    if let Some(grown) = l.measured_epoch_allocations.filter(|&n| n > 0) {
        out += &format!("; the staging pool grew {grown} buffers in the measured epochs");
    }
    if let (Some(gb), Some(s), Some(r)) = (
        l.copy_stage_gb_per_s,
        l.copy_stage_seconds,
        l.copy_stage_ratio_to_pinned_h2d,
    ) {
        out += &format!(
            "; H2D copy {} = {gb:.2} GB/s = {r:.2} of pinned H2D",
            duration(s)
        );
    }
    out += &format!(
        "; waited {} = {:.1}%",
        duration(wait_s),
        100.0 * l.waiting_fraction.unwrap_or(0.0)
    );
    if let Some(idle) = l.gpu_waiting_fraction {
        out += &format!(" (GPU idle {:.1}%)", 100.0 * idle);
    }
    if let Some(busy) = l.cpus_busy {
        out += &format!("; {busy:.2} CPUs busy");
    }
    if let (Some(gb), Some(s)) = (l.timed_copy_gb_per_s, l.timed_copy_seconds) {
        out += &format!(
            "\n               copies timed one by one in the run: {gb:.2} GB/s ({}; \
             host issue latency and the timing events included)",
            duration(s)
        );
    }
    if let Some(g) = &l.gather_stages {
        out += &format!("\n               {}", gather_stages_line(g));
    }
    if let Some(s) = l.outside_gather_seconds_per_batch {
        out += &format!("; the workers outside the gather {} per batch", duration(s));
        let mut parts = Vec::new();
        if let Some(buffer) = l.buffer_wait_seconds_per_batch {
            parts.push(format!(
                "blocked for a free staging buffer {:.1} µs",
                buffer * 1e6
            ));
        }
        if let Some(permit) = l.permit_wait_seconds_per_batch {
            parts.push(format!(
                "waiting for a gathering permit {:.1} µs",
                permit * 1e6
            ));
        }
        if let Some(in_loader) = l.planning_in_loader_seconds_per_batch {
            let mut planning = format!("planning it {:.1} µs", in_loader * 1e6);
            if let Some(p) = &l.planning {
                planning += &format!(
                    ", one thread alone {:.1} µs ({:.1} ns an event)",
                    p.seconds_per_batch() * 1e6,
                    p.ns_per_event()
                );
            }
            parts.push(planning);
        }
        if !parts.is_empty() {
            out += &format!(" ({})", parts.join("; "));
        }
    }
    out + "\n"
}

/// Which rows ran in which [`CachePlacement`], one line (empty where no row's placement is
/// known); where they differ, it warns that their ratios to memcpy do not compare.
fn placement_line(loaders: &[LoaderFigures]) -> String {
    let placed = loaders
        .iter()
        .filter_map(|l| Some((l.window?, l.cache_placement?)));
    let mut groups: Vec<(CachePlacement, Vec<usize>)> = Vec::new();
    for (window, placement) in placed {
        match groups.iter_mut().find(|(p, _)| *p == placement) {
            // Rows of several policies share a window: each is named once per placement.
            Some((_, windows)) if windows.contains(&window) => {}
            Some((_, windows)) => windows.push(window),
            None => groups.push((placement, vec![window])),
        }
    }
    if groups.is_empty() {
        return String::new();
    }
    let said = groups
        .iter()
        .map(|(p, windows)| {
            let plural = if windows.len() > 1 { "s" } else { "" };
            let list: Vec<String> = windows.iter().map(usize::to_string).collect();
            format!("{} at window{plural} {}", p.describe(), list.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ");
    let warning = match groups.len() {
        1 => "",
        _ => " -- ratios to memcpy compare only between rows of one placement",
    };
    format!(
        "placement (a cache line between two threads and back under or over {SPLIT_ROUND_TRIP_NS:.0} ns before and after each row): {said}{warning}\n"
    )
}

/// Where one thread's gather time goes, per event, against the floor of its reads.
fn gather_stages_line(g: &GatherStages) -> String {
    let per_event = |s| g.ns_per_event(s);
    let mut out = format!(
        "one thread gathers an event in {:.0} ns: locating {:.0}, columns and offsets {:.0}",
        per_event(g.gather_seconds),
        per_event(g.locate_seconds),
        per_event(g.columns_seconds)
    );
    if let Some(p) = g.positions_seconds {
        out += &format!(
            ", positions {:.0} ({:.2} ns per DOM)",
            per_event(p),
            p * 1e9 / g.doms.max(1) as f64
        );
    }
    let huge = g
        .rotation_huge_fraction
        .map(|f| format!(" ({:.0}% in huge pages)", 100.0 * f))
        .unwrap_or_default();
    out + &format!(
        "; into the pool's {} buffers in turn{huge} {:.0} ns (stores missing the cache {:+.0}); \
         reading its pieces alone {:.0} ns",
        g.rotation,
        per_event(g.rotated_gather_seconds),
        per_event(g.rotated_gather_seconds - g.gather_seconds),
        per_event(g.read_floor_seconds)
    )
}

/// Below this share of the shards in huge pages, the stages line says how to get them there.
const FEW_HUGE_PAGES: f64 = 0.9;

/// How much of the shards the process maps in huge pages, for the stages line; with a way
/// to more where few are (the loader's random reads walk the page tables less in them).
fn huge_pages_note(fraction: f64) -> String {
    let mut note = format!(", {:.0}% of it mapped in huge pages", 100.0 * fraction);
    if fraction < FEW_HUGE_PAGES {
        note += " (a copy made by `shardify copy` is cached in huge pages; wide windows read \
                 it faster: docs/converting.md)";
    }
    note
}

/// The report as a table.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "dataset {} events, {} pulses; {} CPUs ({}); memcpy {:.2} GB/s (same threads, same run; {:.2} again after the shardify loaders); compute step {} ms\n",
        report.dataset_events, report.dataset_pulses, report.machine.cpus, report.machine.describe_cpu(), report.memcpy_gb_per_s, report.memcpy_after_loaders_gb_per_s, report.simulate_compute_ms
    );
    out += &format!(
        "batches of {} events; shardify: {}blocks of {} events, runs of {}, batch order {}, grouped by length: {}, {} workers ({} scheduling; {}), {} batches prepared ahead, prefetching into {} ({}), columns shards copied in {} pass{}\n",
        report.batch_events, report.batching.as_deref().map_or(String::new(), |b| format!("batches by {b}, ")), report.block_events, report.run_events, report.batch_order, report.group_by_length, report.workers,
        report.worker_scheduling.iter().map(|s| s.name()).collect::<Vec<_>>().join(", then "),
        report.consumer_gathers.iter().map(|&g| waiting_thread(g)).collect::<Vec<_>>().join(", then "),
        report.prefetch,
        report.prefetch_level.name().to_uppercase(),
        report.prefetch_level.instruction(),
        report.columns_passes,
        if report.columns_passes == ColumnsPasses::One { "" } else { "es" }
    );
    out += &format!(
        "{:<44} {:>6} {:>11} {:>12} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6}\n",
        "loader",
        "window",
        "events/s",
        "pulses/s",
        "GB/s",
        "memcpy",
        "waiting",
        "mixing",
        "autocor",
        "repeat",
        "displ",
        "fill"
    );
    for l in &report.loaders {
        let q = &l.quality;
        out +=
            &format!(
            "{:<44} {:>6} {:>11.0} {:>12.0} {:>7.3} {:>6.2} {:>7} {:>7.3} {:>7} {:>7.4} {:>6.3} {:>6.3}\n",
            l.name,
            l.window.map_or("-".into(), |w| w.to_string()),
            l.events_per_s,
            l.pulses_per_s,
            l.gb_per_s,
            l.ratio_to_memcpy,
            l.waiting_fraction.map_or("-".into(), |w| format!("{:.1}%", 100.0 * w)),
            q.file_mixing,
            q.label_autocorrelation.map_or("-".into(), |a| format!("{a:.3}")),
            q.pair_repeat,
            q.displacement,
            q.padded_fill
        );
    }
    out += &placement_line(&report.loaders);
    out += &format!(
        "stages: shard read {:.2} GB/s sequential through the memory map, {:.2} of memcpy \
         ({} for the dataset){}\n",
        report.shard_read_gb_per_s,
        report.shard_read_gb_per_s / report.memcpy_gb_per_s.max(1e-12),
        duration(report.shard_read_seconds),
        report
            .shard_huge_page_fraction
            .map(huge_pages_note)
            .unwrap_or_default()
    );
    if let Some(disk) = report.cold_read_gb_per_s {
        out += &format!(
            "cold: every shardify epoch started with the shards evicted from the page cache; \
             bound: a cold sequential read of the shards, {disk:.3} GB/s\n"
        );
        for l in report
            .loaders
            .iter()
            .filter(|l| l.cold_ratio_to_disk.is_some())
        {
            out += &format!(
                "  window {:>4}: {:.0} events/s cold, the shards read at {:.2} of the disk's sequential rate\n",
                l.window.unwrap_or_default(),
                l.cold_events_per_s.unwrap_or_default(),
                l.cold_ratio_to_disk.unwrap_or_default()
            );
        }
    }
    match &report.gpu {
        None => {
            out += &format!(
                "device: {} -- no host-to-device stage\n",
                report.machine.device
            )
        }
        Some(g) => {
            out += &format!(
                "device: {}, {} device buffers; bound: pinned H2D {:.2} GB/s (pageable {:.2} GB/s), {} B pieces\n",
                g.device,
                report.device_buffers.unwrap_or_default(),
                g.pinned_h2d_gb_per_s,
                g.pageable_h2d_gb_per_s,
                g.chunk_bytes
            )
        }
    }
    out += "per loader, each stage against its bound (gather: thread time summed, bytes per thread-second x workers):\n";
    for l in &report.loaders {
        out += &stage_line(l);
    }
    if let (Some(n), Some(b)) = (report.speedup_vs_naive, report.speedup_vs_block_shuffle) {
        out += &format!("best shardify window: {n:.0}x the naive loader's events/s, {b:.1}x the Parquet block shuffle's\n");
    }
    let iid = report
        .loaders
        .first()
        .map_or(0.0, |l| l.quality.pair_repeat_iid);
    out += &format!(
        "mixing: in-batch source-file entropy / i.i.d. (1 ideal); autocor: lag-1 zenith autocorrelation (0 ideal);\n\
         repeat: same-batch pairs repeated next epoch (i.i.d. {iid:.4}); displ: mean displacement / N (1/3 for a uniform shuffle);\n\
         fill: pulses over the cells of batches padded to their longest event, events cut to {PADDED_FILL_CUT} pulses (1 without padding)\n"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::baselines::Throughput;
    use crate::bench::quality::Quality;
    use crate::bench::report::figures;

    #[test]
    fn few_huge_pages_name_the_copy_that_makes_more() {
        assert_eq!(huge_pages_note(0.99), ", 99% of it mapped in huge pages");
        let few = huge_pages_note(0.84);
        assert!(
            few.starts_with(", 84% of it mapped in huge pages ("),
            "{few}"
        );
        assert!(few.contains("`shardify copy`"), "{few}");
    }

    /// A shardify row at `window` (`None`: a baseline) in `placement`.
    fn row(window: Option<usize>, placement: Option<CachePlacement>) -> LoaderFigures {
        let throughput = Throughput {
            events: 1,
            pulses: 1,
            bytes: 1,
            seconds: 1.0,
        };
        let quality = Quality {
            file_mixing: 1.0,
            label_autocorrelation: None,
            pair_repeat: 0.0,
            pair_repeat_iid: 0.0,
            displacement: 0.3,
            padded_fill: 0.3,
        };
        let mut f = figures("shardify", window, throughput, 1.0, quality);
        f.cache_placement = placement;
        f
    }

    #[test]
    fn the_placement_line_names_each_placements_windows_and_warns_when_they_differ() {
        use CachePlacement::*;
        let line = |rows: &[LoaderFigures]| placement_line(rows);
        // No row with a known placement (baselines, or round trips not timed): no line.
        assert_eq!(line(&[row(None, None), row(Some(4), None)]), "");
        let same = line(&[
            row(None, None),
            row(Some(1), Some(Shared)),
            row(Some(4), Some(Shared)),
        ]);
        assert!(same.ends_with(": a shared L3 at windows 1, 4\n"), "{same}");
        assert!(same.contains("under or over 200 ns"), "{same}");
        assert!(!same.contains("compare only"), "{same}");
        // Two policies at window 16 split by the host: each placement names it once.
        let rows = [
            row(Some(4), Some(Shared)),
            row(Some(16), Some(Split)),
            row(Some(16), Some(Split)),
            row(Some(64), Some(Changed)),
            row(Some(4), Some(Shared)),
        ];
        let mixed = line(&rows);
        assert!(
            mixed.contains(
                ": a shared L3 at window 4; no shared L3 at window 16; moved during the row at \
                 window 64 -- ratios to memcpy compare only between rows of one placement\n"
            ),
            "{mixed}"
        );
    }
}
