//! Byte-identical output whatever the thread count, task split or interruptions; safety of
//! the output directory.

mod common;

use std::process::Command;

use common::*;
use shardify::convert::work::WorkDir;
use shardify::convert::{convert, Phase, Silent, Summary, TaskSlice};
use shardify::format::Manifest;
use shardify::source::InputSet;
use shardify::synth;
use shardify::Error;

#[test]
fn same_seed_same_bytes_whatever_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("t1");
    convert_all(&fixture(), "train", &reference, &options(3, 1)).unwrap();
    let expected = dir_files(&reference);
    assert!(
        expected.len() > 4,
        "several shards and a manifest: {:?}",
        expected.keys()
    );
    for threads in [2, 3, 5] {
        let out = dir.path().join(format!("t{threads}"));
        convert_all(&fixture(), "train", &out, &options(3, threads)).unwrap();
        assert!(
            dir_files(&out) == expected,
            "{threads} threads differ from 1 thread"
        );
    }
    let other = dir.path().join("seed4");
    convert_all(&fixture(), "train", &other, &options(4, 2)).unwrap();
    let mut a = dump_lines(&reference);
    let mut b = dump_lines(&other);
    assert_ne!(a, b, "another seed gives another order");
    a.sort();
    b.sort();
    assert_eq!(a, b, "...of the same events");
}

/// The fixture's train inputs and their conversion with `seed` (two threads) into
/// `dir/ref`: the files a conversion run in pieces must end as.
fn fixture_reference(dir: &std::path::Path, seed: u64) -> (std::path::PathBuf, InputSet) {
    let reference = dir.join("ref");
    convert_all(&fixture(), "train", &reference, &options(seed, 2)).unwrap();
    let inputs = InputSet::discover(&fixture(), Some("train")).unwrap();
    (reference, inputs)
}

#[test]
fn job_array_phases_give_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (reference, inputs) = fixture_reference(dir.path(), 9);
    let out = dir.path().join("array");
    let opts = options(9, 1);
    convert(
        &inputs,
        &out,
        &opts,
        Phase::Plan,
        TaskSlice::default(),
        &Silent,
    )
    .unwrap();
    for phase in [Phase::Scatter, Phase::Gather] {
        for index in [2, 0, 1] {
            let s = convert(
                &inputs,
                &out,
                &opts,
                phase,
                TaskSlice { index, count: 3 },
                &Silent,
            )
            .unwrap();
            assert!(s.manifest.is_none());
        }
    }
    let s = convert(
        &inputs,
        &out,
        &opts,
        Phase::Finalize,
        TaskSlice::default(),
        &Silent,
    )
    .unwrap();
    assert!(s.manifest.is_some());
    assert!(dir_files(&out) == dir_files(&reference));
}

/// Checks that a conversion run into `out` (`what` it ran) was refused as [`Error::Busy`].
fn assert_busy(run: shardify::Result<Summary>, out: &std::path::Path, what: &str) {
    match run {
        Err(Error::Busy { path }) => assert_eq!(path, out),
        other => panic!("{what}: expected Busy, got {other:?}"),
    }
}

#[test]
fn a_run_that_writes_alone_is_refused_while_another_run_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (reference, inputs) = fixture_reference(dir.path(), 2);
    let out = dir.path().join("o");
    let run = |phase, slice| convert(&inputs, &out, &options(2, 1), phase, slice, &Silent);
    run(Phase::Plan, TaskSlice::default()).unwrap();
    let work = WorkDir::new(&out);
    let (first, second) = (
        TaskSlice { index: 0, count: 2 },
        TaskSlice { index: 1, count: 2 },
    );
    {
        // A job array's task is writing: another task may, a whole run or a finalize not.
        let _task = work.lock(false).unwrap();
        run(Phase::Scatter, first).unwrap();
        for phase in [Phase::All, Phase::Finalize, Phase::Plan] {
            assert_busy(
                run(phase, TaskSlice::default()),
                &out,
                &format!("{phase:?}"),
            );
        }
    }
    {
        // A whole run is writing: nothing else may.
        let _whole = work.lock(true).unwrap();
        assert_busy(run(Phase::Scatter, second), &out, "a scatter task");
        assert_busy(run(Phase::All, TaskSlice::default()), &out, "All");
    }
    // Unlocked, the conversion finishes: the same files as one undisturbed run.
    let s = convert_all(&fixture(), "train", &out, &options(2, 2)).unwrap();
    assert!(
        s.units_skipped >= 1,
        "the task's scatter units are not redone"
    );
    assert!(dir_files(&out) == dir_files(&reference));
    assert!(!out.join(".work").exists());
}

