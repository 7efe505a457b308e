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
mod demonstration;
mod host;
mod rollout;
mod shape;
mod sink;

use contributions::ContributionTargets;
use tamiyo::masks::MaskTensors;
use tamiyo::policy::SampledActions;
use tch::{Device, Kind, Tensor};

use crate::error::TorchResultExt;
use crate::{Error, Result};
use leyline::NUM_ACTION_HEADS;

pub use demonstration::Demonstration;
pub use host::HostStep;
pub use rollout::{AnchorTargets, Rollout};
pub use shape::{BufferShape, MAX_ELEMENTS, MAX_TRANSITIONS};

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
    /// The raw observations of each step, `[T, E, obs_dim]` step-major,
    /// when kept ([`RolloutBuffer::keep_raw_observations`]): what the
    /// observation normaliser learns from after the rollout.
    raw_obs: Option<Tensor>,
    /// The anchor's labels of this round, on the host, when any was
    /// recorded ([`RolloutBuffer::record_anchor`]).
    anchor: Option<AnchorLabels>,
}

/// The anchor's labels on the host, `[E, T, 8]` environment-major.
#[derive(Debug)]
struct AnchorLabels {
    actions: Vec<i64>,
    relevance: Vec<bool>,
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
            raw_obs: None,
            anchor: None,
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
        self.anchor = None;
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
    /// The columns are strided (the buffer is environment-major), so a
    /// multi-tensor copy would take libtorch's pair-by-pair path anyway;
    /// the staged policy step writes its columns inside its graph instead
    /// (`sink.rs`).
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
            anchor: self.anchor_targets()?,
        })
    }
}
