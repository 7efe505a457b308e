//! The rollout buffer (reference §4.3): one round of every environment's
//! transitions, preallocated on the policy's device as `[n_envs, max_steps]`
//! rows.
//!
//! What the policy produced (observations, blueprint indices, the eight head
//! actions, their log-probabilities, the critic's values, the base masks the
//! heads were sampled under, the causal relevance of each head) is written
//! device-to-device, one column per step for all environments at once,
//! into tensors allocated once: a step allocates nothing on the device and
//! reads nothing back. What the host decides (rewards, which steps ended an
//! episode, forced steps, which rows hold a real transition) is small and
//! kept on the host until [`RolloutBuffer::finish`] uploads it once per
//! round — the governor's rollback rule rewrites earlier rewards of an
//! episode, so they cannot be final before the round ends. The contribution
//! predictor's targets (the contributions measured at each step) travel the
//! same way ([`RolloutBuffer::record_contributions`]).
//!
//! Every call that writes checks all of its arguments before it writes
//! anything: a refused call leaves the buffer as it was. Host values are
//! checked where they enter (rewards finite as `f32`, contribution targets
//! finite and inside the `f32` range) and once more by
//! [`RolloutBuffer::finish`]; the device tensors are not read back here
//! (that would cost a readback per step): GAE and the PPO update check them
//! once per round ([`crate::gae::compute_gae`], [`crate::ppo::PpoTrainer`]).
//!
//! Rows an environment did not fill (it ended its episode early) keep the
//! "allow everything" masks [`RolloutBuffer::reset`] writes, so evaluating
//! them never meets a head without a valid option; their `valid` flag is
//! false, which zeroes their actor and critic weights in the PPO batch.

mod contributions;

use contributions::ContributionTargets;
use tamiyo::masks::MaskTensors;
use tamiyo::policy::SampledActions;
use tch::{Device, Kind, Tensor};

use crate::error::TorchResultExt;
use crate::ppo::PpoBatch;
use crate::{Error, Result};
use leyline::NUM_ACTION_HEADS;

/// Sizes of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferShape {
    /// Environments (rows).
    pub n_envs: usize,
    /// Steps per environment per round (columns).
    pub max_steps: usize,
    /// Observation width.
    pub obs_dim: usize,
    /// Slots of every environment.
    pub num_slots: usize,
}

/// Most transitions (`n_envs · max_steps`) a buffer holds.
pub const MAX_TRANSITIONS: usize = 1 << 24;

/// Most elements of any one of a buffer's tensors or host lists
/// (`n_envs · max_steps · width`, the widest being the observations or the
/// `ops × slots` mask).
pub const MAX_ELEMENTS: usize = 1 << 28;

impl BufferShape {
    /// Checks the sizes: each at least 1, at most [`MAX_TRANSITIONS`]
    /// transitions, at most [`MAX_ELEMENTS`] elements in any one tensor
    /// (checked before anything is allocated: an absurd shape is a typed
    /// error, not an allocation failure).
    pub fn check(&self) -> Result<()> {
        for (field, value) in [
            ("BufferShape.n_envs", self.n_envs),
            ("BufferShape.max_steps", self.max_steps),
            ("BufferShape.obs_dim", self.obs_dim),
            ("BufferShape.num_slots", self.num_slots),
        ] {
            if value == 0 || i64::try_from(value).is_err() {
                return Err(Error::InvalidConfig {
                    field,
                    reason: format!("{value}; must be at least 1 and fit i64"),
                });
            }
        }
        let transitions = self
            .n_envs
            .checked_mul(self.max_steps)
            .filter(|&cells| cells <= MAX_TRANSITIONS)
            .ok_or_else(|| Error::InvalidConfig {
                field: "BufferShape.max_steps",
                reason: format!(
                    "{} environments × {} steps is more than {MAX_TRANSITIONS} transitions",
                    self.n_envs, self.max_steps
                ),
            })?;
        let widest = self
            .obs_dim
            .max(tamiyo::features::NUM_OPS.saturating_mul(self.num_slots))
            .max(NUM_ACTION_HEADS);
        let fits = transitions
            .checked_mul(widest)
            .is_some_and(|elements| elements <= MAX_ELEMENTS)
            && tamiyo::heads::head_sizes(self.num_slots)
                .iter()
                .all(|&size| {
                    transitions
                        .checked_mul(size)
                        .is_some_and(|elements| elements <= MAX_ELEMENTS)
                });
        if !fits {
            return Err(Error::InvalidConfig {
                field: "BufferShape.obs_dim",
                reason: format!(
                    "{transitions} transitions of width up to {widest} is more than \
                     {MAX_ELEMENTS} elements in one tensor"
                ),
            });
        }
        Ok(())
    }
}

