//! The README's job-array recipe on a real single-node Slurm (started by
//! `tools/slurm-cluster.sh`, which installs Debian's slurm-wlm and munge when missing): one
//! scatter task is cancelled, which strands the later phases, and recovered the documented
//! way; the dataset ends byte-identical to a single-process conversion, and verifies.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

/// The cluster, stopped (by its pid files) when dropped.
struct Cluster {
    dir: PathBuf,
    conf: String,
}

impl Cluster {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/slurm-cluster.sh")
    }

    /// `None` where Slurm cannot be had (not root, no apt-get): a skip, except in CI.
    fn start(dir: &Path) -> Option<Cluster> {
        let out = Command::new("bash")
            .arg(Self::script())
            .arg("start")
            .arg(dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(3) && !in_ci() {
            println!("SKIPPED: {}", stderr.trim());
            return None;
        }
        assert!(out.status.success(), "the cluster did not start: {stderr}");
        let conf = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Some(Cluster {
            dir: dir.to_path_buf(),
            conf,
        })
    }

    /// Runs a bash script with the cluster's configuration, in `cwd`.
    fn bash(&self, cwd: &Path, script: &str) -> Output {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(cwd)
            .env("SLURM_CONF", &self.conf)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Waits until no job is left in the queue.
    fn wait_for_empty_queue(&self, cwd: &Path, limit: Duration) {
        let started = Instant::now();
        loop {
            let queue = self.bash(cwd, "squeue -h -o '%i %T %r'");
            let text = String::from_utf8_lossy(&queue.stdout).to_string();
            if text.trim().is_empty() {
                return;
            }
            assert!(started.elapsed() < limit, "jobs still queued: {text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(Self::script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

#[test]
fn the_readme_recipe_runs_on_slurm_and_a_failed_task_is_recovered_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cluster) = Cluster::start(&dir.path().join("cluster")) else {
        return;
    };
    let shardify = env!("CARGO_BIN_EXE_shardify");
    let fixture_dir = fixture().display().to_string();
    let args = "--split train --seed 3 --shard-size 64KiB --memory-limit 256MiB --threads 1";
    let reference = dir.path().join("reference");
    let out = dir.path().join("array");
    cluster.bash(
        dir.path(),
        &format!(
            "{shardify} convert {fixture_dir} {} {args}",
            reference.display()
        ),
    );
    let plan = cluster.bash(
        dir.path(),
        &format!(
            "{shardify} convert {fixture_dir} {} {args} --phase plan",
            out.display()
        ),
    );
    let printed = String::from_utf8_lossy(&plan.stdout).to_string();
    let lines: Vec<&str> = printed
        .lines()
        .filter(|l| l.trim_start().starts_with("scatter=") || l.contains("sbatch"))
        .map(str::trim)
        .collect();
    assert_eq!(lines.len(), 3, "three array lines: {printed}");
    // The printed lines, with the scatter array held until its task 1 is cancelled: a
    // failed task, which leaves the gather pending forever (DependencyNeverSatisfied).
    let script = format!(
        "{}\nscancel ${{scatter}}_1\nscontrol release $scatter\n{}\nfinal=$({})\necho $scatter $gather $final",
        lines[0].replacen("sbatch --parsable", "sbatch --parsable --hold", 1),
        lines[1],
        lines[2].replacen("sbatch", "sbatch --parsable", 1),
    );
    let ids = String::from_utf8_lossy(&cluster.bash(dir.path(), &script).stdout).to_string();
    let ids: Vec<&str> = ids.split_whitespace().collect();
    let (scatter, gather) = (ids[0], ids[1]);
    let started = Instant::now();
    loop {
        let state = cluster.bash(dir.path(), &format!("squeue -h -j {gather} -o %r"));
        let reason = String::from_utf8_lossy(&state.stdout).to_string();
        if reason.contains("DependencyNeverSatisfied") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the gather should be stranded: {reason}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!out.join("manifest.json").exists());
    // The README's recovery: resubmit the failed task, then release the stranded phase.
    let resubmit = lines[0]
        .trim_start_matches("scatter=$(")
        .trim_end_matches(')')
        .replacen("--array=0-2", "--array=1", 1);
    cluster.bash(
        dir.path(),
        &format!("again=$({resubmit})\nscontrol update jobid={gather} dependency=afterok:$again"),
    );
    cluster.wait_for_empty_queue(dir.path(), Duration::from_secs(150));
    assert!(
        out.join("manifest.json").exists(),
        "the finalize ran (scatter job {scatter})"
    );
    assert!(
        dir_files(&out) == dir_files(&reference),
        "byte-identical to one process"
    );
    let report = shardify::dataset::verify::verify(
        &out,
        Some(&shardify::source::InputSet::discover(&fixture(), Some("train")).unwrap()),
    )
    .unwrap();
    assert!(report.ok(), "{:?}", report.problems);
}
