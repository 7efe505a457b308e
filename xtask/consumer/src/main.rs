//! A dependent team's first program: the examples of leyline's, kasmina's
//! and tolaria's READMEs, built outside the Esper-rs workspace against the
//! crates by path, on the CPU.

use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::GerminationOptions;
use kasmina::model::MorphogeneticModel;
use leyline::{SeedStage, Telemetry};
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};
use tolaria::task::{Task, TaskOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // leyline's README: the lifecycle's transition table.
    assert!(SeedStage::Training.can_transition_to(SeedStage::Blending));
    assert!(!SeedStage::Dormant.can_transition_to(SeedStage::Fossilized));
    println!("leyline: {} stages", leyline::stage::NUM_STAGES);

    // kasmina's README: a host, two slots, a seed germinated.
    let device = tch::Device::Cpu;
    let telemetry = Telemetry::disabled();
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), device)?;
    let mut model = MorphogeneticModel::with_slot_names(
        host,
        &["r0c1", "r0c2"],
        Default::default(),
        telemetry.clone(),
    )?;
    model.germinate(
        SlotId::new(0, 1),
        "conv_light",
        GerminationOptions::new("seed-0"),
    )?;
    let stage = model.slot(SlotId::new(0, 1))?.stage();
    assert_eq!(stage, Some(SeedStage::Germinated));
    println!("kasmina: a seed in r0c1, {stage:?}");

    // tolaria's README: a task's data and host, one epoch of ModelTrainer.
    let data = tolaria::task::load(
        Task::Synthetic,
        &TaskOptions {
            train_samples: 256,
            seed: 1,
            ..TaskOptions::default()
        },
    )?;
    let model = tolaria::task::build_model(Task::Synthetic, &["r0c1"], 1, device, telemetry.clone())?;
    let config = ModelTrainerConfig {
        batch_size: 64,
        validation_batch_size: 256,
        ..ModelTrainerConfig::default()
    };
    let mut trainer = ModelTrainer::new(model, &data.train, Some(&data.validation), config, telemetry)?;
    let report = trainer.train_epoch()?;
    let loss = report.train.loss;
    assert!(loss.is_finite(), "the epoch's loss is {loss}");
    println!("tolaria: epoch 0, training loss {loss:.3}");
    Ok(())
}