#[test]
fn gather_before_scatter_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = InputSet::discover(&fixture(), Some("train")).unwrap();
    let out = dir.path().join("o");
    let e = convert(
        &inputs,
        &out,
        &options(1, 1),
        Phase::Gather,
        TaskSlice::default(),
        &Silent,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("the scatter phase has not finished"),
        "{e}"
    );
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn leftovers_of_a_crash_are_never_mistaken_for_output() {
    let dir = tempfile::tempdir().unwrap();
    let (reference, inputs) = fixture_reference(dir.path(), 2);
    let out = dir.path().join("o");
    // Half of the scatter units, then debris of a crash: temp files with garbage.
    convert(
        &inputs,
        &out,
        &options(2, 1),
        Phase::Scatter,
        TaskSlice { index: 0, count: 2 },
        &Silent,
    )
    .unwrap();
    std::fs::write(out.join(".tmp.shard_00000.safetensors.999.0"), b"garbage").unwrap();
    std::fs::write(out.join(".work/spill/.tmp.batch_2.spill.999.1"), b"garbage").unwrap();
    // Opened before it is finished: not found, saying how to finish it.
    let why = why_no_dataset(&out);
    assert!(why.contains("unfinished conversion"), "{why}");
    assert!(why.contains("`shardify convert` again"), "{why}");
    let s = convert_all(&fixture(), "train", &out, &options(2, 2)).unwrap();
    assert!(s.units_skipped >= 1, "finished units are not redone");
    assert!(dir_files(&out) == dir_files(&reference));
}

/// `path` with the byte in its middle inverted (its size unchanged).
fn flip_middle_byte(path: &std::path::Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

/// Something done to an unfinished conversion's output directory.
type Damage<'a> = dyn Fn(&std::path::Path) + 'a;

#[test]
fn damaged_or_outdated_scatter_work_is_done_again_with_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    let (reference, inputs) = fixture_reference(dir.path(), 2);
    let spill = |out: &std::path::Path, name: &str| out.join(".work/spill").join(name);
    let damages: [(&str, &Damage<'_>); 3] = [
        // Spill data is not fsynced: after a machine crash a chunk may hold anything.
        ("a spill chunk", &|out| {
            flip_middle_byte(&spill(out, "batch_2.spill"))
        }),
        ("a chunk table", &|out| {
            flip_middle_byte(&spill(out, "batch_2.chunks"))
        }),
        // Indexes of older versions listed the chunks themselves, and had no table.
        ("an older index", &|out| {
            let path = spill(out, "batch_2.json");
            let mut index: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let object = index.as_object_mut().unwrap();
            assert!(object.remove("table").is_some(), "{path:?} has a table");
            object.insert("chunks".into(), serde_json::json!([]));
            std::fs::write(&path, serde_json::to_vec(&index).unwrap()).unwrap();
            std::fs::remove_file(spill(out, "batch_2.chunks")).unwrap();
        }),
    ];
    for (what, damage) in damages {
        let out = dir.path().join(what.replace(' ', "-"));
        convert(
            &inputs,
            &out,
            &options(2, 1),
            Phase::Scatter,
            TaskSlice::default(),
            &Silent,
        )
        .unwrap();
        damage(&out);
        let s = convert_all(&fixture(), "train", &out, &options(2, 2)).unwrap();
        assert_eq!(
            s.units_run.iter().find(|(phase, _)| *phase == "scatter"),
            Some(&("scatter", 1)),
            "{what}: the one batch scattered again, {s:?}"
        );
        assert_eq!(s.units_skipped, 2, "{what}: {s:?}");
        assert!(
            dir_files(&out) == dir_files(&reference),
            "{what}: another output"
        );
    }
}

#[test]
fn a_killed_conversion_restarted_gives_the_same_result() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = synthetic_source(dir.path(), 20_000, 6, 5);
    let command = |out: &std::path::Path| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_shardify"));
        c.args([
            "convert",
            src.to_str().unwrap(),
            out.to_str().unwrap(),
            "--seed",
            "1",
            "--threads",
            "2",
        ])
        .args(["--shard-size", "1MiB", "--memory-limit", "64MiB"]);
        c
    };
    let reference = dir.path().join("ref");
    assert!(command(&reference).output().unwrap().status.success());
    let expected = dir_files(&reference);
    // Kill points chosen from the conversion's own progress lines: after the plan, in the
    // middle of the scatter, as the gather starts, after its first bucket.
    let kill_points = [
        "scatter: 6 units to do",
        "scatter: 3/6 done",
        "gather: ",
        "gather: 1/",
    ];
    for (i, point) in kill_points.into_iter().enumerate() {
        let out = dir.path().join(format!("killed{i}"));
        let mut child = command(&out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let reached = stderr
            .lines()
            .map_while(|l| l.ok())
            .any(|line| line.starts_with(point));
        let _ = child.kill();
        child.wait().unwrap();
        assert!(reached, "the conversion never printed {point:?}");
        assert!(
            !out.join("manifest.json").exists() && out.join(".work").is_dir(),
            "killed at {point:?}: an unfinished conversion is left behind"
        );
        let restart = command(&out).output().unwrap();
        assert!(
            restart.status.success(),
            "restart after a kill at {point:?}: {}",
            String::from_utf8_lossy(&restart.stderr)
        );
        assert!(
            dir_files(&out) == expected,
            "restart after a kill at {point:?} differs"
        );
    }
}

