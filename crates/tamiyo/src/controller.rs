//! [`PolicyController`]: the policy network behind Tolaria's
//! [`Controller`] trait, for one environment.
//!
//! Each [`Controller::decide`] call builds the Obs V3 observation of the
//! epoch (its [`ObservationTracker`] keeps the history), optionally
//! normalises it with a frozen [`RunningMeanStd`], computes the action masks
//! from the observation, runs the network for a batch of one from the LSTM
//! state it keeps between calls, samples (or takes the greedy action of)
//! every head and turns the result into a [`Decision`]: the op, the slot
//! (by position in the observation's slot order) and, for GERMINATE, the
//! blueprint; the confidence is the probability of the chosen op. All eight
//! heads of the last choice are available as a [`FactoredAction`]
//! ([`PolicyController::last_action`]); Tolaria's `Decision` carries no
//! style, tempo or alpha schedule yet.
//!
//! Whether the previous decision succeeded (an observation feature) is read
//! off the next observation: GERMINATE succeeded when a new seed id sits in
//! the slot, ADVANCE and FOSSILIZE when the seed's stage changed, PRUNE when
//! the seed is gone or in a failure stage, SET_ALPHA_TARGET when its alpha
//! target or mode changed, WAIT always. A driver that knows better (a PPO
//! environment) records it with [`PolicyController::record_outcome`].
//!
//! [`PolicyController::decide_with`] also takes Kasmina's
//! [`OpAvailability`] and [`SlotExtras`] when the caller holds the model.
//! By default the controller masks SET_ALPHA_TARGET, which Tolaria's `apply`
//! does not carry out yet (see [`PolicyControllerConfig`]).

use kasmina::host::SlotId;
use kasmina::model::OpAvailability;
use leyline::proto::SeedState;
use leyline::{AlphaMode, LifecycleOp, SeedStage};
use tolaria::controller::{Controller, Decision, EpochObservation};

use crate::error::{finite, shape_mismatch};
use crate::features::{FeatureBatch, ObservationTracker, RawObservation, SlotExtras};
use crate::finite::{all_finite, check_finite};
use crate::heads::{FactoredAction, OP};
use crate::masks::{MaskConfig, MaskTensors, observation_masks};
use crate::normaliser::RunningMeanStd;
use crate::policy::{LstmState, Policy, SampleMode, Sampler, SamplingConfig};
use crate::{Error, Result};

/// The controller's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyControllerConfig {
    /// Episode length observations are normalised by.
    pub max_epochs: u32,
    /// Greedy or sampled actions, and probability floors.
    pub sampling: SamplingConfig,
    /// Seed of the sampling generator.
    pub seed: u64,
    /// Mask rules.
    pub masks: MaskConfig,
}

impl Default for PolicyControllerConfig {
    /// 150-epoch episodes (HEAD's `DEFAULT_EPISODE_LENGTH`), greedy
    /// actions, seed 0, the reference's mask rules with SET_ALPHA_TARGET
    /// masked (Tolaria's `apply` cannot carry it out yet).
    fn default() -> Self {
        PolicyControllerConfig {
            max_epochs: 150,
            sampling: SamplingConfig {
                mode: SampleMode::Greedy,
                floors: None,
            },
            seed: 0,
            masks: MaskConfig {
                disable_set_alpha_target: true,
                ..MaskConfig::default()
            },
        }
    }
}

/// What the controller remembers about its last decision, to tell from the
/// next observation whether it succeeded.
#[derive(Debug, Clone)]
struct Pending {
    op: LifecycleOp,
    slot: String,
    seed: Option<SeedState>,
}

/// The policy controller (see the module docs).
#[derive(Debug)]
pub struct PolicyController {
    policy: Policy,
    config: PolicyControllerConfig,
    normaliser: Option<RunningMeanStd>,
    tracker: ObservationTracker,
    batch: FeatureBatch,
    hidden: LstmState,
    sampler: Sampler,
    pending: Option<Pending>,
    last_action: Option<FactoredAction>,
    last_value: Option<f64>,
    last_observation: Option<RawObservation>,
}

