//! One shard: a safetensors file of whole DOM-packed columns for a run of events, and the
//! validating reader that turns its bytes into typed views.
//!
//! | tensor | shape | dtype |
//! |---|---|---|
//! | `event_id` | `[E]` | I64 |
//! | `event_batch_id` | `[E]` | I64 (lineage: source batch) |
//! | `event_first_row` | `[E]` | I64 (lineage: first row in the source batch file) |
//! | `event_azimuth`, `event_zenith` | `[E]` | F64 (train split only) |
//! | `event_dom_offsets` | `[E+1]` | I32, DOMs of event e: `[o[e], o[e+1])` |
//! | `dom_sensor_id` | `[D]` | I16 (I32 when the geometry has larger ids) |
//! | `dom_pulse_offsets` | `[D+1]` | I32, pulses of DOM d: `[o[d], o[d+1])` |
//! | `pulse_time` | `[P]` | I64 ns (I32 when every value fits) |
//! | `pulse_charge` | `[P]` | F64 (F32 when exact, or with `--lossy`) |
//! | `pulse_auxiliary` | `[P]` | BOOL |
//!
//! Offsets are local to the shard and start at 0; a shard holds fewer than 2^31 DOMs and
//! pulses, so I32 offsets always hold them. Positions are not in the shard: each DOM's
//! `dom_sensor_id` is a row of the dataset's sensor table ([`super::sensor_table`]).

use serde::{Deserialize, Serialize};

use super::columns::{FloatColumn, IntColumn};
use super::names;
use super::pod::{try_cast, Pod};
use super::records::{ShardLayout, LAYOUT_KEY};
use super::safetensors::{Dtype, Element, Header, HeaderError, TensorInfo};
use super::{FORMAT, FORMAT_VERSION};
use crate::event::EventHeader;

/// The most DOMs or pulses one shard may hold: its offsets are I32.
pub const MAX_SHARD_ITEMS: u64 = i32::MAX as u64;

/// The storage type of each column whose width is decided per dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageTypes {
    /// `dom_sensor_id`: I16 or I32.
    pub sensor_id: Dtype,
    /// The sensor table's `sensor_position` (and a batch's `dom_position`): F32 or F64.
    pub position: Dtype,
    /// `pulse_time`: I32 or I64.
    pub time: Dtype,
    /// `pulse_charge`: F32 or F64.
    pub charge: Dtype,
    /// Whether the labels are stored.
    pub labels: bool,
}

/// What the manifest records of a written shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// File name inside the dataset directory.
    pub file: String,
    /// Events in the shard.
    pub events: u64,
    /// DOMs in the shard.
    pub doms: u64,
    /// Pulses in the shard.
    pub pulses: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// XXH3-64 of the whole file, hex.
    pub xxh3: String,
}

