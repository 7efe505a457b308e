//! `esper train` and `esper plot` driven as a user drives them: the built
//! binary, real files in a temporary directory, the synthetic task on the
//! CPU (a few seconds per run).

mod common;

use common::esper;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const ESPER: &str = env!("CARGO_BIN_EXE_esper");

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// A short synthetic run's arguments into `run_dir`.
fn synthetic_run(run_dir: &Path, epochs: &str) -> Vec<String> {
    [
        "train",
        "--controller",
        "heuristic",
        "--task",
        "synthetic",
        "--train-samples",
        "512",
        "--epochs",
        epochs,
        "--device",
        "cpu",
        "--run-dir",
        path_arg(run_dir),
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect()
}

/// `esper train --controller ppo` on the synthetic task on the CPU: 2
/// environments of 256 samples, three slots, `epochs` a episode, `rounds`
/// rounds, then `extra`.
fn synthetic_ppo(run_dir: &Path, epochs: &str, rounds: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "train",
        "--controller",
        "ppo",
        "--task",
        "synthetic",
        "--train-samples",
        "256",
        "--epochs",
        epochs,
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
        "--run-dir",
        path_arg(run_dir),
    ];
    args.extend_from_slice(extra);
    esper(&args)
}

fn epoch_lines(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("epochs.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("an epoch line is JSON"))
        .collect()
}

fn assert_picture(run_dir: &Path) {
    let png = std::fs::read(run_dir.join("run.png")).expect("run.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "run.png is a PNG");
    assert!(
        png.len() > 10_000,
        "run.png has content ({} bytes)",
        png.len()
    );
    let svg = std::fs::read_to_string(run_dir.join("run.svg")).expect("run.svg");
    assert!(svg.contains("<svg"), "run.svg is an SVG");
    assert!(
        svg.contains("accuracy") && svg.contains("r0c1"),
        "charts and lanes"
    );
}

#[test]
fn a_config_with_an_unknown_key_fails_naming_the_key_and_its_nearest_spelling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("run.toml");
    std::fs::write(&config, "task = \"synthetic\"\nepoch = 3\n").expect("write");
    let run_dir = dir.path().join("run");
    let output = esper(&[
        "train",
        "--config",
        path_arg(&config),
        "--run-dir",
        path_arg(&run_dir),
    ]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains("unknown key \"epoch\" in ") && stderr.contains("run.toml"),
        "names the key and the file: {stderr}"
    );
    assert!(
        stderr.contains("did you mean \"epochs\"?"),
        "suggests the nearest key: {stderr}"
    );
    assert!(!run_dir.exists(), "nothing was created");
}

#[test]
fn a_short_synthetic_heuristic_run_writes_its_directory_and_plot_redraws_the_picture() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The file says 5 epochs and batch 64; the flag's 3 epochs win.
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        "epochs = 5\nbatch-size = 64\nslots = [\"r0c1\", \"r0c2\"]\n",
    )
    .expect("write");
    let run_dir = dir.path().join("run");
    let mut args = synthetic_run(&run_dir, "3");
    args.extend(["--config".to_owned(), path_arg(&config).to_owned()]);
    let output = Command::new(ESPER)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "run failed: {stdout}\n{}",
        text(&output.stderr)
    );
    // Not a terminal: one plain line per epoch.
    for epoch in 1..=3 {
        assert!(
            stdout.contains(&format!("epoch {epoch}/3  train loss")),
            "{stdout}"
        );
    }

    // The resolved configuration: flag over file over default.
    let written: toml::Table = std::fs::read_to_string(run_dir.join("config.toml"))
        .expect("config.toml")
        .parse()
        .expect("config.toml is TOML");
    assert_eq!(written["epochs"].as_integer(), Some(3));
    assert_eq!(written["batch_size"].as_integer(), Some(64));
    assert_eq!(written["task"].as_str(), Some("synthetic"));
    assert_eq!(written["controller"].as_str(), Some("heuristic"));
    assert_eq!(written["train_samples"].as_integer(), Some(512));

    // One line per epoch with the figures, the slots and the decision.
    let epochs = epoch_lines(&run_dir);
    assert_eq!(epochs.len(), 3);
    for (index, epoch) in epochs.iter().enumerate() {
        assert_eq!(epoch["epoch"].as_u64(), Some(index as u64));
        for key in [
            "train_loss",
            "train_accuracy",
            "val_loss",
            "val_accuracy",
            "epoch_ms",
        ] {
            assert!(epoch[key].as_f64().is_some(), "{key} in {epoch}");
        }
        let slots = epoch["slots"].as_array().expect("slots");
        let names: Vec<&str> = slots.iter().filter_map(|s| s["slot"].as_str()).collect();
        assert_eq!(names, ["r0c1", "r0c2"]);
        for slot in slots {
            assert!(slot["stage"].as_str().is_some() && slot["alpha"].as_f64().is_some());
        }
        assert_eq!(
            epoch["decision"]["op"].as_str(),
            Some("WAIT"),
            "too early to act"
        );
    }

    // Telemetry: JSON lines through nissa into telemetry/.
    let telemetry: String = std::fs::read_dir(run_dir.join("telemetry"))
        .expect("telemetry/")
        .map(|entry| std::fs::read_to_string(entry.expect("entry").path()).expect("read"))
        .collect();
    assert!(
        telemetry.contains("tolaria.training.latency_ms"),
        "the trainer's epoch telemetry was delivered"
    );

    assert_picture(&run_dir);

    // `esper plot` draws the picture again from epochs.jsonl.
    std::fs::remove_file(run_dir.join("run.png")).expect("remove");
    std::fs::remove_file(run_dir.join("run.svg")).expect("remove");
    let plot = esper(&["plot", path_arg(&run_dir)]);
    assert!(plot.status.success(), "{}", text(&plot.stderr));
    assert_picture(&run_dir);

    // A run directory is never overwritten.
    let again = Command::new(ESPER)
        .args(synthetic_run(&run_dir, "1"))
        .output()
        .expect("esper runs");
    assert!(!again.status.success());
    assert!(text(&again.stderr).contains("already holds files"));
}

