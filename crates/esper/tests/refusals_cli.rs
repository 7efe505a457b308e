//! What `esper` refuses, driven as a user meets it: the built binary on the
//! synthetic task on the CPU.
//!
//! - every class of bad configuration (a slot the host lacks, learning rates
//!   out of range or not finite, a batch larger than the data, a graph mode
//!   on the CPU, absurd sizes, PPO settings the environments cannot train
//!   with) is refused with a message naming it, before anything is written:
//!   no run directory appears, an empty one stays empty, and a rerun with a
//!   good configuration into the same `--run-dir` goes ahead;
//! - bf16 on the CPU either trains or is refused leaving nothing;
//! - arguments that are not UTF-8 (legal Unix paths) are taken as paths or
//!   refused with a message, never a panic (exit status 101);
//! - `esper plot` of well-formed records with absurd epochs, slot counts or
//!   round numbers is refused with a message, drawing nothing;
//! - `esper train --help` describes the controllers and the default mode as
//!   they are.

mod common;

use common::esper;
use std::path::Path;
use std::process::Output;

/// Exit status of a Rust panic.
const PANICKED: i32 = 101;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// A small synthetic heuristic run into `run_dir` with `extra` options
/// (each replacing the base option of the same flag).
fn synthetic(run_dir: &Path, extra: &[&str]) -> Vec<String> {
    let base = [
        ("--task", "synthetic"),
        ("--train-samples", "256"),
        ("--batch-size", "64"),
        ("--epochs", "1"),
        ("--device", "cpu"),
        ("--run-dir", path_arg(run_dir)),
    ];
    let mut args = vec!["train".to_owned()];
    for (flag, value) in base {
        if !extra.contains(&flag) {
            args.extend([flag.to_owned(), value.to_owned()]);
        }
    }
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    args
}

/// The PPO counterpart of [`synthetic`] (2 environments of 128 samples).
fn synthetic_ppo(run_dir: &Path, extra: &[&str]) -> Vec<String> {
    let base = [
        ("--controller", "ppo"),
        ("--rounds", "1"),
        ("--envs", "2"),
        ("--slots", "r0c0,r0c1"),
    ];
    let mut all: Vec<&str> = Vec::new();
    for (flag, value) in base {
        if !extra.contains(&flag) {
            all.extend([flag, value]);
        }
    }
    all.extend(extra);
    synthetic(run_dir, &all)
}

/// Asserts that `output` is a refusal (status 1, not a panic) whose message
/// holds `needle`.
fn assert_refused(output: &Output, needle: &str, what: &str) {
    let stderr = text(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{what}: refused with status 1\n{}\n{stderr}",
        text(&output.stdout)
    );
    assert!(
        stderr.contains(needle),
        "{what}: the message names {needle:?}: {stderr}"
    );
}

#[test]
fn bad_configurations_are_refused_before_the_run_directory_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let heuristic: [(&[&str], &str); 12] = [
        (&["--slots", "r9c9"], "r9c9"),
        (&["--learning-rate", "1e9"], "learning_rate"),
        (&["--learning-rate", "NaN"], "learning_rate NaN"),
        (&["--learning-rate", "inf"], "learning_rate inf"),
        (
            &["--batch-size", "512"],
            "batch_size 512 is more than the 256",
        ),
        (&["--mode", "graph-step"], "graph"),
        (&["--mode", "graph-epoch"], "graph"),
        (&["--epochs", "1000000"], "epochs 1000000"),
        (&["--max-seeds", "1000000"], "max_seeds"),
        (&["--train-samples", "4000000000"], "synthetic"),
        (&["--slots", "r0c1,r0c1"], "twice"),
        (&["--device", "cuda:99"], "device"),
    ];
    for (extra, needle) in heuristic {
        let output = esper(&synthetic(&run_dir, extra));
        assert_refused(&output, needle, &format!("{extra:?}"));
        assert!(!run_dir.exists(), "{extra:?} left a run directory");
    }
    let ppo: [(&[&str], &str); 5] = [
        (&["--slots", "r0c1,r9c9"], "r9c9"),
        (
            &["--batch-size", "200"],
            "batch_size 200 is more than the 128",
        ),
        (&["--mode", "graph-step"], "graph"),
        (&["--entropy-coef=-inf"], "entropy_coef"),
        (
            &["--envs", "256", "--epochs", "10000"],
            "environment-epochs",
        ),
    ];
    for (extra, needle) in ppo {
        let output = esper(&synthetic_ppo(&run_dir, extra));
        assert_refused(&output, needle, &format!("ppo {extra:?}"));
        assert!(!run_dir.exists(), "ppo {extra:?} left a run directory");
    }
    // A port already taken is refused before the run directory is made.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("address").port().to_string();
    let output = esper(&synthetic(&run_dir, &["--metrics-port", &port]));
    assert_refused(&output, "--metrics-port", "a taken port");
    assert!(!run_dir.exists(), "a taken port left a run directory");
    drop(taken);

    // An empty run directory that exists stays empty.
    std::fs::create_dir(&run_dir).expect("mkdir");
    let output = esper(&synthetic(&run_dir, &["--slots", "r9c9"]));
    assert_refused(&output, "r9c9", "into an empty directory");
    assert_eq!(
        std::fs::read_dir(&run_dir).expect("read_dir").count(),
        0,
        "the empty run directory stays empty"
    );

    // The same directory then takes a good run.
    let output = esper(&synthetic(&run_dir, &[]));
    assert!(
        output.status.success(),
        "a rerun into the same --run-dir: {}",
        text(&output.stderr)
    );
    assert!(run_dir.join("config.toml").is_file());
    assert!(run_dir.join("epochs.jsonl").is_file());
    let config = std::fs::read_to_string(run_dir.join("config.toml")).expect("config");
    assert!(config.contains("mode = \"auto\""), "{config}");
    assert!(
        text(&output.stdout).contains(" eager"),
        "auto is eager on the CPU: {}",
        text(&output.stdout)
    );
}

