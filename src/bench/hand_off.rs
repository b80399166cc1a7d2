//! How far apart the loader's cores are: the time two threads take to pass one cache line
//! back and forth. Where two cores share a last-level cache the line goes through it; where
//! they do not (a virtual machine's two vCPUs placed on two of the host's core complexes),
//! it goes through the memory fabric, and so does every staging buffer line one core
//! writes after the other (docs/results.md, "Staging buffers back to the core that filled
//! them"). On the 2-core Zen 5 machine this measurement read 42-60 ns in one placement and
//! 340-420 ns in the other (a one-off program with both threads pinned: 78-150 and 275-500
//! ns), and the host moved between them from minute to minute: every shardbench row reports
//! it, so a reader can tell which placement its figures came from.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::median;
use crate::cores::{available_cores, OwnLines};

/// Round trips timed together.
const TRIPS: u64 = 2_000;

/// Groups of [`TRIPS`] timed; the median is reported.
const ROUNDS: u64 = 5;

/// A measurement that takes longer than this is abandoned (the two threads were not
/// running at once: another thread held one of the cores).
const DEADLINE: Duration = Duration::from_millis(200);

/// Written by the timing thread to release the other one.
const STOP: u64 = u64::MAX;

/// The median time, in ns, over 5 groups of 2,000 round trips, that one cache line takes
/// to go from this thread to another and back (each thread waits for the other's write
/// before it writes). `None` with fewer than two cores, or when the threads did not run at
/// once within 200 ms.
pub fn cache_line_round_trip_ns() -> Option<f64> {
    if available_cores() < 2 {
        return None;
    }
    let line = OwnLines(AtomicU64::new(0));
    std::thread::scope(|scope| {
        scope.spawn(|| answer(&line.0));
        let timed = time_round_trips(&line.0, DEADLINE);
        line.0.store(STOP, Ordering::Release);
        timed
    })
}

/// The round trip, in ns, above which two threads' CPUs are taken to share no last-level
/// cache. Measured with shardbench's timing: 42-60 ns (Zen 5), 60-72 ns (Zen 4) and
/// 111-151 ns (Xeon, family 6 model 167) with a shared L3; 305-420 ns on the Zen 4 and the
/// Zen 5 without one (docs/results.md, "Eighty runs sorted by placement").
pub const SPLIT_ROUND_TRIP_NS: f64 = 200.0;

/// Where a row's two threads ran, told from the cache-line round trips timed just before
/// and just after its epochs. A shared-cache and a split row's ratios to memcpy do not
/// compare: on the 2-core Zen 4, without a shared L3 memcpy ran a tenth faster and the
/// scattered copy of the batches' pieces 3-15% slower, the loader with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CachePlacement {
    /// Both round trips under [`SPLIT_ROUND_TRIP_NS`]: CPUs sharing a last-level cache.
    Shared,
    /// Both at or over it: CPUs without a shared last-level cache.
    Split,
    /// One under, one over: the host moved the CPUs during the row.
    Changed,
}

impl CachePlacement {
    /// The placement of a row timed `before` and `after` its epochs (ns); `None` when
    /// either could not be timed.
    pub fn from_round_trips(before: Option<f64>, after: Option<f64>) -> Option<CachePlacement> {
        let split = |ns: f64| ns >= SPLIT_ROUND_TRIP_NS;
        match (split(before?), split(after?)) {
            (false, false) => Some(CachePlacement::Shared),
            (true, true) => Some(CachePlacement::Split),
            _ => Some(CachePlacement::Changed),
        }
    }

    /// Its words in shardbench's report.
    pub fn describe(self) -> &'static str {
        match self {
            CachePlacement::Shared => "a shared L3",
            CachePlacement::Split => "no shared L3",
            CachePlacement::Changed => "moved during the row",
        }
    }
}

