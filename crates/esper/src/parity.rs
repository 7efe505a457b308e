//! `esper parity-capture --out FILE.json`: a short, seeded CPU run whose
//! figures `cargo xtask parity` compares with the committed baseline
//! (`baselines/parity/cpu.json`).
//!
//! One capture holds
//! - `telemetry`: every metric and event name the run emitted (through one
//!   `leyline::Collector`), sorted;
//! - `figures`, which must not change: the general trainer's losses on a
//!   small synthetic task while a seed is germinated and walked through
//!   its lifecycle and a second one is pruned, the `SeedState` export and
//!   the gate outcomes after every epoch; the drills (a controller that
//!   fails, one that misses its deadline, NaN weights rolled back by the
//!   governor); one short simic round; the parameter counts of the hosts
//!   and blueprints; tamiyo's observation widths, head sizes and mask
//!   shapes and values;
//! - `timings_ms`, which are only reported.
//!
//! Everything runs on the CPU with one intra-op thread, so reductions run in
//! one order whatever the machine's core count. This module only drives
//! library code and writes the file; the comparison lives in xtask.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use kasmina::blueprint::Blueprint;
use kasmina::export::{export_seed_states, seed_state_message};
use kasmina::gate::{GateOutcome, GateThresholds, QualityGates};
use kasmina::host::cnn::{CnnHost, CnnHostConfig};
use kasmina::host::linear::LinearHost;
use kasmina::host::transformer::{TransformerHost, TransformerHostConfig};
use kasmina::host::{Host, SlotId, Topology};
use kasmina::lifecycle::{GerminationOptions, PruneInitiator, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::{Collector, HEAD_NAMES, SeedStage, Telemetry, TempoAction};
use serde_json::{Map, Value, json};
use simic::vectorized::{EnvSpec, Simic, SimicConfig};
use tamiyo::masks::{MaskConfig, MaskTensors, SlotMaskInfo, compute_masks};
use tamiyo::policy::PolicyConfig;
use tch::Device;
use tolaria::amp::Precision;
use tolaria::controller::{Controller, DeadlineOutcome, Decision, EpochObservation};
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use tolaria::data::{Dataset, SplitSize};
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};

/// Version of the capture's layout; `cargo xtask parity` refuses to compare
/// captures of different versions.
pub(crate) const CAPTURE_VERSION: u64 = 1;

/// Root seed of every part of the capture.
const SEED: u64 = 17;

/// Epochs of the trainer walk: the seed in `r0c1` reaches FOSSILIZED.
const WALK_EPOCHS: usize = 12;

/// The walk's slot whose seed grows to FOSSILIZED (`r0c1`).
fn grown_slot() -> SlotId {
    SlotId::new(0, 1)
}

/// The walk's slot whose seed is pruned (`r0c2`).
fn pruned_slot() -> SlotId {
    SlotId::new(0, 2)
}

/// The epoch before which the seed in [`pruned_slot`] is pruned.
const PRUNE_EPOCH: usize = 3;

/// `esper parity-capture`: the parity run.
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(
    name = "esper parity-capture",
    about = "Record the parity capture (telemetry names, deterministic figures, timings) of a \
             short seeded CPU run; `cargo xtask parity` compares it with \
             baselines/parity/cpu.json."
)]
pub(crate) struct ParityArgs {
    /// Where to write the capture (JSON).
    #[arg(long, value_name = "FILE.json")]
    pub(crate) out: PathBuf,
}

/// Runs the capture and writes it to `args.out`.
pub(crate) fn run(args: &ParityArgs) -> Result<()> {
    let capture = capture()?;
    write(&args.out, &capture)?;
    println!("wrote {}", args.out.display());
    Ok(())
}

/// The whole capture as JSON (see the module docs).
pub(crate) fn capture() -> Result<Value> {
    tch::set_num_threads(1);
    let started = Instant::now();
    let collector = Collector::new();
    let telemetry = Telemetry::new(collector.clone());
    let mut timings = Map::new();

    let clock = Instant::now();
    let walk = trainer_walk(telemetry.clone())?;
    timings.insert("trainer_walk".to_owned(), json!(elapsed_ms(clock)));

    let clock = Instant::now();
    let drills = drills(telemetry.clone())?;
    timings.insert("drills".to_owned(), json!(elapsed_ms(clock)));

    let clock = Instant::now();
    let simic = simic_round(telemetry)?;
    timings.insert("simic_round".to_owned(), json!(elapsed_ms(clock)));

    let clock = Instant::now();
    let parameters = parameter_counts()?;
    let tamiyo = tamiyo_shapes(&walk.mask_inputs)?;
    timings.insert("shapes".to_owned(), json!(elapsed_ms(clock)));
    timings.insert("total".to_owned(), json!(elapsed_ms(started)));

    Ok(json!({
        "version": CAPTURE_VERSION,
        "telemetry": telemetry_names(&collector),
        "figures": {
            "trainer": walk.figures,
            "drills": drills,
            "simic": simic,
            "parameters": parameters,
            "tamiyo": tamiyo,
        },
        "timings_ms": timings,
    }))
}

