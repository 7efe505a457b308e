//! [`ModelTrainer::restore`]: a trainer rebuilt from a [`TrainerState`], every
//! tensor's copy checked before the first is written.

use std::collections::HashMap;

use kasmina::groups::GroupKey;
use kasmina::host::SlotId;
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use tch::Tensor;

use super::{
    GOVERNOR_HOST, GovernorManifest, HOST, TrainerManifest, TrainerState, group_name, refuse,
    sorted,
};
use crate::data::Dataset;
use crate::engine::trainer::{ModelTrainer, ModelTrainerConfig};
use crate::error::{Error, Result};
use crate::governor::{FossilSnapshot, GovernorState, SnapshotState};

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
