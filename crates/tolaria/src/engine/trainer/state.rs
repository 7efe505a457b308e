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
use kasmina::host::SlotId;
use kasmina::lifecycle::SeedState;
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use super::{ModelTrainer, ModelTrainerConfig};
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::governor::{FossilSnapshot, GovernorState, SnapshotState};
use crate::optim::GroupOptimizerConfig;

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

/// A contiguous CPU copy of `tensor`, detached.
fn cpu_copy(tensor: &Tensor) -> Result<Tensor> {
    let mut copy = Tensor::f_empty(tensor.size().as_slice(), (tensor.kind(), Device::Cpu))
        .map_err(|source| Error::Torch {
            op: "checkpoint copy",
            source,
        })?;
    tch::no_grad(|| copy.f_copy_(tensor)).map_err(|source| Error::Torch {
        op: "checkpoint copy",
        source,
    })?;
    Ok(copy)
}

/// Collects tensors and their entries while exporting.
#[derive(Default)]
struct Collected {
    tensors: Vec<(String, Tensor)>,
    entries: Vec<TensorEntry>,
}

impl Collected {
    fn push(&mut self, name: String, role: &str, tensor: &Tensor) -> Result<String> {
        if self.entries.iter().any(|entry| entry.name == name) {
            return Err(refuse("tensors", format!("{name} is named twice")));
        }
        self.entries.push(TensorEntry {
            name: name.clone(),
            role: role.to_owned(),
            dtype: format!("{:?}", tensor.kind()),
            shape: tensor.size(),
        });
        self.tensors.push((name.clone(), cpu_copy(tensor)?));
        Ok(name)
    }
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

/// `(target, source, what)` copies, checked before any is made.
#[derive(Default)]
struct Copies<'a> {
    pairs: Vec<(Tensor, &'a Tensor, String)>,
}

impl<'a> Copies<'a> {
    fn add(&mut self, target: Tensor, source: &'a Tensor, what: String) -> Result<()> {
        if target.size() != source.size() || target.kind() != source.kind() {
            return Err(refuse(
                "tensors",
                format!(
                    "{what} is {:?} {:?} in the state, {:?} {:?} in the trainer",
                    source.kind(),
                    source.size(),
                    target.kind(),
                    target.size()
                ),
            ));
        }
        self.pairs.push((target, source, what));
        Ok(())
    }

    /// Every `<prefix><variable>` tensor into the variable of that name; the
    /// two sets must be the same.
    fn add_all(
        &mut self,
        manifest: &TrainerManifest,
        index: &HashMap<&str, &'a Tensor>,
        variables: Vec<(String, Tensor)>,
        prefix: &str,
        owner: &str,
    ) -> Result<()> {
        let expected = manifest
            .tensors
            .iter()
            .filter(|entry| entry.name.starts_with(prefix))
            .count();
        if expected != variables.len() {
            return Err(refuse(
                "model",
                format!(
                    "the state holds {expected} variables of the {owner}, the model {}",
                    variables.len()
                ),
            ));
        }
        for (name, variable) in variables {
            let source = lookup(index, &format!("{prefix}{name}"))?;
            self.add(variable, source, format!("{owner} variable {name}"))?;
        }
        Ok(())
    }

    fn write(self) -> Result<()> {
        for (target, source, _) in self.pairs {
            let mut target = target;
            tch::no_grad(|| target.f_copy_(source)).map_err(|source| Error::Torch {
                op: "checkpoint restore copy",
                source,
            })?;
        }
        Ok(())
    }
}

fn lookup<'a>(index: &HashMap<&str, &'a Tensor>, name: &str) -> Result<&'a Tensor> {
    index
        .get(name)
        .copied()
        .ok_or_else(|| refuse("tensors", format!("no tensor {name}")))
}

