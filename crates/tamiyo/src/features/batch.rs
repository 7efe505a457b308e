//! [`FeatureBatch`]: the observations of many environments, encoded on the
//! host into one buffer and copied into preallocated device tensors
//! (`[n_envs, obs_dim]` `f32` and `[n_envs, num_slots]` `i64`) with one copy
//! each per step.
//!
//! Every value is checked on the host while it is encoded
//! ([`RawObservation::encode_into`]), so the device tensors only ever hold
//! finite, in-range features and the policy's per-step path need not read
//! them back. A refused observation changes no row.

use tch::{Device, Kind, Tensor};

use super::{EMPTY_BLUEPRINT, ObsLayout, RawObservation, layout};
use crate::error::{TorchResultExt, shape_mismatch};
use crate::{Error, Result};

/// Most environments one batch holds.
pub const MAX_ENVS: usize = 1 << 16;

/// Preallocated observation and blueprint-index tensors for `n_envs`
/// environments (see the module docs).
#[derive(Debug)]
pub struct FeatureBatch {
    layout: ObsLayout,
    n_envs: usize,
    host_obs: Vec<f32>,
    host_blueprints: Vec<i64>,
    obs: Tensor,
    blueprint_indices: Tensor,
}

impl FeatureBatch {
    /// A batch of `n_envs` (`1..=MAX_ENVS`) observations with `num_slots`
    /// slots each, its tensors allocated on `device` (zeros; blueprint
    /// indices [`EMPTY_BLUEPRINT`]).
    pub fn new(n_envs: usize, num_slots: usize, device: Device) -> Result<FeatureBatch> {
        let layout = layout(num_slots)?;
        if !(1..=MAX_ENVS).contains(&n_envs) {
            return Err(Error::InvalidConfig {
                field: "FeatureBatch.n_envs",
                reason: format!("{n_envs} is outside [1, {MAX_ENVS}]"),
            });
        }
        // n_envs ≤ 2^16 and obs_dim < 2^12: the products fit easily.
        let obs_len = n_envs.saturating_mul(layout.obs_dim());
        let blueprint_len = n_envs.saturating_mul(num_slots);
        let rows = i64::try_from(n_envs).unwrap_or(i64::MAX);
        let width = i64::try_from(layout.obs_dim()).unwrap_or(i64::MAX);
        let slots = i64::try_from(num_slots).unwrap_or(i64::MAX);
        Ok(FeatureBatch {
            layout,
            n_envs,
            host_obs: vec![0.0; obs_len],
            host_blueprints: vec![EMPTY_BLUEPRINT; blueprint_len],
            obs: Tensor::f_zeros([rows, width], (Kind::Float, device)).op("feature batch")?,
            blueprint_indices: Tensor::f_full(
                [rows, slots],
                EMPTY_BLUEPRINT,
                (Kind::Int64, device),
            )
            .op("blueprint batch")?,
        })
    }

    /// Number of environments.
    pub fn n_envs(&self) -> usize {
        self.n_envs
    }

    /// The observation layout.
    pub fn layout(&self) -> ObsLayout {
        self.layout
    }

    /// Encodes environment `env`'s observation into the host buffer (the
    /// device tensors change at [`FeatureBatch::upload`]). The observation
    /// must have this batch's slot count; on an error the row is unchanged.
    pub fn set(&mut self, env: usize, observation: &RawObservation) -> Result<()> {
        if observation.num_slots() != self.layout.num_slots() {
            return Err(shape_mismatch(
                "FeatureBatch.set.slots",
                self.layout.num_slots(),
                observation.num_slots(),
            ));
        }
        let obs_dim = self.layout.obs_dim();
        let num_slots = self.layout.num_slots();
        let row = self
            .host_obs
            .chunks_exact_mut(obs_dim)
            .nth(env)
            .ok_or_else(|| shape_mismatch("FeatureBatch.set.env", self.n_envs, env))?;
        let blueprints = self
            .host_blueprints
            .chunks_exact_mut(num_slots)
            .nth(env)
            .ok_or_else(|| shape_mismatch("FeatureBatch.set.env", self.n_envs, env))?;
        observation.encode_into(row, blueprints)
    }

    /// Encodes one observation per environment (exactly `n_envs`) and
    /// uploads them. All or nothing: when any observation is refused (a
    /// NaN or an infinity is [`Error::NonFinite`] naming the field), no row
    /// changes, on the host or the device.
    pub fn write_all(&mut self, observations: &[RawObservation]) -> Result<()> {
        if observations.len() != self.n_envs {
            return Err(shape_mismatch(
                "FeatureBatch.write_all",
                self.n_envs,
                observations.len(),
            ));
        }
        let saved_obs = self.host_obs.clone();
        let saved_blueprints = self.host_blueprints.clone();
        let written = observations
            .iter()
            .enumerate()
            .try_for_each(|(env, observation)| self.set(env, observation))
            .and_then(|()| self.upload());
        if written.is_err() {
            self.host_obs = saved_obs;
            self.host_blueprints = saved_blueprints;
        }
        written
    }

    /// Copies the host buffers into the device tensors (one copy each).
    pub fn upload(&mut self) -> Result<()> {
        let shape = self.obs.size();
        let obs = Tensor::f_from_slice(&self.host_obs)
            .op("feature batch from host")?
            .f_view(shape.as_slice())
            .op("feature batch view")?;
        self.obs.f_copy_(&obs).op("feature batch upload")?;
        let shape = self.blueprint_indices.size();
        let blueprints = Tensor::f_from_slice(&self.host_blueprints)
            .op("blueprint batch from host")?
            .f_view(shape.as_slice())
            .op("blueprint batch view")?;
        self.blueprint_indices
            .f_copy_(&blueprints)
            .op("blueprint batch upload")
    }

    /// The host copy of every encoded row, `n_envs × obs_dim` floats, row
    /// after row (what [`FeatureBatch::upload`] copies, or what a
    /// [`crate::policy::StepStaging`] packs).
    pub fn host_obs(&self) -> &[f32] {
        &self.host_obs
    }

    /// The host copy of the blueprint indices, `n_envs × num_slots`.
    pub fn host_blueprints(&self) -> &[i64] {
        &self.host_blueprints
    }

    /// The host copy of environment `env`'s encoded row.
    pub fn host_row(&self, env: usize) -> Option<&[f32]> {
        self.host_obs.chunks_exact(self.layout.obs_dim()).nth(env)
    }

    /// The observations, `[n_envs, obs_dim]` `f32` on the device.
    pub fn obs(&self) -> &Tensor {
        &self.obs
    }

    /// The blueprint indices, `[n_envs, num_slots]` `i64` on the device
    /// (−1 for an empty slot).
    pub fn blueprint_indices(&self) -> &Tensor {
        &self.blueprint_indices
    }
}
