//! A freshly initialised Tamiyo policy controls a small Fashion-MNIST CNN
//! host for a short episode: each epoch Kasmina's model is observed (Obs V3
//! plus Kasmina's extras), the action masks are narrowed to what Kasmina
//! allows, the policy samples a factored action, and Tolaria's `apply`
//! carries the decision out. No training happens here (the accuracies are
//! synthetic); the point is the controller's loop and what it sees.
//!
//! Run with `cargo run -p tamiyo --example policy_controller`.

use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use tamiyo::controller::{PolicyController, PolicyControllerConfig};
use tamiyo::features::slot_extras;
use tamiyo::policy::{Policy, PolicyConfig, SampleMode, SamplingConfig};
use tch::Device;
use tolaria::controller::{EpochMetrics, EpochObservation, apply};

fn main() -> anyhow::Result<()> {
    tch::manual_seed(7);
    let slots = [SlotId::new(0, 0), SlotId::new(0, 1), SlotId::new(0, 2)];
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 4,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )?;
    let mut model =
        MorphogeneticModel::new(host, &slots, SlotConfig::default(), Telemetry::disabled())?;

    // HEAD's network is 512 wide; a narrower one keeps the example quick.
    let policy = Policy::new(
        PolicyConfig {
            feature_dim: 128,
            hidden_dim: 128,
            ..PolicyConfig::default()
        },
        Device::Cpu,
    )?;
    println!(
        "policy: {} parameters, observation {} floats",
        policy.parameter_count(),
        policy.network().config().obs_dim()
    );
    let config = PolicyControllerConfig {
        max_epochs: 20,
        sampling: SamplingConfig {
            mode: SampleMode::Stochastic,
            floors: Some(tamiyo::policy::sampling::reference_probability_floors()),
        },
        seed: 2026,
        ..PolicyControllerConfig::default()
    };
    let mut controller = PolicyController::new(policy, &slots, config)?;

    for epoch in 0..20_u32 {
        let accuracy = 60.0 + 20.0 * (1.0 - (-f64::from(epoch) / 6.0).exp());
        model.record_accuracy(accuracy, accuracy)?;
        let metrics = EpochMetrics {
            train_loss: 1.5 - accuracy / 100.0,
            train_accuracy: accuracy,
            val_loss: 1.6 - accuracy / 100.0,
            val_accuracy: accuracy,
        };
        let observation = EpochObservation::from_model(&model, epoch, metrics)?;
        let decision = controller.decide_with(
            &observation,
            Some(&model.op_availability(3)),
            &slot_extras(&model),
        )?;
        let applied = apply(&decision, &mut model, &format!("seed-{epoch}"))?;
        println!(
            "epoch {epoch:>2}: {:<16} slot {:<5} p(op) {:.2}  value {:+.3}  -> {applied:?}",
            decision.op.name(),
            decision
                .slot
                .map(|slot| slot.to_string())
                .unwrap_or_default(),
            decision.confidence,
            controller.last_value().unwrap_or(f64::NAN),
        );
        model.step_epoch()?;
    }
    Ok(())
}
