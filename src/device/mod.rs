//! Host and device memory for batches. This layer knows bytes and buffers, never events:
//! [`staging`] hands out host buffers (pinned when a GPU is used), and the pipeline fills
//! them through [`crate::batch`].

pub mod staging;

/// Where batches are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum DeviceChoice {
    /// A CUDA GPU when a driver and device are present, else the CPU.
    #[default]
    Auto,
    /// Host memory.
    Cpu,
    /// CUDA device `n`.
    Cuda(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| format!("device {s:?} is not auto, cpu, cuda or cuda:N")),
        }
    }
}
