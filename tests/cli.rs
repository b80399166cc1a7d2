//! The `shardify` command: convert, inspect, dump, verify, and their exit codes.

mod common;

use std::process::{Command, Output};
use std::sync::Arc;

use common::*;
use serde_json::Value;
use shardify::dataset::{ChecksumPolicy, Dataset, View};
use shardify::synth;

#[test]
fn convert_inspect_dump_verify() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let (fx, o) = (fixture().display().to_string(), out.display().to_string());
    let run = shardify(&[
        "convert",
        &fx,
        &o,
        "--split",
        "train",
        "--seed",
        "3",
        "--shard-size",
        "64KiB",
        "--threads",
        "2",
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout).contains("converted 300 events"),
        "{}",
        text(&run.stdout)
    );

    let inspect = shardify(&["inspect", &o, "--json"]);
    assert!(inspect.status.success());
    let v: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(v["inspection"]["events"], 300);
    assert_eq!(v["parameters"]["seed"], 3);
    // The identity a loader's saved state names, in both forms of the report.
    let dataset = Arc::new(Dataset::open(&out, ChecksumPolicy::Lazy).unwrap());
    let identity = View::from(dataset).identity();
    assert_eq!(v["identity"], identity.as_str());
    let plain = text(&shardify(&["inspect", &o]).stdout);
    assert!(
        plain.contains(&format!("identity     {identity}\n")),
        "{plain}"
    );
    let ppe = &v["inspection"]["pulses_per_event"];
    assert!(
        ppe["min"].as_u64().unwrap() >= 5
            && ppe["median"].as_u64().unwrap() <= ppe["max"].as_u64().unwrap()
    );
    // The byte budget, from the layout: every tensor's dtype and count in the manifest.
    let b = &v["inspection"]["bytes_by_level"];
    let m = shardify::format::Manifest::read(&out).unwrap();
    let (t, types) = (&m.totals, &m.schema.types);
    let (events, doms, pulses, shards) = (t.events, t.doms, t.pulses, m.shards.len() as u64);
    let size = |dtype: shardify::format::safetensors::Dtype| dtype.size() as u64;
    let got = |k: &str| b[k].as_u64().unwrap();
    assert_eq!(
        got("event_bytes"),
        40 * events + 4 * (events + shards),
        "5 I64/F64 columns and I32 offsets"
    );
    assert_eq!(
        got("dom_bytes"),
        size(types.sensor_id) * doms + 4 * (doms + shards)
    );
    assert_eq!(
        got("pulse_bytes"),
        (size(types.time) + size(types.charge) + 1) * pulses
    );
    assert_eq!(
        got("event_bytes") + got("dom_bytes") + got("pulse_bytes") + got("header_bytes"),
        t.bytes
    );
    let table = std::fs::metadata(out.join("geometry.safetensors"))
        .unwrap()
        .len();
    assert_eq!(got("sensor_table_bytes"), table);
    // Version 1: I64 offsets and x, y, z per DOM, no sensor table.
    let v1 = t.bytes + 4 * (events + doms + 2 * shards) + 3 * size(types.position) * doms;
    assert_eq!(got("v1_bytes"), v1);
    assert!(text(&shardify(&["inspect", &o]).stdout).contains("format v1 would store"));

    let dump = shardify(&["dump", &o]);
    assert!(dump.status.success());
    let lines: Vec<Value> = text(&dump.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 300);
    let id = lines[17]["event_id"].as_i64().unwrap();
    let one = shardify(&["dump", &o, "--event", &id.to_string()]);
    assert_eq!(
        serde_json::from_slice::<Value>(&one.stdout).unwrap(),
        lines[17]
    );
    let missing = shardify(&["dump", &o, "--event=-5"]);
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("event -5 is not in the dataset"));

    let verify = shardify(&["verify", &o, "--against", &fx, "--split", "train"]);
    assert!(verify.status.success(), "{}", text(&verify.stderr));
    assert!(text(&verify.stdout).contains("OK"));
    assert!(text(&verify.stdout).contains("300 source events compared"));
    let alone = text(&shardify(&["verify", &o]).stdout);
    assert!(
        alone.contains(" shards, 300 events, 17042 pulses); no source compared"),
        "{alone}"
    );
}

#[test]
fn verify_names_a_damaged_shard_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(1, 1)).unwrap();
    let shard = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    let verify = shardify(&["verify", &out.display().to_string()]);
    assert!(!verify.status.success());
    let err = text(&verify.stderr);
    assert!(
        err.contains(&shard.display().to_string()) && err.contains("checksum mismatch"),
        "{err}"
    );
}