#[test]
fn a_ppo_run_trains_the_policy_round_by_round_and_saves_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let output = synthetic_ppo(
        &run_dir,
        "2",
        "2",
        &["--ppo-epochs", "2", "--reward-mode", "sparse"],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(stdout.contains("round 2/2: reward"), "{stdout}");
    let rounds: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("rounds.jsonl"))
        .expect("rounds.jsonl")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a round line is JSON"))
        .collect();
    assert_eq!(rounds.len(), 2);
    for (index, round) in rounds.iter().enumerate() {
        assert_eq!(round["round"], index);
        assert_eq!(round["env_epochs"], 4, "2 environments x 2 epochs");
        assert!(round["mean_episode_reward"].is_f64(), "{round}");
        assert!(round["ppo"]["policy_loss"].is_f64(), "{round}");
        // Two passes asked for; the KL early stop may end the second.
        let passes = round["ppo"]["epochs_run"].as_u64().expect("epochs run");
        assert!((1..=2).contains(&passes), "{round}");
        // The decision analytics: 4 decisions, each op named.
        let chosen = round["actions"]["chosen"].as_object().expect("chosen ops");
        assert_eq!(chosen.len(), 6, "{round}");
        let total: u64 = chosen.values().map(|v| v.as_u64().expect("count")).sum();
        assert_eq!(total, round["actions"]["steps"].as_u64().expect("steps"));
        assert!(total <= 4, "{round}");
    }
    assert!(stdout.contains("chose "), "{stdout}");
    let policy = std::fs::metadata(run_dir.join("policy.safetensors")).expect("policy saved");
    assert!(policy.len() > 1000);
    // The run picture (reward, eps, accuracy and live seeds per round), and
    // `esper plot` redraws it from rounds.jsonl.
    let png = std::fs::metadata(run_dir.join("run.png")).expect("run.png");
    assert!(png.len() > 1000);
    std::fs::remove_file(run_dir.join("run.svg")).expect("run.svg");
    let plot = esper(&["plot", path_arg(&run_dir)]);
    assert!(plot.status.success(), "{}", text(&plot.stderr));
    let svg = std::fs::read_to_string(run_dir.join("run.svg")).expect("redrawn run.svg");
    assert!(svg.contains("mean episode reward"));
    // The first environment's last episode, epoch by epoch, with every
    // slot's stage, and its picture (the seeds' lifecycles).
    let episode: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("episode.jsonl"))
        .expect("episode.jsonl")
        .lines()
        .map(|line| serde_json::from_str(line).expect("an episode line is JSON"))
        .collect();
    assert_eq!(episode.len(), 2, "one line per epoch of the episode");
    for (epoch, line) in episode.iter().enumerate() {
        assert_eq!(line["epoch"], epoch);
        assert_eq!(line["slots"].as_array().expect("slots").len(), 3);
        assert!(line["decision"]["op"].is_string(), "{line}");
    }
    let episode_svg =
        std::fs::read_to_string(run_dir.join("episode.svg")).expect("the episode picture");
    assert!(episode_svg.contains("r0c2"), "a lane per slot");
    let config = std::fs::read_to_string(run_dir.join("config.toml")).expect("config");
    assert!(
        config.contains("envs = 2")
            && config.contains("rounds = 2")
            && config.contains("ppo_epochs = 2")
            && config.contains("reward_mode = \"sparse\""),
        "{config}"
    );
    let telemetry: String = std::fs::read_dir(run_dir.join("telemetry"))
        .expect("telemetry dir")
        .map(|entry| std::fs::read_to_string(entry.expect("entry").path()).expect("telemetry"))
        .collect();
    assert!(
        telemetry.contains("simic.ppo.update_completed"),
        "no PPO event"
    );
    assert!(
        telemetry.contains("simic.episode.outcome")
            && telemetry.contains("simic.analytics.action_distribution"),
        "no decision analytics"
    );
    // The last round wrote a checkpoint: resuming the complete run says so.
    let resume = esper(&["train", "--resume", path_arg(&run_dir)]);
    assert!(resume.status.success(), "{}", text(&resume.stderr));
    assert!(
        text(&resume.stdout).contains("is complete (2 of 2 rounds)"),
        "{}",
        text(&resume.stdout)
    );
}