/// `shardify args` run under the shell's `ulimit option limit`, set in the shell the binary
/// replaces: a `pre_exec` hook makes the test process fork, and the child then holds, until
/// its exec, copies of every descriptor another test's thread has open, work directory
/// locks among them (a conversion in another test then found its directory `Busy`, once in
/// CI). The shell ignores SIGXFSZ, so a write past a file-size limit fails with EFBIG, as
/// one on a full disk or past a quota fails with ENOSPC or EDQUOT: an error returned, not
/// a kill.
fn shardify_under_limit(option: &str, limit: &str, args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .args([
            "-c",
            "trap '' XFSZ && ulimit \"$0\" \"$1\" && shift && exec \"$@\"",
            option,
            limit,
        ])
        .arg(env!("CARGO_BIN_EXE_shardify"))
        .args(args)
        .output()
        .unwrap()
}

/// What a conversion of `src` into `out` under a file-size limit (KiB, or "unlimited")
/// printed, and whether it succeeded (see [`shardify_under_limit`]).
fn convert_under_file_size_limit(
    src: &std::path::Path,
    out: &std::path::Path,
    limit_kib: &str,
    phase: &str,
) -> (bool, String) {
    let (src, out) = (src.to_str().unwrap(), out.to_str().unwrap());
    let run = shardify_under_limit(
        "-f",
        limit_kib,
        &[
            "convert",
            src,
            out,
            "--seed",
            "1",
            "--threads",
            "2",
            "--memory-limit",
            "64MiB",
            "--phase",
            phase,
        ],
    );
    (run.status.success(), text(&run.stderr))
}

