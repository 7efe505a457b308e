//! PPO checkpoints driven as a user drives them, on the CPU: a run killed
//! with SIGKILL and resumed with `--resume` ends with the same policy, bit
//! for bit, as the run that was never stopped, with every round written
//! (and every PPO update event) exactly once; a damaged newest checkpoint is
//! skipped with a warning. A resume whose newest checkpoint is damaged and
//! whose older ones verify but cannot be restored exits non-zero and leaves
//! every file of the run directory byte for byte as it was; made restorable
//! again, the oldest is resumed and the rounds after it run again.

mod common;
use common::{fnv1a64, rewrite_manifest, tree};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ESPER: &str = env!("CARGO_BIN_EXE_esper");

fn args(run_dir: &Path) -> Vec<String> {
    args_with_rounds(run_dir, "4")
}

fn args_with_rounds(run_dir: &Path, rounds: &str) -> Vec<String> {
    [
        "train",
        "--controller",
        "ppo",
        "--task",
        "synthetic",
        "--train-samples",
        "256",
        "--epochs",
        "2",
        "--envs",
        "2",
        "--rounds",
        rounds,
        "--batch-size",
        "64",
        "--slots",
        "r0c0,r0c1,r0c2",
        "--device",
        "cpu",
        "--checkpoint-every",
        "1",
        "--run-dir",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([run_dir.to_str().expect("utf-8 path").to_owned()])
    .collect()
}

fn policy(run_dir: &Path) -> Vec<(String, Vec<u32>)> {
    let mut tensors = tch::Tensor::read_safetensors(run_dir.join("policy.safetensors"))
        .expect("policy.safetensors");
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
        .into_iter()
        .map(|(name, t)| {
            let values = Vec::<f32>::try_from(&t.reshape([-1])).expect("values");
            (name, values.into_iter().map(f32::to_bits).collect())
        })
        .collect()
}

fn rounds(run_dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(run_dir.join("rounds.jsonl"))
        .expect("rounds.jsonl")
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("JSON");
            value["round"].as_u64().expect("round")
        })
        .collect()
}

fn run_to_end(args: &[String]) -> std::process::Output {
    Command::new(ESPER)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs")
}

#[test]
fn a_killed_ppo_run_resumes_to_the_uninterrupted_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = dir.path().join("whole");
    let output = run_to_end(&args(&whole));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(rounds(&whole), vec![0, 1, 2, 3]);

    let cut = dir.path().join("cut");
    let mut child = Command::new(ESPER)
        .args(args(&cut))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("esper starts");
    let start = Instant::now();
    while std::fs::read_to_string(cut.join("rounds.jsonl")).map_or(0, |t| t.lines().count()) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "two rounds never finished"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();

    // A damaged newest checkpoint is skipped, with a warning.
    let checkpoints = cut.join("checkpoints");
    let mut saved: Vec<_> = std::fs::read_dir(&checkpoints)
        .expect("checkpoints")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("round-"))
        })
        .collect();
    saved.sort();
    assert!(
        !saved.is_empty(),
        "no checkpoint was written before the kill"
    );
    if saved.len() >= 2 {
        let newest = saved.last().expect("newest").join("tensors.safetensors");
        let mut bytes = std::fs::read(&newest).expect("tensors");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&newest, bytes).expect("corrupt");
    }

    let resume = run_to_end(&[
        "train".to_owned(),
        "--resume".to_owned(),
        cut.display().to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&resume.stderr);
    assert!(resume.status.success(), "{stderr}");
    if saved.len() >= 2 {
        assert!(
            stderr.contains("skipping the damaged checkpoint"),
            "{stderr}"
        );
    }
    assert_eq!(rounds(&cut), vec![0, 1, 2, 3], "every round exactly once");
    // Telemetry too: one PPO update event per round, none lost or repeated.
    let updates = |run_dir: &Path| -> usize {
        std::fs::read_dir(run_dir.join("telemetry"))
            .expect("telemetry")
            .filter_map(|e| e.ok())
            .map(|e| std::fs::read_to_string(e.path()).expect("telemetry file"))
            .map(|text| text.matches("simic.ppo.update_completed").count())
            .sum()
    };
    assert_eq!(updates(&whole), 4);
    assert_eq!(updates(&cut), 4, "telemetry of the resumed run");
    assert_eq!(policy(&cut), policy(&whole), "the resumed policy differs");
}

#[test]
fn a_ppo_resume_that_restores_no_checkpoint_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let output = run_to_end(&args_with_rounds(&run_dir, "3"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let checkpoint = |round: u32| {
        run_dir
            .join("checkpoints")
            .join(format!("round-{round:06}"))
    };
    // The newest is damaged; the older two verify (their manifests are
    // edited with a fresh checksum) but cannot be restored: their
    // observation normaliser is gone, while the run normalises observations.
    let newest = checkpoint(3).join("tensors.safetensors");
    let mut bytes = std::fs::read(&newest).expect("tensors");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&newest, bytes).expect("corrupt");
    let first_manifest = std::fs::read(checkpoint(1).join("manifest.json")).expect("manifest");
    for round in [1, 2] {
        rewrite_manifest(&checkpoint(round).join("manifest.json"), |manifest| {
            assert!(!manifest["state"]["obs_normaliser"].is_null(), "{manifest}");
            manifest["state"]["obs_normaliser"] = serde_json::Value::Null;
        });
    }
    let before = tree(&run_dir);
    let resume = run_to_end(&[
        "train".to_owned(),
        "--resume".to_owned(),
        run_dir.display().to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&resume.stderr);
    assert_eq!(resume.status.code(), Some(1), "refused: {stderr}");
    assert!(
        stderr.contains("skipping the damaged checkpoint") && stderr.contains("round-000003"),
        "{stderr}"
    );
    for round in ["round-000001", "round-000002"] {
        assert!(
            stderr.contains(&format!(
                "{round}, which verifies but could not be restored"
            )),
            "{round}: {stderr}"
        );
    }
    assert!(stderr.contains("verifies and restores"), "{stderr}");
    let after = tree(&run_dir);
    let changed: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|path| before.get(*path) != after.get(*path))
        .map(|path| {
            let hash = |entry: Option<&Option<Vec<u8>>>| {
                entry.map_or("absent".to_owned(), |entry| {
                    entry.as_ref().map_or("folder".to_owned(), |bytes| {
                        format!("{:016x}", fnv1a64(bytes))
                    })
                })
            };
            format!(
                "{}: {} -> {}",
                path.display(),
                hash(before.get(path)),
                hash(after.get(path))
            )
        })
        .collect();
    assert!(
        changed.is_empty(),
        "the refused resume changed the run directory:\n{}",
        changed.join("\n")
    );

    // Round 1 restorable again: it is resumed, rounds 2 and 3 run again.
    std::fs::write(checkpoint(1).join("manifest.json"), first_manifest).expect("put back");
    let resume = run_to_end(&[
        "train".to_owned(),
        "--resume".to_owned(),
        run_dir.display().to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&resume.stderr);
    assert!(resume.status.success(), "{stderr}");
    assert!(
        stderr.contains("round-000002, which verifies but could not be restored"),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&resume.stdout).contains("after round 1"),
        "{}",
        String::from_utf8_lossy(&resume.stdout)
    );
    assert_eq!(rounds(&run_dir), vec![0, 1, 2], "every round exactly once");
}