/// Why a shard (or the sensor table) was rejected: a caller can match on the kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardProblem {
    /// The safetensors container itself is malformed.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The file's `__metadata__` names another format or version.
    #[error("format {found:?} is not {FORMAT} version {FORMAT_VERSION}: convert the source again with this version of shardify")]
    Version {
        /// `format` and `format_version` as found (empty when absent).
        found: String,
    },
    /// A required tensor is absent.
    #[error("missing tensor `{0}`")]
    MissingTensor(&'static str),
    /// A tensor this format does not define.
    #[error("unexpected tensor `{0}`")]
    ExtraTensor(String),
    /// A tensor of the wrong element type.
    #[error("tensor `{tensor}` is {found:?}, expected {expected}")]
    Dtype {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        found: Dtype,
        /// What is accepted.
        expected: &'static str,
    },
    /// A tensor of the wrong shape.
    #[error("tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    Shape {
        /// The tensor.
        tensor: String,
        /// Its shape.
        found: Vec<usize>,
        /// The shape the other tensors imply.
        expected: Vec<usize>,
    },
    /// A tensor whose data is not aligned to its element size.
    #[error("tensor `{tensor}` is not aligned to its element size")]
    Misaligned {
        /// The tensor.
        tensor: String,
    },
    /// An offsets array whose first entry is not 0.
    #[error("`{tensor}` does not start at 0")]
    OffsetsStart {
        /// The offsets tensor.
        tensor: &'static str,
    },
    /// An offsets array that does not increase (an empty event or DOM, or going back).
    #[error("`{tensor}` is not increasing at index {index} (empty entry or decreasing)")]
    OffsetsNotIncreasing {
        /// The offsets tensor.
        tensor: &'static str,
        /// The first index `i` with `o[i+1] <= o[i]`.
        index: usize,
    },
    /// An offsets array whose last entry is not the length of the level it indexes.
    #[error("`{tensor}` ends at {found}, expected {expected}")]
    OffsetsEnd {
        /// The offsets tensor.
        tensor: &'static str,
        /// Its last entry.
        found: i64,
        /// The length of the indexed level.
        expected: usize,
    },
    /// A DOM whose sensor id is not a row of the sensor table.
    #[error("dom_sensor_id {sensor} (DOM {dom}) is outside the {rows}-row sensor table")]
    SensorOutsideTable {
        /// The DOM index in the shard.
        dom: usize,
        /// Its sensor id.
        sensor: i64,
        /// Rows of the sensor table.
        rows: usize,
    },
    /// The file's size differs from the manifest's record.
    #[error("is {found} bytes, the manifest says {expected}")]
    Size {
        /// Bytes on disk.
        found: u64,
        /// Bytes recorded.
        expected: u64,
    },
    /// A shard of another layout than the dataset's.
    #[error("is not a {} shard (the manifest's layout)", expected.name())]
    Layout {
        /// The layout the manifest gives.
        expected: ShardLayout,
    },
    /// A records shard whose `__metadata__` lacks a piece's width, or names a wrong one.
    #[error("`__metadata__` gives `{key}` as {found:?}, not a width records store")]
    RecordWidth {
        /// The metadata key.
        key: &'static str,
        /// Its value (empty when absent).
        found: String,
    },
    /// A record that contradicts the event columns or itself.
    #[error("the record of event {event}: {problem}")]
    Record {
        /// The event index in the shard.
        event: usize,
        /// What is wrong.
        problem: &'static str,
    },
    /// The event, DOM and pulse counts differ from the manifest's record.
    #[error("holds {found:?} events/DOMs/pulses, the manifest says {expected:?}")]
    Counts {
        /// Counts found.
        found: [u64; 3],
        /// Counts recorded.
        expected: [u64; 3],
    },
}

/// A validated safetensors header checked against the set of tensors a file may hold.
pub(crate) struct TensorCheck<'h> {
    header: &'h Header,
}

impl<'h> TensorCheck<'h> {
    /// Checks the format metadata and that every tensor is one of those `allowed` lists.
    pub(crate) fn new(header: &'h Header, allowed: &[&[&str]]) -> Result<Self, ShardProblem> {
        let format = header.metadata.get("format").map(String::as_str);
        let version = header.metadata.get("format_version").map(String::as_str);
        if format != Some(FORMAT) || version != Some(&FORMAT_VERSION.to_string()) {
            return Err(ShardProblem::Version {
                found: format!("{} {}", format.unwrap_or(""), version.unwrap_or("")),
            });
        }
        if let Some(extra) = header
            .tensors
            .keys()
            .find(|name| !allowed.iter().any(|list| list.contains(&name.as_str())))
        {
            return Err(ShardProblem::ExtraTensor(extra.clone()));
        }
        Ok(TensorCheck { header })
    }

