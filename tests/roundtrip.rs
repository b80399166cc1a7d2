//! Conversion round trips: every field of every event, checked against an independent
//! oracle built from the generated tables; the real Kaggle sample; verify.

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{json, Value};
use shardify::dataset::verify::verify;
use shardify::format::order::shuffle_key;
use shardify::source::{Geometry, InputSet};
use shardify::synth::{meta_columns, pulse_columns, MetaTable, PulseTable};

/// What an event must dump as, computed from the source rows without the library's packer.
fn oracle(table: &PulseTable, meta: &MetaTable, geometry: &Geometry) -> BTreeMap<i64, Value> {
    let mut events = BTreeMap::new();
    for m in 0..meta.event_id.len() {
        let rows = meta.first_pulse_index[m] as usize..=meta.last_pulse_index[m] as usize;
        // sensor -> pulses in (time, row) order
        let mut doms: BTreeMap<i16, Vec<(i64, usize)>> = BTreeMap::new();
        for r in rows {
            doms.entry(table.sensor_id[r])
                .or_default()
                .push((table.time[r], r));
        }
        let mut doms: Vec<(i16, Vec<(i64, usize)>)> = doms.into_iter().collect();
        for (_, pulses) in &mut doms {
            pulses.sort();
        }
        doms.sort_by_key(|(s, p)| (p[0].0, *s));
        let doms: Vec<Value> = doms
            .iter()
            .map(|(s, pulses)| {
                let s = *s as usize;
                json!({"sensor_id": s, "x": geometry.x[s], "y": geometry.y[s], "z": geometry.z[s],
                       "pulses": pulses.iter().map(|&(_, r)| json!([table.time[r], table.charge[r], table.auxiliary[r]])).collect::<Vec<_>>()})
            })
            .collect();
        let label = |v: &Vec<f64>| v.get(m).map_or(Value::Null, |x| json!(x));
        events.insert(
            meta.event_id[m],
            json!({"event_id": meta.event_id[m], "batch_id": meta.batch_id[m], "azimuth": label(&meta.azimuth),
                   "zenith": label(&meta.zenith), "doms": doms}),
        );
    }
    events
}

#[test]
fn every_field_of_every_event_round_trips_in_seeded_order() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mut next_id = 0;
    let mut expected = BTreeMap::new();
    let mut batches = Vec::new();
    let mut all_meta = MetaTable {
        labels: true,
        ..MetaTable::default()
    };
    synth_geometry_into(&src);
    let geometry = Geometry::read(&src.join("sensor_geometry.csv")).unwrap();
    for batch_id in [3, 8] {
        let (table, meta) = generated_batch(batch_id as u64, batch_id, 150, &mut next_id, true);
        expected.extend(oracle(&table, &meta, &geometry));
        batches.push((batch_id, pulse_columns(&table)));
        all_meta.extend(&meta);
    }
    write_layout(&src, &batches, &meta_columns(&all_meta));
    let out = dir.path().join("out");
    let summary = convert_all(&src, "train", &out, &options(11, 2)).unwrap();
    let manifest = summary.manifest.unwrap();
    assert_eq!(manifest.totals.events, 300);
    assert!(
        manifest.shards.len() > 3,
        "small shard size gives several shards"
    );
    let lines = dump_lines(&out);
    assert_eq!(lines.len(), 300);
    let mut seen_keys = Vec::new();
    for line in &lines {
        let value: Value = serde_json::from_str(line).unwrap();
        let id = value["event_id"].as_i64().unwrap();
        assert_eq!(&value, &expected[&id], "event {id}");
        seen_keys.push(shuffle_key(11, id));
    }
    assert!(
        seen_keys.windows(2).all(|w| w[0] < w[1]),
        "stored order is the seeded key order"
    );
    let ids: Vec<i64> = lines
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["event_id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_ne!(ids, sorted, "events are shuffled");
    let report = verify(
        &out,
        Some(&InputSet::discover(&src, Some("train")).unwrap()),
    )
    .unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.source_events, Some(300));
}

fn synth_geometry_into(root: &std::path::Path) {
    std::fs::create_dir_all(root).unwrap();
    shardify::synth::write_geometry(&root.join("sensor_geometry.csv")).unwrap();
}

#[test]
fn real_kaggle_sample_round_trips() {
    let Some(sample) = kaggle_sample() else {
        eprintln!("skipped: ../shared/data/kaggle-sample is not present");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let manifest = convert_all(&sample, "test", &out, &options(0, 1))
        .unwrap()
        .manifest
        .unwrap();
    assert_eq!(
        (
            manifest.totals.events,
            manifest.totals.doms,
            manifest.totals.pulses
        ),
        (3, 157, 378)
    );
    assert!(!manifest.schema.types.labels);
    let mut counts: Vec<(usize, u64)> = dump_lines(&out)
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            assert!(v["azimuth"].is_null());
            let doms = v["doms"].as_array().unwrap();
            (
                doms.len(),
                doms.iter()
                    .map(|d| d["pulses"].as_array().unwrap().len() as u64)
                    .sum(),
            )
        })
        .collect();
    counts.sort();
    assert_eq!(counts, vec![(32, 36), (37, 43), (88, 299)]);
    let report = verify(&out, Some(&InputSet::discover(&sample, None).unwrap())).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
}

