//! The fused validation + counterfactual pass of one environment, split
//! into a launch on the environment's stream and a readback, so that every
//! environment's pass is queued before any is read
//! ([`crate::counterfactual::launch_fused_validation`]).

use std::time::Instant;

use tch::Device;
use tolaria::engine::trainer::Validation;

use super::env::Env;
use crate::counterfactual::{
    ConfigLabel, ConfigSet, CounterfactualReport, FusedConfig, PendingFused, PlayerOptions,
    Players, ShapleyConfig, ShapleyPlan, launch_fused_validation,
};
use crate::{Error, Result};

/// Milliseconds since `start`.
pub(super) fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

/// What the fused pass gave one environment this step.
pub(super) struct Measured {
    pub(super) validation: Validation,
    pub(super) report: CounterfactualReport,
    pub(super) committed: Option<f64>,
    /// Configurations the pass measured (main, counterfactuals, Shapley).
    pub(super) configs: usize,
}

/// A fused pass queued on an environment's stream.
pub(super) struct Launched {
    started: Instant,
    set: ConfigSet,
    pending: PendingFused,
    shapley: Option<ShapleyPlan>,
}

/// Queues the fused validation + counterfactual pass of `env` on its
/// compute stream, in the trainer's precision; nothing is read back. With
/// `shapley`, the pass also measures that plan's configurations (reference
/// §4.5: at an episode's last epoch).
pub(super) fn launch_measure(
    env: &Env,
    fused: &FusedConfig,
    shapley: Option<&ShapleyConfig>,
) -> Result<Launched> {
    let started = Instant::now();
    let trainer = &env.trainer;
    let model = trainer.model();
    let players = Players::from_model(model, PlayerOptions::default())?;
    let mut set = ConfigSet::counterfactual(players)?;
    let shapley = match shapley {
        Some(config) if !set.players().is_empty() => Some(set.add_shapley(config)?),
        _ => None,
    };
    let alphas = set.alphas();
    let data = trainer
        .validation_data()
        .ok_or_else(|| Error::InvalidConfig {
            field: "EnvSpec.validation",
            reason: "the environment's trainer has no validation set".to_owned(),
        })?;
    let autocast = match (trainer.precision().autocast_kind(), model.device()) {
        (Some(kind), Device::Cuda(_)) => Some(kind),
        _ => None,
    };
    let mut outcome = None;
    trainer.engine().on_compute_stream(|| {
        let _autocast = match autocast {
            Some(kind) => Some(torch_ext::AutocastGuard::new(
                torch_ext::AutocastDevice::Cuda,
                kind,
            )?),
            None => None,
        };
        outcome = Some(launch_fused_validation(
            model,
            data.inputs(),
            data.labels(),
            &alphas,
            fused,
        ));
        Ok(())
    })?;
    let pending = outcome.ok_or_else(|| Error::Readback {
        what: "fused validation",
        reason: "the pass did not run".to_owned(),
    })??;
    Ok(Launched {
        started,
        set,
        pending,
        shapley,
    })
}

/// Reads `launched` back on `env`'s stream and turns it into validation
/// figures and the counterfactual report.
pub(super) fn read_measure(env: &Env, launched: Launched) -> Result<Measured> {
    let Launched {
        started,
        set,
        pending,
        shapley,
    } = launched;
    let mut outcome = None;
    env.trainer.engine().on_compute_stream(|| {
        outcome = Some(pending.read());
        Ok(())
    })?;
    let fused = outcome.ok_or_else(|| Error::Readback {
        what: "fused validation",
        reason: "the readback did not run".to_owned(),
    })??;
    let accuracies = fused.accuracies();
    let main = set
        .index_of(ConfigLabel::Main)
        .and_then(|index| fused.outcomes.get(index).copied())
        .ok_or_else(|| Error::Readback {
            what: "fused validation",
            reason: "no main configuration".to_owned(),
        })?;
    let committed = set
        .index_of(ConfigLabel::Committed)
        .and_then(|index| accuracies.get(index).copied());
    let report = CounterfactualReport::new(&set, &accuracies, shapley.as_ref())?;
    let configs = set.len();
    Ok(Measured {
        validation: Validation {
            loss: main.loss,
            accuracy: main.accuracy,
            elapsed_ms: ms(started),
        },
        report,
        committed,
        configs,
    })
}