impl PolicyController {
    /// A controller running `policy` for an environment with `slots` (the
    /// enabled slots in execution order; as many as the policy's slot head).
    pub fn new(
        policy: Policy,
        slots: &[SlotId],
        config: PolicyControllerConfig,
    ) -> Result<PolicyController> {
        let network = policy.network();
        if slots.len() != network.config().num_slots {
            return Err(Error::InvalidConfig {
                field: "PolicyController.slots",
                reason: format!(
                    "{} slots for a policy with {} slot options",
                    slots.len(),
                    network.config().num_slots
                ),
            });
        }
        let device = network.device();
        Ok(PolicyController {
            tracker: ObservationTracker::new(slots, config.max_epochs)?,
            batch: FeatureBatch::new(1, slots.len(), device)?,
            hidden: network.initial_state(1)?,
            sampler: Sampler::new(config.sampling, config.seed, device)?,
            policy,
            config,
            normaliser: None,
            pending: None,
            last_action: None,
            last_value: None,
            last_observation: None,
        })
    }

    /// Normalises observations with `normaliser` (frozen: the controller
    /// never updates it). Its width must be the observation's and it must
    /// live on the policy's device.
    pub fn with_normaliser(mut self, normaliser: RunningMeanStd) -> Result<PolicyController> {
        let obs_dim = self.batch.layout().obs_dim();
        if normaliser.dim() != obs_dim || normaliser.device() != self.policy.network().device() {
            return Err(shape_mismatch(
                "PolicyController.normaliser",
                format!("{obs_dim} features on {:?}", self.policy.network().device()),
                (normaliser.dim(), normaliser.device()),
            ));
        }
        self.normaliser = Some(normaliser);
        Ok(self)
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The settings.
    pub fn config(&self) -> PolicyControllerConfig {
        self.config
    }

    /// The LSTM state carried to the next decision (`[layers, 1, hidden]`).
    pub fn hidden(&self) -> &LstmState {
        &self.hidden
    }

    /// All heads of the last decision.
    pub fn last_action(&self) -> Option<&FactoredAction> {
        self.last_action.as_ref()
    }

    /// The critic's value at the last decision.
    pub fn last_value(&self) -> Option<f64> {
        self.last_value
    }

    /// The raw observation of the last decision.
    pub fn last_observation(&self) -> Option<&RawObservation> {
        self.last_observation.as_ref()
    }

    /// The observation tracker.
    pub fn tracker(&self) -> &ObservationTracker {
        &self.tracker
    }

    /// Starts a new episode: zero LSTM state, empty history.
    pub fn reset(&mut self) -> Result<()> {
        self.hidden = self.policy.network().initial_state(1)?;
        self.tracker.reset();
        self.pending = None;
        self.last_action = None;
        self.last_value = None;
        self.last_observation = None;
        Ok(())
    }

    /// Records whether the last decision succeeded (instead of reading it
    /// off the next observation).
    pub fn record_outcome(&mut self, op: LifecycleOp, success: bool) {
        self.tracker.record_action(op, success);
        self.pending = None;
    }

    /// The decision for `observation`, with Kasmina's `availability` of the
    /// same model (narrows the masks) and per-slot `extras` (empty for none;
    /// see [`crate::features::tracker`]). Every number of the observation
    /// and the extras is checked first ([`crate::features::check_observation`],
    /// [`SlotExtras::validate`]), and the network's value and new LSTM state
    /// must come out finite ([`Error::NonFinite`] naming `policy.value`,
    /// `policy.hidden.h` or `policy.hidden.c` otherwise: a policy with
    /// broken weights never poisons the carried state). On any error the controller is exactly as
    /// before: LSTM state, history, pending outcome and the sampler's
    /// generator.
    pub fn decide_with(
        &mut self,
        observation: &EpochObservation,
        availability: Option<&OpAvailability>,
        extras: &[Option<SlotExtras>],
    ) -> Result<Decision> {
        let rng = self.sampler.rng().clone();
        let decided = self.try_decide(observation, availability, extras);
        if decided.is_err() {
            self.sampler.set_rng(rng);
        }
        decided
    }

    /// [`PolicyController::decide_with`], committing only on success (the
    /// sampler's generator excepted: the caller restores it).
    fn try_decide(
        &mut self,
        observation: &EpochObservation,
        availability: Option<&OpAvailability>,
        extras: &[Option<SlotExtras>],
    ) -> Result<Decision> {
        let mut tracker = self.tracker.clone();
        if let Some(pending) = &self.pending {
            tracker.record_action(pending.op, outcome(pending, observation));
        }
        let raw = tracker.observe(observation, extras)?;
        let mut masks = observation_masks(observation, &self.config.masks)?;
        if let Some(availability) = availability {
            masks.restrict(availability)?;
        }
        masks.check()?;
        let network = self.policy.network();
        let device = network.device();
        self.batch.set(0, &raw)?;
        self.batch.upload()?;
        let obs = match &self.normaliser {
            Some(normaliser) => normaliser.normalize(self.batch.obs())?,
            None => self.batch.obs().shallow_clone(),
        };
        let mask_tensors = MaskTensors::from_masks(std::slice::from_ref(&masks), device)?;
        let act = self.policy.act(
            &obs,
            self.batch.blueprint_indices(),
            &self.hidden,
            &mask_tensors,
            &mut self.sampler,
        )?;
        let num_slots = self.tracker.slots().len();
        let action = act
            .sample
            .to_host(num_slots)?
            .into_iter()
            .next()
            .ok_or(Error::Readback {
                what: "actions",
                expected: 1,
                got: 0,
            })?;
        let op_log_prob = act
            .sample
            .log_probs
            .f_double_value(&[0, i64::try_from(OP).unwrap_or(0)])
            .map_err(|source| Error::Torch {
                op: "op log prob readback",
                source,
            })?;
        let value = act
            .value
            .f_double_value(&[0])
            .map_err(|source| Error::Torch {
                op: "value readback",
                source,
            })?;
        finite("policy.value", value)?;
        if !all_finite(&[&act.hidden.h, &act.hidden.c])? {
            check_finite("policy.hidden.h", &act.hidden.h)?;
            check_finite("policy.hidden.c", &act.hidden.c)?;
        }

        let decision = to_decision(&action, self.tracker.slots(), op_log_prob.exp())?;
        let slot_name = decision
            .slot
            .map(|slot| slot.to_string())
            .unwrap_or_default();
        self.pending = Some(Pending {
            op: action.op,
            seed: observation
                .seeds
                .iter()
                .find(|seed| seed.slot_id == slot_name)
                .cloned(),
            slot: slot_name,
        });
        self.tracker = tracker;
        self.hidden = act.hidden;
        self.last_action = Some(action);
        self.last_value = Some(value);
        self.last_observation = Some(raw);
        Ok(decision)
    }
}

/// The Tolaria decision of `action` (slot by position in `slots`), with
/// `confidence` (clamped to `[0, 1]`, 0 when not finite). SET_ALPHA_TARGET
/// carries only its slot: Tolaria's `Decision` has no alpha schedule yet.
pub fn to_decision(action: &FactoredAction, slots: &[SlotId], confidence: f64) -> Result<Decision> {
    let slot = slots
        .get(action.slot)
        .copied()
        .ok_or_else(|| shape_mismatch("decision.slot", slots.len(), action.slot))?;
    let confidence = if confidence.is_finite() {
        confidence.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let decision = match action.op {
        LifecycleOp::Wait => Decision::wait(),
        LifecycleOp::Germinate => Decision::germinate(slot, action.blueprint),
        LifecycleOp::Advance => Decision::advance(slot),
        LifecycleOp::Fossilize => Decision::fossilize(slot),
        LifecycleOp::Prune => Decision::prune(slot),
        LifecycleOp::SetAlphaTarget => Decision {
            op: LifecycleOp::SetAlphaTarget,
            slot: Some(slot),
            ..Decision::wait()
        },
    };
    Ok(decision.because("policy", confidence))
}

/// The factored action that carries `decision` out (slot by position in
/// `slots`; WAIT targets the first slot): the inverse of [`to_decision`],
/// so a scripted controller can drive what the policy drives. Every head
/// the decision does not name takes the reference's canonical option
/// (style SIGMOID_ADD, tempo STANDARD, alpha target FULL, speed INSTANT,
/// curve LINEAR; blueprint NOOP unless GERMINATE names one). A decision
/// whose slot is not in `slots`, or an op other than WAIT without a slot,
/// is refused.
pub fn to_action(decision: &Decision, slots: &[SlotId]) -> Result<FactoredAction> {
    use leyline::{
        AlphaCurveAction, AlphaSpeedAction, AlphaTargetAction, BlueprintAction, GerminationStyle,
        TempoAction,
    };
    let slot = match (decision.op, decision.slot) {
        (LifecycleOp::Wait, None) => 0,
        (_, Some(slot)) => slots
            .iter()
            .position(|known| *known == slot)
            .ok_or_else(|| Error::InvalidInput {
                field: "decision.slot",
                reason: format!("{slot} is not one of the {} slots", slots.len()),
            })?,
        (op, None) => {
            return Err(Error::InvalidInput {
                field: "decision.slot",
                reason: format!("{op:?} names no slot"),
            });
        }
    };
    Ok(FactoredAction {
        slot,
        blueprint: decision.blueprint.unwrap_or(BlueprintAction::Noop),
        style: GerminationStyle::SigmoidAdd,
        tempo: TempoAction::Standard,
        alpha_target: AlphaTargetAction::Full,
        alpha_speed: AlphaSpeedAction::Instant,
        alpha_curve: AlphaCurveAction::Linear,
        op: decision.op,
    })
}

/// Whether the `pending` decision took effect, judged from the next
/// `observation` (see the module docs).
fn outcome(pending: &Pending, observation: &EpochObservation) -> bool {
    let now = observation
        .seeds
        .iter()
        .find(|seed| seed.slot_id == pending.slot);
    let stage = |seed: &SeedState| SeedStage::from_value(seed.stage).ok();
    match pending.op {
        LifecycleOp::Wait => true,
        LifecycleOp::Germinate => match (now, &pending.seed) {
            (Some(now), Some(before)) => now.seed_id != before.seed_id,
            (Some(_), None) => true,
            (None, _) => false,
        },
        LifecycleOp::Advance | LifecycleOp::Fossilize => match (now, &pending.seed) {
            (Some(now), Some(before)) => now.seed_id == before.seed_id && now.stage != before.stage,
            _ => false,
        },
        LifecycleOp::Prune => match now {
            None => pending.seed.is_some(),
            Some(now) => {
                stage(now).is_some_and(SeedStage::is_failure)
                    && pending
                        .seed
                        .as_ref()
                        .and_then(stage)
                        .is_some_and(|before| !before.is_failure())
            }
        },
        LifecycleOp::SetAlphaTarget => match (now, &pending.seed) {
            (Some(now), Some(before)) => {
                now.seed_id == before.seed_id
                    && (now.alpha_target != before.alpha_target
                        || (now.alpha_mode != before.alpha_mode
                            && AlphaMode::from_value(now.alpha_mode).is_ok()))
            }
            _ => false,
        },
    }
}

impl Controller for PolicyController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        self.decide_with(observation, None, &[])
            .map_err(|error| tolaria::Error::Controller {
                field: error.field().unwrap_or("tamiyo.policy"),
                reason: error.to_string(),
            })
    }
}
