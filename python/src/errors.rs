//! Library errors as Python exceptions: the same message (with its causes), a type a
//! caller can catch.

use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyNotADirectoryError, PyOSError, PyPermissionError,
    PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use shardify::error::chain_text;
use shardify::Error;

use crate::process::Forked;

pyo3::create_exception!(
    shardify,
    DatasetError,
    pyo3::exceptions::PyException,
    "A dataset that cannot be read as written: a damaged or truncated shard, a checksum \
     mismatch, a manifest that does not match its files, another format version."
);

/// The Python exception for a library error: `ValueError` for a bad setting,
/// `OSError` (`FileNotFoundError`, `PermissionError`, `NotADirectoryError`) for the
/// operating system's errors,
/// `FileExistsError` for an output directory that is not empty,
/// `RuntimeError` for the CUDA driver, [`DatasetError`] for damaged or inconsistent data.
pub fn to_py(error: Error) -> PyErr {
    let message = chain_text(&error);
    match &error {
        Error::Config { .. } => PyValueError::new_err(message),
        Error::Io { source, .. } => match source.kind() {
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(message),
            std::io::ErrorKind::NotADirectory => PyNotADirectoryError::new_err(message),
            _ => PyOSError::new_err(message),
        },
        Error::NoSpace { .. } => PyOSError::new_err(message),
        Error::NotEmpty { .. } => PyFileExistsError::new_err(message),
        Error::Device(_) | Error::CopyInFlight(_) => PyRuntimeError::new_err(message),
        _ => DatasetError::new_err(message),
    }
}

/// A forked child's use of a loader.
pub fn forked(error: Forked) -> PyErr {
    PyRuntimeError::new_err(error.to_string())
}
