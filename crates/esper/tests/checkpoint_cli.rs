//! Checkpoints and `esper train --resume`, driven as a user drives them: the
//! built binary on the synthetic task on the CPU, real files in a temporary
//! directory.
//!
//! - a short run writes verified checkpoints (safetensors + manifest) every
//!   N epochs and at the end; a truncated newest checkpoint is passed over
//!   with a warning naming what is wrong, the previous one is resumed, and
//!   the run ends bitwise where it ended before;
//! - a run killed with SIGKILL after 3, 6 and 8 epochs (before the first
//!   seed, just after its germination, while it trains) and resumed each
//!   time ends with tensors (host, seed, optimizers, governor snapshot)
//!   bitwise equal to an uninterrupted run's, with every epoch and every
//!   telemetry packet exactly once;
//! - a resume whose newest checkpoint is damaged and whose older ones verify
//!   but cannot be restored exits non-zero and leaves every file of the run
//!   directory byte for byte as it was (a `.partial-` folder included); made
//!   restorable again, the oldest one is resumed (never one that merely
//!   verifies) and the run ends bitwise where it ended before.

mod common;
use common::{fnv1a64, rewrite_manifest, tree};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ESPER: &str = env!("CARGO_BIN_EXE_esper");

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// A small synthetic run into `run_dir`. Its learning rate is low enough for
/// the heuristic to see a plateau early: it germinates a seed in r0c1 at the
/// boundary of epoch 6 (seed 0), which goes TRAINING at epoch 7.
fn synthetic_run(run_dir: &Path, epochs: usize, every: usize) -> Command {
    let mut command = Command::new(ESPER);
    command
        .args([
            "train",
            "--task",
            "synthetic",
            "--train-samples",
            "256",
            "--batch-size",
            "64",
            "--device",
            "cpu",
            "--learning-rate",
            "0.0001",
        ])
        .args(["--epochs", &epochs.to_string()])
        .args(["--checkpoint-every", &every.to_string()])
        .args(["--run-dir", path_arg(run_dir)])
        .stdin(Stdio::null());
    command
}

fn resume(run_dir: &Path) -> Command {
    let mut command = Command::new(ESPER);
    command
        .args(["train", "--resume", path_arg(run_dir)])
        .stdin(Stdio::null());
    command
}

fn succeed(mut command: Command) -> Output {
    let output = command.output().expect("esper runs");
    assert!(
        output.status.success(),
        "esper failed: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    output
}

fn epoch_lines(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("epochs.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn tensors(run_dir: &Path, epoch: usize) -> Vec<u8> {
    std::fs::read(
        run_dir
            .join("checkpoints")
            .join(epoch.to_string())
            .join("tensors.safetensors"),
    )
    .expect("the checkpoint's tensors")
}

/// Every telemetry line of the run, in file order.
fn telemetry_lines(run_dir: &Path) -> usize {
    let mut files: Vec<_> = std::fs::read_dir(run_dir.join("telemetry"))
        .expect("telemetry")
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            std::fs::read_to_string(file)
                .expect("telemetry file")
                .lines()
                .count()
        })
        .sum()
}

/// Starts `command` with its output into `log`.
fn spawn(mut command: Command, log: &Path) -> Child {
    let file = std::fs::File::create(log).expect("log file");
    command
        .stdout(file.try_clone().expect("clone"))
        .stderr(file)
        .spawn()
        .expect("esper starts")
}

