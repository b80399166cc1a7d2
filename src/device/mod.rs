//! Where batches go: host memory, or a CUDA device.
//!
//! This layer knows bytes and buffers, never events: [`staging`] hands out aligned host
//! buffers from a bounded pool (pinned when a GPU is used), and [`cuda`] copies filled
//! buffers onto the device on a dedicated copy stream, double-buffered and guarded by CUDA
//! events. The pipeline ([`crate::pipeline`]) fills the buffers through [`crate::batch`].
//!
//! The device is chosen at run time ([`DeviceChoice`]): `auto` takes CUDA device 0 when a
//! driver and a device are there, and the CPU otherwise; `cpu` never touches CUDA;
//! `cuda:N` insists and fails with [`crate::Error::Device`] when it cannot. A machine
//! without libcuda never panics: the driver library is probed before any CUDA call.

pub mod cuda;
pub mod memory;
pub mod staging;
pub mod transfer;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Which device a loader delivers batches to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum DeviceChoice {
    /// CUDA device 0 when one can be used, else the CPU.
    #[default]
    Auto,
    /// Host memory only.
    Cpu,
    /// This CUDA device, or an error.
    Cuda(usize),
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = Error;

    /// `auto`, `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<DeviceChoice> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| {
                    Error::config(
                        "device",
                        format!("`{s}`: expected auto, cpu, cuda or cuda:N"),
                    )
                }),
        }
    }
}

impl From<DeviceChoice> for String {
    fn from(choice: DeviceChoice) -> String {
        choice.to_string()
    }
}

impl TryFrom<String> for DeviceChoice {
    type Error = Error;

    fn try_from(s: String) -> Result<DeviceChoice> {
        s.parse()
    }
}

/// A resolved device: what a loader actually uses.
#[derive(Clone)]
pub enum Placement {
    /// Host memory; the reason says why when `auto` fell back from CUDA.
    Cpu {
        /// Why the CPU was chosen (`requested`, or the CUDA problem met).
        reason: String,
    },
    /// An opened CUDA device.
    Cuda(Arc<cuda::CudaDevice>),
}

impl fmt::Debug for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Placement {
    /// Resolves a choice: opens the CUDA device, or explains why the CPU is used.
    pub fn resolve(choice: DeviceChoice) -> Result<Placement> {
        match choice {
            DeviceChoice::Cpu => Ok(Placement::Cpu {
                reason: "requested".into(),
            }),
            DeviceChoice::Cuda(ordinal) => Ok(Placement::Cuda(cuda::CudaDevice::open(ordinal)?)),
            DeviceChoice::Auto => match cuda::CudaDevice::open(0) {
                Ok(device) => Ok(Placement::Cuda(device)),
                Err(e) => {
                    tracing::info!("no GPU used: {e}");
                    Ok(Placement::Cpu {
                        reason: e.to_string(),
                    })
                }
            },
        }
    }

    /// The CUDA device, if any.
    pub fn cuda(&self) -> Option<&Arc<cuda::CudaDevice>> {
        match self {
            Placement::Cuda(device) => Some(device),
            Placement::Cpu { .. } => None,
        }
    }

    /// One line for logs and reports, e.g. `cuda:0 (NVIDIA H100 80GB HBM3)` or
    /// `cpu (CUDA: no CUDA driver ...)`.
    pub fn describe(&self) -> String {
        match self {
            Placement::Cuda(device) => format!("cuda:{} ({})", device.ordinal(), device.name()),
            Placement::Cpu { reason } => format!("cpu ({reason})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_print_back() {
        for (text, choice) in [
            ("auto", DeviceChoice::Auto),
            ("cpu", DeviceChoice::Cpu),
            ("cuda:0", DeviceChoice::Cuda(0)),
            ("cuda:3", DeviceChoice::Cuda(3)),
        ] {
            assert_eq!(text.parse::<DeviceChoice>().unwrap(), choice);
            assert_eq!(choice.to_string(), text);
            let json = serde_json::to_string(&choice).unwrap();
            assert_eq!(serde_json::from_str::<DeviceChoice>(&json).unwrap(), choice);
        }
        assert_eq!(
            "cuda".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(0)
        );
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let e = bad.parse::<DeviceChoice>().unwrap_err().to_string();
            assert!(e.contains("expected auto, cpu, cuda or cuda:N"), "{e}");
        }
    }

    #[test]
    fn cpu_is_chosen_without_touching_cuda() {
        let placement = Placement::resolve(DeviceChoice::Cpu).unwrap();
        assert!(placement.cuda().is_none());
        assert_eq!(placement.describe(), "cpu (requested)");
    }
}
