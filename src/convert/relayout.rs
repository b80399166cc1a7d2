//! A shard written again in a given layout ([`ShardLayout`]) from a validated view of its
//! columns: a columns shard's own view, or a records shard's decoded columns. `shardify
//! copy --layout` and `shardify convert --layout records` write their shards this way.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use super::shard_writer::write_tensors;
use crate::error::{Error, IoContext, Result};
use crate::format::columns::element_range;
use crate::format::names;
use crate::format::pod::as_bytes;
use crate::format::records::{RecordWidths, LAYOUT_KEY};
use crate::format::safetensors::{self, Dtype, Raw, TensorBytes, TensorOut};
use crate::format::{ShardEntry, ShardLayout, ShardProblem, ShardView, Validation};

/// Bytes of records encoded before each write.
const RECORDS_CHUNK: usize = 1 << 20;

/// The `__metadata__` keys that describe a layout (replaced by the writer's own).
const LAYOUT_KEYS: [&str; 4] = [
    LAYOUT_KEY,
    names::DOM_SENSOR_ID,
    names::PULSE_TIME,
    names::PULSE_CHARGE,
];

/// The widths of `view`'s records.
pub fn record_widths(view: &ShardView) -> RecordWidths {
    RecordWidths {
        sensor_id: view.dom_sensor_id.raw().1,
        time: view.pulse_time.raw().1,
        charge: view.pulse_charge.raw().1,
        labels: view.event_azimuth.is_some() && view.event_zenith.is_some(),
    }
}

/// Appends event `e`'s record ([`crate::format::records`]) to `out`.
fn encode_record(view: &ShardView, widths: RecordWidths, e: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&view.event_id[e].to_le_bytes());
    if let (true, Some(azimuth), Some(zenith)) =
        (widths.labels, view.event_azimuth, view.event_zenith)
    {
        out.extend_from_slice(&azimuth[e].to_le_bytes());
        out.extend_from_slice(&zenith[e].to_le_bytes());
    }
    let (doms, pulses) = (view.dom_range(e), view.event_pulse_range(e));
    out.extend_from_slice(element_range(view.dom_sensor_id.raw(), doms.clone()));
    let first = pulses.start as i32;
    for &end in &view.dom_pulse_offsets[doms.start + 1..=doms.end] {
        out.extend_from_slice(&(end - first).to_le_bytes());
    }
    out.extend_from_slice(element_range(view.pulse_time.raw(), pulses.clone()));
    out.extend_from_slice(element_range(view.pulse_charge.raw(), pulses.clone()));
    out.extend_from_slice(&view.pulse_auxiliary[pulses]);
}

/// Every event's record of a view, encoded while written.
struct Records<'v> {
    view: &'v ShardView<'v>,
    widths: RecordWidths,
}

impl TensorBytes for Records<'_> {
    fn byte_len(&self) -> usize {
        let v = self.view;
        self.widths.start(v.events(), v.doms(), v.pulses())
    }

    fn write_to(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let mut chunk = Vec::with_capacity(2 * RECORDS_CHUNK);
        for e in 0..self.view.events() {
            encode_record(self.view, self.widths, e, &mut chunk);
            if chunk.len() >= RECORDS_CHUNK {
                out.write_all(&chunk)?;
                chunk.clear();
            }
        }
        out.write_all(&chunk)
    }
}

/// Writes the columns shard at `source` (validated in its structure: a records shard is
/// refused) to `target` in `layout`, as [`write_view`] does; returns `target`'s manifest
/// entry. Shards of a dataset go through [`crate::dataset::Shard::columns`] instead.
pub fn rewrite_file(source: &Path, target: &Path, layout: ShardLayout) -> Result<ShardEntry> {
    let file = std::fs::File::open(source).at(source)?;
    // SAFETY: a read-only map of a file this process wrote and renamed into place, which
    // nothing writes while the map lives (it is removed after).
    let map = unsafe { memmap2::Mmap::map(&file) }.at(source)?;
    crate::dataset::fault_report::report_faults_on_mapped_files();
    let header =
        safetensors::parse(&map).map_err(|p| Error::shard(source, ShardProblem::from(p)))?;
    let view = ShardView::parse(&map, &header, 0, Validation::Structure)
        .map_err(|p| Error::shard(source, p))?;
    write_view(target, &view, &header.metadata, layout)
}

