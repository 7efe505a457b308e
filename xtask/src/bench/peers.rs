//! The Python peers of a workload: the same workload in plain PyTorch
//! (eager, compile, CUDA graph), run in the same `cargo xtask bench` and
//! merged into the same record.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

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

/// `cargo xtask test`'s check of the peers the GPU bundle runs: on the CPU,
/// on synthetic data, a few steps of each peer's eager mode (and a CUDA-only
/// mode, which must be recorded as skipped), then the record read back:
/// every eager entry has an epoch time and a finite validation loss. Also
/// `tolaria_fmnist_check.py`, which trains the Fashion-MNIST peer beside a
/// second PyTorch network and compares losses and tensors. A peer that no
/// longer runs fails the test command here rather than on the GPU machine.
pub(crate) fn smoke(root: &Path) -> Result<()> {
    let Some(python) = python_with_torch(root) else {
        bail!(
            "no python3 with torch found for the Python peers' check (the provisioned venv \
             behind .esper-torch has one: run `cargo xtask provision`, or set ESPER_BENCH_PYTHON)"
        );
    };
    let scratch = std::env::temp_dir().join(format!("esper-peers-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let result = smoke_in(root, &python, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// One peer's smoke run: its script and arguments (after `--device cpu
/// --out RECORD`), the workload its record names (the reference peer's
/// record names none), its validation-loss metric and a CUDA-only mode it
/// must record as skipped.
struct Smoke {
    script: &'static str,
    args: &'static [&'static str],
    workload: Option<&'static str>,
    loss: &'static str,
    cuda_only: &'static str,
}

/// The tolaria peers' smoke arguments: synthetic data, one epoch of two
/// eager steps, the whole-step graph mode (skipped on the CPU), no profile.
const TWO_EAGER_STEPS: &[&str] = &[
    "--synthetic",
    "--quick",
    "--no-kernels",
    "--modes",
    "eager,graph",
    "--steps-per-epoch",
    "2",
    "--epochs",
    "1",
    "--warmup-epochs",
    "0",
];

const SMOKES: &[Smoke] = &[
    Smoke {
        script: "tolaria_fmnist.py",
        args: TWO_EAGER_STEPS,
        workload: Some("tolaria-fmnist"),
        loss: "val_loss",
        cuda_only: "graph",
    },
    Smoke {
        script: "tolaria_lm.py",
        args: TWO_EAGER_STEPS,
        workload: Some("tolaria-lm"),
        loss: "val_loss",
        cuda_only: "graph",
    },
    Smoke {
        script: "tolaria_reference.py",
        args: &["--quick", "--modes", "eager,graph-step"],
        workload: None,
        loss: "validation_loss",
        cuda_only: "graph-step",
    },
];

fn smoke_in(root: &Path, python: &Path, scratch: &Path) -> Result<()> {
    let python_dir = root.join("bench/python");
    crate::run_step(
        "python peers: tolaria_fmnist_check.py (the peer against a second PyTorch network)",
        Command::new(python)
            .arg(python_dir.join("tolaria_fmnist_check.py"))
            .arg("--synthetic")
            .env("PYTHONUNBUFFERED", "1"),
    )?;
    for smoke in SMOKES {
        let record = scratch.join(smoke.script.replace(".py", ".json"));
        crate::run_step(
            &format!(
                "python peers: {} on the CPU (eager, a few steps)",
                smoke.script
            ),
            Command::new(python)
                .arg(python_dir.join(smoke.script))
                .args(["--device", "cpu", "--out"])
                .arg(&record)
                .args(smoke.args)
                .env("PYTHONUNBUFFERED", "1"),
        )?;
        check_record(&record, smoke)?;
    }
    refuses_a_missing_merge_target(python, &python_dir, scratch)
}

/// A `--merge-into` record that does not exist is refused before any mode
/// runs, so that minutes of compiling and measuring are not spent on
/// results that could not be written.
fn refuses_a_missing_merge_target(python: &Path, python_dir: &Path, scratch: &Path) -> Result<()> {
    let name = "python peers: tolaria_lm.py refuses a missing --merge-into record before measuring";
    eprintln!("==> {name}");
    let missing = scratch.join("no-such-record.json");
    let output = Command::new(python)
        .arg(python_dir.join("tolaria_lm.py"))
        .args(["--device", "cpu", "--merge-into"])
        .arg(&missing)
        .args(TWO_EAGER_STEPS)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .with_context(|| format!("could not start `{name}`"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let measured = stdout.contains("epoch 1/") || stderr.contains("epoch 1/");
    if output.status.success() || measured || !stderr.contains("--merge-into") {
        bail!(
            "`{name}` failed (status {}, a mode measured: {measured}); stderr:\n{stderr}",
            output.status
        );
    }
    Ok(())
}

/// The smoke run's record: its workload, an eager entry with an epoch time
/// and a finite validation loss, the CUDA-only mode skipped with its reason.
fn check_record(path: &Path, smoke: &Smoke) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let record: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if let Some(workload) = smoke.workload
        && record["workload"] != workload
    {
        bail!(
            "{}: workload {}, expected {workload}",
            path.display(),
            record["workload"]
        );
    }
    let entry = |mode: &str| {
        record["results"]
            .as_array()
            .and_then(|results| results.iter().find(|entry| entry["mode"] == mode))
            .with_context(|| format!("{}: no `{mode}` entry", path.display()))
    };
    let eager = entry("eager")?;
    if let Some(error) = eager.get("error") {
        bail!("{}: the eager mode failed: {error}", path.display());
    }
    let metric = |name: &str| eager["metrics"][name].as_f64();
    let epoch_ms = metric("epoch_ms_p50");
    let loss = metric(smoke.loss);
    if !epoch_ms.is_some_and(|ms| ms > 0.0) || !loss.is_some_and(f64::is_finite) {
        bail!(
            "{}: the eager entry lacks a positive epoch_ms_p50 or a finite {}: {}",
            path.display(),
            smoke.loss,
            eager["metrics"]
        );
    }
    let skipped = entry(smoke.cuda_only)?["error"]
        .as_str()
        .unwrap_or_default();
    if !skipped.contains("this run is on the CPU") {
        bail!(
            "{}: the CUDA-only mode `{}` was not recorded as skipped on the CPU: {skipped:?}",
            path.display(),
            smoke.cuda_only
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::{SMOKES, check_record};

    fn record(dir: &Path, eager: &str, graph: &str) -> PathBuf {
        let path = dir.join("record.json");
        let text = format!(
            r#"{{"workload": "tolaria-lm", "results": [{{"impl": "python", "mode": "eager", {eager}}},
                {{"impl": "python", "mode": "graph", {graph}}}]}}"#
        );
        std::fs::write(&path, text).expect("written");
        path
    }

    const SKIPPED: &str =
        r#""metrics": {}, "error": "CUDA graphs need a CUDA device; this run is on the CPU""#;

    #[test]
    fn a_smoke_record_passes_only_with_a_measured_eager_entry_and_a_skipped_graph() {
        let dir = std::env::temp_dir().join(format!("esper-peers-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("folder");
        let good = r#""metrics": {"epoch_ms_p50": 12.5, "val_loss": 5.4}"#;
        let lm = &SMOKES[1];
        check_record(&record(&dir, good, SKIPPED), lm).expect("a good record");

        let wrong_workload = check_record(&record(&dir, good, SKIPPED), &SMOKES[0]);
        assert!(format!("{:#}", wrong_workload.expect_err("workload")).contains("expected"));
        let failed = record(
            &dir,
            r#""metrics": {}, "error": "RuntimeError: boom""#,
            SKIPPED,
        );
        let error = format!("{:#}", check_record(&failed, lm).expect_err("failed"));
        assert!(
            error.contains("eager mode failed") && error.contains("boom"),
            "{error}"
        );
        let no_loss = record(&dir, r#""metrics": {"epoch_ms_p50": 12.5}"#, SKIPPED);
        let error = format!("{:#}", check_record(&no_loss, lm).expect_err("no loss"));
        assert!(error.contains("finite val_loss"), "{error}");
        let ran_graph = record(&dir, good, good);
        let error = format!("{:#}", check_record(&ran_graph, lm).expect_err("graph"));
        assert!(error.contains("not recorded as skipped"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