fn elapsed_ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Writes `capture` to `path`, atomically (`durable::write_file`).
fn write(path: &Path, capture: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(capture).context("encoding the capture")?;
    text.push('\n');
    durable::write_file(path, text.as_bytes())
        .with_context(|| format!("writing the capture to {}", path.display()))
}

/// The metric names and the event names the collector saw, each sorted.
fn telemetry_names(collector: &Collector) -> Value {
    let mut metrics = std::collections::BTreeSet::new();
    let mut events = std::collections::BTreeSet::new();
    for packet in collector.packets() {
        metrics.extend(packet.metrics.iter().map(|metric| metric.name.clone()));
        events.extend(packet.events.iter().map(|event| event.name.clone()));
    }
    json!({ "metrics": metrics, "events": events })
}

/// A small synthetic Fashion-MNIST-shaped task of one generator (seed
/// `seed`): `train` training samples and 128 validation samples.
fn synthetic_task(seed: u64, train: usize) -> Result<(Dataset, Dataset)> {
    let total = train.checked_add(128).context("sample count")?;
    image_task(&ImageTaskOptions::fashion_like(total, seed))
        .context("generating the synthetic task")?
        .split(SplitSize::Count(train), None)
        .context("splitting the synthetic task")
}

/// Permissive gates with two epochs in TRAINING (instead of ten), so the
/// walk fits a few epochs.
fn walk_slot_config() -> SlotConfig {
    SlotConfig {
        gates: QualityGates {
            thresholds: GateThresholds {
                min_stage_epochs: 2,
                ..GateThresholds::default()
            },
            ..QualityGates::permissive()
        },
        ..SlotConfig::default()
    }
}

/// What the trainer walk gives the other parts of the capture.
struct Walk {
    /// Its figures.
    figures: Value,
    /// The mask inputs of its slots at the end (`None`: empty).
    mask_inputs: Vec<Option<SlotMaskInfo>>,
}

fn gate_json(slot: SlotId, op: &str, outcome: &GateOutcome) -> Value {
    json!({
        "slot": slot.to_string(),
        "op": op,
        "gate": outcome.gate.name(),
        "passed": outcome.passed,
        "checks_failed": outcome.checks_failed,
    })
}

/// The lifecycle moves before epoch `epoch`: germinate both seeds before
/// the second epoch, prune the one in [`pruned_slot`] before
/// [`PRUNE_EPOCH`], and move the one in [`grown_slot`] one gate on before
/// every other epoch (fossilize from HOLDING).
fn lifecycle_moves(model: &mut MorphogeneticModel, epoch: usize) -> Result<Vec<Value>> {
    let (grown, pruned) = (grown_slot(), pruned_slot());
    let mut moves = Vec::new();
    if epoch == 1 {
        for (slot, blueprint) in [(grown, "conv_light"), (pruned, "conv_small")] {
            let options =
                GerminationOptions::new(format!("parity-{slot}")).with_tempo(TempoAction::Fast);
            model
                .germinate(slot, blueprint, options)
                .with_context(|| format!("germinating {blueprint} in {slot}"))?;
            moves.push(
                json!({ "slot": slot.to_string(), "op": "germinate", "blueprint": blueprint }),
            );
        }
        return Ok(moves);
    }
    if epoch == PRUNE_EPOCH {
        let done = model
            .prune(pruned, "parity walk", PruneInitiator::Policy)
            .with_context(|| format!("pruning {pruned}"))?;
        moves.push(json!({ "slot": pruned.to_string(), "op": "prune", "pruned": done }));
    }
    let stage = model.slot(grown)?.stage();
    let outcome = match stage {
        Some(SeedStage::Holding) => Some(("fossilize", model.fossilize(grown)?)),
        Some(SeedStage::Fossilized) | None => None,
        Some(_) => Some(("advance", model.advance_stage(grown, None)?)),
    };
    if let Some((op, outcome)) = outcome {
        moves.push(gate_json(grown, op, &outcome));
    }
    Ok(moves)
}

