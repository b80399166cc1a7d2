//! A conversion as a job array: the lines that submit it, and the slice of a phase's units
//! that one task of the array runs.

use anyhow::{bail, Context, Result};
use shardify::convert::{ConvertOptions, Phase, TaskSlice};
use shardify::format::ShardLayout;
use shardify::source::InputSet;

use super::convert::ConvertArgs;

/// After the plan phase: the units of each phase, and the job-array lines that cover them
/// with absolute paths and the resources the options ask for.
pub(super) fn print_array_lines(
    inputs: &InputSet,
    args: &ConvertArgs,
    options: &ConvertOptions,
    units: shardify::convert::PlannedUnits,
) -> Result<()> {
    say!(
        "planned: {} scatter units (one per batch file), {} gather units (one per bucket); \
         the meta {}",
        units.scatter,
        units.gather,
        if units.meta_split {
            "is split by batch"
        } else {
            "is read per batch"
        }
    )?;
    let exe = std::env::current_exe().context("the path of this shardify binary")?;
    let out = std::path::absolute(args.out())?;
    let source = match args.input() {
        Some(dir) => std::path::absolute(dir)?.display().to_string(),
        None => format!(
            "--batch {} --meta {} --geometry {}",
            inputs
                .batches
                .iter()
                .map(|b| b.path.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            inputs
                .meta
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            inputs.geometry.display()
        ),
    };
    let mut common = format!(
        "--seed {} --threads {} --memory-limit {}MiB --shard-size {}",
        options.seed,
        options.threads_within_limit(),
        options.memory_limit_bytes >> 20,
        options.shard_target_bytes
    );
    if let Some(split) = &args.split {
        common += &format!(" --split {split}");
    }
    if options.lossy {
        common += " --lossy";
    }
    if options.layout == ShardLayout::Records {
        common += " --layout records";
    }
    let convert = format!(
        "{} convert {source} {} {common}",
        exe.display(),
        out.display()
    );
    // Peak RSS stays within --memory-limit; a tenth more for the page tables and the
    // allocator's slack that a job's memory accounting also counts.
    let resources = format!(
        "--cpus-per-task={} --mem={}M",
        options.threads_within_limit(),
        (options.memory_limit_bytes >> 20) * 11 / 10
    );
    say!("submit (each array task takes its index and the array's size from Slurm):")?;
    say!(
        "  scatter=$(sbatch --parsable --array=0-{} {resources} --wrap \"{convert} --phase scatter\")",
        units.scatter.saturating_sub(1)
    )?;
    say!(
        "  gather=$(sbatch --parsable --dependency=afterok:$scatter --array=0-{} {resources} --wrap \"{convert} --phase gather\")",
        units.gather.saturating_sub(1)
    )?;
    say!(
        "  sbatch --dependency=afterok:$gather {resources} --wrap \"{convert} --phase finalize\""
    )?;
    Ok(())
}

/// A Slurm array variable, when set.
fn slurm(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Ok(v) => {
            Ok(Some(v.trim().parse().with_context(|| {
                format!("{name}={v:?} is not a task number")
            })?))
        }
        Err(_) => Ok(None),
    }
}

/// This task's slice of a phase's units: from `--task-index`/`--task-count`, else from the
/// Slurm array the task runs in. A count that disagrees with the array would leave units
/// that no task runs: refused before any work, naming them.
pub(super) fn task_slice(args: &ConvertArgs, phase: Phase) -> Result<TaskSlice> {
    let in_array = matches!(phase, Phase::Scatter | Phase::Gather);
    let array_count = if in_array {
        slurm("SLURM_ARRAY_TASK_COUNT")?
    } else {
        None
    };
    let array_index = match (in_array, slurm("SLURM_ARRAY_TASK_ID")?) {
        (true, Some(id)) => {
            let min = slurm("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let step = slurm("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
            Some(id.saturating_sub(min) / step)
        }
        _ => None,
    };
    let count = args.task_count.or(array_count).unwrap_or(1);
    if let Some(array) = array_count.filter(|&a| a != count) {
        let left_over: Vec<u64> = (array..count).take(8).collect();
        bail!(
            "--task-count {count} but this Slurm array has {array} tasks \
             (SLURM_ARRAY_TASK_COUNT): the units whose number modulo {count} is {}{} would \
             never run; omit --task-count inside an array, or submit --array=0-{}",
            left_over
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if count - array > 8 { ", ..." } else { "" },
            count.saturating_sub(1)
        );
    }
    Ok(TaskSlice {
        index: args.task_index.or(array_index).unwrap_or(0),
        count,
    })
}
