//! `shardify._native`: the Rust side of the Python package, a thin face over the
//! `shardify` crate. The pure-Python layer (`python/shardify/`) resolves defaults from
//! torch (rank, world, device) and turns the sections handed out here into torch tensors
//! or numpy arrays through DLPack.
//!
//! ```text
//! Dataset ── Loader ── next_batch() ──> (Section, Section, ...)  one per batch section
//!                                          │ __dlpack__ (zero copy)
//!                                          └─> torch.Tensor / numpy.ndarray
//! ```
//! Every section of a batch shares one `Arc` of the delivered batch; the staging buffer
//! (and on a GPU the device buffer) goes back to the loader's pool when the last tensor
//! over it is freed.

mod array;
mod batch;
mod cli;
mod dataset;
mod errors;
mod exchange;
mod loader;
mod log;
mod machine;
mod process;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log::install();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DatasetError", m.py().get_type::<errors::DatasetError>())?;
    m.add("ONE_THREAD_AT_A_TIME", loader::ONE_THREAD_AT_A_TIME)?;
    m.add_class::<dataset::PyDataset>()?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<batch::PySection>()?;
    m.add_class::<array::PyHostArray>()?;
    m.add_function(wrap_pyfunction!(cli::run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(dataset::copy_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(machine::machine, m)?)?;
    Ok(())
}
