//! `shardify verify`: checksums and every invariant, and with a source, every pulse.

use std::path::PathBuf;

use anyhow::{bail, Result};
use shardify::dataset::verify::verify;
use shardify::source::InputSet;

/// Verifies `dir` (against the source `against`, of `split`), printing each problem.
pub(super) fn run_verify(
    dir: PathBuf,
    against: Option<PathBuf>,
    split: Option<String>,
) -> Result<()> {
    let source = against
        .map(|a| InputSet::discover(&a, split.as_deref()))
        .transpose()?;
    let report = verify(&dir, source.as_ref())?;
    for problem in &report.problems {
        tell!("problem: {problem}");
    }
    if report.problem_count > report.problems.len() as u64 {
        tell!(
            "... and {} more problems",
            report.problem_count - report.problems.len() as u64
        );
    }
    let compared = report
        .source_events
        .map_or(String::new(), |n| format!(", {n} source events compared"));
    // Without a source, the manifest's lineage (the input files' names, sizes and
    // fingerprints) and its descriptive parameters are taken as written: say so.
    let unchecked = match report.source_events {
        Some(_) => "",
        None => "; no source compared: --against INPUT_DIR compares every pulse and the lineage",
    };
    if !report.ok() {
        bail!(
            "{}: {} problems ({} shards, {} events checked{compared})",
            dir.display(),
            report.problem_count,
            report.shards,
            report.events
        );
    }
    say!(
        "{}: OK ({} shards, {} events, {} pulses{compared}){unchecked}",
        dir.display(),
        report.shards,
        report.events,
        report.pulses
    )?;
    Ok(())
}