/// Writes the shard `view` describes to `path` in `layout`, atomically (the fsync is the
/// caller's), with `metadata` (the source shard's: its layout's own keys are replaced);
/// returns its manifest entry.
pub fn write_view(
    path: &Path,
    view: &ShardView,
    metadata: &BTreeMap<String, String>,
    layout: ShardLayout,
) -> Result<ShardEntry> {
    let (e, d, p) = (view.events(), view.doms(), view.pulses());
    let mut metadata = metadata.clone();
    metadata.retain(|key, _| !LAYOUT_KEYS.contains(&key.as_str()));
    let widths = record_widths(view);
    let mut events = vec![
        (names::EVENT_ID, Dtype::I64, as_bytes(view.event_id)),
        (
            names::EVENT_BATCH_ID,
            Dtype::I64,
            as_bytes(view.event_batch_id),
        ),
        (
            names::EVENT_FIRST_ROW,
            Dtype::I64,
            as_bytes(view.event_first_row),
        ),
        (
            names::EVENT_DOM_OFFSETS,
            Dtype::I32,
            as_bytes(view.event_dom_offsets),
        ),
    ];
    if let (true, Some(azimuth), Some(zenith)) =
        (widths.labels, view.event_azimuth, view.event_zenith)
    {
        events.push((names::EVENT_AZIMUTH, Dtype::F64, as_bytes(azimuth)));
        events.push((names::EVENT_ZENITH, Dtype::F64, as_bytes(zenith)));
    }
    let pulse_offsets: Vec<i32>;
    let records = Records { view, widths };
    let mut extra: Vec<TensorOut> = Vec::new();
    match layout {
        ShardLayout::Columns => {
            let (sensor, time, charge) = (
                view.dom_sensor_id.raw(),
                view.pulse_time.raw(),
                view.pulse_charge.raw(),
            );
            events.extend([
                (names::DOM_SENSOR_ID, sensor.1, sensor.0),
                (
                    names::DOM_PULSE_OFFSETS,
                    Dtype::I32,
                    as_bytes(view.dom_pulse_offsets),
                ),
                (names::PULSE_TIME, time.1, time.0),
                (names::PULSE_CHARGE, charge.1, charge.0),
                (names::PULSE_AUXILIARY, Dtype::BOOL, view.pulse_auxiliary),
            ]);
        }
        ShardLayout::Records => {
            pulse_offsets = view
                .event_dom_offsets
                .iter()
                .map(|&d| view.dom_pulse_offsets[d as usize])
                .collect();
            events.push((
                names::EVENT_PULSE_OFFSETS,
                Dtype::I32,
                as_bytes(&pulse_offsets),
            ));
            metadata.insert(LAYOUT_KEY.into(), layout.name().into());
            for (key, dtype) in [
                (names::DOM_SENSOR_ID, widths.sensor_id),
                (names::PULSE_TIME, widths.time),
                (names::PULSE_CHARGE, widths.charge),
            ] {
                metadata.insert(key.into(), dtype.name().into());
            }
            extra.push(TensorOut {
                name: names::EVENT_RECORDS.into(),
                dtype: Dtype::U8,
                shape: vec![records.byte_len()],
                data: &records,
            });
        }
    }
    let raws: Vec<(&str, Dtype, Raw)> = events
        .into_iter()
        .map(|(name, dtype, bytes)| (name, dtype, Raw(bytes)))
        .collect();
    let mut tensors: Vec<TensorOut> = raws
        .iter()
        .map(|(name, dtype, raw)| TensorOut {
            name: name.to_string(),
            dtype: *dtype,
            shape: vec![raw.0.len() / dtype.size()],
            data: raw,
        })
        .collect();
    tensors.append(&mut extra);
    write_tensors(path, &metadata, &tensors, [e, d, p])
}