#[cfg(test)]
mod tests {
    //! The pass with a Shapley plan, on a model whose two seeds blend: the
    //! values are exact (two players: the factorial plan) and efficient,
    //! summing to the main accuracy less the all-off accuracy.

    use kasmina::host::CnnHostConfig;
    use leyline::Telemetry;
    use tch::Device;
    use tolaria::data::synthetic::{ImageTaskOptions, image_task};
    use tolaria::engine::bench::{bring_to_blending, fmnist_model};
    use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};

    use super::{launch_measure, read_measure};
    use crate::counterfactual::{FusedConfig, ShapleyConfig};
    use crate::vectorized::EnvSpec;
    use crate::vectorized::env::Env;

    #[test]
    fn a_shapley_plan_in_the_fused_pass_gives_exact_efficient_values() {
        let _rng = crate::global_rng_lock();
        let train = image_task(&ImageTaskOptions::fashion_like(256, 3)).expect("train");
        let validation = image_task(&ImageTaskOptions::fashion_like(200, 4)).expect("validation");
        let slots = vec!["r0c1".to_owned(), "r0c2".to_owned()];
        let spec = EnvSpec::sharded(
            CnnHostConfig::fashion_mnist(),
            slots,
            &train,
            image_task(&ImageTaskOptions::fashion_like(200, 4)).expect("validation"),
            1,
        )
        .expect("spec");
        let config = ModelTrainerConfig {
            batch_size: 128,
            validation_batch_size: 200,
            ..ModelTrainerConfig::default()
        };
        let simic = crate::vectorized::SimicConfig {
            trainer: config.clone(),
            ..crate::vectorized::SimicConfig::reference(5)
        };
        let mut env =
            Env::new(&spec, (0, 7), Device::Cpu, &simic, &Telemetry::disabled()).expect("env");
        tch::manual_seed(7);
        let model = fmnist_model(Device::Cpu, Telemetry::disabled()).expect("model");
        let model = bring_to_blending(model, &train, 40).expect("blending");
        env.trainer = ModelTrainer::new(
            model,
            &train,
            Some(&validation),
            config,
            Telemetry::disabled(),
        )
        .expect("trainer");

        let plain = launch_measure(&env, &FusedConfig::default(), None).expect("launch");
        let plain = read_measure(&env, plain).expect("read");
        assert!(plain.report.shapley.is_none());
        // Main, a solo-off and a solo-on per blending seed, and all-off
        // with two seeds active.
        assert!(plain.configs >= 4, "{} configurations", plain.configs);

        let launched = launch_measure(
            &env,
            &FusedConfig::default(),
            Some(&ShapleyConfig::default()),
        )
        .expect("launch with shapley");
        let measured = read_measure(&env, launched).expect("read");
        assert!(
            measured.configs >= plain.configs,
            "the plan adds configurations"
        );
        let values = measured.report.shapley.as_ref().expect("shapley values");
        assert_eq!(values.len(), 2, "one value per blending seed");
        assert!(
            values
                .iter()
                .all(|value| value.exact && value.mean.is_finite())
        );
        // Main is the all-on coalition; the plan measures all-off, so the
        // total is main − all-off.
        let total = measured.report.reward.total.expect("all-off measured");
        let sum: f64 = values.iter().map(|value| value.mean).sum();
        assert!(
            (sum - total).abs() < 1e-6,
            "Shapley values sum to {sum}, main - all-off is {total}"
        );
        // The plan's configurations do not change the main figures.
        let main = measured.validation.accuracy;
        assert!((main - plain.validation.accuracy).abs() < 1e-9);
    }
}
