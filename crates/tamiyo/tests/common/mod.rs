//! Builders shared by Tamiyo's integration tests: hand-built seed states
//! and observations, and a tiny Kasmina model.

#![allow(dead_code, unreachable_pub)]

use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::proto::{SeedMetricSet, SeedState};
use leyline::{AlphaAlgorithm, AlphaCurve, AlphaMode, SeedStage, Telemetry};
use tch::Device;
use tolaria::controller::{EpochMetrics, EpochObservation};

pub const R0C0: SlotId = SlotId { row: 0, col: 0 };
pub const R0C1: SlotId = SlotId { row: 0, col: 1 };
pub const R0C2: SlotId = SlotId { row: 0, col: 2 };

pub fn metrics(val_loss: f64, val_accuracy: f64) -> EpochMetrics {
    EpochMetrics {
        train_loss: val_loss,
        train_accuracy: val_accuracy,
        val_loss,
        val_accuracy,
    }
}

/// A contract-valid seed state (HOLD, ADD, linear) with metrics.
pub fn seed(id: &str, slot: SlotId, blueprint: &str, stage: SeedStage) -> SeedState {
    SeedState {
        schema_version: leyline::SCHEMA_VERSION,
        seed_id: id.to_owned(),
        slot_id: slot.to_string(),
        blueprint_id: blueprint.to_owned(),
        stage: stage.value(),
        previous_stage: SeedStage::Unknown.value(),
        alpha: 0.0,
        alpha_target: 1.0,
        alpha_mode: AlphaMode::Hold.value(),
        alpha_curve: AlphaCurve::Linear.value(),
        alpha_algorithm: AlphaAlgorithm::Add.value(),
        is_healthy: true,
        metrics: Some(SeedMetricSet {
            schema_version: leyline::SCHEMA_VERSION,
            val_accuracy: 60.0,
            ..SeedMetricSet::default()
        }),
        ..SeedState::default()
    }
}

/// `seed` with its metrics edited.
pub fn with_metrics(mut seed: SeedState, edit: impl FnOnce(&mut SeedMetricSet)) -> SeedState {
    if let Some(metrics) = seed.metrics.as_mut() {
        edit(metrics);
    }
    seed
}

pub fn observation(
    epoch: u32,
    val_loss: f64,
    val_accuracy: f64,
    seeds: Vec<SeedState>,
    slots: &[SlotId],
) -> EpochObservation {
    EpochObservation::new(
        epoch,
        metrics(val_loss, val_accuracy),
        seeds,
        slots.to_vec(),
    )
    .expect("observation")
}

/// A small Fashion-MNIST CNN host (channels 2/4/8) with `slots` enabled.
pub fn tiny_model(slots: &[SlotId]) -> MorphogeneticModel {
    tch::manual_seed(3);
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host");
    MorphogeneticModel::new(host, slots, SlotConfig::default(), Telemetry::disabled())
        .expect("model")
}

/// A small policy (feature and hidden width 32, the default slots), libtorch's
/// generator seeded first.
pub fn small_policy(device: Device) -> tamiyo::policy::Policy {
    tch::manual_seed(7);
    tamiyo::policy::Policy::new(
        tamiyo::policy::PolicyConfig {
            feature_dim: 32,
            hidden_dim: 32,
            ..tamiyo::policy::PolicyConfig::default()
        },
        device,
    )
    .expect("policy")
}

/// A stochastic sampler with the reference's probability floors, seed 11.
pub fn floored_sampler(device: Device) -> tamiyo::policy::Sampler {
    tamiyo::policy::Sampler::new(
        tamiyo::policy::SamplingConfig {
            mode: tamiyo::policy::SampleMode::Stochastic,
            floors: Some(tamiyo::policy::sampling::reference_probability_floors()),
        },
        11,
        device,
    )
    .expect("sampler")
}
