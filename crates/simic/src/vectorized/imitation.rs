//! Imitation warm-up ([`ImitationConfig`]): the first PPO updates of a run
//! learn from a demonstrator instead of from the policy's own samples.
//!
//! Not a reference option (the reference trains from scratch; the default,
//! `updates = 0`, is the reference's). In an imitation round the
//! environments are driven by a scripted controller (the reference's
//! heuristic, or max growth), exactly as in [`super::Simic::drive_round`];
//! the policy still steps every epoch, so its recurrent state and values
//! follow the demonstrated trajectory. The rollout buffer then holds the
//! demonstrator's actions in place of the policy's samples
//! ([`crate::buffer::RolloutBuffer::record_demonstration`]) and the update
//! minimises their negative log-likelihood, head by head over the heads
//! that matter for the demonstrated op, beside the usual value, entropy and
//! auxiliary terms ([`crate::ppo::Objective::Imitation`]). Where the
//! auto-forward flags take ADVANCE out of the action space, Kasmina
//! advances every gate by itself, and a demonstrated ADVANCE (the
//! heuristic asks for one at every gate) is imitated as the WAIT it
//! amounts to. Any other demonstrated action that the policy's masks
//! forbid (a blueprint taken out of the policy's action space) is carried
//! out but not imitated: no head of its row is relevant, and the round
//! counts it ([`super::RoundReport::imitation`]). After the imitation
//! updates, PPO goes on from the imitating policy as usual.
//!
//! **The anchor** ([`ImitationConfig::anchor_weight`]; also not a reference
//! option, off by default). PPO rounds after the imitation leave the
//! demonstration: the sampled policy drifts to germinating and pruning
//! within 16 updates (`baselines/perf/simic-learning/NOTES.md`, "A third of
//! the learning rate after the imitation"). With an anchor weight `β > 0`,
//! the demonstrator also runs beside the policy in every PPO round, without
//! acting: at each decision it says what it would do in the state the
//! policy reached ([`crate::buffer::RolloutBuffer::record_anchor`]), and the
//! update adds `β·d^k` times the negative log-likelihood of those labels
//! (per head over the heads that matter for the labelled op, as the
//! imitation's loss) to PPO's loss, `k` counting the PPO updates after the
//! imitation and `d` the [`ImitationConfig::anchor_decay`]. A
//! behaviour-cloning term beside the policy gradient, on the policy's own
//! states: it keeps PPO near the demonstrator while it improves on it, and
//! with `d < 1` lets it go. Only a demonstrator whose decision is a
//! function of the observation can label states it did not reach itself:
//! max growth; the heuristic keeps a plateau history of its own and is
//! refused.
//!
//! Why: a policy trained from scratch keeps WAIT the likeliest op in almost
//! every state, so its greedy read-out idles where its sampled policy grows
//! (`baselines/perf/simic-learning/NOTES.md`). Starting PPO from a policy
//! that already grows as a demonstrator does is the standard remedy (a
//! demonstrator's actions as a supervised warm start). Max growth is the
//! default demonstrator: its decisions follow from the masks the policy
//! sees, so its imitation reads out greedily as max growth; the heuristic,
//! the stronger controller on the impaired hosts, germinates on a plateau
//! the policy has not learned to see in the CPU tests' small runs.

use leyline::{LifecycleOp, NUM_ACTION_HEADS};
use tamiyo::heads::{FactoredAction, OP, SLOT};
use tamiyo::masks::ActionMasks;
use tolaria::controller::Controller;

use super::SimicConfig;
use super::env::EnvSpec;
use crate::{Error, Result};

/// The scripted controller an imitation round follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Demonstrator {
    /// The reference's heuristic (reference §3.5), with the blueprint
    /// rotation of the host's topology, as the baselines run it. It
    /// germinates when its host has plateaued, a condition the policy has
    /// to read from its observations: on the CPU tests' small task eight
    /// imitation updates left a greedy read-out that waits every epoch
    /// (`baselines/perf/simic-learning/NOTES.md`).
    Heuristic,
    /// Max growth ([`tamiyo::growth::MaxGrowthController`]) under the
    /// policy's own mask rules: as many seeds as the masks allow. The
    /// default: its decisions follow from the masks the policy sees, and
    /// the greedy read-out of a policy that imitated it grows as it does.
    #[default]
    MaxGrowth,
}