#[test]
fn both_fixture_splits_convert_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    for (split, events, labels) in [("train", 300, true), ("test", 120, false)] {
        let out = dir.path().join(split);
        let manifest = convert_all(&fixture(), split, &out, &options(5, 2))
            .unwrap()
            .manifest
            .unwrap();
        assert_eq!(manifest.totals.events, events);
        assert_eq!(manifest.schema.types.labels, labels);
        let report = verify(
            &out,
            Some(&InputSet::discover(&fixture(), Some(split)).unwrap()),
        )
        .unwrap();
        assert!(report.ok(), "{split}: {:?}", report.problems);
        assert_eq!(report.source_events, Some(events));
    }
}

#[test]
fn a_dataset_of_format_version_1_is_refused_with_the_fix() {
    use shardify::dataset::{ChecksumPolicy, Dataset};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(5, 2)).unwrap();
    // What version 1 wrote: no sensor table, a position per DOM in every shard.
    edit_manifest(&out, |m| {
        m["format_version"] = 1.into();
        m.as_object_mut().unwrap().remove("sensor_table");
    });
    let err = Dataset::open(&out, ChecksumPolicy::Off).err().unwrap();
    assert!(
        matches!(&err, shardify::Error::FormatVersion { found, .. } if found == "shardify version 1"),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("the dataset is shardify version 1")
            && text.contains("reads shardify version 2")
            && text.contains("convert the source again with `shardify convert`"),
        "{text}"
    );
}

#[test]
fn verify_against_the_source_checks_every_row_of_the_sensor_table() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(5, 2)).unwrap();
    // Move sensor 7 by one ulp and record the new checksum, so only the comparison with
    // the geometry can notice.
    let table = out.join("geometry.safetensors");
    let mut bytes = std::fs::read(&table).unwrap();
    let data = bytes.len() - 8 * 3 * 5160 + 8 * 3 * 7;
    bytes[data] ^= 1;
    std::fs::write(&table, &bytes).unwrap();
    edit_manifest(&out, |m| {
        m["sensor_table"]["xxh3"] = shardify::format::checksum::of_bytes(&bytes).into()
    });
    assert!(
        verify(&out, None).unwrap().ok(),
        "structure alone cannot tell"
    );
    let source = InputSet::discover(&fixture(), Some("train")).unwrap();
    let report = verify(&out, Some(&source)).unwrap();
    assert_eq!(report.problem_count, 1, "{:?}", report.problems);
    assert!(
        report.problems[0].starts_with("geometry.safetensors: sensor 7 is at"),
        "{:?}",
        report.problems
    );
}

/// Rewrites `path` with the charge of row `row` changed.
fn change_charge(path: &std::path::Path, row: usize) {
    let mut table = read_pulses(path);
    table.charge[row] += 0.25;
    shardify::synth::write_parquet(
        path,
        &pulse_columns(&table),
        shardify::synth::Codec::Snappy,
        None,
    )
    .unwrap();
}

#[test]
fn verify_names_one_changed_pulse_and_summarises_many_changed_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = synthetic_source(dir.path(), 600, 12, 4);
    let out = dir.path().join("ds");
    convert_all(&src, "train", &out, &options(2, 2)).unwrap();
    let inputs = InputSet::discover(&src, Some("train")).unwrap();
    assert!(verify(&out, Some(&inputs)).unwrap().ok());
    // One pulse changed in one batch file: exactly that event is named.
    change_charge(&src.join("train/batch_3.parquet"), 7);
    let report = verify(&out, Some(&inputs)).unwrap();
    assert_eq!(report.problem_count, 1, "{:?}", report.problems);
    assert!(
        report.problems[0].contains("batch_3.parquet row")
            && report.problems[0].contains("pulses differ"),
        "{:?}",
        report.problems
    );
    // A different source: every batch differs; the first ones are listed event by event,
    // the rest by counts (few events per batch, so that every problem is listed).
    let small = dir.path().join("small");
    let (src, _) = synthetic_source(&small, 24, 12, 4);
    convert_all(&src, "train", &small.join("ds"), &options(2, 2)).unwrap();
    let (other, _) = synthetic_source(&dir.path().join("other"), 24, 12, 5);
    let other = InputSet::discover(&other, Some("train")).unwrap();
    let report = verify(&small.join("ds"), Some(&other)).unwrap();
    assert!(report.problem_count < 50, "{:?}", report.problems);
    let summarised = report
        .problems
        .iter()
        .filter(|p| p.contains("not listed: more than 8 batches differ"))
        .count();
    assert_eq!(summarised, 12 - 8, "{:?}", report.problems);
    assert!(
        report.problems.iter().any(|p| p.starts_with("event ")),
        "{:?}",
        report.problems
    );
}
