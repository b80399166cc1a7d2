//! `shardify copy`: a dataset to a node's local disk, checked on the way.

use std::path::PathBuf;

use anyhow::Result;
use shardify::dataset::copy::{copy_dataset_with, CopyOptions, CopyOutcome};
use shardify::format::ShardLayout;

use super::progress::Reporter;
use super::LayoutArg;

/// Copies `dataset` to `destination` (or finds or finishes the copy there) and says how.
pub(super) fn run_copy(
    dataset: PathBuf,
    destination: PathBuf,
    layout: Option<LayoutArg>,
    check: bool,
) -> Result<()> {
    let layout = layout.map(ShardLayout::from);
    let options = CopyOptions { layout, check };
    let report = copy_dataset_with(&dataset, &destination, &options, &Reporter::new())?;
    let how = match layout {
        Some(layout) => format!(" ({} layout)", layout.name()),
        None => String::new(),
    };
    let files = format!(
        "{} shards, the sensor table and the manifest, {:.1} MB",
        report.shards,
        report.bytes as f64 / 1e6
    );
    let (from, to) = (dataset.display(), destination.display());
    let rate = |bytes: u64| {
        format!(
            "{:.2} s ({:.0} MB/s)",
            report.seconds,
            bytes as f64 / 1e6 / report.seconds.max(1e-9)
        )
    };
    match report.outcome {
        CopyOutcome::Present => {
            let checked = if check {
                "; every file's checksum matches"
            } else {
                ""
            };
            say!("{to} holds this copy of {from}{how} already ({files}): nothing copied{checked}")?
        }
        CopyOutcome::Repaired => say!(
            "{from} -> {to}{how}: {files}, checked: {} files matched, {:.1} MB copied again in \
             {}; checksums match",
            report.kept,
            report.written as f64 / 1e6,
            rate(report.written)
        )?,
        CopyOutcome::Copied => say!(
            "{from} -> {to}{how}: {files} in {}; checksums match",
            rate(report.bytes)
        )?,
        CopyOutcome::Resumed => say!(
            "{from} -> {to}{how}: {files}, finishing a stopped copy: {} files kept (sizes \
             and checksums match), {:.1} MB written in {}; checksums match",
            report.kept,
            report.written as f64 / 1e6,
            rate(report.written)
        )?,
    }
    Ok(())
}