impl Demonstrator {
    /// Every demonstrator, with the name a setting uses.
    pub const ALL: [(&'static str, Demonstrator); 2] = [
        ("heuristic", Demonstrator::Heuristic),
        ("max_growth", Demonstrator::MaxGrowth),
    ];

    /// The demonstrator named `name` (`heuristic`, `max_growth`); an
    /// unknown name is an error listing the known ones.
    pub fn from_name(name: &str) -> Result<Demonstrator> {
        Self::ALL
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, demonstrator)| *demonstrator)
            .ok_or_else(|| Error::InvalidConfig {
                field: "ImitationConfig.demonstrator",
                reason: format!(
                    "no demonstrator {name:?} (demonstrators: {})",
                    Self::ALL.map(|(known, _)| known).join(", ")
                ),
            })
    }

    /// The name a setting uses.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, demonstrator)| *demonstrator == self)
            .map_or("?", |(name, _)| name)
    }

    /// One fresh controller of this kind for each of `config`'s
    /// environments on `spec`'s host (a controller keeps an episode's state,
    /// so a round takes fresh ones).
    pub fn controllers(self, spec: &EnvSpec, config: &SimicConfig) -> Vec<Box<dyn Controller>> {
        let topology = spec.host.topology();
        let masks = tamiyo::masks::MaskConfig {
            max_seeds: config.max_seeds,
            topology,
            ..config.masks
        };
        (0..config.n_envs)
            .map(|_| match self {
                Demonstrator::Heuristic => Box::new(
                    tamiyo::heuristic::HeuristicController::new()
                        .with_rotation(tamiyo::heuristic::rotation_for(topology)),
                ) as Box<dyn Controller>,
                Demonstrator::MaxGrowth => {
                    Box::new(tamiyo::growth::MaxGrowthController::new(masks)) as Box<dyn Controller>
                }
            })
            .collect()
    }
}

/// Passes over an imitation round's demonstration by default
/// ([`ImitationConfig::epochs`]).
pub const DEFAULT_IMITATION_EPOCHS: usize = 32;

/// The imitation warm-up of a run, and the anchor after it (see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImitationConfig {
    /// How many of the run's first PPO updates imitate (0: none, the
    /// reference's training). Counted in updates, so evaluation rounds
    /// between them do not count.
    pub updates: u64,
    /// Whom they imitate.
    pub demonstrator: Demonstrator,
    /// Passes an imitation update makes over its round's demonstration
    /// ([`DEFAULT_IMITATION_EPOCHS`]), in place of the PPO epochs: with the
    /// reference's one to four passes an update, eight updates barely move
    /// the policy towards the demonstrator (on the CPU test's task the
    /// demonstrated actions' negative log-likelihood fell 2% in six).
    pub epochs: usize,
    /// The anchor's weight `β` in the first PPO update after the imitation
    /// (0: no anchor, the default; finite, at least 0).
    pub anchor_weight: f64,
    /// The anchor's weight is multiplied by this after every PPO update
    /// (in `(0, 1]`; 1, the default, keeps it).
    pub anchor_decay: f64,
}

impl Default for ImitationConfig {
    fn default() -> ImitationConfig {
        ImitationConfig {
            updates: 0,
            demonstrator: Demonstrator::default(),
            epochs: DEFAULT_IMITATION_EPOCHS,
            anchor_weight: 0.0,
            anchor_decay: 1.0,
        }
    }
}

impl ImitationConfig {
    /// Checks `epochs` (in `[1, MAX_EPOCHS]` of the PPO update), the
    /// anchor's weight (finite, at least 0) and decay (in `(0, 1]`), and
    /// that an anchor has a demonstrator that can label the policy's states
    /// (max growth); the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.anchor_weight.is_finite() && self.anchor_weight >= 0.0) {
            return Err(Error::InvalidConfig {
                field: "ImitationConfig.anchor_weight",
                reason: format!("{}, not a finite number >= 0", self.anchor_weight),
            });
        }
        if !(self.anchor_decay > 0.0 && self.anchor_decay <= 1.0) {
            return Err(Error::InvalidConfig {
                field: "ImitationConfig.anchor_decay",
                reason: format!("{}, not in (0, 1]", self.anchor_decay),
            });
        }
        if self.anchor_weight > 0.0 && self.demonstrator == Demonstrator::Heuristic {
            return Err(Error::InvalidConfig {
                field: "ImitationConfig.anchor_weight",
                reason: "the heuristic cannot label the policy's states (its decisions \
                         follow a plateau history of its own): anchor to max_growth"
                    .to_owned(),
            });
        }
        if !(1..=crate::ppo::config::MAX_EPOCHS).contains(&self.epochs) {
            return Err(Error::InvalidConfig {
                field: "ImitationConfig.epochs",
                reason: format!(
                    "{}, not in [1, {}]",
                    self.epochs,
                    crate::ppo::config::MAX_EPOCHS
                ),
            });
        }
        Ok(())
    }

    /// The update objective of an imitation round.
    pub fn objective(&self) -> crate::ppo::Objective {
        crate::ppo::Objective::Imitation {
            epochs: self.epochs,
        }
    }

    /// Whether the update that follows `updates_done` earlier updates
    /// imitates.
    pub fn imitates_after(&self, updates_done: u64) -> bool {
        updates_done < self.updates
    }

    /// The anchor's coefficient in the update that follows `updates_done`
    /// earlier updates: 0 in an imitation update and without an anchor,
    /// `anchor_weight·anchor_decay^k` in the `k`-th PPO update after the
    /// imitation (from 0).
    pub fn anchor_coef_after(&self, updates_done: u64) -> f64 {
        if self.anchor_weight <= 0.0 || self.imitates_after(updates_done) {
            return 0.0;
        }
        let k = updates_done.saturating_sub(self.updates);
        let k = i32::try_from(k).unwrap_or(i32::MAX);
        self.anchor_weight * self.anchor_decay.powi(k)
    }
}