/// What the host decided about one step of every environment.
#[derive(Debug, Clone, PartialEq)]
pub struct HostStep {
    /// Reward per environment (before normalisation or after: the caller's
    /// choice, kept as given).
    pub rewards: Vec<f32>,
    /// The step ended its episode for good (a true terminal, e.g. the
    /// governor's rollback).
    pub terminated: Vec<bool>,
    /// The step ended its episode by the time limit (bootstrapped).
    pub truncated: Vec<bool>,
    /// The policy had no real choice (only WAIT was allowed).
    pub forced: Vec<bool>,
    /// The row holds a real transition (false: the environment had already
    /// ended its episode, or the step was rolled back).
    pub valid: Vec<bool>,
}

/// The rollout buffer (see the module docs).
#[derive(Debug)]
pub struct RolloutBuffer {
    shape: BufferShape,
    device: Device,
    obs: Tensor,
    blueprints: Tensor,
    actions: Tensor,
    log_probs: Tensor,
    values: Tensor,
    relevance: Tensor,
    bootstrap: Tensor,
    heads: [Tensor; NUM_ACTION_HEADS],
    slot_by_op: Tensor,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    forced: Vec<bool>,
    valid: Vec<bool>,
    written: Vec<bool>,
    contributions: ContributionTargets,
}

