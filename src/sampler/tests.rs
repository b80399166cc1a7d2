//! The sampler's tests: every event once per epoch, for many seeds, world sizes, windows
//! and batchings (property tests); resumes at any world size; runs, blocks and refusals.

use super::batches::delivered_global_batches;
use super::stream::EventStream;
use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

/// Shards of events (their counts) whose pulses and DOMs follow from their place.
pub(super) struct Sizes(pub(super) Vec<usize>);

impl EventSizes for Sizes {
    fn shard_events(&self) -> Vec<usize> {
        self.0.clone()
    }
    fn pulses(&self, e: EventRef) -> usize {
        1 + ((e.shard as usize * 7919 + e.index as usize * 104_729) % 97)
    }
    fn doms(&self, e: EventRef) -> usize {
        1 + ((e.shard as usize * 31 + e.index as usize * 7_727) % 41)
    }
}

/// [`Sizes`] with one event in five of 70,000 to 270,000 pulses: longer than the lengths
/// a window of fewer than 8,750 events counts (eight times its events), so sorted by
/// comparing them.
struct LongSizes(Vec<usize>);

impl EventSizes for LongSizes {
    fn shard_events(&self) -> Vec<usize> {
        self.0.clone()
    }
    fn pulses(&self, e: EventRef) -> usize {
        let short = Sizes(Vec::new()).pulses(e);
        match e.index % 5 {
            0 => 70_000 + short * 2_000,
            _ => short,
        }
    }
    fn doms(&self, e: EventRef) -> usize {
        Sizes(Vec::new()).doms(e)
    }
}

/// `e`'s length as `grouping` counts it, capped (its pulses when off).
fn grouped_length(sizes: &Sizes, grouping: LengthGrouping, e: EventRef) -> usize {
    match grouping.length_and_cap() {
        Some((EventLength::Doms, cap)) => sizes.doms(e).min(cap.unwrap_or(usize::MAX)),
        Some((EventLength::Pulses, cap)) => sizes.pulses(e).min(cap.unwrap_or(usize::MAX)),
        None => sizes.pulses(e),
    }
}

fn all(sizes: &Sizes, config: &SamplerConfig, epoch: u64) -> Vec<BatchPlan> {
    EpochBatches::new(sizes, config, SamplerState::start(epoch)).collect()
}

fn batching() -> impl Strategy<Value = Batching> {
    prop_oneof![events_or_pulses(), tokens()]
}

/// Batches of a fixed count, or by a pulse budget (counting each event's pulses up to a cap
/// of 1 to 59, or all of its 1 to 97): the batchings that need no grouping.
fn events_or_pulses() -> impl Strategy<Value = Batching> {
    prop_oneof![
        (1usize..40).prop_map(Batching::Events),
        (
            1usize..400,
            proptest::option::of(1usize..30),
            proptest::option::of(1usize..60)
        )
            .prop_map(|(max_pulses, max_events, pulse_cap)| Batching::Pulses {
                max_pulses,
                max_events,
                pulse_cap,
            }),
    ]
}

/// A token budget: from below one event's length (1 to 97 pulses, 1 to 41 DOMs) to many,
/// its grids rounded up to a multiple or not.
fn tokens() -> impl Strategy<Value = Batching> {
    (
        1usize..2000,
        proptest::option::of(1usize..30),
        proptest::option::of(1usize..20),
    )
        .prop_map(
            |(max_tokens, max_events, pad_to_multiple_of)| Batching::Tokens {
                max_tokens,
                max_events,
                pad_to_multiple_of,
            },
        )
}

/// A grid's width for a batch whose longest length is `longest` (capped as `grouping`
/// caps it): rounded up to `multiple`, at most the cap.
fn padded_width(longest: usize, multiple: Option<usize>, grouping: LengthGrouping) -> usize {
    let rounded = longest.div_ceil(multiple.unwrap_or(1)) * multiple.unwrap_or(1);
    let cap = grouping.length_and_cap().and_then(|(_, cap)| cap);
    cap.map_or(rounded, |cap| rounded.min(cap))
}

/// The pulses of `events` as a pulse budget counts them: each event's up to `cap`.
fn counted_pulses(sizes: &Sizes, cap: Option<usize>, events: &[EventRef]) -> usize {
    let cap = cap.unwrap_or(usize::MAX);
    events.iter().map(|&e| sizes.pulses(e).min(cap)).sum()
}

/// The longest of `events`' lengths as `grouping` counts them, capped (pulses when off).
fn longest(sizes: &Sizes, grouping: LengthGrouping, events: &[EventRef]) -> usize {
    let lengths = events.iter().map(|&e| grouped_length(sizes, grouping, e));
    lengths.max().unwrap_or(0)
}

