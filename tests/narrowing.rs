//! Lossless by default: a column is narrowed only when every value round-trips; `lossy`
//! narrows charge and positions anyway.

mod common;

use common::*;
use serde_json::Value;
use shardify::dataset::verify::verify;
use shardify::format::safetensors::Dtype;
use shardify::source::InputSet;
use shardify::synth::{meta_columns, pulse_columns};

fn convert_with(
    edit: impl FnOnce(&mut shardify::synth::PulseTable),
    lossy: bool,
) -> (tempfile::TempDir, shardify::format::Manifest) {
    let dir = tempfile::tempdir().unwrap();
    let mut next = 0;
    let (mut t, m) = generated_batch(3, 1, 30, &mut next, true);
    edit(&mut t);
    write_layout(
        &dir.path().join("src"),
        &[(1, pulse_columns(&t))],
        &meta_columns(&m),
    );
    let mut opts = options(1, 1);
    opts.lossy = lossy;
    let manifest = convert_all(
        &dir.path().join("src"),
        "train",
        &dir.path().join("out"),
        &opts,
    )
    .unwrap()
    .manifest
    .unwrap();
    (dir, manifest)
}

fn all_pulses(dir: &std::path::Path) -> Vec<(i64, f64)> {
    let mut pulses = Vec::new();
    for line in dump_lines(dir) {
        let v: Value = serde_json::from_str(&line).unwrap();
        for dom in v["doms"].as_array().unwrap() {
            for p in dom["pulses"].as_array().unwrap() {
                pulses.push((p[0].as_i64().unwrap(), p[1].as_f64().unwrap()));
            }
        }
    }
    pulses
}

#[test]
fn narrow_only_when_exact() {
    let (_, m) = convert_with(|_| {}, false);
    let t = m.schema.types;
    assert_eq!(
        (t.time, t.charge, t.position, t.sensor_id),
        (Dtype::I32, Dtype::F32, Dtype::F64, Dtype::I16)
    );
}

#[test]
fn wide_values_keep_the_wide_type_and_exact_values() {
    let big = 5_000_000_000i64;
    let (dir, m) = convert_with(
        |t| {
            t.time[0] = big;
            t.charge[1] = 0.1;
        },
        false,
    );
    assert_eq!(
        (m.schema.types.time, m.schema.types.charge),
        (Dtype::I64, Dtype::F64)
    );
    let pulses = all_pulses(&dir.path().join("out"));
    assert!(pulses.iter().any(|&(t, _)| t == big));
    assert!(
        pulses.iter().any(|&(_, c)| c == 0.1),
        "0.1 kept exactly as f64"
    );
    let source = InputSet::discover(&dir.path().join("src"), Some("train")).unwrap();
    assert!(verify(&dir.path().join("out"), Some(&source)).unwrap().ok());
}

#[test]
fn lossy_narrows_charge_and_positions_but_never_wraps_time() {
    let big = 5_000_000_000i64;
    let (dir, m) = convert_with(
        |t| {
            t.time[0] = big;
            t.charge[1] = 0.1;
        },
        true,
    );
    let types = m.schema.types;
    assert_eq!(
        (types.time, types.charge, types.position),
        (Dtype::I64, Dtype::F32, Dtype::F32)
    );
    assert!(m.parameters.lossy);
    let pulses = all_pulses(&dir.path().join("out"));
    assert!(
        pulses.iter().any(|&(_, c)| c == 0.1f32 as f64),
        "0.1 rounded to f32"
    );
    assert!(
        pulses.iter().any(|&(t, _)| t == big),
        "time is never narrowed past its range"
    );
    let source = InputSet::discover(&dir.path().join("src"), Some("train")).unwrap();
    let report = verify(&dir.path().join("out"), Some(&source)).unwrap();
    assert!(
        report.ok(),
        "verify compares at the stored precision: {:?}",
        report.problems
    );
}