/// What the policy imitates of a demonstrated `action` under `masks`: the
/// action itself where the masks allow it; WAIT for an ADVANCE where
/// ADVANCE is out of the action space (`advance_disabled`,
/// `MaskConfig::disable_advance`: Kasmina then advances every gate by
/// itself, so asking for it is waiting); `None` for anything else the masks
/// forbid (its log-probability would be about `MASKED_LOGIT_VALUE`).
pub(super) fn imitation_target(
    action: &FactoredAction,
    masks: &ActionMasks,
    advance_disabled: bool,
) -> Option<FactoredAction> {
    let target = if advance_disabled && action.op == LifecycleOp::Advance {
        FactoredAction {
            op: LifecycleOp::Wait,
            ..*action
        }
    } else {
        *action
    };
    imitable(&target, masks).then_some(target)
}

/// Whether the policy could take `action` under `masks`: its op is
/// allowed, and so is every other head's choice that matters for the op
/// (the slot among the op's slots).
fn imitable(action: &FactoredAction, masks: &ActionMasks) -> bool {
    if !masks.allows(action.op) {
        return false;
    }
    let indices = action.indices();
    let relevant = tamiyo::heads::relevance(action.op);
    (0..NUM_ACTION_HEADS)
        .filter(|&head| head != OP && relevant.get(head).copied().unwrap_or(false))
        .all(|head| {
            let allowed = if head == SLOT {
                masks.slots_for(action.op)
            } else {
                masks.head(head)
            };
            indices
                .get(head)
                .and_then(|&value| usize::try_from(value).ok())
                .and_then(|value| allowed.get(value))
                .copied()
                .unwrap_or(false)
        })
}

/// What an imitation round demonstrated ([`super::RoundReport::imitation`]),
/// or what the demonstrator labelled beside the policy in an anchored PPO
/// round ([`super::RoundReport::anchor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImitationFigures {
    /// The demonstrator followed.
    pub demonstrator: Demonstrator,
    /// Decisions demonstrated and imitated (the policy's masks allow them,
    /// or they are an ADVANCE imitated as WAIT).
    pub imitated: u64,
    /// Of those, the ADVANCEs imitated as WAIT (ADVANCE out of the action
    /// space).
    pub advances_as_wait: u64,
    /// Decisions demonstrated and carried out but not imitated: the
    /// policy's masks forbid them.
    pub not_imitable: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demonstrators_round_trip_their_names_and_refuse_others() {
        for (name, demonstrator) in Demonstrator::ALL {
            assert_eq!(Demonstrator::from_name(name).unwrap(), demonstrator);
            assert_eq!(demonstrator.name(), name);
        }
        let error = Demonstrator::from_name("oracle").unwrap_err().to_string();
        assert!(
            error.contains("oracle") && error.contains("heuristic"),
            "{error}"
        );
    }

    #[test]
    fn only_the_first_updates_imitate() {
        let config = ImitationConfig {
            updates: 2,
            demonstrator: Demonstrator::MaxGrowth,
            ..ImitationConfig::default()
        };
        assert!(config.imitates_after(0));
        assert!(config.imitates_after(1));
        assert!(!config.imitates_after(2));
        assert!(!ImitationConfig::default().imitates_after(0));
        assert!(ImitationConfig::default().validate().is_ok());
        for epochs in [0, crate::ppo::config::MAX_EPOCHS + 1] {
            let bad = ImitationConfig { epochs, ..config };
            assert!(bad.validate().unwrap_err().to_string().contains("epochs"));
        }
    }

    #[test]
    fn the_anchor_starts_after_the_imitation_and_decays() {
        let config = ImitationConfig {
            updates: 2,
            anchor_weight: 2.0,
            anchor_decay: 0.5,
            ..ImitationConfig::default()
        };
        assert!(config.validate().is_ok());
        let coefs: Vec<f64> = (0..5).map(|done| config.anchor_coef_after(done)).collect();
        assert_eq!(coefs, [0.0, 0.0, 2.0, 1.0, 0.5]);
        assert_eq!(ImitationConfig::default().anchor_coef_after(3), 0.0);
        for (weight, decay, field) in [
            (-1.0, 1.0, "anchor_weight"),
            (f64::NAN, 1.0, "anchor_weight"),
            (1.0, 0.0, "anchor_decay"),
            (1.0, 1.5, "anchor_decay"),
        ] {
            let bad = ImitationConfig {
                anchor_weight: weight,
                anchor_decay: decay,
                ..config
            };
            assert!(bad.validate().unwrap_err().to_string().contains(field));
        }
        let heuristic = ImitationConfig {
            demonstrator: Demonstrator::Heuristic,
            ..config
        };
        let error = heuristic.validate().unwrap_err().to_string();
        assert!(error.contains("max_growth"), "{error}");
    }
}
