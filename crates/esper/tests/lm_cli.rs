//! `esper train` on the language-model tasks, as a user runs it: the
//! synthetic text on the CPU with max growth (a transformer seed germinated
//! and trained), the validation perplexity in `epochs.jsonl` falling, and
//! `--controller ppo`: vectorized PPO environments on the transformer host.

use std::process::{Command, Stdio};

const ESPER: &str = env!("CARGO_BIN_EXE_esper");

#[test]
fn a_synthetic_text_run_lowers_the_perplexity_while_a_transformer_seed_grows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let output = Command::new(ESPER)
        .args([
            "train",
            "--task",
            "lm-synthetic",
            "--controller",
            "max-growth",
        ])
        .args(["--train-samples", "256", "--epochs", "6", "--device", "cpu"])
        .arg("--run-dir")
        .arg(&run_dir)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("val ppl"), "{stdout}");
    assert!(stdout.contains("GERMINATE r0c1 mlp_small"), "{stdout}");
    let epochs: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("epochs.jsonl"))
        .expect("epochs.jsonl")
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect();
    assert_eq!(epochs.len(), 6);
    let perplexity: Vec<f64> = epochs
        .iter()
        .map(|epoch| epoch["val_perplexity"].as_f64().expect("val_perplexity"))
        .collect();
    for (epoch, ppl) in epochs.iter().zip(&perplexity) {
        let loss = epoch["val_loss"].as_f64().expect("val_loss");
        assert!(
            (ppl - loss.exp()).abs() < 1e-6 * ppl,
            "{ppl} vs exp({loss})"
        );
    }
    assert!(
        perplexity[5] < 0.8 * perplexity[0],
        "perplexity {perplexity:?} did not fall"
    );
    assert!(
        epochs
            .iter()
            .any(|epoch| epoch["active_seeds"].as_u64() > Some(0)),
        "a seed lived"
    );
}

#[test]
fn ppo_trains_a_policy_on_the_transformer_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let output = Command::new(ESPER)
        .args(["train", "--task", "lm-synthetic", "--controller", "ppo"])
        .args(["--train-samples", "128", "--epochs", "3", "--envs", "2"])
        .args(["--rounds", "1", "--batch-size", "32", "--ppo-epochs", "1"])
        .args(["--device", "cpu", "--run-dir"])
        .arg(&run_dir)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("round 1/1: reward"), "{stdout}");
    let rounds = std::fs::read_to_string(run_dir.join("rounds.jsonl")).expect("rounds.jsonl");
    let round: serde_json::Value =
        serde_json::from_str(rounds.lines().next().expect("one round")).expect("JSON");
    assert_eq!(round["env_epochs"], 6, "2 environments x 3 epochs");
    assert!(round["ppo"]["policy_loss"].is_f64(), "{round}");
    // The blueprint head offered the transformer's blueprints only: any
    // germination the sampled policy chose named one of them.
    let episode = std::fs::read_to_string(run_dir.join("episode.jsonl")).expect("episode.jsonl");
    for cnn in [
        "conv_light",
        "conv_heavy",
        "depthwise",
        "bottleneck",
        "conv_small",
    ] {
        assert!(!episode.contains(cnn), "{cnn} on a transformer: {episode}");
    }
    assert!(
        std::fs::metadata(run_dir.join("policy.safetensors"))
            .expect("policy saved")
            .len()
            > 1000
    );
}