#[test]
fn verify_against_other_source_reports_mismatches() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "test", &out, &options(1, 1)).unwrap();
    let src = dir.path().join("src");
    shardify::synth::write_dataset(
        &src,
        &shardify::synth::SynthOptions {
            events: 120,
            files: 2,
            split: "test".into(),
            first_batch_id: 661,
            seed: 99,
            ..Default::default()
        },
    )
    .unwrap();
    // The same geometry: the events are what differs.
    std::fs::copy(
        fixture().join("sensor_geometry.csv"),
        src.join("sensor_geometry.csv"),
    )
    .unwrap();
    let verify = shardify(&[
        "verify",
        &out.display().to_string(),
        "--against",
        &src.display().to_string(),
    ]);
    assert!(!verify.status.success());
    assert!(
        text(&verify.stderr).contains("problem: event"),
        "{}",
        text(&verify.stderr)
    );
}

/// Verified against the other split (other inputs than it was made from), a dataset gets
/// one problem for each batch absent from a side, not one for each of its events.
#[test]
fn verify_against_the_other_split_names_whole_batches() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(1, 1)).unwrap();
    let (o, fx) = (out.display().to_string(), fixture().display().to_string());
    let verify = shardify(&["verify", &o, "--against", &fx, "--split", "test"]);
    let stderr = text(&verify.stderr);
    assert!(!verify.status.success(), "{stderr}");
    let problems: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("problem: "))
        .collect();
    let number_after = |line: &str, before: &str| -> u64 {
        let rest = &line[line.find(before).unwrap() + before.len()..];
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    let saying = |words: &str| -> Vec<&str> {
        problems
            .iter()
            .copied()
            .filter(|p| p.contains(words))
            .collect()
    };
    let absent = saying("events is in the dataset");
    assert_eq!(absent.len(), 2, "test batches 661 and 662: {stderr}");
    for (line, batch) in absent.iter().zip(["batch_661", "batch_662"]) {
        assert!(
            line.contains(batch) && line.contains("none of its"),
            "{line}"
        );
    }
    let test_events: u64 = absent.iter().map(|l| number_after(l, "none of its ")).sum();
    assert_eq!(test_events, 120, "{stderr}");
    let extra = saying("the source has no such batch");
    assert_eq!(extra.len(), 3, "train batches 1, 2, 3: {stderr}");
    let train_events: u64 = extra.iter().map(|l| number_after(l, "")).sum();
    assert_eq!(train_events, 300, "{stderr}");
    assert_eq!(problems.len(), 5, "nothing listed event by event: {stderr}");
    assert!(stderr.contains("5 problems"), "{stderr}");
}

#[test]
fn bad_arguments_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let o = dir.path().join("x").display().to_string();
    let both = shardify(&["convert", &fixture().display().to_string(), &o]);
    assert!(!both.status.success());
    assert!(text(&both.stderr).contains("choose one with --split"));
    let size = shardify(&[
        "convert",
        &fixture().display().to_string(),
        &o,
        "--split",
        "train",
        "--memory-limit",
        "12 furlongs",
    ]);
    assert!(!size.status.success());
    assert!(text(&size.stderr).contains("unknown size unit"));
    // The dataset after --group-by-length is read as its CAP: refused, saying so.
    let grouped = shardify(&["order", "--group-by-length", &o]);
    assert!(!grouped.status.success());
    assert!(
        text(&grouped.stderr).contains("is not a length: the value after --group-by-length is"),
        "{}",
        text(&grouped.stderr)
    );
}

/// A limit beyond the machine's memory is warned about, and converts without asking the
/// allocator for it (spill buffers were reserved whole: 64 GiB aborted on a 24 GiB machine).
#[test]
fn a_memory_limit_beyond_the_machine_warns_and_converts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out").display().to_string();
    let input = fixture().display().to_string();
    let run = shardify(&[
        "convert",
        &input,
        &out,
        "--split",
        "train",
        "--memory-limit",
        "16384TiB",
    ]);
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: --memory-limit 17179869184 MiB is more than this"),
        "{stderr}"
    );
    let verify = shardify(&["verify", &out, "--against", &input, "--split", "train"]);
    assert!(verify.status.success(), "{}", text(&verify.stderr));
}

