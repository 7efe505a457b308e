//! `esper bench simic-growth --policy PATH` as a user runs it, on the CPU:
//! the trained policy of an `esper train --controller ppo` run (its run
//! directory: the newest checkpoint that verifies, a damaged newer one
//! skipped with a warning; or one checkpoint folder) is read, named and
//! handed to the bench; a folder without a PPO checkpoint, a policy of other
//! episodes and `--policy` with `--gpus` are refused with the reason. (The
//! bench's environments need CIFAR-10: where it is missing the record says
//! so. The driving itself is simic's `learned_driver` test.)

mod common;

use common::esper;
use std::path::Path;
use std::process::Output;

/// Two PPO rounds of five-epoch episodes (the quick bench's length) on the
/// synthetic task, a checkpoint after each.
fn train(run_dir: &Path) {
    let run_dir = run_dir.to_str().expect("utf-8 path");
    let output = esper(&[
        "train",
        "--controller",
        "ppo",
        "--task",
        "synthetic",
        "--train-samples",
        "256",
        "--epochs",
        "5",
        "--envs",
        "2",
        "--rounds",
        "2",
        "--batch-size",
        "64",
        "--slots",
        "r0c0,r0c1,r0c2",
        "--device",
        "cpu",
        "--checkpoint-every",
        "1",
        "--preset",
        "growth",
        "--run-dir",
        run_dir,
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn bench(policy: &Path, out: &Path, more: &[&str]) -> Output {
    let mut args = vec![
        "bench",
        "simic-growth",
        "--quick",
        "--device",
        "cpu",
        "--policy",
        policy.to_str().expect("utf-8 path"),
        "--out",
        out.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(more);
    esper(&args)
}

#[test]
fn a_trained_run_drives_the_growth_bench_and_bad_policies_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    train(&run);
    let out = dir.path().join("growth.json");

    // The run directory: its newest checkpoint, with its settings.
    let output = bench(&run, &out, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("round-000002, trained on synthetic (after 2 rounds"),
        "{stderr}"
    );
    assert!(stderr.contains("slot.auto_forward_g1=true"), "{stderr}");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("the record")).expect("JSON");
    let driver = record["params"]["driver"].as_str().unwrap_or_default();
    let no_data = record["results"][0]["mode"] == "data";
    assert!(
        no_data || driver.starts_with("learned"),
        "the record's driver: {driver:?}"
    );

    // A damaged newest checkpoint is skipped with a warning.
    let newest = run.join("checkpoints").join("round-000002");
    std::fs::write(newest.join("tensors.safetensors"), b"damaged").expect("damage");
    let output = bench(&run, &out, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: skipping") && stderr.contains("round-000001, trained on"),
        "{stderr}"
    );

    // One checkpoint folder.
    let output = bench(&run.join("checkpoints").join("round-000001"), &out, &[]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Refusals, each with its reason.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("a folder");
    for (policy, more, reason) in [
        (empty.as_path(), &[][..], "holds no PPO checkpoint"),
        (
            run.as_path(),
            &["--episode", "7"][..],
            "trained on episodes of 5",
        ),
        (
            run.as_path(),
            &["--gpus", "1"][..],
            "--policy drives one process",
        ),
    ] {
        let output = bench(policy, &out, more);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{more:?}: {stderr}");
        assert!(stderr.contains(reason), "{more:?}: {stderr}");
    }
    let output = esper(&[
        "bench",
        "simic-cifar",
        "--policy",
        run.to_str().expect("utf-8"),
        "--out",
        "a.json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--policy does not apply to simic-cifar"),
        "{stderr}"
    );
}
