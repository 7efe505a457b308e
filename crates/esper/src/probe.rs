//! What a record says about the machine it ran on: the probing of the
//! environment, done here (where records are written) and nowhere in the
//! library crates.
//!
//! - CPU model from `/proc/cpuinfo`, core count from the standard library;
//! - code revision from `ESPER_GIT_REV` (`cargo xtask bench` and the bench
//!   bundle set it from `git rev-parse`), else "unknown";
//! - torch version from `ESPER_TORCH_VERSION` (the bundle sets it from the
//!   GPU machine's python), else the `version.py` beside the libtorch this
//!   process loaded, else "unknown";
//! - on a CUDA device: its name and CUDA runtime through torch-ext, the
//!   driver from `ESPER_DRIVER_VERSION` (the bundle sets it from
//!   `nvidia-smi`), else the driver's CUDA API level.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use leyline::baseline::Environment;
use tch::Device;

/// An environment without torch: the CPU, the revision, "n/a" for the rest.
pub(crate) fn host() -> Environment {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| cpu_model_in(&text))
        .unwrap_or_else(|| "unknown".to_owned());
    Environment {
        device: "cpu".to_owned(),
        torch: "n/a".to_owned(),
        cuda: "n/a".to_owned(),
        driver: "n/a".to_owned(),
        cpu,
        git_rev: variable("ESPER_GIT_REV").unwrap_or_else(|| "unknown".to_owned()),
        tf32: false,
        amp: "off".to_owned(),
        extra: BTreeMap::from([(
            "cpu_cores".to_owned(),
            serde_json::Value::from(
                std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            ),
        )]),
    }
}

/// [`host`] plus the torch version and, on a CUDA `device`, the GPU's name,
/// CUDA runtime and driver.
///
/// # Errors
/// A CUDA device whose name or versions libtorch cannot report.
pub(crate) fn with_torch(device: Device) -> Result<Environment> {
    let mut environment = host();
    environment.torch = torch_version();
    if let Device::Cuda(index) = device {
        environment.device = torch_ext::cuda::device_name(index)
            .with_context(|| format!("reading the name of cuda:{index}"))?;
        let (runtime, driver) =
            torch_ext::cuda::runtime_versions().context("reading the CUDA versions")?;
        environment.cuda = runtime;
        environment.driver =
            variable("ESPER_DRIVER_VERSION").unwrap_or_else(|| format!("CUDA driver API {driver}"));
    }
    let settings = library_settings(variable);
    if !settings.is_empty() {
        environment.extra.insert(
            "library_settings".to_owned(),
            serde_json::Value::Object(settings),
        );
    }
    Ok(environment)
}

/// Environment variables that change how libtorch, cuDNN or CUDA run (and
/// so the figures), as the process saw them: a record says which were set.
const LIBRARY_SETTINGS: [&str; 6] = [
    "TORCH_CUDNN_V8_API_DISABLED",
    "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT",
    "CUDA_MODULE_LOADING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_LAUNCH_BLOCKING",
];

/// The [`LIBRARY_SETTINGS`] that `lookup` finds set, by name.
fn library_settings(
    lookup: impl Fn(&str) -> Option<String>,
) -> serde_json::Map<String, serde_json::Value> {
    LIBRARY_SETTINGS
        .iter()
        .filter_map(|&name| lookup(name).map(|value| (name.to_owned(), value.into())))
        .collect()
}

/// A non-empty environment variable.
fn variable(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// The `model name` of the first processor in `/proc/cpuinfo` text.
fn cpu_model_in(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, model)| model.trim().to_owned())
        .filter(|model| !model.is_empty())
}

/// `ESPER_TORCH_VERSION`, else the version of the libtorch this process
/// loaded (tch does not report it), else "unknown".
fn torch_version() -> String {
    variable("ESPER_TORCH_VERSION")
        .or_else(|| {
            let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
            loaded_torch_version(&maps, |path| std::fs::read_to_string(path).ok())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The `__version__` of the `version.py` in the parent of the folder of the
/// `libtorch_cpu.so` named in `maps` (the `/proc/self/maps` text), read with
/// `read`.
fn loaded_torch_version(maps: &str, read: impl Fn(&Path) -> Option<String>) -> Option<String> {
    let library = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.ends_with("libtorch_cpu.so"))?;
    let torch_dir = Path::new(library).parent()?.parent()?;
    let text = read(&torch_dir.join("version.py"))?;
    let line = text.lines().find(|line| line.starts_with("__version__"))?;
    line.split(['\'', '"'])
        .nth(1)
        .map(str::to_owned)
        .filter(|version| !version.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_library_settings_are_named_in_the_record() {
        let settings = library_settings(|name| {
            (name == "TORCH_CUDNN_V8_API_DISABLED").then(|| "1".to_owned())
        });
        assert_eq!(settings.len(), 1);
        assert_eq!(settings["TORCH_CUDNN_V8_API_DISABLED"], "1");
        assert!(library_settings(|_| None).is_empty());
    }

    #[test]
    fn cpu_model_is_read_from_cpuinfo_text() {
        let text = "processor\t: 0\nvendor_id\t: X\nmodel name\t: Test CPU @ 3.0GHz\n\
                    processor\t: 1\nmodel name\t: Test CPU @ 3.0GHz\n";
        assert_eq!(cpu_model_in(text).as_deref(), Some("Test CPU @ 3.0GHz"));
        assert_eq!(cpu_model_in("processor : 0\n"), None);
        assert_eq!(cpu_model_in("model name :   \n"), None);
    }

    #[test]
    fn torch_version_comes_from_the_loaded_library() {
        let maps = "7f00-7f01 r-xp 00000000 08:01 42 /venv/site-packages/torch/lib/libtorch_cpu.so\n\
                    7f02-7f03 r-xp 00000000 08:01 43 /usr/lib/libc.so.6\n";
        let read = |path: &Path| {
            (path == Path::new("/venv/site-packages/torch/version.py"))
                .then(|| "from typing import Optional\n__version__ = '2.11.0+cu130'\n".to_owned())
        };
        assert_eq!(
            loaded_torch_version(maps, read).as_deref(),
            Some("2.11.0+cu130")
        );
        assert_eq!(loaded_torch_version("", read), None);
        assert_eq!(loaded_torch_version(maps, |_| None), None);
    }

    #[test]
    fn a_cpu_environment_makes_a_valid_record() -> anyhow::Result<()> {
        let environment = with_torch(Device::Cpu)?;
        assert_eq!(environment.device, "cpu");
        assert_eq!(environment.cuda, "n/a");
        assert!(environment.extra.contains_key("cpu_cores"));
        let record = leyline::baseline::BaselineRecord::from_measurements(
            "nissa-emit",
            "probe-test",
            environment,
            leyline::baseline::Measurements {
                params: serde_json::json!({}),
                results: Vec::new(),
                telemetry_names: Vec::new(),
            },
        )?;
        let text = record.to_json_pretty()?;
        assert_eq!(leyline::baseline::BaselineRecord::from_json(&text)?, record);
        assert_eq!(host().torch, "n/a");
        Ok(())
    }
}