#[test]
fn bf16_on_the_cpu_trains_or_is_refused_leaving_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let output = esper(&synthetic(&run_dir, &["--precision", "bf16"]));
    assert_ne!(output.status.code(), Some(PANICKED), "no panic");
    if output.status.success() {
        assert!(run_dir.join("epochs.jsonl").is_file(), "a run that trained");
    } else {
        assert!(
            text(&output.stderr).contains("bf16"),
            "{}",
            text(&output.stderr)
        );
        assert!(!run_dir.exists(), "a refused bf16 run left a run directory");
    }
}

#[cfg(unix)]
#[test]
fn arguments_that_are_not_utf8_are_paths_or_clear_errors_never_panics() {
    use std::ffi::{OsStr, OsString};
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let odd = |name: &[u8]| dir.path().join(OsStr::from_bytes(name));

    // A run directory whose name is not UTF-8 is a legal Unix path: the run
    // trains into it.
    let run_dir = odd(b"run-\xff");
    let mut args: Vec<OsString> = synthetic(&dir.path().join("unused"), &[])
        .into_iter()
        .map(OsString::from)
        .collect();
    let last = args.len() - 1;
    args[last] = run_dir.clone().into_os_string();
    let output = esper(&args);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(run_dir.join("epochs.jsonl").is_file());
    assert!(run_dir.join("checkpoints").join("1").is_dir());
    // And it resumes (the run is complete: nothing to do).
    let output = esper(&[
        OsStr::new("train"),
        OsStr::new("--resume"),
        run_dir.as_os_str(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("is complete"));

    // A value that is not a path must be text: clap refuses it (status 2).
    let mut args: Vec<OsString> = synthetic(&dir.path().join("other"), &[])
        .into_iter()
        .map(OsString::from)
        .collect();
    args.extend([OsString::from("--task"), odd(b"\xfe").into_os_string()]);
    let output = esper(&args);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(!dir.path().join("other").exists());

    // A data folder is recorded as text: refused before anything is written.
    let output = esper(&[
        OsStr::new("train"),
        OsStr::new("--device"),
        OsStr::new("cpu"),
        OsStr::new("--data-dir"),
        odd(b"data-\xff").as_os_str(),
        OsStr::new("--run-dir"),
        dir.path().join("fmnist").as_os_str(),
    ]);
    assert_refused(&output, "not valid UTF-8", "--data-dir");
    assert!(!dir.path().join("fmnist").exists());

    // `esper bench --out` takes the path; the label it cannot take from a
    // stem that is not text is asked for.
    let output = esper(&[
        OsStr::new("bench"),
        OsStr::new("nissa-emit"),
        OsStr::new("--out"),
        odd(b"record-\xff.json").as_os_str(),
    ]);
    assert_refused(&output, "UTF-8 file stem", "bench --out");
    let output = esper(&[
        OsStr::new("bench"),
        OsStr::new("nissa-emit"),
        OsStr::new("--out"),
        dir.path().join("r.json").as_os_str(),
        OsStr::new("--label"),
        OsStr::new(OsStr::from_bytes(b"l\xff")),
    ]);
    assert_refused(&output, "not valid UTF-8", "bench --label");

    // The command word, `esper plot`'s folder and `--config`'s file.
    for (args, needle) in [
        (
            vec![OsString::from(OsStr::from_bytes(b"tr\xffin"))],
            "unknown command",
        ),
        (
            vec!["plot".into(), odd(b"no-run-\xff").into_os_string()],
            "epochs.jsonl",
        ),
        (
            vec![
                "train".into(),
                "--config".into(),
                odd(b"no-config-\xff.toml").into_os_string(),
            ],
            "configuration file",
        ),
    ] {
        let output = esper(&args);
        assert_refused(&output, needle, &format!("{args:?}"));
    }
}

#[test]
fn plot_refuses_absurd_records_and_writes_no_picture() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = |epoch: &str, slots: usize| {
        let slots: Vec<String> = (0..slots)
            .map(|index| format!("{{\"slot\":\"s{index}\",\"stage\":\"DORMANT\",\"alpha\":0.0}}"))
            .collect();
        format!(
            "{{\"epoch\":{epoch},\"train_loss\":1.0,\"train_accuracy\":50.0,\"val_loss\":1.0,\
             \"val_accuracy\":50.0,\"epoch_ms\":1.0,\"samples_per_s\":1.0,\"active_seeds\":0,\
             \"slots\":[{}],\"decision\":null}}\n",
            slots.join(",")
        )
    };
    for (name, lines, needle) in [
        (
            "far",
            record("0", 1) + &record(&u64::MAX.to_string(), 1),
            "beyond the 100000 epochs",
        ),
        ("crowded", record("0", 50_000), "50000 slots"),
    ] {
        let run_dir = dir.path().join(name);
        std::fs::create_dir(&run_dir).expect("mkdir");
        std::fs::write(run_dir.join("epochs.jsonl"), lines).expect("write");
        let output = esper(&["plot", path_arg(&run_dir)]);
        assert_refused(&output, needle, name);
        assert!(!run_dir.join("run.png").exists() && !run_dir.join("run.svg").exists());
    }
    let run_dir = dir.path().join("rounds");
    std::fs::create_dir(&run_dir).expect("mkdir");
    std::fs::write(
        run_dir.join("rounds.jsonl"),
        "{\"round\":0,\"mean_episode_reward\":1e308}\n{\"round\":1e300}\n",
    )
    .expect("write");
    let output = esper(&["plot", path_arg(&run_dir)]);
    assert_refused(&output, "not a round number", "a round of 1e300");
    assert!(!run_dir.join("run.png").exists());
}

#[test]
fn train_help_describes_the_controllers_and_the_default_mode_as_they_are() {
    let help = esper(&["train", "--help"]);
    assert!(help.status.success());
    let help = text(&help.stdout);
    for stale in ["issue", "not implemented"] {
        assert!(!help.contains(stale), "{stale:?} in the help: {help}");
    }
    for needle in [
        "Simic's vectorized PPO",
        "graph-step on CUDA",
        "eager on the CPU",
    ] {
        assert!(help.contains(needle), "{needle:?} in the help: {help}");
    }
    let usage = text(&esper(&["help"]).stdout);
    assert!(!usage.contains("issue"), "{usage}");
    assert!(usage.contains("auto: graph-step on CUDA"), "{usage}");
}

#[test]
fn bad_settings_and_presets_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    for (extra, needle, what) in [
        (
            vec!["--set", "reward.rent_weight=-1"],
            "rent_weight",
            "a negative rent",
        ),
        (
            vec!["--set", "reward.no_such_field=1"],
            "no_such_field",
            "an unknown field",
        ),
        (vec!["--preset", "grow"], "growth", "an unknown preset"),
    ] {
        let output = esper(&synthetic_ppo(&run_dir, &extra));
        assert_refused(&output, needle, what);
        assert!(!run_dir.exists(), "{what}: nothing written");
    }
    let output = esper(&synthetic(&run_dir, &["--preset", "growth"]));
    assert_refused(&output, "--controller ppo only", "a preset without ppo");
    assert!(!run_dir.exists(), "a preset without ppo: nothing written");
}