fn order_lines(args: &[&str]) -> Vec<String> {
    let out = shardify(&[&["order"], args].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn order_is_the_same_global_sequence_for_any_world_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(2, 2)).unwrap();
    let ds = out.display().to_string();
    let common = [
        "--seed",
        "5",
        "--epoch",
        "1",
        "--max-pulses",
        "400",
        "--block-events",
        "10",
        "--window",
        "3",
    ];
    let whole = order_lines(&[&[ds.as_str()], &common[..], &["--threads", "3"]].concat());
    let mut ids: Vec<i64> = whole
        .iter()
        .flat_map(|l| l.split(' '))
        .map(|id| id.parse().unwrap())
        .collect();
    ids.sort_unstable();
    let delivered = ids.len();
    ids.dedup();
    assert_eq!(
        (delivered, ids.len()),
        (300, 300),
        "every event exactly once"
    );
    for world in [2usize, 3, 8] {
        let ranks: Vec<Vec<String>> = (0..world)
            .map(|r| {
                let (r, w) = (r.to_string(), world.to_string());
                order_lines(
                    &[
                        &[ds.as_str()],
                        &common[..],
                        &["--rank", &r, "--world", &w, "--threads", "1"],
                    ]
                    .concat(),
                )
            })
            .collect();
        let interleaved: Vec<String> = (0..whole.len())
            .map(|k| ranks[k % world][k / world].clone())
            .collect();
        assert_eq!(interleaved, whole, "world {world}");
    }
    let state = dir.path().join("state.json").display().to_string();
    let first = order_lines(
        &[
            &[ds.as_str()],
            &common[..],
            &["--stop-after", "4", "--save-state", &state],
        ]
        .concat(),
    );
    let rest = order_lines(&[&[ds.as_str()], &common[..], &["--resume", &state]].concat());
    assert_eq!([first.clone(), rest].concat(), whole);
    // A state file named without a directory is written into the current one.
    let stop = ["--stop-after", "4", "--save-state", "bare.json"];
    let bare = Command::new(env!("CARGO_BIN_EXE_shardify"))
        .args([&["order", ds.as_str()], &common[..], &stop[..]].concat())
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(bare.status.success(), "{}", text(&bare.stderr));
    assert_eq!(text(&bare.stdout).lines().count(), first.len());
    let saved = std::fs::read(dir.path().join("bare.json")).unwrap();
    assert_eq!(saved, std::fs::read(&state).unwrap(), "the same state");
    // Elastic: two ranks take 3 batches each and rank 0 saves its state; three ranks resume
    // from it and deal the remaining global batches, from the 7th, round-robin.
    let ranks = |world: usize, extra: &[&str]| -> Vec<Vec<String>> {
        (0..world)
            .map(|r| {
                let (r, w) = (r.to_string(), world.to_string());
                let own = ["--rank", r.as_str(), "--world", w.as_str()];
                order_lines(&[&[ds.as_str()], &common[..], &own[..], extra].concat())
            })
            .collect()
    };
    let two = ranks(2, &["--stop-after", "3", "--save-state", &state]);
    let three = ranks(3, &["--resume", &state]);
    let first: Vec<String> = (0..6).map(|k| two[k % 2][k / 2].clone()).collect();
    let rest: Vec<String> = (0..whole.len() - 6)
        .map(|k| three[k % 3][k / 3].clone())
        .collect();
    assert_eq!(three.iter().map(Vec::len).sum::<usize>(), whole.len() - 6);
    assert_eq!(
        [first, rest].concat(),
        whole,
        "2 ranks, then 3 from rank 0's state"
    );
    let mut next_epoch = common.to_vec();
    next_epoch[3] = "2";
    let other = order_lines(&[&[ds.as_str()], &next_epoch[..]].concat());
    assert_ne!(other, whole, "another epoch, another order");
    // The batch order changes the order inside each batch, never which events it holds.
    let drawn = order_lines(&[&[ds.as_str()], &common[..], &["--batch-order", "drawn"]].concat());
    let sorted = |line: &String| {
        let mut ids: Vec<&str> = line.split(' ').collect();
        ids.sort();
        ids.join(" ")
    };
    assert_eq!(
        drawn.iter().map(sorted).collect::<Vec<_>>(),
        whole.iter().map(sorted).collect::<Vec<_>>()
    );
    assert_ne!(drawn, whole, "drawn order is not stored order");
}

/// A small tmpfs mounted for the life of the value (needs root).
struct SmallFilesystem(std::path::PathBuf);

