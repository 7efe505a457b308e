//! `esper bench ... --gpus` on the CPU: the scaling bench's ranks as
//! processes with Gloo. With the provisioned venv's real torchrun, each
//! count also runs under torchrun beside esper's own launcher.
//! `simic-growth --gpus 1,2` on two CPU ranks (CIFAR-10 files the test
//! writes) drives seeds in every rank, sums the ranks into one record, and
//! runs each variant as the single-process bench beside its 1-GPU entry,
//! and as two single processes at once beside its 2-GPU entry.

use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::venv_torchrun;

const ESPER: &str = env!("CARGO_BIN_EXE_esper");

#[test]
fn the_scaling_bench_starts_each_count_under_torchrun_beside_its_own_launcher() {
    let Some(torchrun) = venv_torchrun() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("scaling.json");
    let record = bench_record(
        &[
            "bench",
            "simic-throughput",
            "--device",
            "cpu",
            "--gpus",
            "2",
            "--torchrun",
            "--quick",
            "--no-concurrent",
        ],
        &record,
        ("ESPER_TORCHRUN", torchrun.as_os_str()),
    );
    for mode in ["dp2-fp32-eager", "dp2-fp32-eager-torchrun"] {
        let entry = entry(&record, mode);
        assert!(entry["error"].is_null(), "{mode}: {}", entry["error"]);
        let eps = entry["metrics"]["eps"].as_f64().expect("eps");
        assert!(eps > 0.0, "{mode}: eps {eps}");
        // The PPO ranks' updates time the group's own calls.
        let collectives = entry["metrics"]["update_collective_ms"]
            .as_f64()
            .expect("update_collective_ms");
        assert!(collectives > 0.0, "{mode}: {}", entry["metrics"]);
    }
    // --no-concurrent: no independent processes ran, and the record says so.
    assert!(
        record["results"]
            .as_array()
            .expect("results")
            .iter()
            .all(|e| !e["mode"].as_str().unwrap_or("").starts_with("concurrent")),
        "{record}"
    );
    assert!(
        record["params"]["concurrent"]
            .as_str()
            .is_some_and(|s| s.contains("not run")),
        "{}",
        record["params"]
    );
}

/// The record's entry of `mode`, which must be there.
fn entry<'a>(record: &'a serde_json::Value, mode: &str) -> &'a serde_json::Value {
    record["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|entry| entry["mode"] == mode)
        .unwrap_or_else(|| panic!("no {mode} entry: {record}"))
}

/// Runs `esper ARGS --out RECORD` with one environment variable set, which
/// must succeed; returns the record it wrote.
fn bench_record(args: &[&str], record: &Path, env: (&str, &std::ffi::OsStr)) -> serde_json::Value {
    let output = Command::new(ESPER)
        .args(args)
        .arg("--out")
        .arg(record)
        .env(env.0, env.1)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&std::fs::read(record).expect("the record")).expect("JSON")
}

/// A small CIFAR-10 in the binary format (five training files of 110
/// records, a test file of 40), seeded pixels, every class present.
fn write_small_cifar(dir: &Path) {
    use tolaria::data::cifar10::{PIXELS_PER_IMAGE, TEST_FILE, TRAIN_FILES};
    let records = |n: usize, salt: usize| {
        let mut bytes = Vec::with_capacity(n * (1 + PIXELS_PER_IMAGE));
        for i in 0..n {
            bytes.push(u8::try_from((i + salt) % 10).expect("a class"));
            bytes.extend((0..PIXELS_PER_IMAGE).map(|p| ((p * 31 + i * 17 + salt) % 251) as u8));
        }
        bytes
    };
    for (k, name) in TRAIN_FILES.iter().enumerate() {
        std::fs::write(dir.join(name), records(110, k)).expect("a training file");
    }
    std::fs::write(dir.join(TEST_FILE), records(40, 9)).expect("the test file");
}

