//! A [`ModelTrainer`]'s state between epochs, for checkpoints: what
//! [`ModelTrainer::export_state`] returns and [`ModelTrainer::restore`] builds
//! a trainer from, so that a run stopped after epoch `e` and restored
//! continues exactly as the run that was never stopped (on the CPU: bit for
//! bit), provided the driver seeds libtorch's generator before every epoch
//! by [`epoch_seed`].
//!
//! The state is a [`TrainerManifest`] (plain serde values: epoch,
//! germinations, every slot's lifecycle state through Kasmina's
//! [`SeedState`] serde, the optimizer groups' configurations, the governor's
//! counters, and what each tensor is) and a list of named CPU tensors:
//!
//! - `model/host/<variable>`: the host's parameters and buffers;
//! - `model/seed/<slot>/<variable>`: each live seed's and fossil's variables;
//! - `optim/<group>/lr`, `optim/<group>/step_count`,
//!   `optim/<group>/state/<i>`: each optimizer group's learning rate, step
//!   count and state (`<group>` is `host` or `seed/<slot>`);
//! - `governor/host/<variable>`, `governor/fossil/<slot>/<variable>`: the
//!   governor's snapshot.
//!
//! How the two are stored (files, checksums, atomic writes) is the caller's
//! choice; the tensors' names suit a safetensors file.
//!
//! Restoring is a constructor, not an import into a running trainer: a seed's
//! module must be back in its slot before the trainer builds the optimizer
//! groups ([`crate::engine::model_step::ModelStep::new`] builds one per
//! parameter group the model has), so [`ModelTrainer::restore`] takes the
//! freshly built model, puts the seeds back ([`MorphogeneticModel::restore_seed`]),
//! builds the trainer and writes the optimizer state, the governor
//! ([`crate::governor::Governor::import_state`]) and the counters
//! ([`ModelTrainer::resume_at`]). A refused restore returns a typed error
//! ([`Error::Checkpoint`], or the owner's error) and builds nothing; the
//! state is only read. Inside, everything that can be checked is checked
//! before the first value is written.
//!
//! Two boundary cases: a seed germinated at the checkpoint's boundary has no
//! optimizer state yet (the original run builds it fresh when the next epoch
//! starts, the restored trainer has built it fresh already); a seed pruned
//! at the boundary still has its group's state in the export (the original
//! run drops it when the next epoch starts), which the restore skips.
//!
//! An example (not run as a doctest: a doctest binary cannot find libtorch
//! from its temporary folder; `tests/trainer_checkpoint.rs` runs this flow
//! across two processes):
//!
//! ```ignore
//! # fn demo(
//! #     trainer: &tolaria::engine::trainer::ModelTrainer,
//! #     fresh_model: kasmina::model::MorphogeneticModel,
//! #     train: &tolaria::data::Dataset,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use tolaria::engine::trainer::{ModelTrainer, epoch_seed};
//!
//! let state = trainer.export_state()?;
//! let json = serde_json::to_string(&state.manifest)?;
//! tch::Tensor::write_safetensors(&state.tensors, "tensors.safetensors")?;
//! // ... later, in another process, with a model built as the first was:
//! let manifest = serde_json::from_str(&json)?;
//! let tensors = tch::Tensor::read_safetensors("tensors.safetensors")?;
//! let state = tolaria::engine::trainer::TrainerState { manifest, tensors };
//! let mut resumed = ModelTrainer::restore(
//!     fresh_model,
//!     &state,
//!     train,
//!     None,
//!     trainer.config().clone(),
//!     leyline::Telemetry::disabled(),
//! )?;
//! tch::manual_seed(epoch_seed(trainer.config().seed, resumed.epoch()));
//! resumed.train_epoch()?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;

use kasmina::groups::GroupKey;
use kasmina::lifecycle::SeedState;
#[cfg(doc)]
use kasmina::model::MorphogeneticModel;
use serde::{Deserialize, Serialize};
use tch::Tensor;

#[cfg(doc)]
use super::ModelTrainer;
use crate::error::{Error, Result};
use crate::optim::GroupOptimizerConfig;

mod export;
mod restore;

/// Prefix of the host's variables among the state tensors.
const HOST: &str = "model/host/";
/// Prefix of the governor's snapshot of the host.
const GOVERNOR_HOST: &str = "governor/host/";

/// The libtorch seed of epoch `epoch` of a run seeded `seed`: a driver sets
/// it ([`tch::manual_seed`]) before each epoch's steps, so that anything
/// drawing from libtorch's generator (a germinated seed's initial weights)
/// draws the same numbers in a restored run. The device shuffle needs
/// nothing: it is seeded per epoch by the trainer.
pub fn epoch_seed(seed: u64, epoch: usize) -> i64 {
    let mut mixed = seed ^ (epoch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    mixed ^= mixed >> 31;
    mixed = mixed.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed ^= mixed >> 29;
    i64::from_ne_bytes(mixed.to_ne_bytes())
}

/// One state tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorEntry {
    /// Its name (see the module docs).
    pub name: String,
    /// What it is, e.g. `host parameter or buffer`, `optimizer state`.
    pub role: String,
    /// libtorch dtype, e.g. `Float`.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<i64>,
}