impl ModelTrainer {
    /// The trainer's state between epochs (see the module docs): CPU copies,
    /// so training may go on while the state is written out.
    pub fn export_state(&self) -> Result<TrainerState> {
        let model = self.model();
        let mut tensors = Collected::default();
        for (name, tensor) in sorted(model.host().var_store().variables()) {
            tensors.push(format!("{HOST}{name}"), "host parameter or buffer", &tensor)?;
        }
        let slots = slot_states(model, &mut tensors)?;
        let mut optimizers = Vec::new();
        let optim = self.step.optimizers();
        for key in optim.keys() {
            let Some(group) = optim.group(key) else {
                continue;
            };
            let prefix = format!("optim/{}", group_name(key));
            let learning_rate = tensors.push(
                format!("{prefix}/lr"),
                "optimizer learning rate",
                group.learning_rate_tensor(),
            )?;
            let step_count = tensors.push(
                format!("{prefix}/step_count"),
                "optimizer step count",
                group.step_count_tensor(),
            )?;
            let state = group
                .state_tensors()
                .iter()
                .enumerate()
                .map(|(index, tensor)| {
                    tensors.push(format!("{prefix}/state/{index}"), "optimizer state", tensor)
                })
                .collect::<Result<Vec<_>>>()?;
            optimizers.push(OptimizerGroup {
                group: group_name(key),
                config: group.config(),
                learning_rate,
                step_count,
                state,
            });
        }
        let governor = match self.governor() {
            Some(governor) => Some(governor_manifest(governor.export_state()?, &mut tensors)?),
            None => None,
        };
        Ok(TrainerState {
            manifest: TrainerManifest {
                epoch: self.epoch,
                germinations: self.germinations,
                slots,
                governor,
                optimizers,
                tensors: tensors.entries,
            },
            tensors: tensors.tensors,
        })
    }

    /// A trainer that continues from `state` (see the module docs): `model`
    /// is freshly built as the exported trainer's was (same host, same
    /// enabled slots, no seed), the data and `config` are those of the
    /// exported trainer, and the next epoch is `state.manifest.epoch`.
    /// Attach the controller afterwards ([`ModelTrainer::with_controller`]).
    ///
    /// Refused with [`Error::Checkpoint`] when the state does not fit: a
    /// tensor missing, unlisted or of another dtype or shape, slots other
    /// than the model's, a governor where the configuration has none (or the
    /// reverse), an optimizer group the trainer lacks or configured
    /// otherwise; with Kasmina's error ([`Error::Lifecycle`]) for a seed
    /// state it refuses, with the governor's for a governor state it
    /// refuses. A refused restore builds nothing and only reads `state`.
    pub fn restore(
        mut model: MorphogeneticModel,
        state: &TrainerState,
        train: &Dataset,
        validation: Option<&Dataset>,
        config: ModelTrainerConfig,
        telemetry: Telemetry,
    ) -> Result<ModelTrainer> {
        let manifest = &state.manifest;
        let index = state.index()?;
        if manifest.governor.is_some() != config.governor {
            return Err(refuse(
                "governor",
                format!(
                    "the state and the trainer disagree on the governor (state: {}, \
                     configuration: {})",
                    if manifest.governor.is_some() {
                        "on"
                    } else {
                        "off"
                    },
                    if config.governor { "on" } else { "off" }
                ),
            ));
        }
        if !manifest
            .optimizers
            .iter()
            .any(|saved| saved.group == group_name(GroupKey::Host))
        {
            return Err(refuse(
                "optimizers",
                "the state holds no optimizer state of the host",
            ));
        }
        let mut copies = Copies::default();
        restore_model(manifest, &index, &mut model, &mut copies)?;
        copies.write()?;
        let mut trainer = ModelTrainer::new(model, train, validation, config, telemetry)?;
        let copies = trainer.optimizer_copies(manifest, &index)?;
        let device = trainer.model().device();
        if let (Some(saved), Some(governor)) = (&manifest.governor, trainer.governor.as_mut()) {
            governor.import_state(governor_state(saved, &index)?, device)?;
        }
        copies.write()?;
        trainer.resume_at(manifest.epoch, manifest.germinations);
        Ok(trainer)
    }