impl SmallFilesystem {
    fn mount(dir: &std::path::Path, size: &str) -> Option<SmallFilesystem> {
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .is_ok_and(|o| o.status.success());
        mounted.then(|| SmallFilesystem(dir.to_path_buf()))
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_conversion_that_cannot_fit_stops_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let Some(small) = SmallFilesystem::mount(dir.path(), "64k") else {
        assert!(!in_ci(), "CI runs as root: the 64 KiB tmpfs must mount");
        println!("SKIPPED: cannot mount a 64 KiB tmpfs here (needs root)");
        return;
    };
    let fixture = fixture();
    let convert_into = |out: &std::path::Path| {
        let args = ["convert", fixture.to_str().unwrap(), out.to_str().unwrap()];
        shardify(&[&args[..], &["--split", "train"]].concat())
    };
    let out = small.0.join("out");
    let run = convert_into(&out);
    assert!(!run.status.success());
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains("the conversion (spill files and shards) needs about")
            && stderr.contains("has 65536 free (65.5 kB)"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing written");

    // Nor does a copy of a dataset larger than the filesystem.
    let elsewhere = tempfile::tempdir().unwrap();
    let ds = elsewhere.path().join("ds");
    let converted = convert_into(&ds);
    assert!(converted.status.success(), "{}", text(&converted.stderr));
    let copy = small.0.join("copy");
    let run = shardify(&["copy", ds.to_str().unwrap(), copy.to_str().unwrap()]);
    assert!(!run.status.success());
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains("the copy needs about") && stderr.contains("has 65536 free"),
        "{stderr}"
    );
    assert!(!copy.exists(), "nothing written");
}

#[test]
fn explicit_batch_files_convert_as_the_readme_writes_them() {
    // `shardify convert --batch DIR/train/batch_1.parquet ... --meta train_meta.parquet
    // --geometry sensor_geometry.csv OUT`: OUT is the only path.
    let dir = tempfile::tempdir().unwrap();
    let fx = fixture();
    let path = |p: &str| fx.join(p).display().to_string();
    let (explicit, whole) = (dir.path().join("explicit"), dir.path().join("whole"));
    let run = shardify(&[
        "convert",
        "--batch",
        &path("train/batch_1.parquet"),
        &path("train/batch_2.parquet"),
        &path("train/batch_3.parquet"),
        "--meta",
        &path("train_meta.parquet"),
        "--geometry",
        &path("sensor_geometry.csv"),
        "--seed",
        "4",
        &explicit.display().to_string(),
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let run = shardify(&[
        "convert",
        &fx.display().to_string(),
        &whole.display().to_string(),
        "--split",
        "train",
        "--seed",
        "4",
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    // The same files in, the same events out (every field, in the same shuffled order).
    let (a, b) = (dump_lines(&explicit), dump_lines(&whole));
    assert!(
        a.len() == 300 && a == b,
        "{} and {} events differ",
        a.len(),
        b.len()
    );
    // Both forms at once, or neither, are refused with what to do.
    let both = shardify(&[
        "convert",
        &fx.display().to_string(),
        &dir.path().join("x").display().to_string(),
        "--batch",
        &path("train/batch_1.parquet"),
    ]);
    assert!(text(&both.stderr).contains("with --batch, the only path is OUT"));
    let neither = shardify(&["convert", &dir.path().join("y").display().to_string()]);
    assert!(text(&neither.stderr).contains("give an input directory before OUT"));
    assert!(!dir.path().join("x").exists() && !dir.path().join("y").exists());
}

#[test]
fn a_job_array_converts_to_records_and_refuses_a_phase_of_another_layout() {
    let dir = tempfile::tempdir().unwrap();
    let (fx, out) = (fixture().display().to_string(), dir.path().join("ds"));
    let o = out.display().to_string();
    let phase = |phase: &str, layout: &str| {
        let args = ["convert", &fx, &o, "--split", "train", "--phase", phase];
        shardify(&[&args[..], &["--layout", layout]].concat())
    };
    let plan = phase("plan", "records");
    assert!(plan.status.success(), "{}", text(&plan.stderr));
    // The printed recipe passes the layout to every phase it runs.
    let recipe = text(&plan.stdout);
    let phases: Vec<&str> = recipe.lines().filter(|l| l.contains("--phase")).collect();
    assert_eq!(phases.len(), 3, "{recipe}");
    assert!(
        phases.iter().all(|l| l.contains("--layout records")),
        "{recipe}"
    );
    assert!(phase("scatter", "records").status.success());
    let other = phase("gather", "columns");
    assert_eq!(other.status.code(), Some(1));
    let err = text(&other.stderr);
    assert!(
        err.contains("`parameters.layout` is \"records\" there and \"columns\" here"),
        "{err}"
    );
    for p in ["gather", "finalize"] {
        let run = phase(p, "records");
        assert!(run.status.success(), "{p}: {}", text(&run.stderr));
        if p == "finalize" {
            // No input pulses/s from a run that read none.
            let said = text(&run.stdout);
            assert!(
                said.contains("(every pulse read by earlier runs)"),
                "{said}"
            );
        }
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["schema"]["layout"], "records");
    let verify = shardify(&["verify", &o, "--against", &fx, "--split", "train"]);
    assert!(verify.status.success(), "{}", text(&verify.stderr));
    assert!(text(&verify.stdout).contains("source events compared"));
}

/// `shardify` run with stdout or stderr going into a pipe whose reader is already gone
/// (as after `| head -1`, here without a race: the reader is closed before the command
/// starts).
fn shardify_into_closed_pipe(args: &[&str], closed: Stream) -> Output {
    into_closed_pipe(env!("CARGO_BIN_EXE_shardify"), args, closed)
}

/// `program` run with `args`, one of its output streams into a pipe whose reader is gone.
fn into_closed_pipe(program: &str, args: &[&str], closed: Stream) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut command = Command::new(program);
    command.args(args);
    match closed {
        Stream::Stdout => command.stdout(writer),
        Stream::Stderr => command.stderr(writer),
    };
    command.output().unwrap()
}

/// Which of the command's output streams is closed.
enum Stream {
    Stdout,
    Stderr,
}

#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds").display().to_string();
    let fx = fixture().display().to_string();
    let made = shardify(&convert_fixture_args(&fx, &ds));
    assert!(made.status.success(), "{}", text(&made.stderr));
    for args in [vec!["order", &ds], vec!["dump", &ds], vec!["inspect", &ds]] {
        let run = shardify_into_closed_pipe(&args, Stream::Stdout);
        // The status a shell reports for a command ended by SIGPIPE; before, `println!`
        // panicked (101) and wrote its panic message to stderr.
        assert_eq!(run.status.code(), Some(141), "shardify {args:?}");
        assert_eq!(text(&run.stderr), "", "shardify {args:?}");
    }
    // An error still reaches stderr when only stdout is closed.
    let missing = dir.path().join("missing").display().to_string();
    let run = shardify_into_closed_pipe(&["order", &missing], Stream::Stdout);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        text(&run.stderr).contains("missing"),
        "{}",
        text(&run.stderr)
    );
}

#[test]
fn shardify_gen_and_shardbench_end_quietly_when_their_reader_has_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (src, ds) = (dir.path().join("src"), dir.path().join("ds"));
    let (src_s, ds_s) = (src.display().to_string(), ds.display().to_string());
    // Before, both ended with status 1 and "Error: ... Broken pipe" on stderr.
    let generated = into_closed_pipe(
        env!("CARGO_BIN_EXE_shardify-gen"),
        &[&src_s, "--events", "200", "--files", "2"],
        Stream::Stdout,
    );
    assert_eq!(generated.status.code(), Some(141));
    assert_eq!(text(&generated.stderr), "");
    // The data was written whole before the summary met the closed pipe.
    let made = shardify(&["convert", &src_s, &ds_s, "--split", "train"]);
    assert!(made.status.success(), "{}", text(&made.stderr));
    assert!(
        text(&made.stdout).starts_with("converted 200 events"),
        "{}",
        text(&made.stdout)
    );
    let json = dir.path().join("report.json");
    let json_s = json.display().to_string();
    let args = [
        &ds_s,
        "--quick",
        "--no-baselines",
        "--batch-events",
        "32",
        "--json",
        &json_s,
    ];
    let bench = into_closed_pipe(env!("CARGO_BIN_EXE_shardbench"), &args, Stream::Stdout);
    assert_eq!(bench.status.code(), Some(141), "{}", text(&bench.stderr));
    assert!(
        !text(&bench.stderr).contains("rror"),
        "{}",
        text(&bench.stderr)
    );
    // The report's file was written before the table met the closed pipe.
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let windows = report["loaders"].as_array().map(Vec::len);
    assert_eq!(windows, Some(2), "windows 1 and 4, no baselines");
    // An error still reaches stderr, with status 1, when only stdout is closed.
    let missing = dir.path().join("missing").display().to_string();
    let refused: [(&str, &[&str]); 2] = [
        (
            env!("CARGO_BIN_EXE_shardbench"),
            &[&missing, "--no-baselines"],
        ),
        (
            env!("CARGO_BIN_EXE_shardify-gen"),
            &[&missing, "--split", "validation"],
        ),
    ];
    for (program, args) in refused {
        let run = into_closed_pipe(program, args, Stream::Stdout);
        assert_eq!(run.status.code(), Some(1), "{program}");
        assert!(
            text(&run.stderr).starts_with("error: "),
            "{program}: {}",
            text(&run.stderr)
        );
    }
}

#[test]
fn shardify_gen_never_writes_over_a_dataset_that_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("src");
    let src = root.display().to_string();
    let gen = |seed: &str| {
        Command::new(env!("CARGO_BIN_EXE_shardify-gen"))
            .args([&src, "--events", "50", "--files", "2", "--seed", seed])
            .output()
            .unwrap()
    };
    assert!(gen("1").status.success());
    let before = dir_files(&root);
    let again = gen("2");
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(
        text(&again.stderr),
        format!(
            "error: writing {src}: {src}: output directory is not empty (holds train); refusing \
             to write into it\n"
        )
    );
    assert!(dir_files(&root) == before, "the first dataset is untouched");
}