#[test]
fn a_write_that_fails_names_its_file_and_the_same_conversion_run_again_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    // 80 batches of 250 events: spill files of 0.3-3.6 MB, shards of 1.4-3.3 MB.
    let (src, _) = synthetic_source(dir.path(), 20_000, 80, 5);
    let reference = dir.path().join("ref");
    let (ok, said) = convert_under_file_size_limit(&src, &reference, "unlimited", "all");
    assert!(ok, "{said}");
    let expected = dir_files(&reference);
    // (where it fails, the phases run under the limit, the file the error must name)
    let cases = [
        ("the scatter", vec!["all"], "/.work/spill/batch_"),
        ("the gather", vec!["plan", "scatter", "gather"], "/shard_"),
    ];
    for (what, phases, named) in cases {
        let out = dir.path().join(what.replace(' ', "-"));
        let (last, before) = phases.split_last().unwrap();
        for phase in before {
            let (ok, said) = convert_under_file_size_limit(&src, &out, "unlimited", phase);
            assert!(ok, "{what}: phase {phase}: {said}");
        }
        let (ok, said) = convert_under_file_size_limit(&src, &out, "1024", last);
        assert!(!ok, "{what}: every file fit in 1 MiB: {said}");
        let error = said
            .lines()
            .find(|line| line.starts_with("error: "))
            .unwrap_or_else(|| panic!("{what}: no error line in {said}"));
        let prefix = format!("{}{named}", out.display());
        assert!(
            error.contains(&prefix) && error.contains("File too large (os error 27)"),
            "{what}: {error}"
        );
        assert!(
            !error.contains(".tmp."),
            "{what}: names a temp file: {error}"
        );
        let why = why_no_dataset(&out);
        assert!(why.contains("unfinished conversion"), "{what}: {why}");
        let leftovers: Vec<_> = dir_files(&out)
            .into_keys()
            .filter(|name| name.starts_with(".tmp.") || name.contains("/.tmp."))
            .collect();
        assert!(leftovers.is_empty(), "{what}: left {leftovers:?}");
        let (ok, said) = convert_under_file_size_limit(&src, &out, "unlimited", "all");
        assert!(ok, "{what}: run again: {said}");
        assert!(
            said.contains("units finished by an earlier run"),
            "{what}: nothing kept: {said}"
        );
        assert!(dir_files(&out) == expected, "{what}: another output");
    }
}

/// A generator whose write fails (the disk full, here a file-size limit) names the batch
/// file and the operating system's error, not a Parquet file it could not read; it leaves
/// nothing in the output, and the same command run again writes what a run never stopped
/// writes.
#[test]
fn a_generator_write_that_fails_names_its_file_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (out, reference) = (dir.path().join("src"), dir.path().join("ref"));
    let generate = |out: &std::path::Path, limit_kib: &str| {
        let out = out.to_str().unwrap();
        let args = ["generate", out, "--events", "20000", "--files", "4"];
        shardify_under_limit("-f", limit_kib, &args)
    };
    let clean = generate(&reference, "unlimited");
    assert!(clean.status.success(), "{}", text(&clean.stderr));
    let failed = generate(&out, "256");
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed.stderr));
    let said = text(&failed.stderr);
    let batch = synth::staging_dir(&out, "train")
        .join("train")
        .join("batch_1.parquet");
    assert_eq!(
        said,
        format!(
            "error: writing {}: {}: File too large (os error 27)\n",
            out.display(),
            batch.display()
        )
    );
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert!(left.is_empty(), "left {left:?}");
    let again = generate(&out, "unlimited");
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(dir_files(&out) == dir_files(&reference), "another output");
}

#[test]
fn output_directory_is_protected() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("precious.txt"), b"mine").unwrap();
    let e = convert_all(&fixture(), "train", &out, &options(1, 1)).unwrap_err();
    assert!(
        e.to_string().contains("not empty (holds precious.txt)"),
        "{e}"
    );
    assert_eq!(std::fs::read(out.join("precious.txt")).unwrap(), b"mine");

    let done = dir.path().join("done");
    convert_all(&fixture(), "train", &done, &options(1, 1)).unwrap();
    let before = dir_files(&done);
    let again = convert_all(&fixture(), "train", &done, &options(1, 2)).unwrap();
    assert!(
        again.already_complete,
        "same inputs and parameters: nothing to do"
    );
    let e = convert_all(&fixture(), "train", &done, &options(2, 1)).unwrap_err();
    assert!(e.to_string().contains("refusing to overwrite"), "{e}");
    assert!(dir_files(&done) == before, "nothing was touched");
}

