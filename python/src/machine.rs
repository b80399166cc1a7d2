//! The machine facts shardbench's reports carry, for the Python benchmarks to report the
//! same way.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use shardify::bench::machine::Machine;

/// This machine's facts as shardbench names them: (JSON of the CPU count, model, signature,
/// last-level cache, OS, architecture and `device`; the CPU described in one line).
#[pyfunction]
pub fn machine(device: &str) -> PyResult<(String, String)> {
    let machine = Machine::probe(device.to_string());
    let json =
        serde_json::to_string(&machine).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok((json, machine.describe_cpu()))
}