/// [`WALK_EPOCHS`] epochs of the general trainer (eager, fp32, batch 64)
/// on the synthetic task, a CNN host with slots `r0c1` and `r0c2`, moved
/// by [`lifecycle_moves`]; after each epoch its losses, accuracies and the
/// `SeedState` export.
fn trainer_walk(telemetry: Telemetry) -> Result<Walk> {
    let (train, validation) = synthetic_task(SEED, 256)?;
    tch::manual_seed(i64::try_from(SEED).context("seed")?);
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), Device::Cpu).context("host")?;
    let model = MorphogeneticModel::with_slot_names(
        host,
        &["r0c1", "r0c2"],
        walk_slot_config(),
        telemetry.clone(),
    )
    .context("enabling the slots")?;
    let config = ModelTrainerConfig {
        seed: SEED,
        batch_size: 64,
        validation_batch_size: 128,
        precision: Some(Precision::Fp32),
        gradient_telemetry_stride: 1,
        counterfactual_samples: 128,
        ..ModelTrainerConfig::default()
    };
    let mut trainer = ModelTrainer::new(model, &train, Some(&validation), config, telemetry)
        .context("setting up the trainer")?;
    let mut epochs = Vec::with_capacity(WALK_EPOCHS);
    let mut steps = 0_usize;
    let mut last_loss = f64::NAN;
    for epoch in 0..WALK_EPOCHS {
        let moves = lifecycle_moves(trainer.model_mut(), epoch)
            .with_context(|| format!("the lifecycle moves before epoch {epoch}"))?;
        let report = trainer
            .train_epoch()
            .with_context(|| format!("training epoch {epoch}"))?;
        steps = steps.saturating_add(report.train.steps);
        last_loss = report.train.loss;
        let seed_states = export_seed_states(trainer.model()).context("exporting seed states")?;
        let validation = report.validation.as_ref();
        epochs.push(json!({
            "epoch": epoch,
            "moves": moves,
            "train_loss": report.train.loss,
            "train_accuracy": report.train.accuracy,
            "validation_loss": validation.map(|v| v.loss),
            "validation_accuracy": validation.map(|v| v.accuracy),
            "active_seeds": report.active_seeds,
            "seed_states": serde_json::to_value(&seed_states).context("encoding seed states")?,
        }));
    }
    let mut mask_inputs = Vec::new();
    for slot in trainer.model().slots() {
        let info = match seed_state_message(slot).context("exporting a seed state")? {
            Some(message) => Some(SlotMaskInfo::from_seed(&message)?),
            None => None,
        };
        mask_inputs.push(info);
    }
    Ok(Walk {
        figures: json!({
            "epochs": WALK_EPOCHS,
            "steps": steps,
            "final_train_loss": last_loss,
            "per_epoch": epochs,
        }),
        mask_inputs,
    })
}

/// Epochs of the drill trainer; the controller misses its deadline in the
/// last one.
const DRILL_EPOCHS: u32 = 4;

/// The drill's controller deadline, and how long its controller sleeps
/// in the last epoch (far beyond the deadline, so the outcome never
/// depends on the machine's speed).
const DRILL_DEADLINE: Duration = Duration::from_millis(5);
const DRILL_SLEEP: Duration = Duration::from_millis(40);

/// Fails at epoch 0, sleeps past the deadline at the last epoch, and
/// answers WAIT otherwise.
struct DrillController;

impl Controller for DrillController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        match observation.epoch {
            0 => Err(tolaria::Error::Controller {
                field: "parity drill",
                reason: "a controller that fails on purpose".to_owned(),
            }),
            epoch if epoch.saturating_add(1) == DRILL_EPOCHS => {
                std::thread::sleep(DRILL_SLEEP);
                Ok(Decision::wait())
            }
            _ => Ok(Decision::wait()),
        }
    }
}

fn outcome_name(outcome: &DeadlineOutcome) -> &'static str {
    match outcome {
        DeadlineOutcome::Decided(_) => "decided",
        DeadlineOutcome::TimedOut { .. } => "timed_out",
        DeadlineOutcome::Failed { .. } => "failed",
    }
}