#[test]
fn a_dataset_larger_than_the_memory_limit_converts() {
    let dir = tempfile::tempdir().unwrap();
    let (src, written) = synthetic_source(dir.path(), 100_000, 4, 8);
    let mut opts = options(1, 2);
    opts.memory_limit_bytes = 48 << 20;
    opts.shard_target_bytes = 1 << 30;
    let out = dir.path().join("o");
    let manifest = convert_all(&src, "train", &out, &opts)
        .unwrap()
        .manifest
        .unwrap();
    assert_eq!(manifest.totals.pulses, written.pulses);
    assert!(
        written.pulses * 24 > 2 * opts.memory_limit_bytes,
        "input is several times the limit"
    );
    assert!(
        manifest.shards.len() >= 8,
        "the limit, not the shard size, set the bucket count"
    );
    assert!(manifest
        .shards
        .iter()
        .all(|s| s.bytes < opts.memory_limit_bytes / 2));
}

#[test]
fn parallel_packing_inside_a_bucket_gives_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = synthetic_source(dir.path(), 20_000, 2, 6);
    let mut outputs = Vec::new();
    for threads in [1, 3] {
        let mut opts = options(4, threads);
        opts.shard_target_bytes = 1 << 30;
        opts.memory_limit_bytes = 1 << 30;
        let out = dir.path().join(format!("t{threads}"));
        let manifest = convert_all(&src, "train", &out, &opts)
            .unwrap()
            .manifest
            .unwrap();
        assert_eq!(
            manifest.shards.len(),
            1,
            "one bucket of 20,000 events: packed in several parts"
        );
        outputs.push(dir_files(&out));
    }
    assert!(outputs[0] == outputs[1]);
}

#[test]
fn the_meta_split_gives_the_same_bytes_as_reading_the_meta_per_batch() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(6, 2);
    let build = |inputs: &InputSet| {
        shardify::convert::plan::Plan::build(inputs, &opts)
            .unwrap()
            .0
            .meta_split
    };
    // Row groups whose statistics pick out each batch (the fixture): nothing to split.
    assert!(!build(
        &InputSet::discover(&fixture(), Some("train")).unwrap()
    ));
    // One meta file per batch: nothing to split.
    let per_batch = synthetic(dir.path(), "per-batch", true);
    assert!(!build(
        &InputSet::discover(&per_batch, Some("train")).unwrap()
    ));
    // One row group for all batches (the Kaggle original): split it once.
    let shared = synthetic(dir.path(), "shared", false);
    let inputs = InputSet::discover(&shared, Some("train")).unwrap();
    assert!(build(&inputs));
    let reference = dir.path().join("ref");
    convert_all(&shared, "train", &reference, &opts).unwrap();
    let expected = dir_files(&reference);
    // `verify --against` reads that meta in passes of bounded memory, and finds every event.
    let report = shardify::dataset::verify::verify(&reference, Some(&inputs)).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.source_events, Some(200));
    let run = |out: &std::path::Path, phases: &[Phase]| {
        for &phase in phases {
            convert(&inputs, out, &opts, phase, TaskSlice::default(), &Silent).unwrap();
        }
    };
    // No plan phase: the scatter units read the meta themselves.
    let direct = dir.path().join("direct");
    run(&direct, &[Phase::Scatter]);
    assert!(!direct.join(".work/meta").exists());
    run(&direct, &[Phase::Gather, Phase::Finalize]);
    assert!(dir_files(&direct) == expected, "direct meta reads differ");
    // A damaged split file is detected and that batch's meta is read directly.
    let damaged = dir.path().join("damaged");
    run(&damaged, &[Phase::Plan]);
    let split_file = damaged.join(".work/meta/batch_2.meta");
    let bytes = std::fs::read(&split_file).unwrap();
    std::fs::write(&split_file, &bytes[..bytes.len() - 40]).unwrap();
    run(&damaged, &[Phase::Scatter, Phase::Gather, Phase::Finalize]);
    assert!(
        dir_files(&damaged) == expected,
        "a damaged split changed the output"
    );
}

fn synthetic(root: &std::path::Path, name: &str, meta_per_batch: bool) -> std::path::PathBuf {
    let src = root.join(name);
    shardify::synth::write_dataset(
        &src,
        &shardify::synth::SynthOptions {
            events: 200,
            files: 3,
            meta_per_batch,
            ..shardify::synth::SynthOptions::default()
        },
    )
    .unwrap();
    src
}