    /// The tensor called `name`.
    pub(crate) fn info(&self, name: &'static str) -> Result<&'h TensorInfo, ShardProblem> {
        self.header
            .tensors
            .get(name)
            .ok_or(ShardProblem::MissingTensor(name))
    }

    /// Checks that tensor `name` has shape `expected`.
    pub(crate) fn shape(&self, name: &'static str, expected: &[usize]) -> Result<(), ShardProblem> {
        let info = self.info(name)?;
        if info.shape != expected {
            return Err(ShardProblem::Shape {
                tensor: name.into(),
                found: info.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }
}

/// A shard's tensors, checked one by one against the file's bytes.
pub(super) struct Tensors<'a> {
    bytes: &'a [u8],
    check: TensorCheck<'a>,
}

impl<'a> Tensors<'a> {
    /// The tensors of `bytes` (a whole file whose header is `header`), checking the format
    /// metadata and that each is one of those `allowed` lists.
    pub(super) fn new(
        bytes: &'a [u8],
        header: &'a Header,
        allowed: &[&[&str]],
    ) -> Result<Self, ShardProblem> {
        Ok(Tensors {
            bytes,
            check: TensorCheck::new(header, allowed)?,
        })
    }

    /// The length of the first dimension of tensor `name`.
    pub(super) fn len(&self, name: &'static str) -> Result<usize, ShardProblem> {
        Ok(self.check.info(name)?.shape.first().copied().unwrap_or(0))
    }

    fn dtype(&self, name: &'static str) -> Result<Dtype, ShardProblem> {
        Ok(self.check.info(name)?.dtype)
    }

    /// Tensor `name` of `shape` as elements of `T`.
    fn typed<T: Pod>(
        &self,
        name: &'static str,
        dtype: Dtype,
        shape: &[usize],
    ) -> Result<&'a [T], ShardProblem> {
        let info = self.check.info(name)?;
        if info.dtype != dtype {
            return Err(ShardProblem::Dtype {
                tensor: name.into(),
                found: info.dtype,
                expected: dtype.name(),
            });
        }
        self.check.shape(name, shape)?;
        try_cast::<T>(&self.bytes[info.range.clone()]).ok_or(ShardProblem::Misaligned {
            tensor: name.into(),
        })
    }

    pub(super) fn exact<T: Element>(
        &self,
        name: &'static str,
        len: usize,
    ) -> Result<&'a [T], ShardProblem> {
        self.typed(name, T::DTYPE, &[len])
    }

    fn ints(&self, name: &'static str, len: usize) -> Result<IntColumn<'a>, ShardProblem> {
        Ok(match self.dtype(name)? {
            Dtype::I16 => IntColumn::I16(self.typed(name, Dtype::I16, &[len])?),
            Dtype::I32 => IntColumn::I32(self.typed(name, Dtype::I32, &[len])?),
            Dtype::I64 => IntColumn::I64(self.typed(name, Dtype::I64, &[len])?),
            found => return Err(wrong_dtype(name, found, "I16, I32 or I64")),
        })
    }

    fn floats(&self, name: &'static str, len: usize) -> Result<FloatColumn<'a>, ShardProblem> {
        Ok(match self.dtype(name)? {
            Dtype::F32 => FloatColumn::F32(self.typed(name, Dtype::F32, &[len])?),
            Dtype::F64 => FloatColumn::F64(self.typed(name, Dtype::F64, &[len])?),
            found => return Err(wrong_dtype(name, found, "F32 or F64")),
        })
    }
}

fn wrong_dtype(tensor: &str, found: Dtype, expected: &'static str) -> ShardProblem {
    ShardProblem::Dtype {
        tensor: tensor.into(),
        found,
        expected,
    }
}

/// Checks that `offsets` start at 0, increase strictly and end at `total`.
pub(super) fn check_offsets(
    tensor: &'static str,
    offsets: &[i32],
    total: usize,
) -> Result<(), ShardProblem> {
    if offsets.first() != Some(&0) {
        return Err(ShardProblem::OffsetsStart { tensor });
    }
    if let Some(index) = offsets.windows(2).position(|w| w[1] <= w[0]) {
        return Err(ShardProblem::OffsetsNotIncreasing { tensor, index });
    }
    let last = *offsets.last().expect("starts at 0, so not empty");
    if last as i64 != total as i64 {
        return Err(ShardProblem::OffsetsEnd {
            tensor,
            found: last.into(),
            expected: total,
        });
    }
    Ok(())
}

/// The event-level tensors both layouts hold ([`EventTensors`]).
pub(super) const EVENT_TENSORS: [&str; 6] = [
    names::EVENT_ID,
    names::EVENT_BATCH_ID,
    names::EVENT_FIRST_ROW,
    names::EVENT_AZIMUTH,
    names::EVENT_ZENITH,
    names::EVENT_DOM_OFFSETS,
];

/// The tensors a columns shard holds besides [`EVENT_TENSORS`].
const COLUMN_TENSORS: [&str; 5] = [
    names::DOM_SENSOR_ID,
    names::DOM_PULSE_OFFSETS,
    names::PULSE_TIME,
    names::PULSE_CHARGE,
    names::PULSE_AUXILIARY,
];

/// The tensors a columns shard may hold.
const SHARD_TENSORS: [&[&str]; 2] = [&EVENT_TENSORS, &COLUMN_TENSORS];

/// The event-level tensors of a shard, the same in both layouts.
#[derive(Debug, Clone, Copy)]
pub struct EventTensors<'a> {
    /// `event_id`, `[E]`.
    pub id: &'a [i64],
    /// `event_batch_id`, `[E]`.
    pub batch_id: &'a [i64],
    /// `event_first_row`, `[E]`.
    pub first_row: &'a [i64],
    /// `event_azimuth`, `[E]` when labelled.
    pub azimuth: Option<&'a [f64]>,
    /// `event_zenith`, `[E]` when labelled.
    pub zenith: Option<&'a [f64]>,
    /// `event_dom_offsets`, `[E+1]`.
    pub dom_offsets: &'a [i32],
}

impl<'a> EventTensors<'a> {
    /// The event-level tensors of `t`, whose header is `header`, checked for their dtypes
    /// and shapes (the labels both or neither).
    pub(super) fn parse(t: &Tensors<'a>, header: &Header) -> Result<Self, ShardProblem> {
        let e = t.len(names::EVENT_ID)?;
        let labels = header.tensors.contains_key(names::EVENT_AZIMUTH)
            || header.tensors.contains_key(names::EVENT_ZENITH);
        let label = |name| -> Result<Option<&'a [f64]>, ShardProblem> {
            labels.then(|| t.exact::<f64>(name, e)).transpose()
        };
        Ok(EventTensors {
            id: t.exact(names::EVENT_ID, e)?,
            batch_id: t.exact(names::EVENT_BATCH_ID, e)?,
            first_row: t.exact(names::EVENT_FIRST_ROW, e)?,
            azimuth: label(names::EVENT_AZIMUTH)?,
            zenith: label(names::EVENT_ZENITH)?,
            dom_offsets: t.exact(names::EVENT_DOM_OFFSETS, e + 1)?,
        })
    }

    /// The header of event `e`.
    pub fn header(&self, e: usize) -> EventHeader {
        EventHeader {
            event_id: self.id[e],
            batch_id: self.batch_id[e],
            first_row: self.first_row[e] as u64,
            azimuth: self.azimuth.map_or(f64::NAN, |a| a[e]),
            zenith: self.zenith.map_or(f64::NAN, |z| z[e]),
        }
    }
}

/// How much of a shard's contents [`ShardView::parse`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validation {
    /// Everything: the structure, and a scan of every offset and sensor id (O(events +
    /// DOMs)).
    Full,
    /// The structure only (tensors, dtypes, shapes), for a shard checked fully once and
    /// immutable since.
    Structure,
}