#[test]
fn a_missing_fashion_mnist_says_how_to_install_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-folder");
    let output = esper(&[
        "train",
        "--task",
        "fmnist",
        "--device",
        "cpu",
        "--data-dir",
        path_arg(&missing),
        "--run-dir",
        path_arg(&dir.path().join("run")),
    ]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    // The data layer's message arrives whole: the folder, the files it
    // wants, and the package that installs them.
    for needle in [
        "no-such-folder does not exist",
        "train-images-idx3-ubyte.gz",
        "cargo xtask provision",
        "dataset-fashion-mnist",
        "--data-dir",
    ] {
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
}

#[test]
fn unknown_options_and_values_are_refused_by_the_parser() {
    for args in [
        &["train", "--task", "mnist"][..],
        &["train", "--epochz", "3"],
        &["plot"],
    ] {
        let output = esper(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
    }
    let help = esper(&["train", "--help"]);
    assert!(help.status.success());
    assert!(text(&help.stdout).contains("--max-seeds"));
    let usage = esper(&["help"]);
    assert!(text(&usage.stdout).contains("train [options]"));
    assert!(text(&usage.stdout).contains("bench WORKLOAD"));
}

#[cfg(unix)]
#[test]
fn ctrl_c_finishes_the_epoch_writes_everything_and_exits_130() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir: PathBuf = dir.path().join("run");
    let child = Command::new(ESPER)
        .args(synthetic_run(&run_dir, "500"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("esper starts");
    let started = Instant::now();
    // Wait for the first whole line (the file may be mid-write).
    let first_epoch_written =
        || std::fs::read_to_string(run_dir.join("epochs.jsonl")).is_ok_and(|t| t.contains('\n'));
    while !first_epoch_written() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no epoch within two minutes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let output = child.wait_with_output().expect("esper ends");
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    let epochs = epoch_lines(&run_dir).len();
    assert!((1..500).contains(&epochs), "{epochs} epochs written");
    assert!(run_dir.join("config.toml").is_file());
    assert_picture(&run_dir);
    // The boundary after Ctrl-C wrote a checkpoint of every epoch written.
    assert!(
        run_dir
            .join("checkpoints")
            .join(epochs.to_string())
            .join("manifest.json")
            .is_file(),
        "a checkpoint after epoch {epochs}"
    );
}

/// `--metrics-port` serves the run's telemetry as Prometheus metrics while
/// it trains (read here over plain HTTP), and the port goes into the
/// resolved configuration.
#[test]
fn a_run_serves_prometheus_metrics_on_the_port_asked_for() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let port = common::free_port();
    let mut args = synthetic_run(&run_dir, "40");
    args.extend(["--metrics-port".to_owned(), port.to_string()]);
    let mut child = Command::new(ESPER)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("esper starts");
    let start = Instant::now();
    let mut body = String::new();
    while start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            continue;
        };
        body.clear();
        let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
        let _ = stream.read_to_string(&mut body);
        if body.contains("tolaria_training_latency_ms") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.contains("200 OK"), "{body}");
    assert!(body.contains("tolaria_training_latency_ms"), "{body}");
    let config = std::fs::read_to_string(run_dir.join("config.toml")).expect("config");
    assert!(
        config.contains(&format!("metrics_port = {port}")),
        "{config}"
    );
}

/// The decisions (`op`, `reason`, `outcome`) of a run's `epochs.jsonl`.
fn decisions(run_dir: &Path) -> Vec<(String, String, String)> {
    epoch_lines(run_dir)
        .iter()
        .map(|line| {
            let decision = &line["decision"];
            let field = |name: &str| decision[name].as_str().unwrap_or("").to_owned();
            (field("op"), field("reason"), field("outcome"))
        })
        .collect()
}

