//! `shardify.Dataset`: an opened dataset directory.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::Error;

use crate::array::{numpy_name, PyHostArray};
use crate::errors::to_py;

/// An opened dataset: its manifest checked, its shards mapped on first use.
#[pyclass(name = "Dataset", module = "shardify._native", frozen)]
pub struct PyDataset {
    /// The dataset, shared with the loaders reading it.
    pub dataset: Arc<Dataset>,
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

#[pymethods]
impl PyDataset {
    /// Opens the dataset directory `path`; `checksums` is when shard checksums are checked:
    /// "full" (all, now), "lazy" (each shard when first read) or "off".
    #[new]
    #[pyo3(signature = (path, checksums = "lazy"))]
    fn new(py: Python<'_>, path: PathBuf, checksums: &str) -> PyResult<Self> {
        let policy = checksum_policy(checksums).map_err(to_py)?;
        let dataset = py.detach(|| Dataset::open(&path, policy)).map_err(to_py)?;
        Ok(PyDataset {
            dataset: Arc::new(dataset),
        })
    }

    /// Events in the dataset.
    #[getter]
    fn events(&self) -> u64 {
        self.dataset.manifest().totals.events
    }

    /// DOMs (one row per hit sensor per event).
    #[getter]
    fn doms(&self) -> u64 {
        self.dataset.manifest().totals.doms
    }

    /// Pulses.
    #[getter]
    fn pulses(&self) -> u64 {
        self.dataset.manifest().totals.pulses
    }

    /// Shard files.
    #[getter]
    fn shards(&self) -> usize {
        self.dataset.shard_count()
    }

    /// Whether the events carry azimuth and zenith (the train split does, test does not).
    #[getter]
    fn labels(&self) -> bool {
        self.dataset.manifest().schema.types.labels
    }

    /// The dataset directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.dataset.dir().to_path_buf()
    }

    /// The manifest as JSON text (the Python layer parses it once).
    fn manifest_json(&self) -> PyResult<String> {
        serde_json::to_string(self.dataset.manifest())
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
    }

    /// The sensor table's bytes (x, y, z per row, row = sensor id, little-endian) and
    /// their numpy dtype name ("float32" or "float64").
    fn sensor_positions<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, &'static str) {
        let (bytes, dtype) = self.dataset.sensor_table().column().raw();
        (PyBytes::new(py, bytes), numpy_name(dtype))
    }

    /// Every event id, in stored order (the shards concatenated in manifest order), as an
    /// int64 host array; reading it opens (and, per the policy, checksums) every shard.
    fn event_ids(&self, py: Python<'_>) -> PyResult<PyHostArray> {
        let dataset = &self.dataset;
        let ids = py
            .detach(|| -> Result<Vec<i64>, Error> {
                let mut ids = Vec::with_capacity(dataset.manifest().totals.events as usize);
                for i in 0..dataset.shard_count() {
                    ids.extend_from_slice(dataset.shard(i)?.view()?.event_id);
                }
                Ok(ids)
            })
            .map_err(to_py)?;
        Ok(PyHostArray::owned(ids))
    }

    /// Shard `shard`'s tensors, in file order, as read-only host arrays viewing its memory
    /// map (no copy). The shard is validated (and checksummed, per the dataset's policy)
    /// when first opened.
    fn shard_tensors(&self, py: Python<'_>, shard: usize) -> PyResult<Vec<(String, PyHostArray)>> {
        if shard >= self.dataset.shard_count() {
            return Err(to_py(Error::config(
                "shard",
                format!(
                    "{shard}: the dataset has {} shards",
                    self.dataset.shard_count()
                ),
            )));
        }
        // Opening (validating, checksumming) takes a while: without the GIL.
        py.detach(|| self.dataset.shard(shard).map(|_| ()))
            .map_err(to_py)?;
        let file = self.dataset.shard(shard).map_err(to_py)?; // open now: no work

        let mut tensors: Vec<_> = file.header().tensors.iter().collect();
        tensors.sort_by_key(|(_, info)| info.range.start);
        Ok(tensors
            .into_iter()
            .map(|(name, info)| {
                let bytes = &file.bytes()[info.range.clone()];
                let array = PyHostArray::in_dataset(
                    self.dataset.clone(),
                    bytes,
                    info.dtype,
                    info.shape.clone(),
                );
                (name.clone(), array)
            })
            .collect())
    }

    fn __len__(&self) -> usize {
        self.dataset.manifest().totals.events as usize
    }

    fn __repr__(&self) -> String {
        format!(
            "shardify.Dataset({:?}: {} events, {} shards)",
            self.dataset.dir(),
            self.dataset.manifest().totals.events,
            self.dataset.shard_count()
        )
    }
}
