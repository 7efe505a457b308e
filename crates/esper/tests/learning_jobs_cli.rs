//! `esper bench simic-learning --jobs N`: the training seeds in child
//! processes, the baselines in the parent, pooled into one record. On the
//! CPU, where every run is deterministic, the pooled record must equal the
//! one the seeds give one after another in one process, entry for entry,
//! and the parts must be gone afterwards; a run that finds a seed trained by
//! an earlier one keeps it and ends with the same record. A short protocol
//! (2 seeds, 1 round, 2-epoch episodes, 4 evaluation environments) on the
//! provisioned Fashion-MNIST subset.

use std::path::Path;
use std::process::{Command, Stdio};

const ESPER: &str = env!("CARGO_BIN_EXE_esper");

/// The short protocol's options.
const PROTOCOL: &[&str] = &[
    "bench",
    "simic-learning",
    "--quick",
    "--device",
    "cpu",
    "--seeds",
    "2",
    "--rounds",
    "1",
    "--episode",
    "2",
    "--eval-environments",
    "4",
    "--set",
    "reward.rent_weight=0",
];

/// Runs the short protocol with `extra` options, writing `out`; returns its
/// stderr.
fn run(out: &Path, extra: &[&str]) -> String {
    let mut args = PROTOCOL.to_vec();
    args.extend_from_slice(&["--out", out.to_str().expect("a UTF-8 temporary path")]);
    args.extend_from_slice(extra);
    let output = Command::new(ESPER)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{args:?} failed: {stderr}");
    stderr
}

/// Runs the short protocol with `extra` options, writing `out`, which must
/// fail; returns its stderr.
fn refused(out: &Path, extra: &[&str]) -> String {
    let mut args = PROTOCOL.to_vec();
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--out", out.to_str().expect("a UTF-8 temporary path")]);
    let output = Command::new(ESPER)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    assert!(!output.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn learning(out: &Path, extra: &[&str]) -> serde_json::Value {
    let mut with_label = vec!["--label", "jobs"];
    with_label.extend_from_slice(extra);
    let _ = run(out, &with_label);
    serde_json::from_slice(&std::fs::read(out).expect("the record")).expect("JSON")
}

#[test]
fn jobs_pool_the_same_record_as_one_process() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let one = learning(&dir.path().join("one.json"), &[]);
    // The children spread over a device list (both the CPU here).
    let jobs = learning(
        &dir.path().join("jobs.json"),
        &["--jobs", "2", "--job-devices", "cpu,cpu"],
    );
    assert_eq!(one["results"], jobs["results"]);
    assert_eq!(one["params"], jobs["params"]);
    assert_eq!(
        jobs["params"]["settings"],
        serde_json::json!(["reward.rent_weight=0"])
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("the directory")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(
        !names.iter().any(|name| name.ends_with(".parts")),
        "the parts stayed: {names:?}"
    );
}

#[test]
fn a_run_in_parts_takes_up_what_an_earlier_one_left() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let one = learning(&dir.path().join("one.json"), &[]);
    // Seed 0 trained by an earlier run that stopped: its part and policy
    // are in the parts folder.
    let out = dir.path().join("jobs.json");
    let parts = dir.path().join("jobs.json.parts");
    let _ = run(&parts.join("seed-0.json"), &["--seed-index", "0"]);
    assert!(parts.join("seed-0-policy").is_dir());
    let stderr = run(&out, &["--label", "jobs", "--jobs", "2"]);
    assert!(stderr.contains("training seed 0: kept"), "{stderr}");
    assert!(!stderr.contains("training seed 0: pid"), "{stderr}");
    assert!(stderr.contains("training seed 1: pid"), "{stderr}");
    let jobs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("the record")).expect("JSON");
    assert_eq!(one["results"], jobs["results"]);
    assert!(!parts.exists(), "the parts stayed");
}

#[test]
fn an_unusable_job_device_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("jobs.json");
    let stderr = refused(&out, &["--jobs", "2", "--job-devices", "cpu,cuda:63"]);
    assert!(stderr.contains("--job-devices: cuda:63"), "{stderr}");
    assert!(!out.exists(), "a record was written");
    assert!(
        !dir.path().join("jobs.json.parts").exists(),
        "a parts folder was made"
    );
}