/// Waits until the run's log shows `epochs` epochs, then kills it with
/// SIGKILL.
fn kill_after(mut child: Child, run_dir: &Path, epochs: usize, log: &Path) {
    let started = Instant::now();
    while epoch_lines(run_dir).len() < epochs {
        if child.try_wait().expect("try_wait").is_some() {
            panic!(
                "the run ended before {epochs} epochs: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no epoch {epochs} in 120 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL: no handler runs, nothing is flushed.
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn checkpoints_verify_and_a_truncated_newest_one_falls_back_to_the_previous() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    succeed(synthetic_run(&run_dir, 4, 2));
    let checkpoints = run_dir.join("checkpoints");
    let mut names: Vec<String> = std::fs::read_dir(&checkpoints)
        .expect("checkpoints")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["2", "4"], "every 2 epochs; nothing partial left");
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoints.join("4").join("manifest.json")).expect("manifest"),
    )
    .expect("the manifest is JSON");
    assert!(
        manifest["checksum"]
            .as_str()
            .expect("checksum")
            .starts_with("fnv1a64:")
    );
    let body = &manifest["manifest"];
    assert_eq!(body["format"], "esper-checkpoint");
    assert_eq!(body["epoch"], 4);
    assert_eq!(body["config"]["checkpoint_every"], 2);
    assert_eq!(body["slots"][0]["slot"], "r0c1");
    assert!(body["controller"]["plateau_epochs"].is_u64());
    assert_eq!(body["rng"]["next_shuffle_epoch"], 4);
    let names: Vec<&str> = body["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|entry| entry["name"].as_str().expect("name"))
        .collect();
    for prefix in ["model/host/", "optim/host/state/", "governor/host/"] {
        assert!(
            names.iter().any(|name| name.starts_with(prefix)),
            "{prefix} in {names:?}"
        );
    }
    // The safetensors header (an 8-byte length, then JSON) names them too,
    // so Python's safetensors reads the file.
    let original = tensors(&run_dir, 4);
    let header_len = usize::try_from(u64::from_le_bytes(
        original[..8].try_into().expect("8 bytes"),
    ))
    .expect("length");
    let header: serde_json::Value =
        serde_json::from_slice(&original[8..8 + header_len]).expect("safetensors header");
    assert_eq!(header["model/host/block0.conv.weight"]["dtype"], "F32");

    // Cut the newest checkpoint short: resume warns, names the problem,
    // takes checkpoint 2 and trains epochs 3 and 4 again, ending bitwise
    // where the run ended.
    let path = checkpoints.join("4").join("tensors.safetensors");
    std::fs::write(&path, &original[..original.len() / 2]).expect("truncate");
    // And a checkpoint whose writing was cut short by a crash.
    std::fs::create_dir(checkpoints.join(".partial-3")).expect("partial");
    let output = succeed(resume(&run_dir));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("checkpoint 3 was cut short while being written"),
        "{stderr}"
    );
    assert!(!checkpoints.join(".partial-3").exists(), "removed");
    assert!(
        stderr.contains("warning: checkpoint")
            && stderr.contains("damaged")
            && stderr.contains("tensors.safetensors is")
            && stderr.contains("cut short"),
        "warns about checkpoint 4: {stderr}"
    );
    assert!(
        text(&output.stdout).contains("resuming from") && text(&output.stdout).contains("epoch 2"),
        "{}",
        text(&output.stdout)
    );
    assert!(tensors(&run_dir, 4) == original, "bitwise the same end");
    let epochs: Vec<u64> = epoch_lines(&run_dir)
        .iter()
        .map(|line| line["epoch"].as_u64().expect("epoch"))
        .collect();
    assert_eq!(epochs, [0, 1, 2, 3], "each epoch once");

    // A manifest whose body was edited fails its checksum; with no
    // checkpoint left that verifies, resume refuses with the reasons.
    for name in ["2", "4"] {
        let path = checkpoints.join(name).join("manifest.json");
        let edited = std::fs::read_to_string(&path)
            .expect("manifest")
            .replace("\"epoch\": ", "\"epoch\":  1");
        std::fs::write(&path, edited).expect("edit");
    }
    let output = resume(&run_dir).output().expect("esper runs");
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "refused");
    assert!(
        stderr.contains("checksum mismatch") && stderr.contains("no checkpoint"),
        "{stderr}"
    );
}

#[test]
fn a_run_killed_three_times_and_resumed_ends_bitwise_equal_to_an_uninterrupted_run() {
    const EPOCHS: usize = 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = dir.path().join("whole");
    succeed(synthetic_run(&whole, EPOCHS, 1));

    let killed = dir.path().join("killed");
    let log = dir.path().join("killed.log");
    kill_after(
        spawn(synthetic_run(&killed, EPOCHS, 1), &log),
        &killed,
        3,
        &log,
    );
    for epochs in [6, 8] {
        kill_after(spawn(resume(&killed), &log), &killed, epochs, &log);
    }
    let output = succeed(resume(&killed));
    assert!(text(&output.stdout).contains("resuming from"));

    assert!(
        tensors(&killed, EPOCHS) == tensors(&whole, EPOCHS),
        "parameters, optimizer state and governor snapshot bitwise equal"
    );
    let lines = epoch_lines(&killed);
    let epochs: Vec<u64> = lines
        .iter()
        .map(|line| line["epoch"].as_u64().expect("epoch"))
        .collect();
    assert_eq!(epochs, (0..EPOCHS as u64).collect::<Vec<_>>());
    for (resumed, original) in lines.iter().zip(epoch_lines(&whole)) {
        assert_eq!(resumed["val_loss"], original["val_loss"]);
        assert_eq!(resumed["slots"], original["slots"]);
        assert_eq!(resumed["decision"], original["decision"]);
    }
    let last = lines.last().expect("the last epoch");
    assert_eq!(
        last["slots"][0]["stage"], "TRAINING",
        "the run grew a seed: {last}"
    );
    assert_eq!(
        telemetry_lines(&killed),
        telemetry_lines(&whole),
        "no telemetry packet duplicated or lost"
    );
}