    /// The optimizer groups' tensors of `manifest` paired with the
    /// trainer's, checked.
    fn optimizer_copies<'a>(
        &self,
        manifest: &TrainerManifest,
        index: &HashMap<&str, &'a Tensor>,
    ) -> Result<Copies<'a>> {
        let optim = self.step.optimizers();
        let mut copies = Copies::default();
        for saved in &manifest.optimizers {
            let key = match saved.group.strip_prefix("seed/") {
                Some(slot) => GroupKey::Seed(SlotId::parse(slot).map_err(|source| {
                    refuse(
                        "optimizers",
                        format!("optimizer group {}: {source}", saved.group),
                    )
                })?),
                None if saved.group == "host" => GroupKey::Host,
                None => {
                    return Err(refuse(
                        "optimizers",
                        format!("unknown optimizer group {:?}", saved.group),
                    ));
                }
            };
            let Some(group) = optim.group(key) else {
                // A seed pruned at the boundary: its slot has no module and
                // so no group (see the module docs).
                let gone = match key {
                    GroupKey::Seed(slot) => self
                        .model()
                        .slot(slot)
                        .is_ok_and(|slot| slot.seed_module().is_none()),
                    GroupKey::Host => false,
                };
                if gone {
                    continue;
                }
                return Err(refuse(
                    "optimizers",
                    format!("the trainer has no optimizer group {}", saved.group),
                ));
            };
            if group.config() != saved.config {
                return Err(refuse(
                    "optimizers",
                    format!(
                        "optimizer group {} is {:?} in the state, {:?} in the trainer",
                        saved.group,
                        saved.config,
                        group.config()
                    ),
                ));
            }
            copies.add(
                group.learning_rate_tensor().shallow_clone(),
                lookup(index, &saved.learning_rate)?,
                saved.learning_rate.clone(),
            )?;
            copies.add(
                group.step_count_tensor().shallow_clone(),
                lookup(index, &saved.step_count)?,
                saved.step_count.clone(),
            )?;
            let state = group.state_tensors();
            if state.len() != saved.state.len() {
                return Err(refuse(
                    "optimizers",
                    format!(
                        "optimizer group {} has {} state tensors, the state {}",
                        saved.group,
                        state.len(),
                        saved.state.len()
                    ),
                ));
            }
            for (target, name) in state.into_iter().zip(&saved.state) {
                copies.add(target, lookup(index, name)?, name.clone())?;
            }
        }
        Ok(copies)
    }
}

fn slot_states(model: &MorphogeneticModel, tensors: &mut Collected) -> Result<Vec<SlotState>> {
    let mut slots = Vec::new();
    for slot in model.slots() {
        let state = slot.state();
        let id = slot.id().to_string();
        if let Some(module) = slot.seed_module() {
            for (name, tensor) in sorted(module.var_store().variables()) {
                tensors.push(
                    format!("model/seed/{id}/{name}"),
                    "seed parameter or buffer",
                    &tensor,
                )?;
            }
        }
        slots.push(SlotState {
            slot: id,
            stage: slot
                .stage()
                .map_or("DORMANT", leyline::SeedStage::name)
                .to_owned(),
            seed_id: state.map(|state| state.seed_id().to_owned()),
            blueprint: state.map(|state| state.blueprint().name().to_owned()),
            alpha: slot.alpha(),
            lifecycle: state.cloned(),
        });
    }
    Ok(slots)
}