/// Typed, validated views of a shard's tensors. Construction checks shapes and offsets, so
/// indexing through the offsets never goes out of bounds.
#[derive(Debug, Clone, Copy)]
pub struct ShardView<'a> {
    /// `[E]`.
    pub event_id: &'a [i64],
    /// `[E]`.
    pub event_batch_id: &'a [i64],
    /// `[E]`.
    pub event_first_row: &'a [i64],
    /// `[E]` when labelled.
    pub event_azimuth: Option<&'a [f64]>,
    /// `[E]` when labelled.
    pub event_zenith: Option<&'a [f64]>,
    /// `[E+1]`.
    pub event_dom_offsets: &'a [i32],
    /// `[D]`, rows of the sensor table.
    pub dom_sensor_id: IntColumn<'a>,
    /// `[D+1]`.
    pub dom_pulse_offsets: &'a [i32],
    /// `[P]`.
    pub pulse_time: IntColumn<'a>,
    /// `[P]`.
    pub pulse_charge: FloatColumn<'a>,
    /// `[P]`, 0 or 1.
    pub pulse_auxiliary: &'a [u8],
}

impl<'a> ShardView<'a> {
    /// Validates `bytes` (a whole shard file, whose header is `header`) and returns typed
    /// views into it; `sensor_rows` is the number of rows of the dataset's sensor table.
    pub fn parse(
        bytes: &'a [u8],
        header: &'a Header,
        sensor_rows: usize,
        validation: Validation,
    ) -> Result<ShardView<'a>, ShardProblem> {
        if header
            .metadata
            .get(LAYOUT_KEY)
            .is_some_and(|l| l != "columns")
        {
            return Err(ShardProblem::Layout {
                expected: ShardLayout::Columns,
            });
        }
        let t = Tensors::new(bytes, header, &SHARD_TENSORS)?;
        let events = EventTensors::parse(&t, header)?;
        let d = t.len(names::DOM_SENSOR_ID)?;
        let p = t.len(names::PULSE_TIME)?;
        let dom_pulse_offsets = t.exact::<i32>(names::DOM_PULSE_OFFSETS, d + 1)?;
        let dom_sensor_id = match t.ints(names::DOM_SENSOR_ID, d)? {
            IntColumn::I64(_) => {
                return Err(wrong_dtype(names::DOM_SENSOR_ID, Dtype::I64, "I16 or I32"))
            }
            narrow => narrow,
        };
        let event_dom_offsets = events.dom_offsets;
        let view = ShardView {
            event_id: events.id,
            event_batch_id: events.batch_id,
            event_first_row: events.first_row,
            event_azimuth: events.azimuth,
            event_zenith: events.zenith,
            event_dom_offsets,
            dom_sensor_id,
            dom_pulse_offsets,
            pulse_time: match t.ints(names::PULSE_TIME, p)? {
                IntColumn::I16(_) => {
                    return Err(wrong_dtype(names::PULSE_TIME, Dtype::I16, "I32 or I64"))
                }
                wide => wide,
            },
            pulse_charge: t.floats(names::PULSE_CHARGE, p)?,
            pulse_auxiliary: t.typed(names::PULSE_AUXILIARY, Dtype::BOOL, &[p])?,
        };
        if validation == Validation::Full {
            check_offsets(names::EVENT_DOM_OFFSETS, event_dom_offsets, d)?;
            check_offsets(names::DOM_PULSE_OFFSETS, dom_pulse_offsets, p)?;
            view.check_sensors(sensor_rows)?;
        }
        Ok(view)
    }

    /// Checks that every DOM's sensor id is a row of a `rows`-row sensor table.
    fn check_sensors(&self, rows: usize) -> Result<(), ShardProblem> {
        let outside = |s: i64| !(0..rows as i64).contains(&s);
        let found = match self.dom_sensor_id {
            IntColumn::I16(v) => v.iter().position(|&s| outside(s.into())),
            IntColumn::I32(v) => v.iter().position(|&s| outside(s.into())),
            IntColumn::I64(v) => v.iter().position(|&s| outside(s)),
        };
        match found {
            Some(dom) => Err(ShardProblem::SensorOutsideTable {
                dom,
                sensor: self.dom_sensor_id.get(dom),
                rows,
            }),
            None => Ok(()),
        }
    }

    /// The number of events.
    pub fn events(&self) -> usize {
        self.event_id.len()
    }

    /// The number of DOMs.
    pub fn doms(&self) -> usize {
        self.dom_sensor_id.len()
    }

    /// The number of pulses.
    pub fn pulses(&self) -> usize {
        self.pulse_time.len()
    }

    /// The DOM index range of event `e`.
    pub fn dom_range(&self, e: usize) -> std::ops::Range<usize> {
        self.event_dom_offsets[e] as usize..self.event_dom_offsets[e + 1] as usize
    }

    /// The pulse index range of event `e` (all its DOMs' pulses).
    pub fn event_pulse_range(&self, e: usize) -> std::ops::Range<usize> {
        let doms = self.dom_range(e);
        self.dom_pulse_offsets[doms.start] as usize..self.dom_pulse_offsets[doms.end] as usize
    }

    /// The pulse index range of DOM `d`.
    pub fn pulse_range(&self, d: usize) -> std::ops::Range<usize> {
        self.dom_pulse_offsets[d] as usize..self.dom_pulse_offsets[d + 1] as usize
    }

    /// The event-level tensors (those a records shard holds too).
    #[inline]
    pub fn event_tensors(&self) -> EventTensors<'a> {
        EventTensors {
            id: self.event_id,
            batch_id: self.event_batch_id,
            first_row: self.event_first_row,
            azimuth: self.event_azimuth,
            zenith: self.event_zenith,
            dom_offsets: self.event_dom_offsets,
        }
    }

    /// The header of event `e`.
    pub fn header(&self, e: usize) -> EventHeader {
        self.event_tensors().header(e)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::convert::shard_writer::{write_shard, ShardContents};
    use crate::event::RawEvent;
    use crate::format::format_metadata;
    use crate::format::safetensors::{self, Raw, TensorOut};
    use crate::pack::{PackedColumns, Packer};

    const SENSOR_ROWS: usize = 10;

    /// A valid shard of three events over sensors below [`SENSOR_ROWS`].
    pub(crate) fn valid_shard() -> Vec<u8> {
        let events: [&[(i32, i64)]; 3] = [
            &[(3, 10), (1, 12), (3, 15)],
            &[(9, 7)],
            &[(0, 5), (2, 5), (0, 6), (2, 9)],
        ];
        let (mut packer, mut packed) = (Packer::default(), PackedColumns::default());
        let mut headers = Vec::new();
        for (k, pulses) in events.iter().enumerate() {
            let event = RawEvent {
                header: None,
                sensor_id: pulses.iter().map(|p| p.0).collect(),
                time: pulses.iter().map(|p| p.1).collect(),
                charge: pulses.iter().map(|p| p.1 as f64 / 4.0).collect(),
                auxiliary: pulses.iter().map(|p| (p.1 % 2) as u8).collect(),
            };
            packer.pack(event.pulses(), &mut packed);
            headers.push(EventHeader {
                event_id: 100 + k as i64,
                batch_id: 1,
                first_row: 10 * k as u64,
                azimuth: 0.5,
                zenith: 1.5,
            });
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.safetensors");
        let contents = ShardContents {
            headers: &headers,
            parts: &[packed],
            types: StorageTypes {
                sensor_id: Dtype::I16,
                position: Dtype::F64,
                time: Dtype::I32,
                charge: Dtype::F32,
                labels: true,
            },
            metadata: format_metadata(BTreeMap::new()),
        };
        write_shard(&path, &contents).unwrap();
        std::fs::read(&path).unwrap()
    }

    fn parse_bytes(bytes: &[u8]) -> Result<usize, ShardProblem> {
        let header = safetensors::parse(bytes)?;
        let view = ShardView::parse(bytes, &header, SENSOR_ROWS, Validation::Full)?;
        Ok(view.events())
    }

    /// The tensors of `bytes` as (name, dtype, shape, data).
    type Parts = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

    fn parts(bytes: &[u8]) -> (BTreeMap<String, String>, Parts) {
        let header = safetensors::parse(bytes).unwrap();
        let parts = header
            .tensors
            .iter()
            .map(|(name, t)| {
                let data = bytes[t.range.clone()].to_vec();
                (name.clone(), t.dtype, t.shape.clone(), data)
            })
            .collect();
        (header.metadata, parts)
    }

    fn rebuild(metadata: &BTreeMap<String, String>, parts: &Parts) -> Vec<u8> {
        let raws: Vec<Raw> = parts.iter().map(|p| Raw(&p.3)).collect();
        let tensors: Vec<TensorOut> = parts
            .iter()
            .zip(&raws)
            .map(|(p, raw)| TensorOut {
                name: p.0.clone(),
                dtype: p.1,
                shape: p.2.clone(),
                data: raw,
            })
            .collect();
        let mut out = Vec::new();
        safetensors::write(&mut out, metadata, &tensors).unwrap();
        out
    }

    /// `bytes` with tensor `name` changed by `change` (its bytes, or anything else).
    fn altered(
        bytes: &[u8],
        name: &str,
        change: impl FnOnce(&mut (String, Dtype, Vec<usize>, Vec<u8>)),
    ) -> Vec<u8> {
        let (metadata, mut parts) = parts(bytes);
        change(parts.iter_mut().find(|p| p.0 == name).unwrap());
        rebuild(&metadata, &parts)
    }

    fn set_i32(data: &mut [u8], index: usize, value: i32) {
        data[4 * index..4 * index + 4].copy_from_slice(&value.to_le_bytes());
    }

    #[test]
    fn a_valid_shard_parses_with_i32_offsets_and_no_positions() {
        let bytes = valid_shard();
        assert_eq!(parse_bytes(&bytes), Ok(3));
        let header = safetensors::parse(&bytes).unwrap();
        assert_eq!(header.tensors[names::EVENT_DOM_OFFSETS].dtype, Dtype::I32);
        assert_eq!(header.tensors[names::DOM_PULSE_OFFSETS].dtype, Dtype::I32);
        assert!(!header.tensors.contains_key(names::DOM_POSITION));
        let view = ShardView::parse(&bytes, &header, SENSOR_ROWS, Validation::Full).unwrap();
        assert_eq!(view.event_dom_offsets, &[0, 2, 3, 5]);
        assert_eq!(view.dom_pulse_offsets, &[0, 2, 3, 4, 6, 8]);
    }

    #[test]
    fn every_structural_rejection_is_typed() {
        let bytes = valid_shard();
        let (metadata, all) = parts(&bytes);
        let without = |name: &str| {
            let kept: Parts = all.iter().filter(|p| p.0 != name).cloned().collect();
            rebuild(&metadata, &kept)
        };
        assert_eq!(
            parse_bytes(&without(names::PULSE_TIME)),
            Err(ShardProblem::MissingTensor(names::PULSE_TIME))
        );
        assert_eq!(
            parse_bytes(&without(names::EVENT_ZENITH)),
            Err(ShardProblem::MissingTensor(names::EVENT_ZENITH))
        );
        let mut extra = all.clone();
        extra.push(("dom_position".into(), Dtype::F64, vec![5, 3], vec![0; 120]));
        assert_eq!(
            parse_bytes(&rebuild(&metadata, &extra)),
            Err(ShardProblem::ExtraTensor("dom_position".into()))
        );
        let as_i64 = altered(&bytes, names::EVENT_DOM_OFFSETS, |p| {
            p.1 = Dtype::I64;
            p.2 = vec![2];
        });
        assert_eq!(
            parse_bytes(&as_i64),
            Err(ShardProblem::Dtype {
                tensor: names::EVENT_DOM_OFFSETS.into(),
                found: Dtype::I64,
                expected: "I32",
            })
        );
        let bool_time = altered(&bytes, names::PULSE_TIME, |p| {
            p.1 = Dtype::BOOL;
            p.2 = vec![32];
        });
        assert!(matches!(
            parse_bytes(&bool_time),
            Err(ShardProblem::Dtype {
                found: Dtype::BOOL,
                ..
            })
        ));
        let wide_sensor = altered(&bytes, names::DOM_SENSOR_ID, |p| {
            p.1 = Dtype::I64;
            p.3 = vec![0; 5 * 8];
        });
        assert_eq!(
            parse_bytes(&wide_sensor),
            Err(ShardProblem::Dtype {
                tensor: names::DOM_SENSOR_ID.into(),
                found: Dtype::I64,
                expected: "I16 or I32",
            })
        );
        let short = altered(&bytes, names::PULSE_CHARGE, |p| {
            p.2 = vec![7];
            p.3.truncate(28);
        });
        assert_eq!(
            parse_bytes(&short),
            Err(ShardProblem::Shape {
                tensor: names::PULSE_CHARGE.into(),
                found: vec![7],
                expected: vec![8],
            })
        );
        let two_d = altered(&bytes, names::EVENT_ID, |p| p.2 = vec![3, 1]);
        assert!(matches!(
            parse_bytes(&two_d),
            Err(ShardProblem::Shape { .. })
        ));
        let mut old = metadata.clone();
        old.insert("format_version".into(), "1".into());
        assert_eq!(
            parse_bytes(&rebuild(&old, &all)),
            Err(ShardProblem::Version {
                found: "shardify 1".into()
            })
        );
        assert_eq!(
            parse_bytes(&rebuild(&BTreeMap::new(), &all)),
            Err(ShardProblem::Version { found: " ".into() })
        );
        assert!(matches!(
            parse_bytes(&bytes[..bytes.len() - 1]),
            Err(ShardProblem::Header(HeaderError::OutsideData { .. }))
        ));
    }

    #[test]
    fn misaligned_data_is_rejected() {
        // One byte before everything shifts every wider tensor off its alignment.
        let (metadata, mut all) = parts(&valid_shard());
        all.push(("a".into(), Dtype::U8, vec![1], vec![7]));
        let raws: Vec<Raw> = all.iter().map(|p| Raw(&p.3)).collect();
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!(metadata));
        let mut offset = 0;
        let mut order: Vec<usize> = (0..all.len()).collect();
        order.sort_by_key(|&i| (all[i].0 != "a", i));
        for &i in &order {
            let p = &all[i];
            header.insert(
                p.0.clone(),
                serde_json::json!({"dtype": p.1.name(), "shape": p.2, "data_offsets": [offset, offset + p.3.len()]}),
            );
            offset += p.3.len();
        }
        let text = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
        let mut file = (text.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(&text);
        let padding = (8 + text.len()).next_multiple_of(64) - (8 + text.len());
        file.splice(
            8 + text.len()..8 + text.len(),
            std::iter::repeat_n(b' ', padding),
        );
        file[..8].copy_from_slice(&((text.len() + padding) as u64).to_le_bytes());
        for &i in &order {
            file.extend_from_slice(raws[i].0);
        }
        let header = safetensors::parse(&file).unwrap();
        let problem = TensorCheck::new(&header, &[&["a"]]);
        assert!(matches!(problem, Err(ShardProblem::ExtraTensor(_))));
        let t = Tensors {
            bytes: &file,
            check: TensorCheck::new(&header, &[&EVENT_TENSORS, &COLUMN_TENSORS, &["a"]]).unwrap(),
        };
        assert_eq!(
            t.exact::<i64>(names::EVENT_ID, 3).unwrap_err(),
            ShardProblem::Misaligned {
                tensor: names::EVENT_ID.into()
            }
        );
    }

    #[test]
    fn every_offset_rejection_is_typed() {
        let bytes = valid_shard();
        let offsets = |name: &'static str, index, value| {
            altered(&bytes, name, |p| set_i32(&mut p.3, index, value))
        };
        assert_eq!(
            parse_bytes(&offsets(names::EVENT_DOM_OFFSETS, 0, 1)),
            Err(ShardProblem::OffsetsStart {
                tensor: names::EVENT_DOM_OFFSETS
            })
        );
        assert_eq!(
            parse_bytes(&offsets(names::EVENT_DOM_OFFSETS, 2, 1)),
            Err(ShardProblem::OffsetsNotIncreasing {
                tensor: names::EVENT_DOM_OFFSETS,
                index: 1
            })
        );
        assert_eq!(
            parse_bytes(&offsets(names::DOM_PULSE_OFFSETS, 2, 2)),
            Err(ShardProblem::OffsetsNotIncreasing {
                tensor: names::DOM_PULSE_OFFSETS,
                index: 1
            })
        );
        assert_eq!(
            parse_bytes(&offsets(names::DOM_PULSE_OFFSETS, 5, 9)),
            Err(ShardProblem::OffsetsEnd {
                tensor: names::DOM_PULSE_OFFSETS,
                found: 9,
                expected: 8
            })
        );
        assert_eq!(
            parse_bytes(&offsets(names::EVENT_DOM_OFFSETS, 3, 4)),
            Err(ShardProblem::OffsetsEnd {
                tensor: names::EVENT_DOM_OFFSETS,
                found: 4,
                expected: 5
            })
        );
        let outside = altered(&bytes, names::DOM_SENSOR_ID, |p| {
            p.3[4..6].copy_from_slice(&(SENSOR_ROWS as i16).to_le_bytes())
        });
        assert_eq!(
            parse_bytes(&outside),
            Err(ShardProblem::SensorOutsideTable {
                dom: 2,
                sensor: SENSOR_ROWS as i64,
                rows: SENSOR_ROWS
            })
        );
        let negative = altered(&bytes, names::DOM_SENSOR_ID, |p| {
            p.3[0..2].copy_from_slice(&(-1i16).to_le_bytes())
        });
        assert!(matches!(
            parse_bytes(&negative),
            Err(ShardProblem::SensorOutsideTable {
                dom: 0,
                sensor: -1,
                ..
            })
        ));
    }

    /// Reads everything a valid view promises: every event's DOMs and pulses.
    fn touch_everything(view: &ShardView) -> u64 {
        let mut sum = 0u64;
        for e in 0..view.events() {
            let header = view.header(e);
            sum = sum.wrapping_add(header.event_id as u64);
            for d in view.dom_range(e) {
                sum = sum.wrapping_add(view.dom_sensor_id.get(d) as u64);
                for p in view.pulse_range(d) {
                    sum = sum.wrapping_add(view.pulse_time.get(p) as u64);
                    sum = sum.wrapping_add(view.pulse_charge.get(p).to_bits());
                    sum = sum.wrapping_add(u64::from(view.pulse_auxiliary[p]));
                }
            }
            assert!(view.event_pulse_range(e).end <= view.pulses());
        }
        sum
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Any damage to the header or the body ends in a typed error or a view whose every
        /// offset is safe to follow, never in a panic (the checksum would be recomputed by
        /// whoever damaged it, so only the parser stands in the way).
        #[test]
        fn damaged_shards_give_typed_errors_never_panics(
            damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            in_header in any::<bool>(),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let mut bytes = valid_shard();
            let header_len = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let text_len = bytes[8..header_len].iter().rposition(|&b| b != b' ').unwrap() + 9;
            for (at, value) in damage {
                let at = if in_header { at.index(text_len) } else { header_len + at.index(bytes.len() - header_len) };
                bytes[at] = value;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len()));
            }
            if let Ok(header) = safetensors::parse(&bytes) {
                if let Ok(view) = ShardView::parse(&bytes, &header, SENSOR_ROWS, Validation::Full) {
                    touch_everything(&view);
                    for d in 0..view.doms() {
                        prop_assert!((0..SENSOR_ROWS as i64).contains(&view.dom_sensor_id.get(d)));
                    }
                }
            }
        }
    }
}