/// A generator stopped part-way leaves nothing that converts (before, with
/// `--meta-per-batch`, the batches and metas written so far converted as a smaller dataset),
/// and the next run takes its leftovers away and writes what an unstopped run writes.
#[test]
fn a_stopped_shardify_gen_leaves_nothing_that_converts() {
    let dir = tempfile::tempdir().unwrap();
    let (root, unstopped) = (dir.path().join("src"), dir.path().join("unstopped"));
    let gen = |out: &std::path::Path| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_shardify-gen"));
        command
            .arg(out)
            .args(["--events", "32000", "--files", "8", "--meta-per-batch"]);
        command
    };
    let mut child = gen(&root)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let staging = synth::staging_dir(&root, "train");
    let first_meta = staging.join("train_meta").join("batch_1.parquet");
    let started = std::time::Instant::now();
    while !first_meta.exists() && started.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    child.wait().unwrap();
    assert!(
        first_meta.exists() && running,
        "killed after batch 1's meta was begun, before the last batch"
    );
    let left: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        [staging.file_name().unwrap()],
        "only the staging directory"
    );

    let out = dir.path().join("ds").display().to_string();
    let refused = shardify(&["convert", &root.display().to_string(), &out]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("no train/ or test/ directory"),
        "{}",
        text(&refused.stderr)
    );

    for out in [&root, &unstopped] {
        let run = gen(out).output().unwrap();
        assert!(run.status.success(), "{}", text(&run.stderr));
    }
    let written = dir_files(&root);
    assert_eq!(written.len(), 1 + 8 + 8, "geometry, 8 batches, 8 metas");
    assert!(!staging.exists(), "the staging directory is gone");
    assert!(
        written == dir_files(&unstopped),
        "the same files as an unstopped run"
    );
}