#[test]
fn the_growth_bench_drives_seeds_on_every_rank_and_sums_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cifar = dir.path().join("cifar");
    std::fs::create_dir_all(&cifar).expect("the data folder");
    write_small_cifar(&cifar);
    let record = dir.path().join("growth.json");
    let record = bench_record(
        &[
            "bench",
            "simic-growth",
            "--device",
            "cpu",
            "--gpus",
            "1,2",
            "--quick",
            "--episode",
            "4",
            "--rounds",
            "2",
            // A variant with a suffix runs on every count too (the ranks
            // read variants as the single-process bench does).
            "--variants",
            "fp32-eager,fp32-eager-fp32-policy",
        ],
        &record,
        ("ESPER_CIFAR10_DIR", cifar.as_os_str()),
    );
    assert!(
        record["params"]["scaling"]
            .as_str()
            .is_some_and(|s| s.contains("max-growth")),
        "{}",
        record["params"]
    );
    // `--rounds` reaches the ranks.
    assert_eq!(record["params"]["rounds"], 2, "{}", record["params"]);
    // No warm-up on the CPU, and the record says so.
    assert!(
        record["params"]["warmup"]
            .as_str()
            .is_some_and(|s| s.contains("none")),
        "{}",
        record["params"]
    );
    for mode in [
        "dp1-fp32-eager",
        "dp2-fp32-eager",
        "dp1-fp32-eager-fp32-policy",
        "dp2-fp32-eager-fp32-policy",
    ] {
        let entry = entry(&record, mode);
        assert!(entry["error"].is_null(), "{mode}: {}", entry["error"]);
        let metrics = &entry["metrics"];
        assert!(
            metrics["eps"].as_f64().is_some_and(|e| e > 0.0),
            "{mode}: {metrics}"
        );
        // Max growth germinates at the first epoch the masks allow: a seed
        // lives from the third epoch of four on, in every environment.
        let seeds = metrics["active_seeds_per_env"]
            .as_f64()
            .expect("live seeds");
        assert!(seeds > 0.2, "{mode}: {metrics}");
        // Where the rollouts' time went, part by part.
        for part in ["train", "launch", "policy", "boundary"] {
            let name = format!("rollout_{part}_ms");
            assert!(
                metrics[name.as_str()].as_f64().is_some_and(|ms| ms > 0.0),
                "{mode}: {name} in {metrics}"
            );
        }
        // The ranks' rollouts, apart from the update.
        assert!(
            metrics["rollout_ms_slowest_rank"]
                .as_f64()
                .is_some_and(|ms| ms > 0.0
                    && ms
                        >= metrics["rollout_ms_fastest_rank"]
                            .as_f64()
                            .unwrap_or(f64::INFINITY)),
            "{mode}: {metrics}"
        );
    }
    // Each variant also ran as the single-process bench right after its
    // one-GPU entry, which says how it compares.
    for variant in ["fp32-eager", "fp32-eager-fp32-policy"] {
        let mode = format!("single-process-{variant}");
        let single = entry(&record, &mode);
        assert!(single["error"].is_null(), "{mode}: {}", single["error"]);
        let eps = single["metrics"]["eps"].as_f64().expect("eps");
        let seeds = single["metrics"]["active_seeds_per_env"]
            .as_f64()
            .expect("live seeds");
        assert!(eps > 0.0 && seeds > 0.2, "{mode}: {}", single["metrics"]);
        let one = entry(&record, &format!("dp1-{variant}"));
        let ratio = one["metrics"]["single_process_ratio"]
            .as_f64()
            .unwrap_or_else(|| panic!("no ratio: {}", one["metrics"]));
        let expected = one["metrics"]["eps"].as_f64().expect("eps") / eps;
        assert!(
            (ratio - expected).abs() < 1e-9,
            "{ratio} against {expected}"
        );
        // Two rounds: steady figures on both sides.
        assert!(
            one["metrics"]["single_process_ratio_steady"]
                .as_f64()
                .is_some(),
            "{}",
            one["metrics"]
        );
    }
    // Only the one-GPU entries carry the comparison.
    let two = entry(&record, "dp2-fp32-eager");
    assert!(two["metrics"]["single_process_ratio"].is_null());
    // After the two-rank count, two single processes ran at once: against
    // the process alone, and the group against them.
    for variant in ["fp32-eager", "fp32-eager-fp32-policy"] {
        let metric = |mode: &str, name: &str| {
            entry(&record, mode)["metrics"][name]
                .as_f64()
                .unwrap_or_else(|| panic!("{mode} has no {name}: {record}"))
        };
        let concurrent = format!("concurrent2-{variant}");
        assert!(entry(&record, &concurrent)["error"].is_null(), "{record}");
        assert_eq!(metric(&concurrent, "processes"), 2.0);
        let seeds = metric(&concurrent, "active_seeds_per_env");
        assert!(seeds > 0.2, "{concurrent}: seeds {seeds}");
        let per_gpu = metric(&concurrent, "eps_per_gpu");
        assert!((per_gpu * 2.0 - metric(&concurrent, "eps")).abs() < 1e-9);
        let alone = metric(&format!("single-process-{variant}"), "eps");
        let sharing = metric(&concurrent, "host_sharing_ratio");
        assert!((sharing - per_gpu / alone).abs() < 1e-9, "{sharing}");
        let dp2 = format!("dp2-{variant}");
        let group = metric(&dp2, "group_ratio");
        let expected = metric(&dp2, "eps") / metric(&concurrent, "eps");
        assert!(
            (group - expected).abs() < 1e-9,
            "{group} against {expected}"
        );
    }
    // Only the counts above one have independent processes beside them.
    assert!(entry(&record, "dp1-fp32-eager")["metrics"]["group_ratio"].is_null());
}