#[test]
fn the_spelling_of_an_input_path_changes_nothing_and_a_mismatch_names_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let linked = dir.path().join("linked-fixture");
    std::os::unix::fs::symlink(fixture(), &linked).unwrap();
    let shardify = |cwd: &std::path::Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_shardify"))
            .current_dir(cwd)
            .args(args)
            .output()
            .unwrap()
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let common = ["--split", "train", "--seed", "4", "--threads", "1"];
    // Plan from the repository with a relative path, finish from elsewhere through a symlink.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let plan = shardify(
        root,
        &[
            &[
                "convert",
                "fixtures/kaggle-mini",
                a.to_str().unwrap(),
                "--phase",
                "plan",
            ],
            &common[..],
        ]
        .concat(),
    );
    assert!(
        plan.status.success(),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    let rest = shardify(
        dir.path(),
        &[&["convert", "linked-fixture", "a"], &common[..]].concat(),
    );
    assert!(
        rest.status.success(),
        "{}",
        String::from_utf8_lossy(&rest.stderr)
    );
    let absolute = fixture().canonicalize().unwrap();
    let whole = shardify(
        root,
        &[
            &["convert", absolute.to_str().unwrap(), b.to_str().unwrap()],
            &common[..],
        ]
        .concat(),
    );
    assert!(
        whole.status.success(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    assert!(
        dir_files(&a) == dir_files(&b),
        "the same bytes, manifest included"
    );
    // Another seed is another conversion: refused, naming the field that differs.
    let c = dir.path().join("c");
    let planned = shardify(
        root,
        &[
            &[
                "convert",
                "fixtures/kaggle-mini",
                c.to_str().unwrap(),
                "--phase",
                "plan",
            ],
            &common[..],
        ]
        .concat(),
    );
    assert!(planned.status.success());
    let other = shardify(
        root,
        &[
            "convert",
            "fixtures/kaggle-mini",
            c.to_str().unwrap(),
            "--split",
            "train",
            "--seed",
            "5",
            "--phase",
            "scatter",
        ],
    );
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success());
    assert!(
        stderr.contains("`parameters.seed` is 4 there and 5 here"),
        "{stderr}"
    );
}

#[test]
fn slurm_array_tasks_take_their_slice_from_the_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    let run = |out: &std::path::Path, extra: &[&str], env: &[(&str, String)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_shardify"));
        c.args([
            "convert",
            fixture().to_str().unwrap(),
            out.to_str().unwrap(),
        ])
        .args(["--split", "train", "--seed", "2", "--shard-size", "64KiB"])
        .args(extra);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let reference = dir.path().join("ref");
    assert!(run(&reference, &[], &[]).status.success());
    let out = dir.path().join("array");
    let plan = run(&out, &["--phase", "plan"], &[]);
    let printed = String::from_utf8_lossy(&plan.stdout).to_string();
    assert!(plan.status.success());
    let units = |phase: &str| -> u64 {
        let line = printed
            .lines()
            .find(|l| l.contains(&format!("--phase {phase}\"")))
            .unwrap();
        let array = line.split("--array=0-").nth(1).unwrap();
        array.split(' ').next().unwrap().parse::<u64>().unwrap() + 1
    };
    let (scatter, gather) = (units("scatter"), units("gather"));
    assert_eq!(scatter, 3, "one scatter unit per batch file: {printed}");
    assert!(
        printed.contains(&format!("{} gather units", gather)),
        "{printed}"
    );
    // An array of 1-based ids, as `--array=1-N` gives.
    for (phase, tasks) in [("scatter", scatter), ("gather", gather)] {
        for id in 1..=tasks {
            let env = [
                ("SLURM_ARRAY_TASK_ID", id.to_string()),
                ("SLURM_ARRAY_TASK_MIN", "1".to_string()),
                ("SLURM_ARRAY_TASK_COUNT", tasks.to_string()),
            ];
            let task = run(&out, &["--phase", phase], &env);
            assert!(
                task.status.success(),
                "{}",
                String::from_utf8_lossy(&task.stderr)
            );
        }
    }
    assert!(run(&out, &["--phase", "finalize"], &[]).status.success());
    assert!(dir_files(&out) == dir_files(&reference));
    // A task count that disagrees with the array is refused, naming what would never run.
    let env = [
        ("SLURM_ARRAY_TASK_ID", "0".to_string()),
        ("SLURM_ARRAY_TASK_COUNT", "2".to_string()),
    ];
    let wrong = run(
        &dir.path().join("w"),
        &["--phase", "scatter", "--task-count", "3"],
        &env,
    );
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success());
    assert!(stderr.contains("modulo 3 is 2 would never run"), "{stderr}");
}

