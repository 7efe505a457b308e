//! The Python peers of a workload: the same workload in plain PyTorch
//! (eager, compile, CUDA graph), run in the same `cargo xtask bench` and
//! merged into the same record.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

/// Runs the peer `script` with a python that has torch (ESPER_BENCH_PYTHON,
/// then python3, then the provisioned venv), merging into `record`.
pub(crate) fn run(root: &Path, script: &str, record: &Path, quick: bool) -> Result<()> {
    let Some(python) = python_with_torch(root) else {
        eprintln!("==> python peers skipped: no python3 with torch found");
        return Ok(());
    };
    let mut command = Command::new(&python);
    command
        .arg(root.join(script))
        .arg("--merge-into")
        .arg(record)
        .env("PYTHONUNBUFFERED", "1")
        .current_dir(root);
    if quick {
        command.arg("--quick");
    }
    crate::run_step(
        &format!("python peers ({})", python.display()),
        &mut command,
    )
}

fn python_with_torch(root: &Path) -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(python) = std::env::var("ESPER_BENCH_PYTHON") {
        candidates.push(PathBuf::from(python));
    }
    candidates.push(PathBuf::from("python3"));
    // The provisioned venv: `.esper-torch` is <venv>/lib/pythonX.Y/site-packages.
    if let Ok(site) = root.join(crate::provision::TORCH_LINK).canonicalize()
        && let Some(venv) = site.ancestors().nth(3)
    {
        candidates.push(venv.join("bin/python"));
    }
    candidates.into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import torch"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}
