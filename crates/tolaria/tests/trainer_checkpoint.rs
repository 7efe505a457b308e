//! A trainer's state saved between epochs as a checkpoint directory
//! ([`ModelTrainer::save_checkpoint`], the library's one writer), read back
//! ([`read_checkpoint`]) and restored in a new process
//! ([`ModelTrainer::restore`]) continues bit for bit as the run that was
//! never stopped: a CNN host on the CPU,
//! synthetic Fashion-MNIST-shaped data, a seed germinated and trained, the
//! governor on with a snapshot. The child process is this test binary run
//! again on its one ignored test, with the state's folder in an environment
//! variable. A state that does not fit is refused with a typed error, and
//! the refusals leave the state as it was; a damaged directory is refused
//! on reading.

use std::path::{Path, PathBuf};
use std::process::Command;

use kasmina::host::SlotId;
use kasmina::host::cnn::{CnnHost, CnnHostConfig};
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::{BlueprintAction, SeedStage, Telemetry};
use tch::{Device, Tensor};
use tolaria::Error;
use tolaria::amp::Precision;
use tolaria::controller::Decision;
use tolaria::data::Dataset;
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use tolaria::engine::trainer::{
    ModelTrainer, ModelTrainerConfig, TrainerState, epoch_seed, read_checkpoint,
};

/// The run's seed (shuffle and the per-epoch generator seed).
const SEED: u64 = 3;
/// Epochs of the whole run.
const EPOCHS: usize = 5;
/// Epochs before the state is exported.
const STOP: usize = 3;
/// Environment variable naming the state's folder for the child process.
const STATE_DIR: &str = "TOLARIA_TRAINER_CHECKPOINT_DIR";
/// The child's test.
const CHILD: &str = "continue_from_the_exported_state_in_this_process";

fn data() -> (Dataset, Dataset) {
    (
        image_task(&ImageTaskOptions::fashion_like(256, 5)).expect("train set"),
        image_task(&ImageTaskOptions::fashion_like(128, 6)).expect("validation set"),
    )
}

fn model(slots: &[&str]) -> MorphogeneticModel {
    tch::manual_seed(11);
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), Device::Cpu).expect("host");
    MorphogeneticModel::with_slot_names(host, slots, SlotConfig::default(), Telemetry::disabled())
        .expect("model")
}

fn config() -> ModelTrainerConfig {
    ModelTrainerConfig {
        seed: SEED,
        batch_size: 64,
        validation_batch_size: 128,
        precision: Some(Precision::Fp32),
        gradient_telemetry_stride: 2,
        counterfactual_samples: 128,
        snapshot_interval_epochs: 2,
        ..ModelTrainerConfig::default()
    }
}

fn slot() -> SlotId {
    SlotId::new(0, 1)
}

/// The run's lifecycle, by epochs finished: a seed germinated after the
/// first epoch, set training after the second.
fn boundary(trainer: &mut ModelTrainer) {
    match trainer.epoch() {
        1 => {
            let _ = trainer
                .apply_decision(&Decision::germinate(slot(), BlueprintAction::ConvLight))
                .expect("germinate");
        }
        2 => {
            let _ = trainer
                .model_mut()
                .advance_stage(slot(), Some(SeedStage::Training))
                .expect("training");
        }
        _ => {}
    }
}

/// One epoch as a driver runs it: the generator seeded by the rule, the
/// epoch, the boundary. Returns the bits of the training loss and accuracy
/// and of the validation loss.
fn epoch(trainer: &mut ModelTrainer) -> [u64; 3] {
    tch::manual_seed(epoch_seed(SEED, trainer.epoch()));
    let report = trainer.train_epoch().expect("epoch");
    boundary(trainer);
    [
        report.train.loss.to_bits(),
        report.train.accuracy.to_bits(),
        report.validation.expect("validation").loss.to_bits(),
    ]
}

/// The caller's own field saved beside the trainer's state.
fn note() -> serde_json::Map<String, serde_json::Value> {
    let mut extra = serde_json::Map::new();
    extra.insert("note".to_owned(), "saved by the test".into());
    extra
}

fn load(dir: &Path) -> TrainerState {
    let saved = read_checkpoint(dir).expect("the checkpoint reads back");
    assert_eq!(saved.extra, note(), "the caller's fields come back");
    saved.state
}