/// Threads asked past 64 a core run as 64 a core, saying so: thousands of rayon threads
/// on a few cores made a conversion of the fixtures take 104 s rather than 0.01. The output
/// is the same.
#[test]
fn threads_past_64_a_core_are_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, many) = (dir.path().join("plain"), dir.path().join("many"));
    let src = fixture().display().to_string();
    let convert = |out: &std::path::Path, extra: &[&str]| {
        let out = out.display().to_string();
        let mut args = vec!["convert", src.as_str(), out.as_str(), "--split", "train"];
        args.extend_from_slice(extra);
        shardify(&args)
    };
    // A limit under which memory would allow them all (the manifest records it).
    let run = convert(&plain, &["--memory-limit", "64GiB"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let run = convert(&many, &["--threads", "100000", "--memory-limit", "64GiB"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let cores = std::thread::available_parallelism().unwrap().get();
    let said = text(&run.stderr);
    assert!(
        said.contains(&format!(
            "running on {} of the 100000 threads asked for: more than 64 a core (this \
             process may run on {cores})",
            64 * cores
        )),
        "{said}"
    );
    assert!(dir_files(&many) == dir_files(&plain), "another output");
}

/// A run stopped between its two moves into place (the batch directory moved, the meta
/// still staged) leaves batches without their meta: the next run takes them back and
/// writes the split whole, the same files as a run never stopped. Stopped after both
/// moves, the split is whole, and the next run refuses to write over it.
#[test]
fn a_generator_stopped_between_its_moves_is_written_again_by_the_next_run() {
    use shardify::source::layout::{meta_dir, meta_file};
    let dir = tempfile::tempdir().unwrap();
    for meta_per_batch in [false, true] {
        let options = synth::SynthOptions {
            events: 30,
            files: 3,
            meta_per_batch,
            ..synth::SynthOptions::default()
        };
        let meta = match meta_per_batch {
            true => meta_dir("train"),
            false => meta_file("train"),
        };
        let clean = dir.path().join(format!("clean-{meta_per_batch}"));
        synth::write_dataset(&clean, &options).unwrap();
        let root = dir.path().join(format!("stopped-{meta_per_batch}"));
        synth::write_dataset(&root, &options).unwrap();
        let staging = synth::staging_dir(&root, "train");
        std::fs::create_dir(&staging).unwrap();
        std::fs::rename(root.join(&meta), staging.join(&meta)).unwrap();

        let summary = synth::write_dataset(&root, &options).unwrap();
        assert_eq!(summary.batch_files.len(), 3);
        assert!(!staging.exists(), "the staging directory is gone");
        let written = dir_files(&root);
        assert!(
            written == dir_files(&clean),
            "the same files as a run never stopped"
        );

        std::fs::create_dir(&staging).unwrap();
        let refused = synth::write_dataset(&root, &options).unwrap_err();
        assert!(
            matches!(&refused, shardify::Error::NotEmpty { holds, .. } if holds == "train"),
            "{refused}"
        );
        std::fs::remove_dir(&staging).unwrap();
        assert!(dir_files(&root) == written, "nothing written over");
    }
}

/// A second split is added beside the first; anything that would be overwritten is
/// refused, naming it, before a byte is written.
#[test]
fn a_dataset_is_never_written_over_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("kaggle");
    let options = |split: &str, meta_per_batch| synth::SynthOptions {
        events: 20,
        split: split.into(),
        meta_per_batch,
        ..synth::SynthOptions::default()
    };
    synth::write_dataset(&root, &options("train", false)).unwrap();
    // An empty directory of the next split is not in the way.
    std::fs::create_dir(root.join("test")).unwrap();
    synth::write_dataset(&root, &options("test", true)).unwrap();
    let written = dir_files(&root);
    assert_eq!(
        written.len(),
        1 + 3 + 4,
        "geometry, train's 2 + meta, test's 2 + 2"
    );

    for (split, meta_per_batch, holds) in [
        ("train", false, "train"),
        ("test", false, "test"),
        ("test", true, "test"),
    ] {
        let refused = synth::write_dataset(&root, &options(split, meta_per_batch)).unwrap_err();
        assert!(
            matches!(&refused, shardify::Error::NotEmpty { path, holds: h } if path == &root && h == holds),
            "{refused}"
        );
    }
    // A meta left alone is in the way too.
    std::fs::remove_dir_all(root.join("train")).unwrap();
    let refused = synth::write_dataset(&root, &options("train", false)).unwrap_err();
    assert!(
        refused.to_string().contains("train_meta.parquet"),
        "{refused}"
    );
    let left = dir_files(&root);

    // Another geometry (a real dataset's) is never replaced.
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::write(
        real.join("sensor_geometry.csv"),
        "sensor_id,x,y,z\n0,1,2,3\n",
    )
    .unwrap();
    let refused = synth::write_dataset(&real, &options("train", false)).unwrap_err();
    assert!(
        refused.to_string().contains("another geometry"),
        "{refused}"
    );
    assert_eq!(dir_files(&real).len(), 1, "nothing written beside it");
    assert!(dir_files(&root) == left, "nothing changed by the refusals");
    assert_eq!(left.len(), written.len() - 2);
}

/// `shardify convert` of the fixtures' train split into `out`.
fn convert_fixture_args<'a>(fx: &'a str, out: &'a str) -> [&'a str; 7] {
    ["convert", fx, out, "--split", "train", "--seed", "3"]
}

#[test]
fn a_closed_stderr_loses_the_progress_never_the_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixture().display().to_string();
    let (open, closed) = (dir.path().join("open"), dir.path().join("closed"));
    let (open_s, closed_s) = (open.display().to_string(), closed.display().to_string());
    // Progress goes to stderr line by line when it is not a terminal.
    let with_stderr = shardify(&convert_fixture_args(&fx, &open_s));
    let progress = text(&with_stderr.stderr);
    assert!(progress.contains("units to do"), "{progress}");
    let run = shardify_into_closed_pipe(&convert_fixture_args(&fx, &closed_s), Stream::Stderr);
    assert!(run.status.success(), "status {:?}", run.status);
    let summary = text(&run.stdout);
    assert!(summary.starts_with("converted 300 events"), "{summary}");
    let verified = shardify(&["verify", &closed_s, "--against", &fx, "--split", "train"]);
    assert!(verified.status.success(), "{}", text(&verified.stderr));
    // The same shards as with stderr open.
    assert_eq!(dump_lines(&open), dump_lines(&closed));
}

