//! `shardify.Dataset`: an opened dataset directory, or a view of a part of its events (a
//! split).

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shardify::convert::Silent;
use shardify::dataset::{copy, ChecksumPolicy, Dataset, View};
use shardify::format::ShardLayout;
use shardify::resident::gather_view_shard;
use shardify::Error;

use crate::array::{numpy_name, PyHostArray};
use crate::errors::to_py;

/// An opened dataset (its manifest checked, its shards mapped on first use), or a part of
/// its events.
#[pyclass(name = "Dataset", module = "shardify._native", frozen)]
pub struct PyDataset {
    /// The events, shared with the loaders reading them.
    pub view: View,
}

fn checksum_policy(name: &str) -> Result<ChecksumPolicy, Error> {
    match name {
        "full" => Ok(ChecksumPolicy::Full),
        "lazy" => Ok(ChecksumPolicy::Lazy),
        "off" => Ok(ChecksumPolicy::Off),
        other => Err(Error::config(
            "checksums",
            format!("`{other}`: expected \"full\", \"lazy\" or \"off\""),
        )),
    }
}

impl PyDataset {
    fn dataset(&self) -> &Arc<Dataset> {
        self.view.dataset()
    }
}

#[pymethods]
impl PyDataset {
    /// Opens the dataset directory `path`; `checksums` is when shard checksums are checked:
    /// "full" (all, now), "lazy" (each shard when first read) or "off".
    #[new]
    #[pyo3(signature = (path, checksums = "lazy"))]
    fn new(py: Python<'_>, path: PathBuf, checksums: &str) -> PyResult<Self> {
        let policy = checksum_policy(checksums).map_err(to_py)?;
        let dataset = crate::log::detached(py, || Dataset::open(&path, policy))?.map_err(to_py)?;
        Ok(PyDataset {
            view: View::from(Arc::new(dataset)),
        })
    }

    /// Splits the events in two disjoint views (see `shardify::dataset::View::split`):
    /// (the rest, `round(fraction * events)` chosen by a hash of their event id and `seed`).
    fn split(&self, py: Python<'_>, fraction: f64, seed: u64) -> PyResult<(Self, Self)> {
        let view = &self.view;
        let (rest, chosen) = py.detach(|| view.split(fraction, seed)).map_err(to_py)?;
        Ok((PyDataset { view: rest }, PyDataset { view: chosen }))
    }

    /// Which events this holds (`shardify::dataset::View::identity`): the same for a copy
    /// at any path or in either layout, another for another conversion or split.
    #[getter]
    fn identity(&self) -> String {
        self.view.identity()
    }

    /// Whether this holds every event of its dataset (not a split).
    #[getter]
    fn whole(&self) -> bool {
        self.view.is_whole()
    }

    /// Events.
    #[getter]
    fn events(&self) -> u64 {
        self.view.totals().events
    }

    /// DOMs (one row per hit sensor per event).
    #[getter]
    fn doms(&self) -> u64 {
        self.view.totals().doms
    }

    /// Pulses.
    #[getter]
    fn pulses(&self) -> u64 {
        self.view.totals().pulses
    }

    /// Per shard (manifest order): (events, DOMs, pulses) this holds of it.
    fn shard_counts(&self) -> Vec<(u64, u64, u64)> {
        self.view
            .shard_counts()
            .iter()
            .map(|c| (c.events, c.doms, c.pulses))
            .collect()
    }

    /// Shard files.
    #[getter]
    fn shards(&self) -> usize {
        self.dataset().shard_count()
    }

    /// Whether the events carry azimuth and zenith (the train split does, test does not).
    #[getter]
    fn labels(&self) -> bool {
        self.dataset().manifest().schema.types.labels
    }

