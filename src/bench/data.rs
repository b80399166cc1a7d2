//! Generated data for the benches, made once and kept: a Kaggle-layout source with the real
//! data's statistics, and its conversion.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::convert::{convert_in_one_go, ConvertOptions};
use crate::error::{IoContext, Result};
use crate::source::layout::meta_file;
use crate::synth::{write_dataset, SynthOptions};

/// Where bench data is kept: `SHARDIFY_BENCH_DATA`, else `target/bench-data` of this
/// repository.
pub fn root() -> PathBuf {
    std::env::var_os("SHARDIFY_BENCH_DATA").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-data"),
        PathBuf::from,
    )
}

/// A generated source of `events` events in `files` batch files (seed 1) under `root`,
/// written unless already there (what an interrupted generation left is removed first);
/// returns its directory.
pub fn source(root: &Path, events: u64, files: u32) -> Result<PathBuf> {
    let dir = root.join(format!("kaggle-{events}-{files}"));
    // The meta is the last file a generation puts in place.
    if !dir.join(meta_file("train")).exists() {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).at(&dir)?;
        }
        let started = std::time::Instant::now();
        let written = write_dataset(
            &dir,
            &SynthOptions {
                events,
                files,
                seed: 1,
                ..SynthOptions::default()
            },
        )?;
        // Progress only: a closed stderr loses the line, never the data.
        let _ = writeln!(
            std::io::stderr(),
            "generated {} events, {} pulses in {:.1} s",
            written.events,
            written.pulses,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(dir)
}

/// [`source`] converted with seed 1 and default options, unless already done; returns the
/// dataset's directory.
pub fn converted(root: &Path, events: u64, files: u32) -> Result<PathBuf> {
    let src = source(root, events, files)?;
    let out = root.join(format!("shards-{events}-{files}"));
    if !out.join("manifest.json").exists() {
        if out.exists() {
            std::fs::remove_dir_all(&out).at(&out)?;
        }
        let options = ConvertOptions {
            seed: 1,
            ..ConvertOptions::default()
        };
        convert_in_one_go(&src, Some("train"), &out, &options)?;
    }
    Ok(out)
}
