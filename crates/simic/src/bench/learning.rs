//! `simic-learning`: PPO rounds on Fashion-MNIST with an impaired host,
//! beside the heuristic controller and the host grown by nobody on the same
//! environment seeds.

use kasmina::host::CnnHostConfig;
use leyline::Telemetry;
use leyline::baseline::{Measurements, ResultEntry};
use serde_json::json;
use tamiyo::heuristic::HeuristicController;
use tch::Device;
use tolaria::amp::Precision;
use tolaria::config::ExecutionMode;
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};

use super::{
    SLOTS, SimicBenchOptions, SimicBenchRun, ThroughputTask, amp_name, load, mean, simic_config,
};
use crate::vectorized::{EnvSpec, Simic, SimicConfig};
use crate::{Error, Result};

/// Rounds at the end of `simic-learning` whose accuracies are compared.
const LAST_ROUNDS: usize = 3;

/// Final validation accuracies of `n_envs` environments trained for
/// `epochs` epochs with the heuristic controller (`heuristic`) or none.
fn baseline_accuracies(
    spec: &EnvSpec,
    config: &SimicConfig,
    device: Device,
    round: u64,
    heuristic: bool,
) -> Result<Vec<f64>> {
    let n = config.n_envs;
    let mut accuracies = Vec::with_capacity(n);
    for env in 0..n {
        let seed = config.seed.wrapping_add(
            round
                .saturating_mul(n as u64)
                .saturating_add(env as u64)
                .saturating_mul(config.env_seed_stride),
        );
        tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
        let host = kasmina::host::CnnHost::new(spec.host.clone(), device)?;
        let names: Vec<&str> = spec.slots.iter().map(String::as_str).collect();
        let model = kasmina::model::MorphogeneticModel::with_slot_names(
            host,
            &names,
            kasmina::lifecycle::SlotConfig::default(),
            Telemetry::disabled(),
        )?;
        let train = spec.train.get(env).ok_or_else(|| Error::InvalidConfig {
            field: "EnvSpec.train",
            reason: format!("no shard {env}"),
        })?;
        let trainer_config = ModelTrainerConfig {
            seed,
            ..config.trainer.clone()
        };
        let mut trainer = ModelTrainer::new(
            model,
            train,
            Some(&spec.validation),
            trainer_config,
            Telemetry::disabled(),
        )?;
        if heuristic {
            trainer = trainer.with_controller(
                HeuristicController::new(),
                std::time::Duration::from_secs(5),
            )?;
        }
        let mut last = 0.0;
        for _ in 0..config.episode_length {
            let report = trainer.train_epoch()?;
            if let Some(validation) = report.validation {
                last = validation.accuracy;
            }
        }
        accuracies.push(last);
    }
    Ok(accuracies)
}

/// `simic-learning`.
pub fn run_learning(
    options: &SimicBenchOptions,
    rounds: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<SimicBenchRun> {
    let device = torch_ext::device::select(options.device)?;
    let (train, test) = load(ThroughputTask::FashionMnist, options)?;
    let host = CnnHostConfig {
        base_channels: 4,
        ..CnnHostConfig::fashion_mnist()
    };
    let spec = EnvSpec::sharded(
        host,
        SLOTS.iter().map(|s| (*s).to_owned()).collect(),
        &train,
        test,
        4,
    )?;
    let episode_length = if options.quick { 5 } else { 25 };
    let (precision, mode) = if device.is_cuda() {
        (Precision::Bf16, ExecutionMode::GraphStep)
    } else {
        (Precision::Fp32, ExecutionMode::Eager)
    };
    let config = simic_config(precision, mode, episode_length, options.quick);
    let mut simic = Simic::new(config.clone(), SLOTS.len(), device, Telemetry::disabled())?;
    let mut results = Vec::new();
    let mut last_ppo = Vec::new();
    for round in 0..rounds {
        let report = simic.run_round(&spec, true)?;
        progress(&format!(
            "  ppo round {round}: reward {:.2}, acc {:?}, seeds {:.2}, germ {} foss {} prune {}",
            report.mean_episode_reward,
            report.final_accuracies,
            report.mean_active_seeds,
            report.germinations,
            report.fossilizations,
            report.prunes
        ));
        let mut metrics = std::collections::BTreeMap::new();
        metrics.insert("round".to_owned(), round as f64);
        metrics.insert("mean_episode_reward".to_owned(), report.mean_episode_reward);
        let accuracy = mean(report.final_accuracies.iter().copied());
        metrics.insert("final_accuracy_pct".to_owned(), accuracy);
        metrics.insert("active_seeds_per_env".to_owned(), report.mean_active_seeds);
        metrics.insert("fossilizations".to_owned(), report.fossilizations as f64);
        if round.saturating_add(LAST_ROUNDS) >= rounds {
            last_ppo.push(accuracy);
        }
        results.push(ResultEntry {
            implementation: "rust".to_owned(),
            mode: format!("ppo-round-{round}"),
            metrics,
            error: None,
            amp: Some(amp_name(precision).to_owned()),
        });
    }
    // The baselines on the same environment seeds as the last rounds.
    let last_rounds: Vec<u64> = (rounds.saturating_sub(LAST_ROUNDS)..rounds)
        .map(|round| u64::try_from(round).unwrap_or(0))
        .collect();
    for (name, heuristic) in [("heuristic", true), ("no-growth", false)] {
        let mut accuracies = Vec::new();
        for &round in &last_rounds {
            let round_accuracies = baseline_accuracies(&spec, &config, device, round, heuristic)?;
            progress(&format!(
                "  {name} (round {round} seeds): acc {round_accuracies:?}"
            ));
            accuracies.extend(round_accuracies);
        }
        let mut metrics = std::collections::BTreeMap::new();
        metrics.insert(
            "final_accuracy_pct".to_owned(),
            mean(accuracies.iter().copied()),
        );
        results.push(ResultEntry {
            implementation: "rust".to_owned(),
            mode: format!("{name}-last-rounds"),
            metrics,
            error: None,
            amp: Some(amp_name(precision).to_owned()),
        });
    }
    let mut metrics = std::collections::BTreeMap::new();
    metrics.insert(
        "final_accuracy_pct".to_owned(),
        mean(last_ppo.iter().copied()),
    );
    results.push(ResultEntry {
        implementation: "rust".to_owned(),
        mode: "ppo-last-rounds".to_owned(),
        metrics,
        error: None,
        amp: Some(amp_name(precision).to_owned()),
    });
    Ok(SimicBenchRun {
        device,
        measurements: Measurements {
            params: json!({
                "task": "fashion-mnist (impaired host, channels 4/8/16)",
                "n_envs": 4,
                "slots": SLOTS,
                "episode_length": episode_length,
                "rounds": rounds,
                "quick": options.quick,
            }),
            results,
            telemetry_names: Vec::new(),
        },
    })
}