/// `shardify generate` (the subcommand the Python package's wheel ships) writes what the
/// `shardify-gen` binary writes, byte for byte, for each of its flags, and refuses what it
/// refuses.
#[test]
fn shardify_generate_writes_what_shardify_gen_writes() {
    let dir = tempfile::tempdir().unwrap();
    let settings: [&[&str]; 2] = [
        &["--events", "300", "--files", "2"],
        &[
            "--events",
            "200",
            "--files",
            "3",
            "--split",
            "test",
            "--first-batch-id",
            "5",
            "--codec",
            "zstd",
            "--row-group-rows",
            "40",
            "--meta-per-batch",
            "--seed",
            "7",
            "--profile",
            "simple",
        ],
    ];
    let expected_names: [&[&str]; 2] = [
        &[
            "sensor_geometry.csv",
            "train/batch_1.parquet",
            "train/batch_2.parquet",
            "train_meta.parquet",
        ],
        &[
            "sensor_geometry.csv",
            "test/batch_5.parquet",
            "test/batch_6.parquet",
            "test/batch_7.parquet",
            "test_meta/batch_5.parquet",
            "test_meta/batch_6.parquet",
            "test_meta/batch_7.parquet",
        ],
    ];
    for (n, (args, names)) in settings.iter().zip(expected_names).enumerate() {
        let (sub, bin) = (
            dir.path().join(format!("sub{n}")),
            dir.path().join(format!("bin{n}")),
        );
        let by_sub = shardify(&[&["generate", &sub.display().to_string()], *args].concat());
        let by_bin = Command::new(env!("CARGO_BIN_EXE_shardify-gen"))
            .arg(&bin)
            .args(*args)
            .output()
            .unwrap();
        assert!(by_sub.status.success(), "{}", text(&by_sub.stderr));
        assert!(by_bin.status.success(), "{}", text(&by_bin.stderr));
        let summary = |out: &Output, root: &std::path::Path| {
            let line = text(&out.stdout).replace(&root.display().to_string(), "OUT");
            line.rsplit_once(" (").unwrap().0.to_string()
        };
        assert_eq!(summary(&by_sub, &sub), summary(&by_bin, &bin));
        let events = &args[1];
        assert!(
            summary(&by_sub, &sub).starts_with(&format!("wrote {events} events, ")),
            "{}",
            text(&by_sub.stdout)
        );
        let (sub_files, bin_files) = (dir_files(&sub), dir_files(&bin));
        assert_eq!(
            sub_files.keys().map(String::as_str).collect::<Vec<_>>(),
            names
        );
        assert!(sub_files == bin_files, "setting {n}: the files differ");
    }
    let refused = shardify(&[
        "generate",
        &dir.path().join("other").display().to_string(),
        "--split",
        "validation",
    ]);
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        text(&refused.stderr),
        "error: --split must be train or test\n"
    );
    assert!(!dir.path().join("other").exists());
}