/// Asserts that two states are the same bit for bit (manifest and every
/// tensor).
fn assert_same(left: &TrainerState, right: &TrainerState) {
    assert_eq!(left.manifest, right.manifest);
    assert_eq!(left.tensors.len(), right.tensors.len());
    for (name, tensor) in &left.tensors {
        let (_, other) = right
            .tensors
            .iter()
            .find(|(other, _)| other == name)
            .unwrap_or_else(|| panic!("{name} is missing"));
        assert_eq!(tensor.kind(), other.kind(), "{name}");
        assert_eq!(tensor.size(), other.size(), "{name}");
        let bytes = |t: &Tensor| -> Vec<u8> {
            let t = t.contiguous();
            let n = t.numel() * t.kind().elt_size_in_bytes();
            let mut out = vec![0u8; n];
            t.copy_data_u8(&mut out, t.numel());
            out
        };
        assert!(bytes(tensor) == bytes(other), "{name} differs");
    }
}

#[test]
fn a_trainer_restored_in_a_new_process_continues_bit_for_bit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (train, validation) = data();
    let mut trainer = ModelTrainer::new(
        model(&["r0c1"]),
        &train,
        Some(&validation),
        config(),
        Telemetry::disabled(),
    )
    .expect("trainer");
    let mut figures = Vec::new();
    while trainer.epoch() < EPOCHS {
        figures.push(epoch(&mut trainer));
        if trainer.epoch() == STOP {
            let state = trainer.export_state().expect("export");
            assert_eq!(state.manifest.epoch, STOP);
            assert_eq!(state.manifest.germinations, 1);
            assert!(
                state
                    .manifest
                    .optimizers
                    .iter()
                    .any(|group| group.group == "seed/r0c1"),
                "the seed's optimizer state is in the state"
            );
            assert!(
                state
                    .manifest
                    .governor
                    .as_ref()
                    .is_some_and(|governor| governor.snapshot.is_some()),
                "the governor's snapshot is in the state"
            );
            trainer
                .save_checkpoint(dir.path(), "state", note())
                .expect("checkpoint written");
            assert_same(&state, &load(&dir.path().join("state")));
        }
    }
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args([CHILD, "--exact", "--ignored", "--test-threads=1"])
        .env(STATE_DIR, dir.path())
        .status()
        .expect("the child runs");
    assert!(status.success(), "the child failed: {status}");
    let child = dir.path().join("child");
    let child_figures: Vec<[u64; 3]> =
        serde_json::from_slice(&std::fs::read(dir.path().join("figures.json")).expect("figures"))
            .expect("figures parse");
    assert_eq!(
        child_figures,
        figures[STOP..],
        "losses and accuracies of the resumed epochs"
    );
    let uninterrupted = trainer.export_state().expect("export");
    assert_eq!(uninterrupted.manifest.epoch, EPOCHS);
    assert_same(&uninterrupted, &load(&child));
}

/// The child: restores the state of the folder `STATE_DIR` names, trains to
/// the end, and writes its figures and final state next to it.
#[test]
#[ignore = "run by a_trainer_restored_in_a_new_process_continues_bit_for_bit in a new process"]
fn continue_from_the_exported_state_in_this_process() {
    let dir = PathBuf::from(std::env::var_os(STATE_DIR).expect("the parent names the folder"));
    let state = load(&dir.join("state"));
    let (train, validation) = data();
    let mut trainer = ModelTrainer::restore(
        model(&["r0c1"]),
        &state,
        &train,
        Some(&validation),
        config(),
        Telemetry::disabled(),
    )
    .expect("restore");
    assert_eq!(trainer.epoch(), STOP);
    assert_eq!(trainer.germinations(), 1);
    let mut figures = Vec::new();
    while trainer.epoch() < EPOCHS {
        figures.push(epoch(&mut trainer));
    }
    trainer
        .save_checkpoint(&dir, "child", note())
        .expect("checkpoint written");
    std::fs::write(
        dir.join("figures.json"),
        serde_json::to_vec(&figures).expect("figures encode"),
    )
    .expect("figures written");
}