/// One slot's lifecycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotState {
    /// Slot id, e.g. `r0c1`.
    pub slot: String,
    /// Stage name; `DORMANT` for an empty slot.
    pub stage: String,
    /// The seed's id, if the slot holds a state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_id: Option<String>,
    /// The seed's blueprint, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blueprint: Option<String>,
    /// Alpha.
    pub alpha: f64,
    /// Kasmina's whole lifecycle state of the seed (stage, history, alpha
    /// controller, blend settings, metrics, cooldown), if the slot holds
    /// one; checked by Kasmina when restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SeedState>,
}

/// One optimizer group's tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerGroup {
    /// `host` or `seed/<slot>`.
    pub group: String,
    /// The group's optimizer configuration.
    pub config: GroupOptimizerConfig,
    /// Tensor name of the learning rate.
    pub learning_rate: String,
    /// Tensor name of the step count.
    pub step_count: String,
    /// Tensor names of the state, in the optimizer's order.
    pub state: Vec<String>,
}

/// A fossil in the governor's snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotFossil {
    /// Its slot.
    pub slot: String,
    /// Its seed id.
    pub seed_id: String,
    /// Tensor names of its variables, sorted by variable name.
    pub tensors: Vec<String>,
}

/// The governor's snapshot: which tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotManifest {
    /// The epoch it was taken at.
    pub epoch: usize,
    /// Tensor names of the host's variables, sorted by variable name.
    pub host: Vec<String>,
    /// The fossils.
    pub fossils: Vec<SnapshotFossil>,
}

/// The governor's counters and snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GovernorManifest {
    /// Losses kept, oldest first.
    pub history: Vec<f64>,
    /// Anomalies in a row.
    pub consecutive_panics: u32,
    /// The last panic's loss.
    pub last_panic_loss: Option<f64>,
    /// Rollbacks done.
    pub rollbacks: u64,
    /// The snapshot, if one was taken.
    pub snapshot: Option<SnapshotManifest>,
}

/// The plain values of a [`TrainerState`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerManifest {
    /// Epochs finished.
    pub epoch: usize,
    /// Seeds germinated so far.
    pub germinations: u64,
    /// Every enabled slot, in execution order.
    pub slots: Vec<SlotState>,
    /// The governor, if on.
    pub governor: Option<GovernorManifest>,
    /// Every optimizer group.
    pub optimizers: Vec<OptimizerGroup>,
    /// Every tensor of [`TrainerState::tensors`].
    pub tensors: Vec<TensorEntry>,
}

/// A trainer's state between epochs (see the module docs).
#[derive(Debug)]
pub struct TrainerState {
    /// The plain values.
    pub manifest: TrainerManifest,
    /// The tensors, contiguous CPU copies, named as the module docs say.
    pub tensors: Vec<(String, Tensor)>,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> Error {
    Error::Checkpoint {
        field,
        reason: reason.into(),
    }
}

fn group_name(key: GroupKey) -> String {
    match key {
        GroupKey::Host => "host".to_owned(),
        GroupKey::Seed(slot) => format!("seed/{slot}"),
    }
}

fn sorted(variables: HashMap<String, Tensor>) -> Vec<(String, Tensor)> {
    let mut variables: Vec<(String, Tensor)> = variables.into_iter().collect();
    variables.sort_by(|a, b| a.0.cmp(&b.0));
    variables
}

impl TrainerState {
    /// The tensors by name, checked against the manifest: every entry
    /// present with its dtype and shape, no tensor twice, none unlisted.
    fn index(&self) -> Result<HashMap<&str, &Tensor>> {
        let mut index = HashMap::with_capacity(self.tensors.len());
        for (name, tensor) in &self.tensors {
            if index.insert(name.as_str(), tensor).is_some() {
                return Err(refuse("tensors", format!("{name} is given twice")));
            }
        }
        if index.len() != self.manifest.tensors.len() {
            return Err(refuse(
                "tensors",
                format!(
                    "{} tensors, the manifest lists {}",
                    index.len(),
                    self.manifest.tensors.len()
                ),
            ));
        }
        for entry in &self.manifest.tensors {
            let Some(tensor) = index.get(entry.name.as_str()) else {
                return Err(refuse("tensors", format!("no tensor {}", entry.name)));
            };
            if tensor.size() != entry.shape || format!("{:?}", tensor.kind()) != entry.dtype {
                return Err(refuse(
                    "tensors",
                    format!(
                        "{} is {:?} {:?}, the manifest says {} {:?}",
                        entry.name,
                        tensor.kind(),
                        tensor.size(),
                        entry.dtype,
                        entry.shape
                    ),
                ));
            }
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_seeds_differ_per_epoch_and_run() {
        assert_ne!(epoch_seed(0, 0), epoch_seed(0, 1));
        assert_ne!(epoch_seed(0, 1), epoch_seed(1, 1));
        assert_eq!(epoch_seed(7, 3), epoch_seed(7, 3));
    }
}