/// The paths whose contents differ between two [`tree`]s, with the FNV-1a
/// hash of each side (for the failure message).
fn changes(
    before: &BTreeMap<PathBuf, Option<Vec<u8>>>,
    after: &BTreeMap<PathBuf, Option<Vec<u8>>>,
) -> Vec<String> {
    let hash = |entry: Option<&Option<Vec<u8>>>| match entry {
        None => "absent".to_owned(),
        Some(None) => "folder".to_owned(),
        Some(Some(bytes)) => format!("{} bytes, fnv1a64 {:016x}", bytes.len(), fnv1a64(bytes)),
    };
    before
        .keys()
        .chain(after.keys())
        .filter(|path| before.get(*path) != after.get(*path))
        .map(|path| {
            format!(
                "{}: {} -> {}",
                path.display(),
                hash(before.get(path)),
                hash(after.get(path))
            )
        })
        .collect()
}

/// Edits the body of checkpoint `epoch`'s manifest and writes it back with
/// a fresh checksum, so that it still verifies.
fn edit_manifest(run_dir: &Path, epoch: usize, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = run_dir
        .join("checkpoints")
        .join(epoch.to_string())
        .join("manifest.json");
    rewrite_manifest(&path, edit);
}

#[test]
fn a_resume_that_restores_no_checkpoint_changes_nothing_and_one_that_does_skips_the_unrestorable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    succeed(synthetic_run(&run_dir, 6, 2));
    let checkpoints = run_dir.join("checkpoints");
    let original = tensors(&run_dir, 6);
    let manifest = |epoch: usize| checkpoints.join(epoch.to_string()).join("manifest.json");
    let manifest_2 = std::fs::read(manifest(2)).expect("manifest 2");

    // The newest is damaged; the two older ones verify (their manifests'
    // checksums hold) but cannot be restored: their governor is gone, while
    // the run's trainer has one.
    std::fs::write(
        checkpoints.join("6").join("tensors.safetensors"),
        &original[..original.len() / 2],
    )
    .expect("truncate");
    for epoch in [2, 4] {
        edit_manifest(&run_dir, epoch, |body| {
            body["governor"] = serde_json::Value::Null
        });
    }
    std::fs::create_dir(checkpoints.join(".partial-5")).expect("partial");
    let before = tree(&run_dir);
    let output = resume(&run_dir).output().expect("esper runs");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "refused: {stderr}");
    assert!(
        stderr.contains("checkpoints/6 is damaged") && stderr.contains("cut short"),
        "{stderr}"
    );
    for epoch in [2, 4] {
        assert!(
            stderr.contains(&format!(
                "checkpoints/{epoch} verifies but could not be restored"
            )),
            "checkpoint {epoch}: {stderr}"
        );
    }
    assert!(stderr.contains("disagree on the governor"), "{stderr}");
    assert!(
        stderr.contains("no checkpoint in") && stderr.contains("verifies and restores"),
        "{stderr}"
    );
    let changed = changes(&before, &tree(&run_dir));
    assert!(
        changed.is_empty(),
        "the refused resume changed the run directory:\n{}",
        changed.join("\n")
    );

    // Checkpoint 2 restorable again: the resume passes over 6 (damaged) and
    // 4 (verifies, cannot be restored), takes 2, and ends where the run
    // ended before, bit for bit.
    std::fs::write(manifest(2), manifest_2).expect("put back");
    let output = succeed(resume(&run_dir));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("checkpoints/4 verifies but could not be restored"),
        "{stderr}"
    );
    assert!(
        text(&output.stdout).contains("resuming from") && text(&output.stdout).contains("epoch 2"),
        "{}",
        text(&output.stdout)
    );
    assert!(
        !checkpoints.join(".partial-5").exists(),
        "removed once resumed"
    );
    assert!(tensors(&run_dir, 6) == original, "bitwise the same end");
    let epochs: Vec<u64> = epoch_lines(&run_dir)
        .iter()
        .map(|line| line["epoch"].as_u64().expect("epoch"))
        .collect();
    assert_eq!(epochs, [0, 1, 2, 3, 4, 5], "each epoch once");
}
