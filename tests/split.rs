//! Views: a split of a dataset's events by a hash of their ids, read like a dataset.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use common::*;
use shardify::dataset::{ChecksumPolicy, Dataset, View};
use shardify::device::DeviceChoice;
use shardify::pipeline::{Loader, LoaderConfig};
use shardify::sampler::{Batching, EventRef, SamplerConfig, SamplerState};

fn open(dir: &Path) -> Arc<Dataset> {
    Arc::new(Dataset::open(dir, ChecksumPolicy::Lazy).unwrap())
}

/// Every event id of `view` in stored order, and what it holds, read from its shards.
fn ids_of(view: &View) -> (Vec<i64>, u64, u64) {
    let dataset = view.dataset();
    let (mut ids, mut doms, mut pulses) = (Vec::new(), 0, 0);
    for shard in 0..dataset.shard_count() {
        let v_columns = dataset.shard(shard).unwrap().columns().unwrap();
        let v = v_columns.view();
        let all: Vec<u32> = (0..v.events() as u32).collect();
        let kept: Vec<u32> = view.kept(shard).map_or(all, |k| k.iter().collect());
        for i in kept {
            ids.push(v.event_id[i as usize]);
            doms += v.dom_range(i as usize).len() as u64;
            pulses += v.event_pulse_range(i as usize).len() as u64;
        }
    }
    (ids, doms, pulses)
}

#[test]
fn a_split_is_exact_disjoint_and_independent_of_the_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    convert_all(&fixture(), "train", &a, &options(5, 2)).unwrap();
    let mut other = options(9, 1);
    other.shard_target_bytes = 1 << 20;
    convert_all(&fixture(), "train", &b, &other).unwrap();
    let (rest, chosen) = View::from(open(&a)).split(0.1, 4).unwrap();
    let (rest_ids, rest_doms, rest_pulses) = ids_of(&rest);
    let (chosen_ids, chosen_doms, chosen_pulses) = ids_of(&chosen);
    assert_eq!(chosen_ids.len(), 30, "round(0.1 x 300)");
    assert_eq!(
        (
            rest.totals().events,
            rest.totals().doms,
            rest.totals().pulses
        ),
        (270, rest_doms, rest_pulses)
    );
    assert_eq!(
        (chosen.totals().doms, chosen.totals().pulses),
        (chosen_doms, chosen_pulses)
    );
    let all: BTreeSet<i64> = rest_ids.iter().chain(&chosen_ids).copied().collect();
    assert_eq!(all.len(), 300, "disjoint, and every event");
    let (_, elsewhere) = View::from(open(&b)).split(0.1, 4).unwrap();
    let set = |ids: Vec<i64>| ids.into_iter().collect::<BTreeSet<_>>();
    assert_eq!(set(ids_of(&elsewhere).0), set(chosen_ids.clone()));
    let (_, reseeded) = View::from(open(&a)).split(0.1, 5).unwrap();
    assert_ne!(set(ids_of(&reseeded).0), set(chosen_ids));
    let err = View::from(open(&a)).split(1.01, 0).unwrap_err();
    assert!(err.to_string().contains("fraction"), "{err}");
}

#[test]
fn a_loader_reads_a_view_like_a_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(5, 2)).unwrap();
    let dataset = open(&out);
    let (rest, chosen) = View::from(dataset.clone()).split(0.25, 1).unwrap();
    for view in [rest, chosen] {
        let config = LoaderConfig {
            sampler: SamplerConfig {
                batching: Batching::Pulses {
                    max_pulses: 600,
                    max_events: None,
                    pulse_cap: None,
                },
                window_blocks: 2,
                block_events: 16,
                ..SamplerConfig::default()
            },
            device: DeviceChoice::Cpu,
            ..LoaderConfig::default()
        };
        let mut delivered = Vec::new();
        for batch in Loader::new(view.clone(), config, SamplerState::start(1)).unwrap() {
            let batch = batch.unwrap();
            let packed = batch.packed().unwrap();
            // The plan names shard events: each delivered id is the shard's, in its place.
            for (k, e) in batch.plan().events.iter().enumerate() {
                let shard_columns = dataset.shard(e.shard as usize).unwrap().columns().unwrap();
                let shard = shard_columns.view();
                assert_eq!(packed.event_id[k], shard.event_id[e.index as usize]);
                let doms = packed.event_dom_offsets[k + 1] - packed.event_dom_offsets[k];
                assert_eq!(doms as usize, shard.dom_range(e.index as usize).len());
            }
            delivered.extend_from_slice(packed.event_id);
        }
        let mut expected = ids_of(&view).0;
        expected.sort_unstable();
        delivered.sort_unstable();
        assert_eq!(delivered, expected, "every event of the view, once");
    }
}

