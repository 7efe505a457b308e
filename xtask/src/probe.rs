//! What xtask asks of the machine, through commands and files only (xtask
//! has no tch): the code revision, today's date and whether a GPU is there.
//! The benchmark records' own environment is probed by `esper bench`, which
//! xtask hands the revision through `ESPER_GIT_REV`.

use std::path::Path;
use std::process::Command;

/// `git rev-parse --short HEAD` in `root`, or "unknown".
pub(crate) fn git_rev(root: &Path) -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .filter(|rev| !rev.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The default record label: `gpu-` or `cpu-` (whether `nvidia-smi -L`
/// succeeds) and the date (`date +%F`, else "undated").
pub(crate) fn default_label() -> String {
    let date = Command::new("date")
        .arg("+%F")
        .output()
        .ok()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .filter(|date| !date.is_empty())
        .unwrap_or_else(|| "undated".to_owned());
    format!("{}-{date}", if has_gpu() { "gpu" } else { "cpu" })
}

/// Whether an NVIDIA GPU is there (`nvidia-smi -L` succeeds): `esper bench`
/// then picks CUDA, else the CPU.
pub(crate) fn has_gpu() -> bool {
    Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|output| output.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_label_is_a_device_and_a_date() {
        let label = default_label();
        assert!(
            label.starts_with("gpu-") || label.starts_with("cpu-"),
            "{label}"
        );
        assert!(label.len() > 4, "{label}");
    }

    #[test]
    fn git_rev_is_never_empty() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        assert!(!git_rev(root).is_empty());
        assert_eq!(git_rev(Path::new("/")), "unknown");
    }
}
