//! The policy of the greedy learning curve's best point ([`Selected`]): a
//! copy of the whole trainer state taken when a point of the curve
//! (`--greedy-every`) is at least as good as every earlier one, kept in the
//! same checkpoints as the trainer (the tensors under [`SELECTED_PREFIX`],
//! the host-side state and the point in the manifest's `selected` field),
//! and evaluated on the shared evaluation environments beside the final
//! policy; and what a training run hands back ([`Trained`]).

use leyline::baseline::ResultEntry;
use serde_json::{Map, Value, json};
use tch::Tensor;

#[cfg(doc)]
use super::LearningSetup;
use crate::checkpoint::PpoCheckpoint;
use crate::error::TorchResultExt;
use crate::vectorized::{Simic, SimicState};
use crate::{Error, Result};

/// The prefix of the selected policy's tensors in a checkpoint.
pub const SELECTED_PREFIX: &str = "selected/";

/// The manifest field that holds the selected point.
const FIELD: &str = "selected";

/// The trainer state at the greedy curve's best point so far.
#[derive(Debug)]
pub struct Selected {
    /// The training round after which the point was measured (0-based).
    pub round: usize,
    /// The point's greedy mean final accuracy (`greedy_accuracy_pct`).
    pub accuracy: f64,
    state: SimicState,
    tensors: Vec<(String, Tensor)>,
}

fn refuse(reason: String) -> Error {
    Error::Checkpoint {
        field: "selected",
        reason,
    }
}

impl Selected {
    /// A copy of `state` and `tensors` (what [`Simic::export_state`]
    /// returned): the tensors are copied into memory of their own, so the
    /// training that goes on does not change them.
    pub(super) fn take(
        round: usize,
        accuracy: f64,
        state: SimicState,
        tensors: &[(String, Tensor)],
    ) -> Result<Selected> {
        let _guard = tch::no_grad_guard();
        let tensors = tensors
            .iter()
            .map(|(name, tensor)| {
                let mut copy = tensor.f_empty_like().op("selected empty_like")?;
                copy.f_copy_(tensor).op("selected copy")?;
                Ok((name.clone(), copy))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Selected {
            round,
            accuracy,
            state,
            tensors,
        })
    }

    /// Puts the selected state into `simic` ([`Simic::import_state`]).
    pub fn apply(&self, simic: &mut Simic) -> Result<()> {
        simic.import_state(&self.state, &self.tensors)
    }

    /// What a checkpoint keeps of it: the manifest field (added to `extra`)
    /// and the tensors under [`SELECTED_PREFIX`] (for
    /// [`Simic::save_checkpoint_with`]).
    pub fn to_checkpoint(&self, extra: &mut Map<String, Value>) -> Result<Vec<(String, Tensor)>> {
        let state = serde_json::to_value(&self.state).map_err(|error| refuse(error.to_string()))?;
        extra.insert(
            FIELD.to_owned(),
            json!({ "round": self.round, "accuracy": self.accuracy, "state": state }),
        );
        Ok(self
            .tensors
            .iter()
            .map(|(name, tensor)| (format!("{SELECTED_PREFIX}{name}"), tensor.shallow_clone()))
            .collect())
    }

    /// The selected state a checkpoint keeps (`None` when it keeps none).
    /// Refused when the field does not parse or its tensors are missing.
    pub fn from_checkpoint(checkpoint: &PpoCheckpoint) -> Result<Option<Selected>> {
        let Some(field) = checkpoint.extra.get(FIELD) else {
            return Ok(None);
        };
        let round = field
            .get("round")
            .and_then(Value::as_u64)
            .and_then(|round| usize::try_from(round).ok())
            .ok_or_else(|| refuse(format!("no round in {field}")))?;
        let accuracy = field
            .get("accuracy")
            .and_then(Value::as_f64)
            .filter(|accuracy| accuracy.is_finite())
            .ok_or_else(|| refuse("no finite accuracy".to_owned()))?;
        let state: SimicState = field
            .get("state")
            .cloned()
            .ok_or_else(|| refuse("no state".to_owned()))
            .and_then(|value| serde_json::from_value(value).map_err(|e| refuse(e.to_string())))?;
        let tensors: Vec<(String, Tensor)> = checkpoint
            .tensors
            .iter()
            .filter_map(|(name, tensor)| {
                name.strip_prefix(SELECTED_PREFIX)
                    .map(|own| (own.to_owned(), tensor.shallow_clone()))
            })
            .collect();
        if tensors.is_empty() {
            return Err(refuse(format!(
                "the manifest names a selected point, the file has no {SELECTED_PREFIX} tensors"
            )));
        }
        Ok(Some(Selected {
            round,
            accuracy,
            state,
            tensors,
        }))
    }
}

/// What [`LearningSetup::continue_policy`] calls after every round: the
/// trainer, the learning curve so far and the selected state.
pub type AfterRound<'a> = dyn FnMut(&Simic, &[ResultEntry], Option<&Selected>) -> Result<()> + 'a;

/// A trained policy ([`LearningSetup::continue_policy`]).
pub struct Trained {
    /// The trainer after the last round.
    pub simic: Simic,
    /// One entry per round (the learning curve).
    pub curve: Vec<ResultEntry>,
    /// With a greedy curve: the state at its best point.
    pub selected: Option<Selected>,
}

/// Whether `selected` is the best point of `curve`'s greedy curve (the
/// last of the best, as [`LearningSetup::continue_policy`] selects), and
/// is there exactly when the curve has points.
pub(super) fn check_selected(curve: &[ResultEntry], selected: Option<&Selected>) -> Result<()> {
    let points = curve.iter().enumerate().filter_map(|(round, entry)| {
        let accuracy = *entry.metrics.get("greedy_accuracy_pct")?;
        Some((round, accuracy))
    });
    let best = points.fold(
        None,
        |best: Option<(usize, f64)>, (round, accuracy)| match best {
            Some((_, top)) if accuracy < top => best,
            _ => Some((round, accuracy)),
        },
    );
    let kept = selected.map(|selected| (selected.round, selected.accuracy));
    if best == kept {
        Ok(())
    } else {
        Err(Error::Checkpoint {
            field: "selected",
            reason: format!(
                "the checkpoint's selected point (round, accuracy) {kept:?} is not the \
                 learning curve's best greedy point {best:?}"
            ),
        })
    }
}
