//! `shardify inspect`: a dataset's counts, distributions, sizes, seed and schema.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use shardify::dataset::{inspect::inspect, ChecksumPolicy, Dataset, View};

/// Prints `dir`'s inspection, as text or as JSON.
pub(super) fn run_inspect(dir: PathBuf, json: bool) -> Result<()> {
    let dataset = Arc::new(Dataset::open(&dir, ChecksumPolicy::Lazy)?);
    let report = inspect(&dataset)?;
    let m = dataset.manifest();
    // What a saved loader state names as its `dataset`.
    let identity = View::from(dataset.clone()).identity();
    if json {
        let value = serde_json::json!({"inspection": report, "parameters": m.parameters, "schema": m.schema, "identity": identity});
        say!("{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    say!("dataset      {}", dir.display())?;
    say!("events       {}", report.events)?;
    say!("DOMs         {}", report.doms)?;
    say!("pulses       {}", report.pulses)?;
    say!(
        "shards       {} ({:.2} MiB)",
        report.shards,
        report.bytes as f64 / (1 << 20) as f64
    )?;
    say!("seed         {}", m.parameters.seed)?;
    say!("sources      {} batch files", m.sources.batches.len())?;
    say!("identity     {identity}")?;
    say!("               min   median      mean      p99      max")?;
    for (name, d) in [
        ("pulses/event", report.pulses_per_event),
        ("DOMs/event", report.doms_per_event),
        ("pulses/DOM", report.pulses_per_dom),
    ] {
        say!(
            "{name:<12} {:>5} {:>8} {:>9.2} {:>8} {:>8}",
            d.min,
            d.median,
            d.mean,
            d.p99,
            d.max
        )?;
    }
    say!(
        "single-pulse DOMs {:.1}%",
        100.0 * report.single_pulse_dom_fraction
    )?;
    let b = &report.bytes_by_level;
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    say!(
        "bytes        {:.2} per event, {:.2} per DOM, {:.2} per pulse (levels); \
         {:.2} MiB of headers, {:.3} MiB sensor table",
        b.bytes_per_event,
        b.bytes_per_dom,
        b.bytes_per_pulse,
        mib(b.header_bytes),
        mib(b.sensor_table_bytes)
    )?;
    say!(
        "per pulse    {:.2} bytes in all; format v1 would store {:.2} ({:.2} MiB)",
        b.total_bytes_per_pulse,
        b.v1_bytes_per_pulse,
        mib(b.v1_bytes)
    )?;
    let t = &m.schema.types;
    say!(
        "types        sensor_id {:?}, position {:?}, time {:?}, charge {:?}, labels {}",
        t.sensor_id,
        t.position,
        t.time,
        t.charge,
        t.labels
    )?;
    say!("layout       {}", m.schema.layout.name())?;
    say!("DOM order    {}", m.schema.dom_order)?;
    say!("pulse order  {}", m.schema.pulse_order)?;
    for shard in &m.shards {
        say!(
            "  {}  {} events  {} pulses  {} bytes  xxh3 {}",
            shard.file,
            shard.events,
            shard.pulses,
            shard.bytes,
            shard.xxh3
        )?;
    }
    Ok(())
}