#[test]
fn a_seed_index_outside_the_run_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("part.json");
    let stderr = refused(&out, &["--seed-index", "2"]);
    assert!(stderr.contains("--seed-index 2"), "{stderr}");
    assert!(!out.exists(), "a part was written");
}

#[test]
fn a_seed_part_leaves_no_progress_and_unreadable_progress_is_not_taken_up() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let parts = dir.path().join("jobs.json.parts");
    // What a stopped child could leave that does not read back: a progress
    // directory without a valid manifest. The seed trains from its start.
    let junk = parts.join("seed-0-progress");
    std::fs::create_dir_all(&junk).expect("the junk directory");
    std::fs::write(junk.join("manifest.json"), b"{ not json").expect("junk");
    let stderr = run(&parts.join("seed-0.json"), &["--seed-index", "0"]);
    assert!(stderr.contains("not taken up"), "{stderr}");
    assert!(stderr.contains("seed 0 ppo round 0"), "{stderr}");
    assert!(parts.join("seed-0.json").is_file());
    assert!(parts.join("seed-0-policy").is_dir());
    assert!(
        !junk.exists(),
        "the progress of a finished seed stayed behind"
    );
}

#[test]
fn a_seed_evaluated_by_a_child_is_kept_and_pools_the_same_record() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let one = learning(&dir.path().join("one.json"), &[]);
    let out = dir.path().join("jobs.json");
    let parts = dir.path().join("jobs.json.parts");
    // What `--jobs` starts on each of several devices: a child trains seed
    // 0, another evaluates it.
    let _ = run(&parts.join("seed-0.json"), &["--seed-index", "0"]);
    let _ = run(
        &parts.join("seed-0-evaluated.json"),
        &["--seed-index", "0", "--evaluate"],
    );
    assert!(parts.join("seed-0-evaluated.json").is_file());
    let stderr = run(&out, &["--label", "jobs", "--jobs", "2"]);
    assert!(stderr.contains("seed 0's evaluations: kept"), "{stderr}");
    let jobs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("the record")).expect("JSON");
    assert_eq!(one["results"], jobs["results"]);
    // Evaluating a seed with nothing trained is refused, naming the part.
    let missing = dir.path().join("empty").join("seed-1-evaluated.json");
    std::fs::create_dir_all(missing.parent().expect("a parent")).expect("the folder");
    let stderr = refused(&missing, &["--seed-index", "1", "--evaluate"]);
    assert!(stderr.contains("seed-1.json"), "{stderr}");
}