fn order() -> impl Strategy<Value = BatchOrder> {
    prop_oneof![Just(BatchOrder::Stored), Just(BatchOrder::Drawn)]
}

/// Off, or by pulse or DOM count with or without a cap (the test sizes are 1 to 97 pulses
/// and 1 to 41 DOMs).
fn grouping() -> impl Strategy<Value = LengthGrouping> {
    prop_oneof![Just(LengthGrouping::Off), on_grouping(),]
}

/// By pulse or DOM count, with or without a cap.
fn on_grouping() -> impl Strategy<Value = LengthGrouping> {
    prop_oneof![
        proptest::option::of(1usize..120).prop_map(|cap| LengthGrouping::Pulses { cap }),
        proptest::option::of(1usize..50).prop_map(|cap| LengthGrouping::Doms { cap }),
    ]
}

#[test]
fn a_refused_resume_names_the_setting_as_the_loader_takes_it() {
    let saved = SamplerConfig {
        batching: Batching::Events(7),
        ..SamplerConfig::default()
    };
    let refusal = |ours: SamplerConfig| ours.check_resumable(&saved).unwrap_err().to_string();
    let other_batching = SamplerConfig {
        batching: Batching::Events(8),
        ..saved.clone()
    };
    assert_eq!(
        refusal(other_batching),
        "invalid batching: the saved state has batch_events 7, this loader batch_events 8"
    );
    let pulses = |max_events| SamplerConfig {
        batching: Batching::Pulses {
            max_pulses: 4096,
            max_events,
            pulse_cap: None,
        },
        ..saved.clone()
    };
    assert!(refusal(pulses(None)).ends_with("this loader max_pulses 4096"));
    assert!(refusal(pulses(Some(64))).ends_with("this loader max_pulses 4096, max_events 64"));
    let tokens = SamplerConfig {
        batching: Batching::Tokens {
            max_tokens: 65536,
            max_events: Some(1024),
            pad_to_multiple_of: Some(16),
        },
        ..saved.clone()
    };
    assert!(refusal(tokens)
        .ends_with("this loader max_tokens 65536, max_events 1024, pad_to_multiple_of 16"));
    let other_order = SamplerConfig {
        batch_order: BatchOrder::Drawn,
        ..saved.clone()
    };
    assert_eq!(
        refusal(other_order),
        "invalid batch_order: the saved state has stored, this loader drawn"
    );
    let grouped = SamplerConfig {
        group_by_length: LengthGrouping::Pulses { cap: Some(256) },
        ..saved.clone()
    };
    assert_eq!(
        refusal(grouped.clone()),
        "invalid group_by_length: the saved state has off, this loader pulses up to 256"
    );
    let by_doms = SamplerConfig {
        group_by_length: LengthGrouping::Doms { cap: None },
        ..saved.clone()
    };
    assert_eq!(
        by_doms.check_resumable(&grouped).unwrap_err().to_string(),
        "invalid group_by_length: the saved state has pulses up to 256, this loader doms"
    );
    let another_world = SamplerConfig {
        world: 3,
        rank: 2,
        drop_last: true,
        ..saved.clone()
    };
    assert!(another_world.check_resumable(&saved).is_ok());
}

#[test]
fn length_groups_are_refused_with_a_pulse_budget_or_a_zero_cap() {
    let refusal = |config: SamplerConfig| config.validate().unwrap_err().to_string();
    let budget = SamplerConfig {
        batching: Batching::Pulses {
            max_pulses: 4096,
            max_events: None,
            pulse_cap: None,
        },
        group_by_length: LengthGrouping::Pulses { cap: None },
        ..SamplerConfig::default()
    };
    assert!(
        refusal(budget.clone())
            .starts_with("invalid group_by_length: groups batches of a fixed number"),
        "names the setting"
    );
    let doms_budget = SamplerConfig {
        group_by_length: LengthGrouping::Doms { cap: Some(64) },
        ..budget.clone()
    };
    assert!(refusal(doms_budget).starts_with("invalid group_by_length: groups batches of"));
    for group_by_length in [
        LengthGrouping::Pulses { cap: Some(0) },
        LengthGrouping::Doms { cap: Some(0) },
    ] {
        let zero = SamplerConfig {
            group_by_length,
            ..SamplerConfig::default()
        };
        assert_eq!(
            refusal(zero),
            "invalid group_by_length: the cap must be at least 1"
        );
    }
}