/// A manifest whose counts disagree with each other is refused when it is read, naming the
/// shard or the totals, by every command and by `Dataset::open`: a loader plans from them
/// before it opens a shard. Before, a shard said to hold 2^63 + 5 events had `shardify
/// order` ask for 2^59 bytes and abort (SIGABRT), and a smaller damage passed until the
/// shard was opened.
#[test]
fn a_manifest_whose_counts_disagree_is_refused_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds");
    convert_all(&fixture(), "train", &ds, &options(0, 2)).unwrap();
    let manifest_path = ds.join("manifest.json");
    let original = std::fs::read_to_string(&manifest_path).unwrap();
    let manifest: Value = serde_json::from_str(&original).unwrap();
    let shard = manifest["shards"][2].clone();
    let file = shard["file"].as_str().unwrap().to_string();
    let (events, pulses) = (
        shard["events"].as_u64().unwrap(),
        shard["pulses"].as_u64().unwrap(),
    );
    let cases: [(&str, &str, Value, String); 4] = [
        (
            "shards",
            "events",
            Value::from(u64::MAX / 2 + 6),
            format!("shard {file}: {} events, ", u64::MAX / 2 + 6),
        ),
        (
            "shards",
            "bytes",
            Value::from(pulses - 1),
            format!(
                "pulses in {} bytes cannot be (each at most the next)",
                pulses - 1
            ),
        ),
        (
            "totals",
            "events",
            Value::from(manifest["totals"]["events"].as_u64().unwrap() - 1),
            "the totals (events, DOMs, pulses, bytes) say [299, ".to_string(),
        ),
        (
            "shards",
            "doms",
            Value::from(events - 1),
            format!("shard {file}: {events} events, {} DOMs", events - 1),
        ),
    ];
    for (place, field, value, expected) in cases {
        std::fs::write(&manifest_path, &original).unwrap();
        edit_manifest(&ds, |damaged| match place {
            "shards" => damaged["shards"][2][field] = value,
            _ => damaged["totals"][field] = value,
        });
        let ds_s = ds.display().to_string();
        for command in [
            &["order", &ds_s, "--batch-events", "16"][..],
            &["inspect", &ds_s],
            &["verify", &ds_s],
        ] {
            let run = shardify(command);
            assert_eq!(run.status.code(), Some(1), "{field}: {command:?}");
            let stderr = text(&run.stderr);
            assert!(
                stderr.starts_with(&format!("error: {}: ", manifest_path.display()))
                    && stderr.contains(&expected),
                "{field}: {command:?}: {stderr}"
            );
        }
        match Dataset::open(&ds, ChecksumPolicy::Lazy) {
            Err(shardify::Error::Manifest { path, problem }) => {
                assert_eq!(path, manifest_path);
                assert!(problem.contains(&expected), "{problem}");
            }
            other => panic!("{field}: expected a manifest error, got {:?}", other.err()),
        }
    }
    std::fs::write(&manifest_path, &original).unwrap();
    assert!(shardify(&["verify", &ds.display().to_string()])
        .status
        .success());
}

/// A Parquet file in the batch directory that is not named as a batch is not converted,
/// and the conversion says so, naming it; other files pass unremarked. Before, such a file
/// was passed over silently (a generator's wrapped batch id made 5 of 10 events vanish).
#[test]
fn a_parquet_file_not_named_as_a_batch_is_named_and_not_converted() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = synthetic_source(dir.path(), 40, 2, 0);
    let batches = src.join("train");
    let strays = ["part-0001.parquet", "batch_-4.parquet", "batch_1a.parquet"];
    for name in strays {
        std::fs::copy(batches.join("batch_1.parquet"), batches.join(name)).unwrap();
    }
    std::fs::write(batches.join("README"), "notes\n").unwrap();
    let out = dir.path().join("ds").display().to_string();
    let run = shardify(&["convert", &src.display().to_string(), &out]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout).starts_with("converted 40 events"),
        "{}",
        text(&run.stdout)
    );
    let warned: Vec<String> = text(&run.stderr)
        .lines()
        .filter(|line| line.contains("not converted"))
        .map(str::to_string)
        .collect();
    let mut expected: Vec<String> = strays
        .iter()
        .map(|name| {
            format!(
                " WARN {}: not converted: a batch file is named batch_N.parquet, N its batch \
                 id in the meta (0 or more)",
                batches.join(name).display()
            )
        })
        .collect();
    expected.sort();
    assert_eq!(warned, expected);
    assert!(!text(&run.stderr).contains("README"));
}
