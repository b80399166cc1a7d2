//! How many passes over a batch's runs the gather makes to copy them from a columns shard:
//! this machine's choice, as measured ([`ColumnsPasses::for_this_machine`]). The batches
//! are the same bytes either way.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::prefetch::{for_this_cpu, resolve_setting};

/// The environment variable that overrides this machine's [`ColumnsPasses`] where a
/// loader's configuration leaves them open: `one` or `two`.
pub const COLUMNS_PASSES_VAR: &str = "SHARDIFY_COLUMNS_PASSES";

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

    /// The passes a loader uses: `configured` when set, else [`COLUMNS_PASSES_VAR`] when
    /// set, else [`ColumnsPasses::for_this_machine`]. A variable holding anything but `one`
    /// or `two` is an error naming it.
    pub fn resolve(configured: Option<ColumnsPasses>) -> Result<ColumnsPasses> {
        let from_env = std::env::var(COLUMNS_PASSES_VAR).ok();
        let variable = (COLUMNS_PASSES_VAR, from_env.as_deref());
        resolve_setting(
            configured,
            variable,
            ColumnsPasses::named,
            ColumnsPasses::for_this_machine,
        )
    }

    /// The passes `name` names (`one` or `two`, or `1` or `2`; any case, spaces around
    /// ignored); another name is an error about `field`.
    fn named(field: &'static str, name: &str) -> Result<ColumnsPasses> {
        match name.trim().to_ascii_lowercase().as_str() {
            "one" | "1" => Ok(ColumnsPasses::One),
            "two" | "2" => Ok(ColumnsPasses::Two),
            _ => Err(Error::config(
                field,
                format!("must be one or two, not {name:?}"),
            )),
        }
    }
}

impl std::str::FromStr for ColumnsPasses {
    type Err = Error;

    fn from_str(s: &str) -> Result<ColumnsPasses> {
        ColumnsPasses::named("columns_passes", s)
    }
}

impl std::fmt::Display for ColumnsPasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::{resolve_setting, ColumnsPasses, COLUMNS_PASSES_VAR};
    use crate::error::Error;

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

    #[test]
    fn names_parse_and_a_bad_one_is_refused_naming_its_field() {
        for (name, passes) in [
            ("one", ColumnsPasses::One),
            (" TWO ", ColumnsPasses::Two),
            ("1", ColumnsPasses::One),
            ("2", ColumnsPasses::Two),
        ] {
            assert_eq!(name.parse::<ColumnsPasses>().unwrap(), passes, "{name:?}");
        }
        let err = "three".parse::<ColumnsPasses>().unwrap_err();
        assert!(
            matches!(&err, Error::Config { field, .. } if *field == "columns_passes"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains(r#"must be one or two, not "three""#),
            "{err}"
        );
    }

    #[test]
    fn the_configuration_beats_the_variable_which_beats_the_machine() {
        let machine = || ColumnsPasses::Two;
        let resolve = |configured, value| {
            resolve_setting(
                configured,
                (COLUMNS_PASSES_VAR, value),
                ColumnsPasses::named,
                machine,
            )
        };
        let one = Some(ColumnsPasses::One);
        assert_eq!(resolve(one, Some("two")).unwrap(), ColumnsPasses::One);
        assert_eq!(resolve(None, Some("one")).unwrap(), ColumnsPasses::One);
        assert_eq!(resolve(None, None).unwrap(), ColumnsPasses::Two);
        let err = resolve(None, Some("3")).unwrap_err();
        assert!(err.to_string().contains(COLUMNS_PASSES_VAR), "{err}");
        // A configured value never reads the variable, however bad.
        assert_eq!(resolve(one, Some("3")).unwrap(), ColumnsPasses::One);
    }
}
