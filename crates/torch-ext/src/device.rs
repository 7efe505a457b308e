//! Device selection for the whole workspace: one [`DeviceChoice`] (what a
//! configuration or a command line asks for) and one [`select`] that turns it
//! into a tch [`Device`] that works, and [`for_rank`], the device of one
//! rank of a process group.
//!
//! tch's CUDA kernels only run once `libtorch_cuda` is loaded; [`select`]
//! asks [`crate::cuda::is_available`] / [`crate::cuda::device_count`], which
//! load it first (see [`crate::cuda::load_backend`]), so a device it returns
//! is usable. Nothing else in the workspace picks a device.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tch::Device;

use crate::cuda;
use crate::error::{Error, Result};

/// Which device to run on, as a configuration or command line states it.
///
/// Serialized in kebab-case (`"auto"`, `"cpu"`, `{"cuda": 1}`): benchmark
/// records carry it inside their trainer configuration. Its text form
/// ([`fmt::Display`] / [`FromStr`]) is `auto`, `cpu`, `cuda` (device 0) or
/// `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceChoice {
    /// CUDA device 0 when libtorch's CUDA backend loads and a GPU is
    /// present, the CPU otherwise. Never fails.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// The CUDA device with this index; an error when it is not there.
    Cuda(usize),
}

/// The tch device for `choice`.
///
/// # Errors
/// For [`DeviceChoice::Cuda`] only: [`Error::CudaUnavailable`] on a machine
/// without a usable CUDA device, [`Error::InvalidDevice`] (naming the index
/// and the device count) when the index is not below the number of devices.
pub fn select(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto => Ok(if cuda::is_available() {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }),
        DeviceChoice::Cuda(device) => {
            let count = cuda::device_count();
            if count == 0 {
                Err(Error::CudaUnavailable)
            } else if device >= count {
                Err(Error::InvalidDevice { device, count })
            } else {
                Ok(Device::Cuda(device))
            }
        }
    }
}

/// The device of one rank of a process group, which the rank keeps for the
/// whole process: with `cuda`, `cuda:N` for `N` the rank's local rank (the
/// launcher's `LOCAL_RANK`) or, without one, its group `rank`, made the
/// calling thread's current CUDA device first (so every later allocation
/// and collective of the rank goes to its own GPU); the CPU otherwise.
///
/// # Errors
/// With `cuda`: [`Error::CudaUnavailable`] without a usable CUDA device,
/// [`Error::InvalidDevice`] for an index beyond the device count,
/// [`Error::Cpp`] when CUDA refuses to switch.
pub fn for_rank(cuda: bool, local_rank: Option<usize>, rank: usize) -> Result<Device> {
    if !cuda {
        return Ok(Device::Cpu);
    }
    let index = local_rank.unwrap_or(rank);
    cuda::set_device(index)?;
    Ok(Device::Cuda(index))
}

impl DeviceChoice {
    /// The choice that names `device` exactly (`Cpu` or `Cuda(index)`);
    /// other tch devices (MPS, Vulkan) are not used by this workspace and
    /// map to `Cpu`.
    pub fn of(device: Device) -> DeviceChoice {
        match device {
            Device::Cuda(index) => DeviceChoice::Cuda(index),
            _ => DeviceChoice::Cpu,
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => formatter.write_str("auto"),
            DeviceChoice::Cpu => formatter.write_str("cpu"),
            DeviceChoice::Cuda(index) => write!(formatter, "cuda:{index}"),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = Error;

    /// Parses `auto`, `cpu`, `cuda` (device 0) or `cuda:N`.
    ///
    /// # Errors
    /// [`Error::UnknownDevice`] naming the refused text.
    fn from_str(text: &str) -> Result<DeviceChoice> {
        match text {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|index| index.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| Error::UnknownDevice {
                    text: other.to_owned(),
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_rank_runs_on_the_cpu() {
        assert_eq!(for_rank(false, Some(3), 1).ok(), Some(Device::Cpu));
        assert_eq!(for_rank(false, None, 0).ok(), Some(Device::Cpu));
    }

    #[test]
    fn text_forms_round_trip() {
        for choice in [
            DeviceChoice::Auto,
            DeviceChoice::Cpu,
            DeviceChoice::Cuda(0),
            DeviceChoice::Cuda(7),
        ] {
            assert_eq!(
                choice.to_string().parse::<DeviceChoice>().ok(),
                Some(choice)
            );
        }
        assert_eq!(
            "cuda".parse::<DeviceChoice>().ok(),
            Some(DeviceChoice::Cuda(0))
        );
    }

    #[test]
    fn unknown_text_is_refused_naming_it() {
        for text in [
            "",
            "gpu",
            "cuda:",
            "cuda:-1",
            "cuda:x",
            "CPU",
            "cuda:99999999999999999999",
        ] {
            match text.parse::<DeviceChoice>() {
                Err(Error::UnknownDevice { text: refused }) => assert_eq!(refused, text),
                other => panic!("{text:?} gave {other:?}"),
            }
        }
    }
}