/// The tolaria drills in one short run: a CNN host with a seed in `r0c1`,
/// snapshots every epoch, [`DrillController`] behind [`DRILL_DEADLINE`];
/// before epoch 2 a host weight is overwritten with NaN, so the governor
/// rolls back (restores the host, prunes the seed). Per epoch: the
/// controller's outcome and the rollback's figures (losses only where
/// finite).
fn drills(telemetry: Telemetry) -> Result<Value> {
    let (train, validation) = synthetic_task(SEED.wrapping_add(2), 128)?;
    tch::manual_seed(i64::try_from(SEED).context("seed")?);
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), Device::Cpu).context("host")?;
    let mut model =
        MorphogeneticModel::with_slot_names(host, &["r0c1"], walk_slot_config(), telemetry.clone())
            .context("enabling the slot")?;
    model.germinate(
        grown_slot(),
        "conv_light",
        GerminationOptions::new("parity-drill"),
    )?;
    let config = ModelTrainerConfig {
        seed: SEED,
        batch_size: 64,
        validation_batch_size: 128,
        precision: Some(Precision::Fp32),
        counterfactual_samples: 0,
        snapshot_interval_epochs: 1,
        ..ModelTrainerConfig::default()
    };
    let mut trainer = ModelTrainer::new(model, &train, Some(&validation), config, telemetry)
        .context("setting up the drill trainer")?
        .with_controller(DrillController, DRILL_DEADLINE)
        .context("starting the drill controller")?;
    let mut epochs = Vec::new();
    for epoch in 0..DRILL_EPOCHS {
        if epoch == 2 {
            let (_, weight) = trainer
                .model()
                .host_parameters()
                .into_iter()
                .next()
                .context("the host has no parameter")?;
            let _ = tch::no_grad(|| weight.shallow_clone().f_fill_(f64::NAN))
                .context("poisoning a host weight")?;
        }
        let report = trainer
            .train_epoch()
            .with_context(|| format!("drill epoch {epoch}"))?;
        let rollback = report.rollback.as_ref().map(|rollback| {
            json!({
                "snapshot_epoch": rollback.snapshot_epoch,
                "restored_tensors": rollback.restored_tensors,
                "pruned": rollback.pruned.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })
        });
        let loss = report.train.loss;
        epochs.push(json!({
            "epoch": epoch,
            "train_loss": loss.is_finite().then_some(loss),
            "controller": report.decision.as_ref().map(|(outcome, _)| outcome_name(outcome)),
            "rollback": rollback,
            "active_seeds": report.active_seeds,
        }));
    }
    Ok(json!({ "per_epoch": epochs }))
}

/// One simic round (two environments, four epochs each, a small policy) on
/// a synthetic task, learning from it.
fn simic_round(telemetry: Telemetry) -> Result<Value> {
    let (train, validation) = synthetic_task(SEED.wrapping_add(1), 256)?;
    let spec = EnvSpec::sharded(
        CnnHostConfig::fashion_mnist(),
        vec!["r0c0".into(), "r0c1".into(), "r0c2".into()],
        &train,
        validation,
        2,
    )?;
    let mut config = SimicConfig::reference(4);
    config.n_envs = 2;
    config.seed = SEED;
    config.trainer = ModelTrainerConfig {
        batch_size: 64,
        ..ModelTrainerConfig::default()
    };
    config.policy = PolicyConfig {
        feature_dim: 32,
        hidden_dim: 32,
        ..PolicyConfig::default()
    };
    let mut simic = Simic::new(config, 3, Device::Cpu, telemetry)?;
    let report = simic.run_round(&spec, true)?;
    let ppo = report.ppo.as_ref().map(|ppo| {
        json!({
            "policy_loss": ppo.policy_loss,
            "value_loss": ppo.value_loss,
            "total_loss": ppo.total_loss,
            "head_entropies": ppo.head_entropies,
            "approx_kl": ppo.approx_kl,
            "clip_fraction": ppo.clip_fraction,
            "epochs_run": ppo.epochs_run,
            "steps": ppo.steps,
        })
    });
    Ok(json!({
        "env_epochs": report.env_epochs,
        "mean_episode_reward": report.mean_episode_reward,
        "final_accuracies": report.final_accuracies,
        "rollbacks": report.rollbacks,
        "germinations": report.germinations,
        "fossilizations": report.fossilizations,
        "prunes": report.prunes,
        "steps": report.inference_samples.len(),
        "ppo": ppo,
    }))
}

