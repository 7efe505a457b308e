//! Growing one seed in a host, the way a trainer and a controller drive
//! Kasmina: a Fashion-MNIST CNN host with a seed slot, a seed germinated
//! from a blueprint, walked through its gates (TRAINING, BLENDING with the
//! alpha schedule, HOLDING, FOSSILIZED) with the measurements each gate
//! reads, an illegal move refused with a typed error, and the seed states
//! exported as leyline contracts. Runs on the CPU in about a second.
//!
//! ```sh
//! cargo run -p kasmina --example grow_a_seed
//! ```

use kasmina::export::export_seed_states;
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::GerminationOptions;
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::{SeedStage, Telemetry};
use tch::{Device, Kind, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tch::manual_seed(0);
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), Device::Cpu)?;
    let mut model = MorphogeneticModel::with_slot_names(
        host,
        &["r0c1"],
        SlotConfig::default(),
        Telemetry::disabled(),
    )?;
    let slot = SlotId::parse("r0c1")?;
    let images = Tensor::randn([8, 1, 28, 28], (Kind::Float, Device::Cpu));
    let logits = model.forward(&images, false)?;
    println!("host alone: logits {:?}", logits.size());

    model.germinate(slot, "conv_light", GerminationOptions::new("seed-1"))?;
    println!(
        "germinated conv_light in r0c1: stage {:?}",
        model.slot(slot)?.stage()
    );

    // An illegal move is refused with a typed error; the seed is unchanged.
    match model.advance_stage(slot, Some(SeedStage::Fossilized)) {
        Ok(outcome) => println!("GERMINATED -> FOSSILIZED: passed {}", outcome.passed),
        Err(error) => println!("GERMINATED -> FOSSILIZED is refused: {error}"),
    }

    // G1: into TRAINING. The seed trains beside the host, isolated.
    model.record_accuracy(70.0, 70.0)?;
    let outcome = model.advance_stage(slot, Some(SeedStage::Training))?;
    println!("G1 -> TRAINING: passed {}", outcome.passed);

    // G2 reads at least ten epochs in TRAINING and measured, healthy gradients.
    let early = model.advance_stage(slot, Some(SeedStage::Blending))?;
    println!(
        "G2 after 0 epochs: passed {} ({})",
        early.passed, early.message
    );
    for epoch in 0..10 {
        model
            .slot_mut(slot)?
            .record_gradient_norms(0.5, 1.0, 10_000)?;
        model.record_accuracy(70.0 + f64::from(epoch), 71.0 + f64::from(epoch))?;
        model.step_epoch()?;
    }
    let outcome = model.advance_stage(slot, Some(SeedStage::Blending))?;
    println!(
        "G2 after 10 epochs: passed {} ({})",
        outcome.passed, outcome.message
    );

    // BLENDING: alpha follows its schedule, one step per epoch, in the forward.
    let mut epochs = 0;
    while !model
        .slot(slot)?
        .state()
        .ok_or("a live seed")?
        .alpha_controller()
        .is_settled()
    {
        model.step_epoch()?;
        epochs += 1;
        let alpha = model.slot(slot)?.state().ok_or("a live seed")?.alpha();
        println!("  blending epoch {epochs}: alpha {alpha:.3}");
    }
    let outcome = model.advance_stage(slot, Some(SeedStage::Holding))?;
    println!("G3 -> HOLDING: passed {}", outcome.passed);

    // G5 reads the seed's counterfactual contribution (the trainer measures it).
    model.slot_mut(slot)?.set_counterfactual_contribution(2.5)?;
    let outcome = model.fossilize(slot)?;
    println!(
        "G5 -> FOSSILIZED: passed {} (stage {:?})",
        outcome.passed,
        model.slot(slot)?.stage()
    );

    let logits = model.forward(&images, false)?;
    println!("host with its fossil: logits {:?}", logits.size());
    for state in export_seed_states(&model)? {
        println!(
            "exported: seed {} in {} at stage {} with alpha {}",
            state.seed_id, state.slot_id, state.stage, state.alpha
        );
    }
    Ok(())
}
