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
    Players, launch_fused_validation,
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
}

/// A fused pass queued on an environment's stream.
pub(super) struct Launched {
    started: Instant,
    set: ConfigSet,
    pending: PendingFused,
}

/// Queues the fused validation + counterfactual pass of `env` on its
/// compute stream, in the trainer's precision; nothing is read back.
pub(super) fn launch_measure(env: &Env, fused: &FusedConfig) -> Result<Launched> {
    let started = Instant::now();
    let trainer = &env.trainer;
    let model = trainer.model();
    let players = Players::from_model(model, PlayerOptions::default())?;
    let set = ConfigSet::counterfactual(players)?;
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
    })
}

/// Reads `launched` back on `env`'s stream and turns it into validation
/// figures and the counterfactual report.
pub(super) fn read_measure(env: &Env, launched: Launched) -> Result<Measured> {
    let Launched {
        started,
        set,
        pending,
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
    let report = CounterfactualReport::new(&set, &accuracies, None)?;
    Ok(Measured {
        validation: Validation {
            loss: main.loss,
            accuracy: main.accuracy,
            elapsed_ms: ms(started),
        },
        report,
        committed,
    })
}
