//! The loaders a typical project writes, reading the source Parquet directly, for
//! comparison in the same run:
//! - [`SourceIndex::run_naive`]: a map-style dataset with per-event random access over the batch files, an
//!   LRU cache of a few decoded files and a global random permutation (PyTorch `Dataset` +
//!   shuffled `DataLoader`): once the files outnumber the cache, nearly every event decodes
//!   a whole file;
//! - [`SourceIndex::run_block_shuffle`]: file-aware: shuffle the file order, decode one file at a time,
//!   shuffle the events inside it.
//!
//! Both collate each batch into fresh column vectors, as Python collate functions do.

use std::time::Instant;

use super::quality::EventInfo;
use crate::error::Result;
use crate::rng::Rng;
use crate::source::batch::{DECODE_BATCH_ROWS, PULSE_COLUMNS};
use crate::source::columns::ParquetSource;
use crate::source::meta::MetaByBatch;
use crate::source::{has_labels, InputSet};

/// One event of the source: its file, rows and what the metrics need.
#[derive(Debug, Clone, Copy)]
struct SourceEvent {
    file: usize,
    rows: (usize, usize),
    info: EventInfo,
}

/// The events of a source, in stored (file, row) order.
pub struct SourceIndex {
    inputs: InputSet,
    events: Vec<SourceEvent>,
}

/// One decoded batch file: the pulse columns.
struct DecodedFile {
    sensor: Vec<i64>,
    time: Vec<i64>,
    charge: Vec<f64>,
    auxiliary: Vec<u8>,
}

fn decode(path: &std::path::Path) -> Result<DecodedFile> {
    let mut f = DecodedFile {
        sensor: Vec::new(),
        time: Vec::new(),
        charge: Vec::new(),
        auxiliary: Vec::new(),
    };
    for columns in ParquetSource::open(path)?.read(&PULSE_COLUMNS, None, DECODE_BATCH_ROWS)? {
        let c = columns?;
        f.sensor.extend_from_slice(c.int(0));
        f.time.extend_from_slice(c.int(1));
        f.charge.extend_from_slice(c.float(2));
        f.auxiliary.extend(c.bool(3).iter().map(|&a| u8::from(a)));
    }
    Ok(f)
}

/// A collated batch: fresh vectors, as a Python collate function builds.
#[derive(Default)]
struct Collated {
    offsets: Vec<i64>,
    sensor: Vec<i16>,
    time: Vec<i64>,
    charge: Vec<f64>,
    auxiliary: Vec<u8>,
}

impl Collated {
    fn push(&mut self, file: &DecodedFile, rows: (usize, usize)) {
        let r = rows.0..rows.1 + 1;
        self.sensor
            .extend(file.sensor[r.clone()].iter().map(|&s| s as i16));
        self.time.extend_from_slice(&file.time[r.clone()]);
        self.charge.extend_from_slice(&file.charge[r.clone()]);
        self.auxiliary.extend_from_slice(&file.auxiliary[r]);
        self.offsets.push(self.time.len() as i64);
    }

    /// Adds this batch's events, pulses and bytes to `t`.
    fn count_into(&self, t: &mut Throughput) {
        t.events += self.offsets.len() as u64;
        t.pulses += self.time.len() as u64;
        t.bytes += self.bytes() as u64;
    }

    fn bytes(&self) -> usize {
        self.offsets.len() * 8
            + self.sensor.len() * 2
            + self.time.len() * 8
            + self.charge.len() * 8
            + self.auxiliary.len()
    }
}

/// Throughput of a run: what was delivered and how long it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Throughput {
    /// Events delivered.
    pub events: u64,
    /// Pulses delivered.
    pub pulses: u64,
    /// Bytes delivered (collated batch payload).
    pub bytes: u64,
    /// Seconds.
    pub seconds: f64,
}

impl Throughput {
    /// Bytes delivered per second, in GB/s.
    pub fn gb_per_s(&self) -> f64 {
        super::gb_per_s(self.bytes, self.seconds)
    }
}

