//! How many passes over a batch's runs the gather makes to copy them from a columns shard:
//! this machine's choice, as measured ([`ColumnsPasses::for_this_machine`]). The batches
//! are the same bytes either way.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::prefetch::for_this_cpu;

/// How a columns shard's runs are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnsPasses {
    /// One pass: each run's ids, labels, sensor ids, offsets and pulse columns together,
    /// all of them prefetched a few runs ahead (nine streams of reads in flight).
    One,
    /// Two passes, each prefetching only what it reads: the event- and DOM-level columns
    /// of every run, then their pulse columns.
    Two,
}

impl ColumnsPasses {
    /// Its name in reports: `one` or `two`.
    pub fn name(self) -> &'static str {
        match self {
            ColumnsPasses::One => "one",
            ColumnsPasses::Two => "two",
        }
    }

    /// The choice that gathers fastest on this CPU, as measured: two passes on AMD's
    /// family 25 (Zen 3 and Zen 4; on a Zen 4, model 17, the loader delivered 2-7% more
    /// events a second at windows 4-64 than with one), one everywhere else (on a Zen 5,
    /// family 26, one pass delivered 2.0% more at windows 4 and 16 and 2.7-3.0% more at 64
    /// than two, the same at window 1; the Xeons measured in docs/results.md ran one
    /// pass). Detected once per process.
    pub fn for_this_machine() -> ColumnsPasses {
        static PASSES: OnceLock<ColumnsPasses> = OnceLock::new();
        *PASSES.get_or_init(|| for_this_cpu(ColumnsPasses::for_cpu, ColumnsPasses::One))
    }

    /// The choice for a CPU of `vendor` (its CPUID vendor string) and `family` (CPUID's
    /// family, the extended family added in).
    pub fn for_cpu(vendor: &str, family: u32) -> ColumnsPasses {
        match (vendor, family) {
            ("AuthenticAMD", 25) => ColumnsPasses::Two,
            _ => ColumnsPasses::One,
        }
    }
}

impl std::fmt::Display for ColumnsPasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::ColumnsPasses;

    #[test]
    fn zen_3_and_4_copy_in_two_passes_every_other_cpu_in_one() {
        let cases = [
            ("AuthenticAMD", 25, ColumnsPasses::Two), // Zen 3, Zen 4
            ("AuthenticAMD", 26, ColumnsPasses::One), // Zen 5
            ("AuthenticAMD", 23, ColumnsPasses::One), // Zen 1, Zen 2
            ("GenuineIntel", 6, ColumnsPasses::One),
            ("HygonGenuine", 24, ColumnsPasses::One),
        ];
        for (vendor, family, passes) in cases {
            assert_eq!(
                ColumnsPasses::for_cpu(vendor, family),
                passes,
                "{vendor} {family}"
            );
        }
        assert_eq!(ColumnsPasses::One.to_string(), "one");
        assert_eq!(ColumnsPasses::Two.to_string(), "two");
    }
}