#[test]
fn runs_of_a_views_events_are_located_as_each_event_alone() {
    let dir = tempfile::tempdir().unwrap();
    // One shard: its 97% leaves out few enough events to list them.
    let [_, most, few, nested, _] = fixture_and_splits(dir.path(), 1 << 20);
    // Bytes held per kept event at most: the 97% lists the 3% it leaves out (and a sample
    // every 64 kept), the 3% lists what it keeps, the 58% (the 60% of the 97%) marks each
    // event of the shard a bit.
    let bounds = [0.25, 4.0, 0.4];
    for (view, bound) in [most, few, nested].into_iter().zip(bounds) {
        // Every event of the view, in runs of 1 to 9 consecutive ones, the runs in a
        // scrambled order (as a window's blocks come).
        let mut runs = Vec::new();
        for (shard, counts) in view.shard_counts().iter().enumerate() {
            let mut index = 0;
            while index < counts.events as u32 {
                let len = (1 + (index * 7 + shard as u32) % 9).min(counts.events as u32 - index);
                runs.push((shard as u32, index..index + len));
                index += len;
            }
        }
        runs.sort_by_key(|(shard, run)| (run.start ^ shard).wrapping_mul(2_654_435_761));
        let events: Vec<EventRef> = runs
            .into_iter()
            .flat_map(|(shard, run)| run.map(move |index| EventRef { shard, index }))
            .collect();
        assert_eq!(events.len() as u64, view.totals().events);
        let one_by_one: Vec<EventRef> = events.iter().map(|&e| view.locate(e)).collect();
        let mut located = events.clone();
        view.locate_all(&mut located);
        assert_eq!(located, one_by_one);
        // Each event alone, in a scrambled order (a wide window's draws): more runs than
        // are located at once.
        let mut alone = events.clone();
        alone.sort_by_key(|e| (e.index ^ e.shard).wrapping_mul(2_654_435_761));
        let mut located_alone = alone.clone();
        view.locate_all(&mut located_alone);
        let expected: Vec<EventRef> = alone.iter().map(|&e| view.locate(e)).collect();
        assert_eq!(located_alone, expected);
        // Each event located is the one the view keeps in that place.
        for (e, found) in events.iter().zip(&located) {
            let kept = view.kept(e.shard as usize).unwrap();
            assert_eq!(kept.iter().nth(e.index as usize), Some(found.index));
        }
        let kept = view.kept(0).unwrap();
        let held = kept.held_bytes() as f64 / kept.len() as f64;
        assert!(held <= bound, "{held} bytes a kept event of {}", kept.len());
    }
}

/// The identities of [`fixture_and_splits`]' views in shards of 64 KiB, as 68c4659 computed
/// them.
const PINNED: [&str; 5] = [
    "2867863a6c74a9e2",
    "20a2a24cd51afcb4",
    "3ebe7a52836ecc4d",
    "118a7f308adeccba",
    "ce6176fecb1ce807",
];

/// The identities a saved loader state names, pinned: a state saved by an earlier version
/// (68c4659 listed every kept event) resumes on the same split only while the digest is
/// computed as it was.
#[test]
fn a_splits_identity_is_the_one_earlier_versions_saved() {
    let dir = tempfile::tempdir().unwrap();
    let identities = fixture_and_splits(dir.path(), 64 << 10).map(|v| v.identity());
    assert_eq!(
        identities, PINNED,
        "the whole dataset, a split and a split of it"
    );
}