fn dim(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn zeros(shape: &[i64], kind: Kind, device: Device) -> Result<Tensor> {
    Tensor::f_zeros(shape, (kind, device)).op("buffer allocation")
}

fn shape_error(what: &'static str, expected: String, got: &Tensor) -> Error {
    Error::ShapeMismatch {
        what,
        expected,
        got: format!("{:?} {:?} on {:?}", got.kind(), got.size(), got.device()),
    }
}

impl RolloutBuffer {
    /// An empty buffer of `shape` on `device`.
    pub fn new(shape: BufferShape, device: Device) -> Result<RolloutBuffer> {
        shape.check()?;
        let (e, t) = (dim(shape.n_envs), dim(shape.max_steps));
        let heads_vec = tamiyo::heads::head_sizes(shape.num_slots)
            .iter()
            .map(|&size| zeros(&[e, t, dim(size)], Kind::Bool, device))
            .collect::<Result<Vec<_>>>()?;
        let heads: [Tensor; NUM_ACTION_HEADS] =
            heads_vec.try_into().map_err(|_| Error::ShapeMismatch {
                what: "RolloutBuffer.heads",
                expected: NUM_ACTION_HEADS.to_string(),
                got: "another count".to_owned(),
            })?;
        let cells = shape.n_envs.saturating_mul(shape.max_steps);
        let heads_n = dim(NUM_ACTION_HEADS);
        let mut buffer = RolloutBuffer {
            obs: zeros(&[e, t, dim(shape.obs_dim)], Kind::Float, device)?,
            blueprints: zeros(&[e, t, dim(shape.num_slots)], Kind::Int64, device)?,
            actions: zeros(&[e, t, heads_n], Kind::Int64, device)?,
            log_probs: zeros(&[e, t, heads_n], Kind::Float, device)?,
            values: zeros(&[e, t], Kind::Float, device)?,
            relevance: zeros(&[e, t, heads_n], Kind::Bool, device)?,
            bootstrap: zeros(&[e, t], Kind::Float, device)?,
            slot_by_op: zeros(
                &[e, t, dim(tamiyo::features::NUM_OPS), dim(shape.num_slots)],
                Kind::Bool,
                device,
            )?,
            heads,
            rewards: vec![0.0; cells],
            terminated: vec![false; cells],
            truncated: vec![false; cells],
            forced: vec![false; cells],
            valid: vec![false; cells],
            written: vec![false; shape.max_steps],
            contributions: ContributionTargets::new(shape.n_envs, shape.max_steps, shape.num_slots),
            shape,
            device,
        };
        buffer.reset()?;
        Ok(buffer)
    }

    /// The buffer's sizes.
    pub fn shape(&self) -> BufferShape {
        self.shape
    }

    /// Clears every transition: zeros everywhere, "allow everything" masks,
    /// no valid row.
    pub fn reset(&mut self) -> Result<()> {
        for tensor in [
            &self.obs,
            &self.blueprints,
            &self.actions,
            &self.log_probs,
            &self.values,
            &self.relevance,
            &self.bootstrap,
        ] {
            let _ = tensor.shallow_clone().f_zero_().op("buffer reset")?;
        }
        for mask in self.heads.iter().chain(std::iter::once(&self.slot_by_op)) {
            let _ = mask.shallow_clone().f_fill_(1).op("buffer reset")?;
        }
        self.rewards.fill(0.0);
        self.terminated.fill(false);
        self.truncated.fill(false);
        self.forced.fill(false);
        self.valid.fill(false);
        self.written.fill(false);
        self.contributions.clear();
        Ok(())
    }

    /// Records the contributions measured for `env` at `step`, one entry
    /// per slot in the environment's slot order (`None`: not measured),
    /// the contribution predictor's targets. A value that is not finite or
    /// outside the `f32` range is refused ([`Error::InvalidInput`]) and
    /// nothing is written.
    pub fn record_contributions(
        &mut self,
        step: usize,
        env: usize,
        values: &[Option<f64>],
    ) -> Result<()> {
        self.contributions.record(step, env, values)
    }

    fn column(tensor: &Tensor, step: i64) -> Result<Tensor> {
        tensor
            .f_narrow(1, step, 1)
            .op("buffer column")?
            .f_squeeze_dim(1)
            .op("buffer column")
    }

    /// Checks that `value` fits column `step` of `tensor` (shape, kind,
    /// device) and returns that column; writes nothing.
    fn fit(
        what: &'static str,
        tensor: &Tensor,
        step: i64,
        value: &Tensor,
        kind: Kind,
    ) -> Result<Tensor> {
        let column = Self::column(tensor, step)?;
        if value.size() != column.size()
            || value.kind() != kind
            || value.device() != tensor.device()
        {
            return Err(shape_error(
                what,
                format!("{kind:?} {:?} on {:?}", column.size(), tensor.device()),
                value,
            ));
        }
        Ok(column)
    }

    /// Copies every `(column, value)` pair (all checked by [`Self::fit`]).
    fn write_all(writes: &[(Tensor, &Tensor)]) -> Result<()> {
        for (column, value) in writes {
            column.shallow_clone().f_copy_(value).op("buffer write")?;
        }
        Ok(())
    }

    /// Writes the device side of step `step` for every environment:
    /// observations `[E, obs_dim]` f32, blueprint indices `[E, S]` i64, the
    /// critic's values `[E]` f32, the sampled actions (their actions,
    /// log-probs and relevance) and the base `masks` they were sampled
    /// under. Device-to-device copies; nothing is read back. Every argument
    /// is checked before the first copy: a refused call writes nothing.
    pub fn record_policy(
        &mut self,
        step: usize,
        obs: &Tensor,
        blueprints: &Tensor,
        values: &Tensor,
        sample: &SampledActions,
        masks: &MaskTensors,
    ) -> Result<()> {
        if step >= self.shape.max_steps {
            return Err(Error::Buffer(format!(
                "step {step} is past the last column ({} steps per round)",
                self.shape.max_steps
            )));
        }
        let t = dim(step);
        if !values.is_floating_point() {
            return Err(shape_error(
                "record.values",
                "a floating-point tensor".to_owned(),
                values,
            ));
        }
        let values = values.f_to_kind(Kind::Float).op("values to f32")?;
        let mut writes: Vec<(Tensor, &Tensor)> =
            Vec::with_capacity(NUM_ACTION_HEADS.saturating_add(7));
        writes.push((
            Self::fit("record.obs", &self.obs, t, obs, Kind::Float)?,
            obs,
        ));
        writes.push((
            Self::fit(
                "record.blueprints",
                &self.blueprints,
                t,
                blueprints,
                Kind::Int64,
            )?,
            blueprints,
        ));
        writes.push((
            Self::fit("record.values", &self.values, t, &values, Kind::Float)?,
            &values,
        ));
        writes.push((
            Self::fit(
                "record.actions",
                &self.actions,
                t,
                &sample.actions,
                Kind::Int64,
            )?,
            &sample.actions,
        ));
        writes.push((
            Self::fit(
                "record.log_probs",
                &self.log_probs,
                t,
                &sample.log_probs,
                Kind::Float,
            )?,
            &sample.log_probs,
        ));
        writes.push((
            Self::fit(
                "record.relevance",
                &self.relevance,
                t,
                &sample.relevance,
                Kind::Bool,
            )?,
            &sample.relevance,
        ));
        for (buffer, mask) in self.heads.iter().zip(masks.heads.iter()) {
            writes.push((
                Self::fit("record.masks", buffer, t, mask, Kind::Bool)?,
                mask,
            ));
        }
        writes.push((
            Self::fit(
                "record.slot_by_op",
                &self.slot_by_op,
                t,
                &masks.slot_by_op,
                Kind::Bool,
            )?,
            &masks.slot_by_op,
        ));
        Self::write_all(&writes)?;
        if let Some(flag) = self.written.get_mut(step) {
            *flag = true;
        }
        Ok(())
    }

    /// Records the host side of step `step` (one entry per environment).
    /// Checks the step, the lengths and that every reward is finite before
    /// it writes anything.
    pub fn record_host(&mut self, step: usize, host: &HostStep) -> Result<()> {
        let n = self.shape.n_envs;
        if step >= self.shape.max_steps {
            return Err(Error::Buffer(format!(
                "step {step} is past the last column ({} steps per round)",
                self.shape.max_steps
            )));
        }
        for (what, len) in [
            ("rewards", host.rewards.len()),
            ("terminated", host.terminated.len()),
            ("truncated", host.truncated.len()),
            ("forced", host.forced.len()),
            ("valid", host.valid.len()),
        ] {
            if len != n {
                return Err(Error::Buffer(format!(
                    "{what} has {len} entries for {n} environments"
                )));
            }
        }
        if let Some((env, bad)) = host
            .rewards
            .iter()
            .enumerate()
            .find(|(_, reward)| !reward.is_finite())
        {
            return Err(Error::InvalidInput {
                field: "HostStep.rewards",
                reason: format!("{bad} for environment {env} at step {step} is not finite"),
            });
        }
        for env in 0..n {
            let cell = env
                .checked_mul(self.shape.max_steps)
                .and_then(|row| row.checked_add(step))
                .ok_or_else(|| Error::Buffer("cell index overflows".to_owned()))?;
            let set = |list: &mut Vec<bool>, source: &[bool]| {
                if let (Some(slot), Some(value)) = (list.get_mut(cell), source.get(env)) {
                    *slot = *value;
                }
            };
            set(&mut self.terminated, &host.terminated);
            set(&mut self.truncated, &host.truncated);
            set(&mut self.forced, &host.forced);
            set(&mut self.valid, &host.valid);
            if let (Some(slot), Some(value)) = (self.rewards.get_mut(cell), host.rewards.get(env)) {
                *slot = *value;
            }
        }
        Ok(())
    }

    /// The host cell of `env` at `step`, if both are in range.
    fn cell(&self, env: usize, step: usize) -> Option<usize> {
        if step >= self.shape.max_steps || env >= self.shape.n_envs {
            return None;
        }
        env.checked_mul(self.shape.max_steps)?.checked_add(step)
    }

    /// Rewrites the reward of `env` at `step` (the episode-level rules: the
    /// governor's forfeit). A reward that is not finite (as `f32`) or a
    /// cell out of range is refused and nothing changes.
    pub fn set_reward(&mut self, env: usize, step: usize, reward: f32) -> Result<()> {
        if !reward.is_finite() {
            return Err(Error::InvalidInput {
                field: "RolloutBuffer.set_reward",
                reason: format!("{reward} for environment {env} at step {step} is not finite"),
            });
        }
        let slot = self
            .cell(env, step)
            .and_then(|cell| self.rewards.get_mut(cell))
            .ok_or_else(|| Error::Buffer(format!("no cell for environment {env} step {step}")))?;
        *slot = reward;
        Ok(())
    }

    /// Marks `env`'s transition at `step` as a true terminal (the episode
    /// ended there: no bootstrap, the recursion resets).
    pub fn set_terminal(&mut self, env: usize, step: usize) -> Result<()> {
        let cell = self
            .cell(env, step)
            .ok_or_else(|| Error::Buffer(format!("no cell for environment {env} step {step}")))?;
        if let Some(flag) = self.terminated.get_mut(cell) {
            *flag = true;
        }
        if let Some(flag) = self.truncated.get_mut(cell) {
            *flag = false;
        }
        Ok(())
    }

    /// The rewards of one environment's row, in step order.
    pub fn row_rewards(&self, env: usize) -> Option<&[f32]> {
        let start = env.checked_mul(self.shape.max_steps)?;
        let end = start.checked_add(self.shape.max_steps)?;
        self.rewards.get(start..end)
    }

    /// Sets the bootstrap value V(s') of every environment at `step`
    /// (`[E]`, used where that step is truncated).
    pub fn set_bootstrap(&mut self, step: usize, values: &Tensor) -> Result<()> {
        if step >= self.shape.max_steps {
            return Err(Error::Buffer(format!("bootstrap step {step} out of range")));
        }
        if !values.is_floating_point() {
            return Err(shape_error(
                "bootstrap",
                "a floating-point tensor".to_owned(),
                values,
            ));
        }
        let values = values.f_to_kind(Kind::Float).op("bootstrap to f32")?;
        let column = Self::fit(
            "bootstrap",
            &self.bootstrap,
            dim(step),
            &values,
            Kind::Float,
        )?;
        Self::write_all(&[(column, &values)])
    }

    fn upload_bool(&self, values: &[bool]) -> Result<Tensor> {
        let bytes: Vec<u8> = values.iter().map(|&value| u8::from(value)).collect();
        Tensor::f_from_slice(&bytes)
            .op("buffer upload")?
            .f_view([dim(self.shape.n_envs), dim(self.shape.max_steps)])
            .op("buffer upload")?
            .f_to_kind(Kind::Bool)
            .op("buffer upload")?
            .f_to_device(self.device)
            .op("buffer upload")
    }

    /// The round as device tensors: the host side uploaded once. The host
    /// rewards are checked again here (whatever wrote them): a non-finite
    /// one is refused naming its environment and step.
    pub fn finish(&self) -> Result<Rollout> {
        if let Some((cell, bad)) = self
            .rewards
            .iter()
            .enumerate()
            .find(|(_, reward)| !reward.is_finite())
        {
            let steps = self.shape.max_steps.max(1);
            return Err(Error::InvalidInput {
                field: "RolloutBuffer.rewards",
                reason: format!(
                    "{bad} for environment {} at step {} is not finite",
                    cell.checked_div(steps).unwrap_or(0),
                    cell.checked_rem(steps).unwrap_or(0)
                ),
            });
        }
        let rewards = Tensor::f_from_slice(&self.rewards)
            .op("buffer upload")?
            .f_view([dim(self.shape.n_envs), dim(self.shape.max_steps)])
            .op("buffer upload")?
            .f_to_device(self.device)
            .op("buffer upload")?;
        let (contributions, contribution_mask) = self.contributions.upload(self.device)?;
        Ok(Rollout {
            obs: self.obs.shallow_clone(),
            blueprints: self.blueprints.shallow_clone(),
            actions: self.actions.shallow_clone(),
            log_probs: self.log_probs.shallow_clone(),
            values: self.values.shallow_clone(),
            relevance: self.relevance.shallow_clone(),
            bootstrap: self.bootstrap.shallow_clone(),
            heads: self.heads.each_ref().map(Tensor::shallow_clone),
            slot_by_op: self.slot_by_op.shallow_clone(),
            rewards,
            terminated: self.upload_bool(&self.terminated)?,
            truncated: self.upload_bool(&self.truncated)?,
            forced: self.upload_bool(&self.forced)?,
            valid: self.upload_bool(&self.valid)?,
            contributions,
            contribution_mask,
        })
    }
}

/// One round on the device, `[E, T, ...]` (see [`RolloutBuffer::finish`]).
#[derive(Debug)]
pub struct Rollout {
    /// `[E, T, obs_dim]` f32 observations (as the policy saw them).
    pub obs: Tensor,
    /// `[E, T, S]` i64 blueprint indices.
    pub blueprints: Tensor,
    /// `[E, T, 8]` i64 actions.
    pub actions: Tensor,
    /// `[E, T, 8]` f32 log-probabilities at sampling time.
    pub log_probs: Tensor,
    /// `[E, T]` f32 critic values at sampling time.
    pub values: Tensor,
    /// `[E, T, 8]` bool causal relevance of each head.
    pub relevance: Tensor,
    /// `[E, T]` f32 bootstrap values.
    pub bootstrap: Tensor,
    /// Base masks per head, `[E, T, n_head]` bool.
    pub heads: [Tensor; NUM_ACTION_HEADS],
    /// `[E, T, ops, S]` bool.
    pub slot_by_op: Tensor,
    /// `[E, T]` f32 rewards.
    pub rewards: Tensor,
    /// `[E, T]` bool.
    pub terminated: Tensor,
    /// `[E, T]` bool.
    pub truncated: Tensor,
    /// `[E, T]` bool.
    pub forced: Tensor,
    /// `[E, T]` bool.
    pub valid: Tensor,
    /// `[E, T, S]` f32 contributions measured at each step (percentage
    /// points; 0 where none was).
    pub contributions: Tensor,
    /// `[E, T, S]` f32: 1 where a contribution was measured.
    pub contribution_mask: Tensor,
}

impl Rollout {
    /// The base masks of `rows` (`[r]` i64), flattened to `[r·T, ...]` for
    /// the sampler's `evaluate_actions`.
    pub fn flat_masks(&self, rows: &Tensor) -> Result<MaskTensors> {
        let flat = |tensor: &Tensor| -> Result<Tensor> {
            let picked = tensor.f_index_select(0, rows).op("mask rows")?;
            let mut size = picked.size();
            let (Some(&r), Some(&t)) = (size.first(), size.get(1)) else {
                return Err(shape_error("flat_masks", "[E, T, ...]".to_owned(), tensor));
            };
            let rest = size.split_off(2);
            let mut shape = vec![r.saturating_mul(t)];
            shape.extend(rest);
            picked.f_reshape(&shape).op("mask flatten")
        };
        let heads = self
            .heads
            .iter()
            .map(flat)
            .collect::<Result<Vec<_>>>()?
            .try_into()
            .map_err(|_| Error::ShapeMismatch {
                what: "flat_masks.heads",
                expected: NUM_ACTION_HEADS.to_string(),
                got: "another count".to_owned(),
            })?;
        Ok(MaskTensors {
            heads,
            slot_by_op: flat(&self.slot_by_op)?,
        })
    }

    /// The PPO batch of this round from `advantages` and critic targets
    /// `returns` (`[E, T]` each): head weights are the causal relevance,
    /// the actor weight is 0 on forced and invalid steps, the critic weight
    /// 0.2 on forced and 0 on invalid steps (reference §4.2).
    pub fn ppo_batch(&self, advantages: &Tensor, returns: &Tensor) -> Result<PpoBatch> {
        let valid = self.valid.f_to_kind(Kind::Float).op("valid")?;
        let forced = self.forced.f_to_kind(Kind::Float).op("forced")?;
        let free = forced.f_neg().op("free")?.f_add_scalar(1.0).op("free")?;
        let actor_weight = valid.f_mul(&free).op("actor weight")?;
        let value_weight = valid
            .f_mul(
                &free
                    .f_add(&forced.f_mul_scalar(0.2).op("forced weight")?)
                    .op("value weight")?,
            )
            .op("value weight")?;
        Ok(PpoBatch {
            log_probs: self.log_probs.shallow_clone(),
            advantages: advantages.shallow_clone(),
            returns: returns.shallow_clone(),
            old_values: self.values.shallow_clone(),
            head_weights: self.relevance.f_to_kind(Kind::Float).op("head weights")?,
            actor_weight,
            value_weight,
        })
    }
}