fn refused_field(result: tolaria::Result<ModelTrainer>) -> &'static str {
    match result {
        Err(Error::Checkpoint { field, .. }) => field,
        Err(other) => panic!("refused with another error: {other}"),
        Ok(_) => panic!("a state that does not fit was restored"),
    }
}

fn copy(state: &TrainerState) -> TrainerState {
    TrainerState {
        manifest: state.manifest.clone(),
        tensors: state
            .tensors
            .iter()
            .map(|(name, tensor)| (name.clone(), tensor.copy()))
            .collect(),
    }
}

#[test]
fn a_state_that_does_not_fit_is_refused_with_a_typed_error_and_left_as_it_was() {
    let (train, validation) = data();
    let mut trainer = ModelTrainer::new(
        model(&["r0c1"]),
        &train,
        Some(&validation),
        config(),
        Telemetry::disabled(),
    )
    .expect("trainer");
    for _ in 0..2 {
        let _ = epoch(&mut trainer);
    }
    let state = trainer.export_state().expect("export");
    let original = copy(&state);
    let restore = |model: MorphogeneticModel, state: &TrainerState, config| {
        ModelTrainer::restore(
            model,
            state,
            &train,
            Some(&validation),
            config,
            Telemetry::disabled(),
        )
    };

    // A tensor missing from the list.
    let mut missing = copy(&state);
    let _ = missing.tensors.pop();
    assert_eq!(
        refused_field(restore(model(&["r0c1"]), &missing, config())),
        "tensors"
    );
    // A host variable of another shape, consistently listed.
    let mut reshaped = copy(&state);
    let name = reshaped.tensors[0].0.clone();
    reshaped.tensors[0].1 = Tensor::zeros([3], (tch::Kind::Float, Device::Cpu));
    let entry = reshaped
        .manifest
        .tensors
        .iter_mut()
        .find(|entry| entry.name == name)
        .expect("listed");
    entry.shape = vec![3];
    entry.dtype = "Float".to_owned();
    assert_eq!(
        refused_field(restore(model(&["r0c1"]), &reshaped, config())),
        "tensors"
    );
    // Another slot than the state's.
    assert_eq!(
        refused_field(restore(model(&["r0c0"]), &state, config())),
        "slots"
    );
    // No governor where the state has one.
    let no_governor = ModelTrainerConfig {
        governor: false,
        ..config()
    };
    assert_eq!(
        refused_field(restore(model(&["r0c1"]), &state, no_governor)),
        "governor"
    );
    // Another optimizer configuration.
    let mut other_optimizer = config();
    other_optimizer.optimizer.host = tolaria::optim::GroupOptimizerConfig::sgd(0.01, 0.5);
    assert_eq!(
        refused_field(restore(model(&["r0c1"]), &state, other_optimizer)),
        "optimizers"
    );

    // The refusals left the state as it was, and it still restores into a
    // trainer whose export is the state.
    assert_same(&state, &original);
    let restored = restore(model(&["r0c1"]), &state, config()).expect("restore");
    assert_same(&restored.export_state().expect("export"), &original);
}

#[test]
fn a_damaged_checkpoint_directory_or_a_clashing_field_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (train, validation) = data();
    let mut trainer = ModelTrainer::new(
        model(&["r0c1"]),
        &train,
        Some(&validation),
        config(),
        Telemetry::disabled(),
    )
    .expect("trainer");
    epoch(&mut trainer);
    let mut clash = serde_json::Map::new();
    clash.insert("epoch".to_owned(), 7.into());
    assert!(matches!(
        trainer.save_checkpoint(dir.path(), "1", clash),
        Err(Error::Checkpoint { field: "extra", .. })
    ));
    assert!(!dir.path().join("1").exists(), "nothing written");
    let saved = trainer
        .save_checkpoint(dir.path(), "1", note())
        .expect("checkpoint written");
    let tensors = saved.join("tensors.safetensors");
    let mut bytes = std::fs::read(&tensors).expect("tensors");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&tensors, &bytes).expect("damage");
    let error = read_checkpoint(&saved).expect_err("a damaged checkpoint");
    assert!(matches!(error, Error::Durable(_)), "{error}");
    assert!(error.to_string().contains("checksum mismatch"), "{error}");
}