/// A copy of the fixture's files at `to`.
fn copy_of_the_fixture(to: &std::path::Path) -> std::path::PathBuf {
    let copied = Command::new("cp")
        .arg("-r")
        .arg(fixture())
        .arg(to)
        .status()
        .unwrap();
    assert!(copied.success());
    to.to_path_buf()
}

#[test]
fn inputs_read_from_another_place_are_the_same_conversion_when_they_hold_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (reference, inputs) = fixture_reference(dir.path(), 6);
    // The inputs staged again elsewhere, as a requeued job or another node would.
    let moved = copy_of_the_fixture(&dir.path().join("staged-again"));
    let out = dir.path().join("out");
    let opts = options(6, 2);
    for phase in [Phase::Plan, Phase::Scatter] {
        convert(&inputs, &out, &opts, phase, TaskSlice::default(), &Silent).unwrap();
    }
    let finished = convert_all(&moved, "train", &out, &opts).unwrap();
    assert!(!finished.already_complete && finished.manifest.is_some());
    // The same shards; the lineage names the files where the last run read them.
    let (ours, theirs) = (dir_files(&out), dir_files(&reference));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &theirs {
        assert!(
            name == "manifest.json" || ours[name] == *bytes,
            "{name} differs"
        );
    }
    let (ours, theirs) = (
        Manifest::read(&out).unwrap(),
        Manifest::read(&reference).unwrap(),
    );
    assert_eq!(ours.sources.by_content(), theirs.sources.by_content());
    assert_eq!(
        (&ours.shards, &ours.parameters),
        (&theirs.shards, &theirs.parameters)
    );
    let staged = moved.canonicalize().unwrap();
    assert!(ours.sources.batches[0]
        .path
        .starts_with(staged.to_str().unwrap()));
    // Run again from the first place: the same dataset, finished.
    assert!(
        convert_all(&fixture(), "train", &out, &opts)
            .unwrap()
            .already_complete
    );

    // Inputs that hold something else are another conversion, named by the field.
    let batches = moved.join("train");
    std::fs::copy(
        batches.join("batch_3.parquet"),
        batches.join("batch_2.parquet"),
    )
    .unwrap();
    let planned = dir.path().join("planned");
    convert(
        &inputs,
        &planned,
        &opts,
        Phase::Plan,
        TaskSlice::default(),
        &Silent,
    )
    .unwrap();
    for target in [&planned, &out] {
        match convert_all(&moved, "train", target, &opts) {
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains("`sources.batches[1]."), "{text}");
                assert!(text.contains("there and"), "{text}");
            }
            Ok(summary) => panic!("other inputs accepted: {summary:?}"),
        }
    }
}

#[test]
fn a_gather_under_a_low_open_files_limit_opens_the_rest_as_it_goes_with_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture();
    let convert = |out: &std::path::Path, open_files: &str| {
        let (fixture, out) = (fixture.to_str().unwrap(), out.to_str().unwrap());
        let run = shardify_under_limit(
            "-n",
            open_files,
            &[
                "convert",
                fixture,
                out,
                "--split",
                "train",
                "--seed",
                "2",
                "--threads",
                "2",
                "--memory-limit",
                "64MiB",
                "--shard-size",
                "64KiB",
            ],
        );
        assert!(run.status.success(), "{}", text(&run.stderr));
        text(&run.stderr)
    };
    let (reference, limited) = (dir.path().join("ref"), dir.path().join("limited"));
    let said = convert(&reference, "1024");
    assert!(!said.contains("open-files limit"), "{said}");
    // 258 files: 256 kept free, so one batch of the three has its two files held.
    let said = convert(&limited, "258");
    assert!(
        said.contains("the open-files limit (ulimit -n) is too low"),
        "{said}"
    );
    assert!(
        dir_files(&limited) == dir_files(&reference),
        "another output"
    );
}
