//! [`ModelTrainer::export_state`]: the trainer's state copied out to the CPU,
//! tensor by tensor, with the manifest that lists them.

use kasmina::model::MorphogeneticModel;
use tch::{Device, Tensor};

use super::{
    GOVERNOR_HOST, GovernorManifest, HOST, OptimizerGroup, SlotState, SnapshotFossil,
    SnapshotManifest, TensorEntry, TrainerManifest, TrainerState, group_name, refuse, sorted,
};
use crate::engine::trainer::ModelTrainer;
use crate::error::{Error, Result};
use crate::governor::GovernorState;

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