#[test]
fn the_scripted_baselines_run_as_controllers_of_esper_train() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut germinations = Vec::new();
    for controller in ["no-growth", "germinate-once", "max-growth"] {
        let run_dir = dir.path().join(controller);
        let mut args = synthetic_run(&run_dir, "13");
        args[2] = controller.to_owned();
        let output = Command::new(ESPER)
            .args(&args)
            .output()
            .expect("esper runs");
        assert!(
            output.status.success(),
            "{controller}: {}",
            text(&output.stderr)
        );
        let decisions = decisions(&run_dir);
        assert_eq!(decisions.len(), 13, "{controller}: one line per epoch");
        let germinated = decisions
            .iter()
            .filter(|(_, _, outcome)| outcome == "germinated")
            .count();
        let reason = controller.replace('-', "_");
        assert!(
            decisions.iter().all(|(_, why, _)| *why == reason),
            "{controller}: every decision is its own: {decisions:?}"
        );
        germinations.push(germinated);
        let config = std::fs::read_to_string(run_dir.join("config.toml")).expect("config.toml");
        assert!(
            config.contains(&format!("controller = \"{controller}\"")),
            "{config}"
        );
    }
    // No growth never germinates; germinate-once germinates once, at the
    // first epoch its masks allow, and its seed reaches a gate (G2 after ten
    // TRAINING epochs); max growth germinates at least that often.
    assert_eq!(germinations[0], 0);
    assert_eq!(germinations[1], 1);
    assert!(germinations[2] >= 1, "{germinations:?}");
}

#[test]
fn a_ppo_run_takes_the_growth_preset_and_keeps_it_in_its_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let output = synthetic_ppo(
        &run_dir,
        "3",
        "1",
        &[
            "--preset",
            "growth",
            "--set",
            "reward.germination_delay_cost=-0.2",
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("round 1/1: reward"));
    let config = std::fs::read_to_string(run_dir.join("config.toml")).expect("config.toml");
    let settings_line = config
        .lines()
        .find(|line| line.starts_with("settings = "))
        .unwrap_or_else(|| panic!("no settings in {config}"));
    for setting in [
        "slot.auto_forward_g3=true",
        "reward.germination_delay_cost=-0.1",
    ] {
        assert!(settings_line.contains(setting), "{settings_line}");
    }
    assert!(
        settings_line.ends_with("\"reward.germination_delay_cost=-0.2\"]"),
        "--set after the preset: {settings_line}"
    );
}

/// One imitation round, then a PPO round anchored to the demonstrator:
/// `rounds.jsonl` says which round imitated, what the demonstrator labelled
/// in the other, and the anchor's coefficient and loss in its update.
#[test]
fn a_ppo_run_with_an_imitation_warm_up_says_which_rounds_imitated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let output = synthetic_ppo(
        &run_dir,
        "3",
        "2",
        &[
            "--set",
            "imitation.updates=1",
            "--set",
            "imitation.epochs=2",
            "--set",
            "imitation.anchor_weight=2",
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("round 1/2 (imitation of max_growth): reward"),
        "{stdout}"
    );
    assert!(stdout.contains("round 2/2: reward"), "{stdout}");
    let rounds: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("rounds.jsonl"))
        .expect("rounds.jsonl")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(rounds.len(), 2);
    let imitation = &rounds[0]["imitation"];
    assert_eq!(imitation["demonstrator"], "max_growth", "{imitation}");
    let imitated = imitation["imitated"].as_u64().expect("imitated");
    let refused = imitation["not_imitable"].as_u64().expect("not imitable");
    // Two environments, three epochs: six decisions, each imitated or not.
    assert_eq!(imitated + refused, 6, "{imitation}");
    assert!(rounds[1]["imitation"].is_null(), "{}", rounds[1]);
    assert!(rounds[0]["ppo"].is_object() && rounds[1]["ppo"].is_object());
    // The anchor: none in the imitation round; in the PPO round every one
    // of the six decisions labelled, the term at its weight.
    assert!(rounds[0]["anchor"].is_null(), "{}", rounds[0]);
    assert_eq!(rounds[0]["ppo"]["anchor_coef"], 0.0, "{}", rounds[0]);
    let anchor = &rounds[1]["anchor"];
    assert_eq!(anchor["demonstrator"], "max_growth", "{anchor}");
    assert_eq!(anchor["labelled"].as_u64(), Some(6), "{anchor}");
    assert_eq!(rounds[1]["ppo"]["anchor_coef"], 2.0, "{}", rounds[1]);
    let loss = rounds[1]["ppo"]["anchor_loss"]
        .as_f64()
        .expect("anchor loss");
    assert!(loss > 0.0, "{}", rounds[1]);
}