#[test]
fn a_token_budget_is_refused_without_grouping_or_at_zero() {
    let refusal = |config: SamplerConfig| config.validate().unwrap_err().to_string();
    let budget = |max_tokens, max_events, pad_to_multiple_of, group_by_length| SamplerConfig {
        batching: Batching::Tokens {
            max_tokens,
            max_events,
            pad_to_multiple_of,
        },
        group_by_length,
        ..SamplerConfig::default()
    };
    let grouped = LengthGrouping::Doms { cap: Some(64) };
    assert!(budget(4096, Some(64), Some(8), grouped).validate().is_ok());
    assert!(refusal(budget(4096, None, None, LengthGrouping::Off))
        .starts_with("invalid max_tokens: bounds the padded grid of batches grouped by length"));
    for (max_tokens, max_events) in [(0, None), (4096, Some(0))] {
        assert_eq!(
            refusal(budget(max_tokens, max_events, None, grouped)),
            "invalid batching: token budget and event cap must be at least 1"
        );
    }
    assert_eq!(
        refusal(budget(4096, None, Some(0), grouped)),
        "invalid pad_to_multiple_of: must be at least 1"
    );
}

#[test]
fn a_token_budget_fills_nearly_equal_grids_in_a_random_order() {
    let sizes = Sizes(vec![5000, 3000]);
    let (cap, max_tokens) = (60, 64 * 60);
    let config = |shuffle| SamplerConfig {
        seed: 3,
        block_events: 64,
        window_blocks: 16,
        batching: Batching::Tokens {
            max_tokens,
            max_events: None,
            pad_to_multiple_of: None,
        },
        group_by_length: LengthGrouping::Pulses { cap: Some(cap) },
        shuffle,
        ..SamplerConfig::default()
    };
    // Each batch's events and longest length, cut to `cap` pulses.
    let batches = |shuffle, epoch| -> Vec<(usize, usize)> {
        all(&sizes, &config(shuffle), epoch)
            .iter()
            .map(|b| {
                let lengths = b.events.iter().map(|&e| sizes.pulses(e).min(cap));
                (b.events.len(), lengths.max().unwrap())
            })
            .collect()
    };
    let shuffled = batches(true, 0);
    let grids: Vec<usize> = shuffled.iter().map(|&(n, longest)| n * longest).collect();
    assert!(grids.iter().all(|&grid| grid <= max_tokens), "{grids:?}");
    // Grids nearly full but for each window's last batch, or its last two when they share
    // (8 windows).
    let full = grids
        .iter()
        .filter(|&&grid| grid * 10 >= max_tokens * 9)
        .count();
    assert!(
        full + 16 >= grids.len(),
        "{full} of {} grids at 90%",
        grids.len()
    );
    let events: Vec<usize> = shuffled.iter().map(|&(n, _)| n).collect();
    let (fewest, most) = (events.iter().min().unwrap(), events.iter().max().unwrap());
    assert!(
        *fewest <= 64 && *most >= 150,
        "{fewest} to {most} events a batch"
    );
    // Shortest first in each window without shuffle: 7 descents at window starts at most;
    // in a random order, about half the steps descend.
    let descents =
        |batches: &[(usize, usize)]| batches.windows(2).filter(|w| w[1].1 < w[0].1).count();
    assert!(descents(&batches(false, 0)) <= 7);
    assert!(descents(&shuffled) * 4 >= shuffled.len(), "{shuffled:?}");
    assert_ne!(shuffled, batches(true, 1), "another order in another epoch");
}

#[test]
fn length_groups_come_in_a_new_random_order_and_pad_less() {
    let sizes = Sizes(vec![5000, 3000]);
    let config = |group_by_length| SamplerConfig {
        seed: 3,
        block_events: 64,
        window_blocks: 16,
        batching: Batching::Events(64),
        group_by_length,
        ..SamplerConfig::default()
    };
    let grouped = config(LengthGrouping::Pulses { cap: Some(60) });
    // What a batch padded to its longest event (cut to 60 pulses) holds: real cells over
    // all cells.
    let filled = |config: &SamplerConfig, epoch| {
        let (mut real, mut cells) = (0, 0);
        for b in all(&sizes, config, epoch) {
            let lengths: Vec<usize> = b.events.iter().map(|&e| sizes.pulses(e).min(60)).collect();
            real += lengths.iter().sum::<usize>();
            cells += lengths.len() * lengths.iter().max().unwrap();
        }
        real as f64 / cells as f64
    };
    let (before, after) = (filled(&config(LengthGrouping::Off), 0), filled(&grouped, 0));
    assert!(
        after > 0.85 && before < 0.7,
        "filled {before:.3} drawn, {after:.3} grouped"
    );
    // Each window's 16 classes in an order drawn per window and epoch, not shortest first.
    let class_order = |epoch| -> Vec<Vec<usize>> {
        all(&sizes, &grouped, epoch)
            .chunks_exact(16)
            .map(|window| {
                let mut longest: Vec<(usize, usize)> = window
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        (
                            b.events
                                .iter()
                                .map(|&e| sizes.pulses(e).min(60))
                                .max()
                                .unwrap(),
                            i,
                        )
                    })
                    .collect();
                longest.sort();
                longest.into_iter().map(|(_, i)| i).collect()
            })
            .collect()
    };
    let (first, second) = (class_order(0), class_order(1));
    let ascending: Vec<usize> = (0..16).collect();
    assert!(first.iter().all(|order| *order != ascending), "{first:?}");
    assert_ne!(first[0], first[1], "another order in another window");
    assert_ne!(first, second, "another order in another epoch");
}