/// The other thread: turns each odd value into the next even one, until [`STOP`]. A
/// compare-and-swap, so that a stop written meanwhile is never overwritten.
fn answer(line: &AtomicU64) {
    let mut expected = 1;
    loop {
        match line.load(Ordering::Acquire) {
            STOP => return,
            v if v == expected => {
                let _ = line.compare_exchange(v, v + 1, Ordering::AcqRel, Ordering::Acquire);
                expected += 2;
            }
            _ => spin_loop(),
        }
    }
}

/// Spins between two looks at the clock while waiting for an answer.
const SPINS_PER_CLOCK: u32 = 1 << 12;

/// This thread's side: writes each odd value and waits for the answer; `None` once
/// `limit` has passed.
fn time_round_trips(line: &AtomicU64, limit: Duration) -> Option<f64> {
    let deadline = Instant::now() + limit;
    let mut per_trip = Vec::with_capacity(ROUNDS as usize);
    for round in 0..ROUNDS {
        let started = Instant::now();
        for trip in round * TRIPS..(round + 1) * TRIPS {
            line.store(2 * trip + 1, Ordering::Release);
            let mut spins = 0u32;
            while line.load(Ordering::Acquire) != 2 * trip + 2 {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(SPINS_PER_CLOCK) && Instant::now() > deadline {
                    return None;
                }
                spin_loop();
            }
        }
        per_trip.push(started.elapsed().as_secs_f64() * 1e9 / TRIPS as f64);
    }
    Some(median(&per_trip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_is_timed_or_said_to_be_unknown() {
        match cache_line_round_trip_ns() {
            // Faster than light within a chip is not a measurement; a millisecond is a
            // time slice, not a cache line.
            Some(ns) => assert!((5.0..1e6).contains(&ns), "{ns} ns"),
            None => eprintln!("no round trip: one core, or the threads never met"),
        }
    }

    #[test]
    fn a_rows_placement_needs_both_round_trips_on_the_same_side_of_the_threshold() {
        use CachePlacement::*;
        let t = SPLIT_ROUND_TRIP_NS;
        let cases = [
            ((Some(65.0), Some(70.0)), Some(Shared)),
            ((Some(151.0), Some(t - 0.1)), Some(Shared)),
            ((Some(330.0), Some(340.0)), Some(Split)),
            ((Some(t), Some(t)), Some(Split)),
            ((Some(65.0), Some(330.0)), Some(Changed)),
            ((Some(330.0), Some(65.0)), Some(Changed)),
            ((None, Some(65.0)), None),
            ((Some(330.0), None), None),
            ((None, None), None),
        ];
        for ((before, after), expected) in cases {
            assert_eq!(
                CachePlacement::from_round_trips(before, after),
                expected,
                "{before:?} then {after:?}"
            );
        }
        let names: Vec<String> = [Shared, Split, Changed]
            .iter()
            .map(|p| serde_json::to_string(p).unwrap())
            .collect();
        assert_eq!(names, ["\"shared\"", "\"split\"", "\"changed\""]);
    }

    #[test]
    fn an_unanswered_line_is_given_up_at_the_deadline() {
        let line = AtomicU64::new(0);
        let started = Instant::now();
        assert_eq!(time_round_trips(&line, Duration::from_millis(20)), None);
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        assert_eq!(
            line.load(Ordering::Acquire),
            1,
            "the first trip's value, unanswered"
        );
    }

    #[test]
    fn a_stop_ends_the_answering_thread() {
        let line = AtomicU64::new(0);
        std::thread::scope(|scope| {
            let answering = scope.spawn(|| answer(&line));
            line.store(1, Ordering::Release);
            while line.load(Ordering::Acquire) != 2 {
                spin_loop();
            }
            line.store(STOP, Ordering::Release);
            answering.join().expect("the answering thread returns");
        });
        assert_eq!(
            line.load(Ordering::Acquire),
            STOP,
            "the stop was not overwritten"
        );
    }
}