fn governor_manifest(state: GovernorState, tensors: &mut Collected) -> Result<GovernorManifest> {
    let snapshot = match &state.snapshot {
        Some(snapshot) => {
            let host = snapshot
                .host
                .iter()
                .map(|(name, tensor)| {
                    tensors.push(
                        format!("{GOVERNOR_HOST}{name}"),
                        "governor snapshot (host)",
                        tensor,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let fossils = snapshot
                .fossils
                .iter()
                .map(|fossil| {
                    Ok(SnapshotFossil {
                        slot: fossil.slot.to_string(),
                        seed_id: fossil.seed_id.clone(),
                        tensors: fossil
                            .variables
                            .iter()
                            .map(|(name, tensor)| {
                                tensors.push(
                                    format!("governor/fossil/{}/{name}", fossil.slot),
                                    "governor snapshot (fossil)",
                                    tensor,
                                )
                            })
                            .collect::<Result<Vec<_>>>()?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Some(SnapshotManifest {
                epoch: snapshot.epoch,
                host,
                fossils,
            })
        }
        None => None,
    };
    Ok(GovernorManifest {
        history: state.history,
        consecutive_panics: state.consecutive_panics,
        last_panic_loss: state.last_panic_loss,
        rollbacks: state.rollbacks,
        snapshot,
    })
}

/// Pairs the host's variables of the state with `model`'s and puts every
/// seed back into its slot (its lifecycle state, then its variables'
/// pairs). The slots and the host's pairs are checked before the first seed
/// is restored.
fn restore_model<'a>(
    manifest: &TrainerManifest,
    index: &HashMap<&str, &'a Tensor>,
    model: &mut MorphogeneticModel,
    copies: &mut Copies<'a>,
) -> Result<()> {
    copies.add_all(
        manifest,
        index,
        sorted(model.host().var_store().variables()),
        HOST,
        "host",
    )?;
    let ids = model.slot_ids();
    if ids.len() != manifest.slots.len() {
        return Err(refuse(
            "slots",
            format!(
                "the state has {} slots, the model {}",
                manifest.slots.len(),
                ids.len()
            ),
        ));
    }
    for (id, saved) in ids.iter().zip(&manifest.slots) {
        if id.to_string() != saved.slot {
            return Err(refuse(
                "slots",
                format!("slot {} in the state is {id} in the model", saved.slot),
            ));
        }
    }
    for (id, saved) in ids.into_iter().zip(&manifest.slots) {
        let Some(state) = &saved.lifecycle else {
            continue;
        };
        model
            .restore_seed(id, state.clone())
            .map_err(|source| Error::Lifecycle {
                op: "restore_seed",
                source,
            })?;
        let variables = model
            .slot(id)
            .map_err(|source| Error::Lifecycle {
                op: "restore_seed",
                source,
            })?
            .seed_module()
            .map(|module| sorted(module.var_store().variables()))
            .unwrap_or_default();
        copies.add_all(
            manifest,
            index,
            variables,
            &format!("model/seed/{id}/"),
            &format!("seed {}", state.seed_id()),
        )?;
    }
    Ok(())
}

/// The governor's state of `saved`, its tensors shallow handles.
fn governor_state(
    saved: &GovernorManifest,
    index: &HashMap<&str, &Tensor>,
) -> Result<GovernorState> {
    let snapshot = match &saved.snapshot {
        Some(snapshot) => Some(SnapshotState {
            epoch: snapshot.epoch,
            host: named(index, &snapshot.host, GOVERNOR_HOST)?,
            fossils: snapshot
                .fossils
                .iter()
                .map(|fossil| {
                    Ok(FossilSnapshot {
                        slot: SlotId::parse(&fossil.slot).map_err(|source| {
                            refuse("governor", format!("fossil slot {}: {source}", fossil.slot))
                        })?,
                        seed_id: fossil.seed_id.clone(),
                        variables: named(
                            index,
                            &fossil.tensors,
                            &format!("governor/fossil/{}/", fossil.slot),
                        )?,
                    })
                })
                .collect::<Result<_>>()?,
        }),
        None => None,
    };
    Ok(GovernorState {
        history: saved.history.clone(),
        consecutive_panics: saved.consecutive_panics,
        last_panic_loss: saved.last_panic_loss,
        rollbacks: saved.rollbacks,
        snapshot,
    })
}

/// `(variable name, tensor)` for tensor names under `prefix`.
fn named(
    index: &HashMap<&str, &Tensor>,
    names: &[String],
    prefix: &str,
) -> Result<Vec<(String, Tensor)>> {
    names
        .iter()
        .map(|name| {
            let variable = name.strip_prefix(prefix).ok_or_else(|| {
                refuse("governor", format!("tensor {name} is not under {prefix}"))
            })?;
            Ok((variable.to_owned(), lookup(index, name)?.shallow_clone()))
        })
        .collect()
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