/// Each event's position in the stored order (shards concatenated).
fn stored_position(sizes: &Sizes, e: EventRef) -> u64 {
    sizes.0[..e.shard as usize].iter().sum::<usize>() as u64 + u64::from(e.index)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_event_once_per_epoch_across_ranks(
        shards in proptest::collection::vec(0usize..300, 1..6),
        seed in any::<u64>(), epoch in 0u64..5, block in 1usize..64, window in 1usize..8,
        batching in batching(), world in 1usize..9, run in 1usize..12, batch_order in order(),
        group_by_length in grouping(),
    ) {
        let sizes = Sizes(shards.clone());
        let total: usize = shards.iter().sum();
        let base = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, batch_order, shuffle: true, group_by_length, drop_last: false, rank: 0, world: 1 };
        let reference: Vec<BatchPlan> = all(&sizes, &base, epoch);
        let mut union = Vec::new();
        for rank in 0..world {
            let config = SamplerConfig { rank, world, ..base.clone() };
            union.extend(all(&sizes, &config, epoch));
        }
        union.sort_by_key(|b| b.global_index);
        prop_assert_eq!(&union, &reference, "the union of ranks is the world-1 sequence");
        let events: Vec<EventRef> = reference.iter().flat_map(|b| b.events.clone()).collect();
        prop_assert_eq!(events.len(), total);
        prop_assert_eq!(events.iter().collect::<BTreeSet<_>>().len(), total, "no event twice");
        for b in &reference {
            let pulses: usize = b.events.iter().map(|&e| sizes.pulses(e)).sum();
            prop_assert!(!b.events.is_empty());
            prop_assert!(batching.max_events().is_none_or(|m| b.events.len() <= m));
            match batching {
                Batching::Events(_) => {}
                Batching::Pulses { max_pulses, pulse_cap, .. } => {
                    let counted = counted_pulses(&sizes, pulse_cap, &b.events);
                    prop_assert!(counted <= max_pulses || b.events.len() == 1);
                    prop_assert!(counted <= pulses);
                }
                Batching::Tokens { max_tokens, pad_to_multiple_of, .. } => {
                    let widest = longest(&sizes, group_by_length, &b.events);
                    let grid = b.events.len() * padded_width(widest, pad_to_multiple_of, group_by_length);
                    prop_assert!(grid <= max_tokens || b.events.len() == 1, "a grid of {}", grid);
                }
            }
        }
        // A pulse budget closes a batch only at an event that does not fit (the next
        // batch's, as counted with the cap) or at max_events.
        if let Batching::Pulses { max_pulses, max_events, pulse_cap } = batching {
            for pair in reference.windows(2) {
                let full = max_events.is_some_and(|m| pair[0].events.len() == m);
                let counted = counted_pulses(&sizes, pulse_cap, &pair[0].events);
                let next = pair[1].events.iter().map(|&e| counted_pulses(&sizes, pulse_cap, &[e]));
                let largest_next = next.max().unwrap_or(0);
                prop_assert!(full || counted + largest_next > max_pulses, "closed with room");
            }
        }
    }

    #[test]
    fn drop_last_gives_equal_counts_and_loses_little(
        shards in proptest::collection::vec(0usize..300, 1..6),
        seed in any::<u64>(), block in 1usize..64, window in 1usize..8,
        batching in batching(), world in 1usize..9, run in 1usize..12, origin in 0u64..40,
        batch_order in order(), group_by_length in grouping(),
    ) {
        // Each rank looks one step ahead to drop an incomplete one: its batches are those
        // the counting pass (`len()`'s) finds before the end, dealt from `origin` (a
        // resume's), and every rank gets as many.
        let sizes = Sizes(shards);
        let base = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, batch_order, shuffle: true, group_by_length, drop_last: true, rank: 0, world };
        let every = all(&sizes, &SamplerConfig { drop_last: false, world: 1, ..base.clone() }, 1);
        let end = delivered_global_batches(&sizes, &base, 1, origin);
        let position = SamplerState { epoch: 1, batches_taken: 0, origin };
        let per_rank: Vec<Vec<BatchPlan>> = (0..world).map(|rank| EpochBatches::new(&sizes, &SamplerConfig { rank, ..base.clone() }, position).collect()).collect();
        for (rank, looked_ahead) in per_rank.iter().enumerate() {
            let counted: Vec<BatchPlan> = every.iter()
                .filter(|b| b.global_index >= origin && b.global_index < end && (b.global_index - origin) % world as u64 == rank as u64)
                .cloned().collect();
            prop_assert_eq!(looked_ahead, &counted, "rank {} of {}", rank, world);
        }
        let counts: BTreeSet<usize> = per_rank.iter().map(|r| r.len()).collect();
        prop_assert!(counts.len() <= 1, "every rank the same number of batches: {:?}", counts);
        let delivered = per_rank.iter().map(|r| r.len()).sum::<usize>();
        prop_assert_eq!(delivered as u64, end.saturating_sub(origin), "every whole step, and only those");
        prop_assert!(every.len().saturating_sub(origin as usize) - delivered <= world, "at most `world` batches dropped");
        if let Batching::Events(n) = batching {
            prop_assert!(per_rank.iter().flatten().all(|b| b.events.len() == n));
        }
        let kept: BTreeSet<EventRef> = per_rank.iter().flatten().flat_map(|b| b.events.clone()).collect();
        prop_assert_eq!(kept.len(), per_rank.iter().flatten().map(|b| b.events.len()).sum::<usize>());
    }

    #[test]
    fn rank_batch_count_is_what_the_epoch_yields(
        shards in proptest::collection::vec(0usize..300, 1..6),
        seed in any::<u64>(), epoch in 0u64..3, block in 1usize..64, window in 1usize..8,
        batching in batching(), world in 1usize..9, drop_last: bool, batch_order in order(),
        group_by_length in grouping(),
    ) {
        let sizes = Sizes(shards);
        for rank in 0..world {
            let config = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: 1, batching, batch_order, shuffle: true, group_by_length, drop_last, rank, world };
            let yielded = all(&sizes, &config, epoch).len() as u64;
            prop_assert_eq!(rank_batch_count(&sizes, &config, epoch, 0), yielded, "rank {} of {}", rank, world);
        }
    }

    /// A token budget's count, which reads no drawn order, is its epoch's batches: events
    /// in runs or not, and lengths past what a window's events are counted by (sorted
    /// instead) among short ones.
    #[test]
    fn a_token_budgets_count_is_what_the_epoch_yields(
        shards in proptest::collection::vec(0usize..300, 1..5),
        seed in any::<u64>(), block in 1usize..40, window in 1usize..6, run in 1usize..5,
        max_tokens in 1usize..400_000, max_events in proptest::option::of(1usize..30),
        multiple in proptest::option::of(1usize..20), cap in proptest::option::of(1usize..300_000),
        world in 1usize..4, drop_last: bool, shuffle: bool,
    ) {
        let sizes = LongSizes(shards);
        let batching = Batching::Tokens { max_tokens, max_events, pad_to_multiple_of: multiple };
        for rank in 0..world {
            let config = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, shuffle, group_by_length: LengthGrouping::Pulses { cap }, drop_last, rank, world, ..SamplerConfig::default() };
            let yielded = EpochBatches::new(&sizes, &config, SamplerState::start(1)).count() as u64;
            prop_assert_eq!(rank_batch_count(&sizes, &config, 1, 0), yielded, "rank {} of {}", rank, world);
        }
    }

    #[test]
    fn resume_yields_exactly_the_rest(
        shards in proptest::collection::vec(1usize..200, 1..4), seed in any::<u64>(),
        batching in batching(), world in 1usize..4, rank_pick in 0usize..4, skip in 0u64..30, drop_last: bool,
        run in 1usize..12, batch_order in order(), group_by_length in grouping(),
    ) {
        let sizes = Sizes(shards);
        let config = SamplerConfig { seed, block_events: 16, window_blocks: 3, run_events: run, batching, batch_order, shuffle: true, group_by_length, drop_last, rank: rank_pick % world, world };
        let whole = all(&sizes, &config, 2);
        let rest: Vec<BatchPlan> = EpochBatches::new(&sizes, &config, SamplerState::at(2, skip)).collect();
        prop_assert_eq!(&rest[..], &whole[(skip as usize).min(whole.len())..]);
    }

    #[test]
    fn a_state_resumes_at_any_world_size(
        shards in proptest::collection::vec(1usize..200, 1..4), seed in any::<u64>(),
        batching in batching(), world in 1usize..6, new_world in 1usize..9, taken in 0u64..12,
        drop_last: bool, new_drop_last: bool, run in 1usize..6, group_by_length in grouping(),
    ) {
        let sizes = Sizes(shards);
        let base = SamplerConfig { seed, block_events: 16, window_blocks: 3, run_events: run, batching, group_by_length, drop_last, world, ..SamplerConfig::default() };
        let every = all(&sizes, &SamplerConfig { world: 1, drop_last: false, ..base.clone() }, 1);
        // Every rank of the old world took `taken` batches (or all it had), then stopped.
        let mut seen: Vec<u64> = Vec::new();
        let mut saved = None;
        for rank in 0..world {
            let config = SamplerConfig { rank, ..base.clone() };
            let mut batches = EpochBatches::new(&sizes, &config, SamplerState::start(1));
            let first: Vec<BatchPlan> = batches.by_ref().take(taken as usize).collect();
            seen.extend(first.iter().map(|b| b.global_index));
            let state = SamplerState::at(1, first.len() as u64);
            if rank == 0 {
                saved = Some(state);
            }
        }
        let saved = saved.unwrap();
        let resumed = SamplerState::resumed(&saved, world);
        prop_assert_eq!(resumed.origin, saved.batches_taken * world as u64);
        let new = SamplerConfig { world: new_world, drop_last: new_drop_last, ..base.clone() };
        prop_assert!(new.check_resumable(&base).is_ok());
        let mut counts = BTreeSet::new();
        for rank in 0..new_world {
            let config = SamplerConfig { rank, ..new.clone() };
            let rest: Vec<BatchPlan> = EpochBatches::new(&sizes, &config, resumed).collect();
            prop_assert_eq!(rest.len() as u64, rank_batch_count(&sizes, &config, 1, resumed.origin));
            counts.insert(rest.len());
            seen.extend(rest.iter().map(|b| b.global_index));
        }
        let unique: BTreeSet<u64> = seen.iter().copied().collect();
        prop_assert_eq!(unique.len(), seen.len(), "no batch twice");
        let end = if new_drop_last {
            prop_assert!(counts.len() <= 1, "equal counts after the resume: {:?}", counts);
            delivered_global_batches(&sizes, &new, 1, resumed.origin)
        } else {
            every.len() as u64
        };
        // Nothing skipped: every global batch before the end, but what the old world's
        // drop_last had already cut off at its own end.
        let old_end = if drop_last { delivered_global_batches(&sizes, &base, 1, 0) } else { every.len() as u64 };
        let expected: BTreeSet<u64> = (0..end.max(resumed.origin.min(old_end))).filter(|&k| k < resumed.origin.min(old_end) || k >= resumed.origin).collect();
        prop_assert_eq!(unique, expected);
    }

    #[test]
    fn without_shuffle_every_epoch_is_the_stored_order(
        shards in proptest::collection::vec(0usize..300, 1..6), seed in any::<u64>(),
        block in 1usize..64, window in 1usize..8, batching in events_or_pulses(),
        world in 1usize..5, run in 1usize..12, batch_order in order(), epoch in 0u64..4,
    ) {
        let sizes = Sizes(shards.clone());
        let config = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, batch_order, shuffle: false, world, ..SamplerConfig::default() };
        let mut union: Vec<BatchPlan> = (0..world).flat_map(|rank| all(&sizes, &SamplerConfig { rank, ..config.clone() }, epoch)).collect();
        union.sort_by_key(|b| b.global_index);
        let events: Vec<u64> = union.iter().flat_map(|b| b.events.iter().map(|&e| stored_position(&sizes, e))).collect();
        prop_assert_eq!(events, (0..shards.iter().sum::<usize>() as u64).collect::<Vec<_>>());
        let other = SamplerConfig { seed: seed ^ 1, block_events: block + 3, rank: 0, world: 1, ..config.clone() };
        let mut single = all(&sizes, &other, epoch + 1);
        for b in &mut single { b.global_index = 0; }
        for b in &mut union { b.global_index = 0; }
        prop_assert_eq!(single, union, "the same batches whatever the seed, blocks or epoch");
    }

    #[test]
    fn length_groups_regroup_only_each_windows_whole_batches(
        shards in proptest::collection::vec(0usize..300, 1..6),
        seed in any::<u64>(), epoch in 0u64..4, block in 1usize..40, window in 1usize..8,
        batch_events in 1usize..24, group_by_length in on_grouping(),
        run in 1usize..6, batch_order in order(), shuffle: bool,
    ) {
        let sizes = Sizes(shards.clone());
        let plain = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching: Batching::Events(batch_events), batch_order, shuffle, ..SamplerConfig::default() };
        let grouped = SamplerConfig { group_by_length, ..plain.clone() };
        prop_assert!(grouped.validate().is_ok());
        let (drawn, regrouped) = (all(&sizes, &plain, epoch), all(&sizes, &grouped, epoch));
        prop_assert_eq!(drawn.len(), regrouped.len());
        let length = |e: &EventRef| grouped_length(&sizes, group_by_length, *e);
        // Window k holds the global positions k * window_events onwards (its blocks are
        // whole but for the epoch's last).
        let window_events = (block * window) as u64;
        let mut whole: std::collections::BTreeMap<u64, [Vec<EventRef>; 2]> = Default::default();
        let mut ranges: std::collections::BTreeMap<u64, Vec<(usize, usize)>> = Default::default();
        for (before, after) in drawn.iter().zip(&regrouped) {
            prop_assert_eq!(before.global_index, after.global_index);
            let start = after.global_index * batch_events as u64;
            let end = start + after.events.len() as u64;
            let w = start / window_events;
            if after.events.len() < batch_events || (end - 1) / window_events != w {
                prop_assert_eq!(before, after, "a batch not whole inside a window is as drawn");
                continue;
            }
            let [a, b] = whole.entry(w).or_default();
            a.extend(&before.events);
            b.extend(&after.events);
            let lengths = after.events.iter().map(length);
            let (min, max) = (lengths.clone().min().unwrap(), lengths.max().unwrap());
            ranges.entry(w).or_default().push((min, max));
        }
        for [mut a, mut b] in whole.into_values() {
            a.sort();
            b.sort();
            prop_assert_eq!(a, b, "a window's whole batches hold the events drawn for them");
        }
        for mut classes in ranges.into_values() {
            if !shuffle {
                prop_assert!(classes.windows(2).all(|c| c[0].1 <= c[1].0), "shortest first: {:?}", classes);
            }
            classes.sort();
            prop_assert!(classes.windows(2).all(|c| c[0].1 <= c[1].0), "disjoint length classes: {:?}", classes);
        }
    }

    #[test]
    fn a_token_budget_cuts_each_window_sorted_by_length(
        shards in proptest::collection::vec(0usize..300, 1..6),
        seed in any::<u64>(), epoch in 0u64..4, block in 1usize..40, window in 1usize..8,
        budget in tokens(), group_by_length in on_grouping(), run in 1usize..6,
        batch_order in order(), shuffle: bool,
    ) {
        let sizes = Sizes(shards.clone());
        // Batch k of `windows` holds window k's events in drawn order (its blocks are
        // whole but for the epoch's last).
        let windows = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching: Batching::Events(block * window), batch_order: BatchOrder::Drawn, shuffle, ..SamplerConfig::default() };
        let cut = SamplerConfig { batching: budget, batch_order, group_by_length, ..windows.clone() };
        prop_assert!(cut.validate().is_ok());
        let Batching::Tokens { max_tokens, max_events, pad_to_multiple_of } = budget else { unreachable!() };
        let length = |e: &EventRef| grouped_length(&sizes, group_by_length, *e);
        let width = |e: &EventRef| padded_width(length(e), pad_to_multiple_of, group_by_length);
        let mut batches = all(&sizes, &cut, epoch).into_iter();
        for (w, drawn) in all(&sizes, &windows, epoch).iter().enumerate() {
            // The reference: the window's drawn events, stably sorted by length, cut from the
            // longest down, each batch taking events while its grid (its first event's
            // length, rounded up) and the event cap allow; a last batch of less than half the one before
            // shares its events evenly; then shortest first.
            let mut sorted = drawn.events.clone();
            sorted.sort_by_key(length);
            let mut expected: Vec<Vec<EventRef>> = Vec::new();
            for e in sorted.into_iter().rev() {
                match expected.last_mut() {
                    Some(b) if max_events.is_none_or(|m| b.len() < m)
                        && (b.len() + 1) * width(&b[0]) <= max_tokens => b.push(e),
                    _ => expected.push(vec![e]),
                }
            }
            if let [.., before, last] = &mut expected[..] {
                if last.len() < before.len() / 2 {
                    let mut both = [before.clone(), last.clone()].concat();
                    *last = both.split_off(both.len().div_ceil(2));
                    *before = both;
                }
            }
            expected.reverse();
            // The window's batches, next in the epoch: no batch spans two windows.
            let mut got: Vec<Vec<EventRef>> = Vec::new();
            while got.iter().map(Vec::len).sum::<usize>() < drawn.events.len() {
                let b = batches.next();
                prop_assert!(b.is_some(), "window {} ends early", w);
                got.push(b.unwrap().events);
            }
            let canonical = |batches: &mut Vec<Vec<EventRef>>| {
                batches.iter_mut().for_each(|b| b.sort());
            };
            canonical(&mut expected);
            canonical(&mut got);
            if shuffle {
                expected.sort();
                got.sort();
            }
            prop_assert_eq!(got, expected, "window {}: its events, cut in length order", w);
        }
        prop_assert!(batches.next().is_none());
    }

    #[test]
    fn batch_order_changes_no_batch_content(
        shards in proptest::collection::vec(0usize..400, 1..5),
        seed in any::<u64>(), epoch in 0u64..4, block in 1usize..80, window in 1usize..20,
        batching in batching(), run in 1usize..6,
    ) {
        let sizes = Sizes(shards);
        let drawn = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, batch_order: BatchOrder::Drawn, ..SamplerConfig::default() };
        let stored = SamplerConfig { batch_order: BatchOrder::Stored, ..drawn.clone() };
        let (a, b) = (all(&sizes, &stored, epoch), all(&sizes, &drawn, epoch));
        prop_assert_eq!(a.len(), b.len());
        for (a, b) in a.iter().zip(&b) {
            let mut sorted = b.events.clone();
            sorted.sort();
            prop_assert_eq!(&a.events, &sorted, "stored order: the drawn batch, sorted");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn a_reused_vector_changes_no_plan(
        shards in proptest::collection::vec(0usize..300, 1..6),
        seed in any::<u64>(), block in 1usize..64, window in 1usize..8,
        batching in batching(), world in 1usize..4, batch_order in order(),
        drop_last in any::<bool>(), stale in 0usize..600, group_by_length in grouping(),
    ) {
        let sizes = Sizes(shards);
        let config = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: 4, batching, batch_order, shuffle: true, group_by_length, drop_last, rank: world - 1, world };
        let expected = all(&sizes, &config, 1);
        // Each plan is made in the vector of the one before, first in one holding
        // events of another batch.
        let mut batches = EpochBatches::new(&sizes, &config, SamplerState::start(1));
        let mut reused = vec![EventRef { shard: 9, index: 9 }; stale];
        let mut planned = Vec::new();
        // Two scratches in turn, as two threads planning in turn use them.
        let mut scratches = [PlanScratch::default(), PlanScratch::default()];
        while let Some(plan) = batches.next_reusing(&mut reused, &mut scratches[planned.len() % 2]) {
            prop_assert!(reused.is_empty(), "the plan took the events out");
            planned.push(plan.clone());
            reused = plan.events;
        }
        prop_assert_eq!(planned, expected);
        prop_assert!(reused.capacity() >= stale, "the last vector kept its memory");
    }
}

