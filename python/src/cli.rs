//! The `shardify` command line inside the module, for the package's console script.

use pyo3::prelude::*;

#[allow(dead_code)] // its `main` is the binary's entry point, unused here
#[path = "../../src/bin/shardify.rs"]
mod command;

/// Runs `shardify` with `argv` (the program name first) and returns its exit status,
/// exactly as the compiled binary would.
#[pyfunction]
pub fn run_cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| {
        crate::log::printing_to_stderr(command::console::stderr_filter(), || {
            command::run_cli(argv.into_iter().map(Into::into))
        })
    })
}