#[test]
fn only_seeds_leave_the_parts_and_their_small_files_finish_the_run_elsewhere() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let one = learning(&dir.path().join("one.json"), &[]);
    // Seed 1 only: trained and evaluated, no record, the parts stay.
    let out = dir.path().join("jobs.json");
    let parts = dir.path().join("jobs.json.parts");
    let stderr = run(
        &out,
        &["--label", "jobs", "--jobs", "2", "--only-seeds", "1"],
    );
    assert!(stderr.contains("not in --only-seeds"), "{stderr}");
    assert!(stderr.contains("no record yet: seeds [0]"), "{stderr}");
    assert!(!out.exists(), "a record was written with a seed missing");
    // The seed evaluated so far, pooled beside the parts: seed 1's figures
    // as the whole run has them, said to be partial.
    assert!(stderr.contains("pooled (not the record)"), "{stderr}");
    let partial: serde_json::Value = serde_json::from_slice(
        &std::fs::read(parts.join("partial.json")).expect("the partial report"),
    )
    .expect("JSON");
    assert_eq!(partial["params"]["partial"], true);
    assert_eq!(partial["params"]["evaluated_seeds"], serde_json::json!([1]));
    assert_eq!(one["params"]["partial"], false);
    // (Without `same_outcome_as_seed`: the whole run may find seed 1 acting
    // as seed 0 did, which the partial report cannot see.)
    let entry = |record: &serde_json::Value, mode: &str| {
        let mut entry = record["results"]
            .as_array()
            .expect("results")
            .iter()
            .find(|e| e["mode"] == mode)
            .unwrap_or_else(|| panic!("no {mode} entry"))
            .clone();
        if let Some(metrics) = entry["metrics"].as_object_mut() {
            metrics.remove("same_outcome_as_seed");
        }
        entry
    };
    for mode in [
        "ppo-seed1-greedy-eval",
        "compare-ppo-vs-no-growth-seed1",
        "no-growth-eval",
    ] {
        assert_eq!(entry(&partial, mode), entry(&one, mode), "{mode}");
    }
    assert!(
        partial["results"]
            .as_array()
            .expect("results")
            .iter()
            .all(|e| !e["mode"].as_str().unwrap_or_default().contains("seed0")),
        "seed 0, never trained, is in the partial report"
    );
    // Another machine carries only the small files of the parts folder
    // (not the trained policy) and finishes the run with the other seed.
    let elsewhere = dir.path().join("elsewhere");
    let carried = elsewhere.join("jobs.json.parts");
    std::fs::create_dir_all(&carried).expect("the carried parts");
    for name in ["baselines.json", "seed-1.json", "seed-1-evaluated.json"] {
        std::fs::copy(parts.join(name), carried.join(name)).expect("a small part");
    }
    let finished = elsewhere.join("jobs.json");
    let stderr = run(&finished, &["--label", "jobs", "--jobs", "2"]);
    assert!(stderr.contains("the baselines kept"), "{stderr}");
    assert!(stderr.contains("seed 1's evaluations: kept"), "{stderr}");
    assert!(stderr.contains("training seed 0: pid"), "{stderr}");
    let jobs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&finished).expect("the record")).expect("JSON");
    assert_eq!(one["results"], jobs["results"]);
    assert!(!carried.exists(), "the parts stayed");
    // A seed outside the run, and --only-seeds without --jobs, are refused.
    let stderr = refused(&out, &["--jobs", "2", "--only-seeds", "0,2"]);
    assert!(stderr.contains("--only-seeds 2"), "{stderr}");
    let stderr = refused(&out, &["--only-seeds", "0"]);
    assert!(stderr.contains("--only-seeds needs --jobs"), "{stderr}");
}

#[test]
fn baselines_are_kept_for_another_twin_weight() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let first = dir.path().join("first.json");
    let twin = |weight: &'static str| {
        [
            "--label",
            "jobs",
            "--jobs",
            "2",
            "--only-seeds",
            "1",
            "--set",
            weight,
        ]
    };
    let stderr = run(&first, &twin("reward.twin_delta_weight=1"));
    assert!(stderr.contains("baselines on the"), "{stderr}");
    // The baselines carry to a run with another twin weight: they run
    // without a twin, whatever the weight.
    let carried = dir.path().join("second.json.parts");
    std::fs::create_dir_all(&carried).expect("the carried parts");
    std::fs::copy(
        dir.path().join("first.json.parts").join("baselines.json"),
        carried.join("baselines.json"),
    )
    .expect("the baselines part");
    let stderr = run(
        &dir.path().join("second.json"),
        &twin("reward.twin_delta_weight=3"),
    );
    assert!(stderr.contains("the baselines kept"), "{stderr}");
    assert!(!stderr.contains("baselines on the"), "{stderr}");
}

#[test]
fn a_greedy_curve_and_its_selected_policy_pool_the_same_in_child_processes() {
    // The selected policy travels in the trained policy's checkpoint from
    // the child that trains to the one that evaluates.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let one = learning(&dir.path().join("one.json"), &["--greedy-every", "1"]);
    let jobs = learning(
        &dir.path().join("jobs.json"),
        &["--greedy-every", "1", "--jobs", "2"],
    );
    assert_eq!(one["results"], jobs["results"]);
    assert_eq!(jobs["params"]["greedy_curve"]["every_rounds"], 1);
    let entry = |mode: &str| {
        jobs["results"]
            .as_array()
            .expect("results")
            .iter()
            .find(|entry| entry["mode"] == mode)
            .unwrap_or_else(|| panic!("no {mode} entry"))
            .clone()
    };
    assert!(entry("ppo-seed1-round-0")["metrics"]["greedy_accuracy_pct"].is_number());
    assert_eq!(
        entry("ppo-seed0-selected-eval")["metrics"]["selected_round"],
        0.0
    );
    assert!(entry("compare-ppo-selected-vs-no-growth")["metrics"]["pairs"].is_number());
}