#[test]
fn runs_are_consecutive_events_of_one_block() {
    let sizes = Sizes(vec![100, 37]);
    let config = SamplerConfig {
        block_events: 20,
        window_blocks: 3,
        run_events: 8,
        batching: Batching::Events(1000),
        batch_order: BatchOrder::Drawn,
        ..SamplerConfig::default()
    };
    for epoch in 0..4 {
        let rotation = EventStream::new(&sizes.0, &config, epoch).rotation();
        // Positions in the epoch's rotated order, where blocks start at multiples of 20.
        let rotated: Vec<u64> = all(&sizes, &config, epoch)
            .into_iter()
            .flat_map(|b| b.events)
            .map(|e| (stored_position(&sizes, e) + 137 - rotation) % 137)
            .collect();
        let mut i = 0;
        while i < rotated.len() {
            let p = rotated[i];
            // A run starts at a multiple of 8 inside its block, ends after 8 events or at
            // the block's end.
            assert_eq!((p % 20) % 8, 0, "epoch {epoch}: {p}");
            let len = 8.min(((p / 20 + 1) * 20).min(137) - p) as usize;
            assert_eq!(rotated[i..i + len], (p..p + len as u64).collect::<Vec<_>>());
            i += len;
        }
    }
}

#[test]
fn window_one_batches_are_whole_blocks_in_stored_order() {
    let sizes = Sizes(vec![1000, 1000, 37]);
    let config = SamplerConfig {
        block_events: 50,
        window_blocks: 1,
        batching: Batching::Events(50),
        ..SamplerConfig::default()
    };
    let epochs: Vec<Vec<BatchPlan>> = (0..3).map(|e| all(&sizes, &config, e)).collect();
    assert_ne!(epochs[0], epochs[1]);
    let mut short_blocks = BTreeSet::new();
    for batches in &epochs {
        let (last, full) = batches.split_last().unwrap();
        assert_eq!(last.events.len(), 2037 % 50, "the short block comes last");
        short_blocks.insert(last.events.clone());
        for b in batches {
            assert!(b.events.windows(2).all(|w| w[0] < w[1]), "stored order");
            // One block: consecutive stored positions, cyclically (rotated epochs wrap).
            let mut p: Vec<u64> = b
                .events
                .iter()
                .map(|&e| stored_position(&sizes, e))
                .collect();
            let gap = p.windows(2).position(|w| w[1] != w[0] + 1);
            if let Some(g) = gap {
                assert_eq!(
                    (p[0], *p.last().unwrap()),
                    (0, 2036),
                    "only the wrap breaks a block"
                );
                p.rotate_left(g + 1);
            }
            assert!(p.windows(2).all(|w| (w[0] + 1) % 2037 == w[1]), "{p:?}");
            if full.contains(b) {
                assert_eq!(b.events.len(), 50);
            }
        }
    }
    assert_eq!(
        short_blocks.len(),
        3,
        "the short block holds other events each epoch"
    );
}
