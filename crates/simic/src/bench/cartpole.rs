//! `ppo-cartpole`: the PPO update code on CartPole-v1 (CleanRL's settings).

use leyline::baseline::{Measurements, ResultEntry};
use serde_json::json;

use super::{SimicBenchOptions, SimicBenchRun};
use crate::Result;
use crate::cartpole::{CartpoleConfig, train_cartpole};

/// `ppo-cartpole`: CleanRL's settings, 500k steps (50k quick).
pub fn run_cartpole(
    options: &SimicBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<SimicBenchRun> {
    let device = torch_ext::device::select(options.device)?;
    let config = CartpoleConfig {
        total_steps: if options.quick { 50_000 } else { 500_000 },
        device: options.device,
        ..CartpoleConfig::default()
    };
    progress(&format!("ppo-cartpole: {} steps", config.total_steps));
    let report = train_cartpole(config)?;
    let at = |steps: u64| {
        report
            .history
            .iter()
            .filter(|record| record.steps <= steps)
            .filter_map(|record| record.mean_return)
            .next_back()
    };
    let mut metrics = std::collections::BTreeMap::new();
    metrics.insert("mean_return_final".to_owned(), report.mean_return);
    metrics.insert("best_mean_return".to_owned(), report.best_mean_return);
    for (name, steps) in [
        ("mean_return_100k", 100_000),
        ("mean_return_250k", 250_000),
        ("mean_return_500k", 500_000),
    ] {
        if let Some(value) = at(steps) {
            metrics.insert(name.to_owned(), value);
        }
    }
    metrics.insert(
        "steps_per_s".to_owned(),
        report.steps as f64 / report.wall_time_s.max(1e-9),
    );
    metrics.insert("wall_s".to_owned(), report.wall_time_s);
    Ok(SimicBenchRun {
        device,
        measurements: Measurements {
            params: json!({
                "steps": report.steps,
                "n_envs": report.config.n_envs,
                "steps_per_rollout": report.config.steps_per_rollout,
                "minibatches": report.config.minibatches,
                "epochs": report.config.epochs,
            }),
            results: vec![ResultEntry {
                implementation: "rust".to_owned(),
                mode: "ppo".to_owned(),
                metrics,
                error: None,
                amp: None,
            }],
            telemetry_names: Vec::new(),
        },
    })
}