    /// The dataset directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.dataset().dir().to_path_buf()
    }

    /// The manifest as JSON text (the Python layer parses it once).
    fn manifest_json(&self) -> PyResult<String> {
        serde_json::to_string(self.dataset().manifest())
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
    }

    /// The sensor table's bytes (x, y, z per row, row = sensor id, little-endian) and
    /// their numpy dtype name ("float32" or "float64").
    fn sensor_positions<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, &'static str) {
        let (bytes, dtype) = self.dataset().sensor_table().column().raw();
        (PyBytes::new(py, bytes), numpy_name(dtype))
    }

    /// Every event id this holds, in stored order (the shards concatenated in manifest
    /// order), as an int64 host array; reading it opens (and, per the policy, checksums)
    /// every shard.
    fn event_ids(&self, py: Python<'_>) -> PyResult<PyHostArray> {
        let view = &self.view;
        let ids = py
            .detach(|| -> Result<Vec<i64>, Error> {
                let mut ids = Vec::with_capacity(view.totals().events as usize);
                for shard in 0..view.dataset().shard_count() {
                    let stored = view.dataset().shard(shard)?.stored()?;
                    let column = stored.event_tensors().id;
                    match view.kept(shard) {
                        Some(kept) => ids.extend(kept.iter().map(|i| column[i as usize])),
                        None => ids.extend_from_slice(column),
                    }
                }
                Ok(ids)
            })
            .map_err(to_py)?;
        Ok(PyHostArray::owned(ids))
    }

    /// Shard `shard`'s tensors as read-only host arrays (name, array): of a whole dataset
    /// of columns shards, the shard file's tensors viewing its memory map (no copy), the
    /// shard validated (and checksummed, per the policy) when first opened; of a split, or
    /// of a records shard, the columns of the events it keeps there, gathered into host
    /// memory (a packed batch of them in stored order, offsets from 0).
    fn shard_tensors(&self, py: Python<'_>, shard: usize) -> PyResult<Vec<(String, PyHostArray)>> {
        let dataset = self.dataset();
        if shard >= dataset.shard_count() {
            return Err(to_py(Error::config(
                "shard",
                format!("{shard}: the dataset has {} shards", dataset.shard_count()),
            )));
        }
        // Opening (validating, checksumming) takes a while: without the GIL.
        let layout = py
            .detach(|| dataset.shard(shard).map(|s| s.layout()))
            .map_err(to_py)?;
        if !self.view.is_whole() || layout == ShardLayout::Records {
            let view = &self.view;
            let (sections, memory) = py
                .detach(|| gather_view_shard(view, shard))
                .map_err(to_py)?;
            return Ok(PyHostArray::sections(sections, memory));
        }
        let file = dataset.shard(shard).map_err(to_py)?; // open now: no work
        let mut tensors: Vec<_> = file.header().tensors.iter().collect();
        tensors.sort_by_key(|(_, info)| info.range.start);
        Ok(tensors
            .into_iter()
            .map(|(name, info)| {
                let bytes = &file.bytes()[info.range.clone()];
                let array =
                    PyHostArray::in_dataset(dataset.clone(), bytes, info.dtype, info.shape.clone());
                (name.clone(), array)
            })
            .collect())
    }

    fn __len__(&self) -> usize {
        self.view.totals().events as usize
    }

    fn __repr__(&self) -> String {
        let part = if self.view.is_whole() {
            ""
        } else {
            "a split of "
        };
        format!(
            "shardify.Dataset({part}{:?}: {} events, {} shards)",
            self.dataset().dir(),
            self.view.totals().events,
            self.dataset().shard_count()
        )
    }
}

/// Copies the dataset in `source` to `destination` (absent, empty, or holding this copy
/// stopped or finished), every file checked against its checksum on the way, its shards
/// written again in `layout` (`"columns"` or `"records"`) when given
/// (`shardify::dataset::copy`), a finished copy read file by file and repaired with
/// `check`; returns the dataset's shards and bytes, the bytes written,
/// the outcome's name, the files kept and the seconds it took.
#[pyfunction]
#[pyo3(signature = (source, destination, layout=None, check=false))]
pub fn copy_dataset(
    py: Python<'_>,
    source: PathBuf,
    destination: PathBuf,
    layout: Option<&str>,
    check: bool,
) -> PyResult<(usize, u64, u64, &'static str, usize, f64)> {
    let layout = layout
        .map(|name| {
            ShardLayout::from_name(name).ok_or_else(|| {
                Error::config(
                    "layout",
                    format!("{name:?}: expected \"columns\" or \"records\""),
                )
            })
        })
        .transpose()
        .map_err(to_py)?;
    let report = loop {
        let options = copy::CopyOptions { layout, check };
        let report = crate::log::detached(py, || {
            copy::copy_dataset_with(&source, &destination, &options, &Silent)
        })?;
        match report {
            // A signal ended a wait for another copy: Ctrl-C raises `KeyboardInterrupt`;
            // after any other signal Python handled, the copy (safe to run again) goes on.
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::Interrupted => {
                py.check_signals()?;
            }
            report => break report.map_err(to_py)?,
        }
    };
    Ok((
        report.shards,
        report.bytes,
        report.written,
        report.outcome.name(),
        report.kept,
        report.seconds,
    ))
}