impl SourceIndex {
    /// Reads the meta of every batch file of `inputs`.
    pub fn new(inputs: &InputSet) -> Result<SourceIndex> {
        let labels = has_labels(&inputs.meta)?;
        let ids: Vec<i64> = inputs.batches.iter().map(|b| b.batch_id).collect();
        let mut metas = MetaByBatch::new(&inputs.meta, &ids, labels)?;
        let mut events = Vec::new();
        for (file, batch) in inputs.batches.iter().enumerate() {
            for m in metas.take(batch.batch_id)?.rows {
                let info = EventInfo {
                    event_id: m.event_id,
                    source_file: batch.batch_id,
                    zenith: m.zenith,
                    stored_position: events.len() as u64,
                    pulses: (m.last_row - m.first_row + 1) as u64,
                };
                events.push(SourceEvent {
                    file,
                    rows: (m.first_row as usize, m.last_row as usize),
                    info,
                });
            }
        }
        Ok(SourceIndex {
            inputs: inputs.clone(),
            events,
        })
    }

    /// Events in the source.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the source has no events.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The naive loader's order for `epoch`: a global permutation, cut into batches.
    pub fn naive_order(&self, seed: u64, epoch: u64, batch: usize) -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..self.events.len()).collect();
        Rng::stream(seed, epoch).shuffle(&mut order);
        order.chunks(batch).map(<[usize]>::to_vec).collect()
    }

    /// The block-shuffle loader's order for `epoch`: files shuffled, events shuffled inside
    /// each file, cut into batches (a batch may span two files).
    pub fn block_shuffle_order(&self, seed: u64, epoch: u64, batch: usize) -> Vec<Vec<usize>> {
        let mut rng = Rng::stream(seed, epoch);
        let mut files: Vec<usize> = (0..self.inputs.batches.len()).collect();
        rng.shuffle(&mut files);
        let mut order = Vec::with_capacity(self.events.len());
        for f in files {
            let start = order.len();
            order.extend((0..self.events.len()).filter(|&i| self.events[i].file == f));
            rng.shuffle(&mut order[start..]);
        }
        order.chunks(batch).map(<[usize]>::to_vec).collect()
    }

    /// The metric view of an order.
    pub fn infos(&self, order: &[Vec<usize>]) -> Vec<Vec<EventInfo>> {
        order
            .iter()
            .map(|b| b.iter().map(|&i| self.events[i].info).collect())
            .collect()
    }

    /// Runs the naive loader over `order` with an LRU cache of `cache_files` decoded files,
    /// for at most `budget_s` seconds (it can take hours on a large dataset).
    pub fn run_naive(
        &self,
        order: &[Vec<usize>],
        cache_files: usize,
        budget_s: f64,
    ) -> Result<Throughput> {
        let started = Instant::now();
        let mut cache: Vec<(usize, DecodedFile)> = Vec::new();
        let mut t = Throughput::default();
        'batches: for batch in order {
            let mut collated = Collated::default();
            for &i in batch {
                if started.elapsed().as_secs_f64() > budget_s {
                    // One batch can take minutes here: stop, counting the events so far.
                    collated.count_into(&mut t);
                    break 'batches;
                }
                let e = self.events[i];
                let hit = cache.iter().position(|(f, _)| *f == e.file);
                let slot = match hit {
                    Some(k) => {
                        let entry = cache.remove(k);
                        cache.push(entry);
                        cache.len() - 1
                    }
                    None => {
                        if cache.len() == cache_files.max(1) {
                            cache.remove(0);
                        }
                        cache.push((e.file, decode(&self.inputs.batches[e.file].path)?));
                        cache.len() - 1
                    }
                };
                collated.push(&cache[slot].1, e.rows);
            }
            collated.count_into(&mut t);
            if started.elapsed().as_secs_f64() > budget_s {
                break;
            }
        }
        t.seconds = started.elapsed().as_secs_f64();
        Ok(t)
    }

    /// Runs the block-shuffle loader over `order` (one decoded file at a time), for at most
    /// `budget_s` seconds.
    pub fn run_block_shuffle(&self, order: &[Vec<usize>], budget_s: f64) -> Result<Throughput> {
        let started = Instant::now();
        let mut current: Option<(usize, DecodedFile)> = None;
        let mut t = Throughput::default();
        for batch in order {
            let mut collated = Collated::default();
            for &i in batch {
                let e = self.events[i];
                if current.as_ref().is_none_or(|(f, _)| *f != e.file) {
                    current = Some((e.file, decode(&self.inputs.batches[e.file].path)?));
                }
                collated.push(&current.as_ref().expect("decoded").1, e.rows);
            }
            collated.count_into(&mut t);
            if started.elapsed().as_secs_f64() > budget_s {
                break;
            }
        }
        t.seconds = started.elapsed().as_secs_f64();
        Ok(t)
    }
}