/// Trainable parameters of a host.
fn host_params(host: &dyn Host) -> i64 {
    host.var_store()
        .trainable_variables()
        .iter()
        .map(|tensor| i64::try_from(tensor.numel()).unwrap_or(i64::MAX))
        .sum()
}

/// Parameter counts of the hosts (built) and of every blueprint (built at
/// the width of each of the Fashion-MNIST host's slots, and on the tiny
/// transformer's width).
fn parameter_counts() -> Result<Value> {
    tch::manual_seed(i64::try_from(SEED).context("seed")?);
    let fashion = CnnHost::new(CnnHostConfig::fashion_mnist(), Device::Cpu)?;
    let impaired = CnnHost::new(
        CnnHostConfig {
            base_channels: 4,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )?;
    let cifar = CnnHost::new(CnnHostConfig::cifar_baseline(), Device::Cpu)?;
    let linear = LinearHost::reference(Device::Cpu)?;
    let tiny = TransformerHost::new(TransformerHostConfig::tiny(), Device::Cpu)?;
    let hosts = json!({
        "cnn_fashion_mnist": host_params(&fashion),
        "cnn_fashion_mnist_impaired": host_params(&impaired),
        "cnn_cifar_baseline": host_params(&cifar),
        "linear_reference": host_params(&linear),
        "transformer_tiny": host_params(&tiny),
        "transformer_reference": TransformerHostConfig::reference().param_count()?,
    });
    let mut widths: Vec<i64> = fashion
        .injection_specs()
        .iter()
        .map(|spec| spec.channels)
        .collect();
    widths.sort_unstable();
    widths.dedup();
    let mut blueprints = Map::new();
    for (topology, name, dims) in [
        (Topology::Cnn, "cnn", widths),
        (
            Topology::Transformer,
            "transformer",
            vec![TransformerHostConfig::tiny().n_embd],
        ),
    ] {
        let mut by_name = Map::new();
        for blueprint in Blueprint::for_topology(topology) {
            let mut by_dim = Map::new();
            for dim in &dims {
                let module = blueprint.build(topology, *dim, Device::Cpu)?;
                by_dim.insert(dim.to_string(), json!(module.param_count()));
            }
            by_name.insert(blueprint.name().to_owned(), Value::Object(by_dim));
        }
        blueprints.insert(name.to_owned(), Value::Object(by_name));
    }
    Ok(json!({ "hosts": hosts, "blueprints": blueprints }))
}

/// Tamiyo's observation widths for one to three slots, the head sizes, and
/// the masks (their shapes as tensors and their values) of an environment
/// whose three slots are empty and of the trainer walk's final slots.
fn tamiyo_shapes(walk_slots: &[Option<SlotMaskInfo>]) -> Result<Value> {
    let mut observation = Map::new();
    for num_slots in 1..=3_usize {
        let layout = tamiyo::features::layout(num_slots)?;
        observation.insert(
            format!("slots_{num_slots}"),
            json!({
                "obs_dim": layout.obs_dim(),
                "network_input_dim": layout.network_input_dim(),
            }),
        );
    }
    let config = MaskConfig::default();
    let empty = compute_masks(&[None, None, None], &config)?;
    let walked = compute_masks(walk_slots, &config)?;
    let mut mask_shapes = Map::new();
    for (label, masks) in [("empty_3_slots", &empty), ("walk_final", &walked)] {
        let tensors = MaskTensors::from_masks(std::slice::from_ref(masks), Device::Cpu)?;
        let mut shapes = Map::new();
        let mut values = Map::new();
        for (head, name) in HEAD_NAMES.iter().enumerate() {
            let shape = tensors.heads.get(head).map(tch::Tensor::size);
            shapes.insert((*name).to_owned(), json!(shape));
            values.insert((*name).to_owned(), json!(masks.head(head)));
        }
        shapes.insert("slot_by_op".to_owned(), json!(tensors.slot_by_op.size()));
        values.insert("slot_by_op".to_owned(), json!(masks.slot_by_op()));
        mask_shapes.insert(
            label.to_owned(),
            json!({ "shapes": shapes, "allowed": values }),
        );
    }
    Ok(json!({
        "schema_version": tamiyo::features::SCHEMA_VERSION,
        "observation": observation,
        "head_sizes_3_slots": tamiyo::heads::head_sizes(3),
        "masks": mask_shapes,
    }))
}
