//! The rollout buffer as the sink of a staged policy step
//! ([`tamiyo::policy::StepSink`]): the step's observations, blueprint
//! indices, value, actions, log-probabilities, relevance and masks written
//! into their column at the step index the staging uploaded
//! ([`torch_ext::index_copy_many`]: on CUDA one kernel launch for all of
//! them), so the writes need no host-side step number and run inside the
//! captured step (one graph node, not sixteen copies a step).
//! [`RolloutBuffer::mark_recorded`] then does the host's half.

use tamiyo::policy::{StepRecord, StepSink};
use tch::{Kind, Tensor};

use super::{RolloutBuffer, dim, shape_error};
use crate::Result;
use crate::error::TorchResultExt;

impl RolloutBuffer {
    /// Every device tensor a step writes, with the value written into it,
    /// its dtype and its name (`[E, T, rest..]` against `[E, rest..]`).
    fn step_writes<'a>(
        &'a self,
        step: &StepRecord<'a>,
    ) -> Vec<(&'static str, &'a Tensor, &'a Tensor, Kind)> {
        let mut writes = vec![
            ("record.obs", &self.obs, step.obs, Kind::Float),
            (
                "record.blueprints",
                &self.blueprints,
                step.blueprints,
                Kind::Int64,
            ),
            ("record.values", &self.values, step.value, Kind::Float),
            (
                "record.actions",
                &self.actions,
                &step.sample.actions,
                Kind::Int64,
            ),
            (
                "record.log_probs",
                &self.log_probs,
                &step.sample.log_probs,
                Kind::Float,
            ),
            (
                "record.relevance",
                &self.relevance,
                &step.sample.relevance,
                Kind::Bool,
            ),
        ];
        for (buffer, mask) in self.heads.iter().zip(step.masks.heads.iter()) {
            writes.push(("record.masks", buffer, mask, Kind::Bool));
        }
        writes.push((
            "record.slot_by_op",
            &self.slot_by_op,
            &step.masks.slot_by_op,
            Kind::Bool,
        ));
        writes
    }

    /// Writes `step` into its column (the device step index), every tensor
    /// checked first: a refused call writes nothing.
    fn record_step(&self, step: &StepRecord<'_>) -> Result<()> {
        let writes = self.step_writes(step);
        for (what, tensor, value, kind) in &writes {
            let mut expected = tensor.size();
            if expected.len() >= 2 {
                expected.remove(1);
            }
            if value.size() != expected || value.kind() != *kind || value.device() != self.device {
                return Err(shape_error(
                    what,
                    format!("{kind:?} {expected:?} on {:?}", self.device),
                    value,
                ));
            }
        }
        let index = step.step;
        if index.size() != [1] || index.kind() != Kind::Int64 || index.device() != self.device {
            return Err(shape_error(
                "record.step",
                format!("Int64 [1] on {:?}", self.device),
                index,
            ));
        }
        if self.raw_obs.is_some() && step.raw_obs.size() != step.obs.size() {
            return Err(shape_error(
                "record.raw_obs",
                format!("{:?}", step.obs.size()),
                step.raw_obs,
            ));
        }
        // Every write in one launch where the layouts allow (on CUDA).
        let mut all: Vec<(&Tensor, i64, &Tensor)> = writes
            .iter()
            .map(|(_, tensor, value, _)| (*tensor, 1, *value))
            .collect();
        if let Some(raw) = &self.raw_obs {
            all.push((raw, 0, step.raw_obs));
        }
        torch_ext::index_copy_many(&all, index)
            .map_err(|error| crate::Error::Buffer(format!("buffer record: {error}")))
    }

    /// From now on a staged step also keeps its raw observations
    /// ([`RolloutBuffer::raw_observations`]), allocating their storage once.
    pub fn keep_raw_observations(&mut self) -> Result<()> {
        if self.raw_obs.is_none() {
            let (e, t) = (dim(self.shape.n_envs), dim(self.shape.max_steps));
            self.raw_obs = Some(
                Tensor::f_zeros([t, e, dim(self.shape.obs_dim)], (Kind::Float, self.device))
                    .op("raw observations")?,
            );
        }
        Ok(())
    }

    /// The raw observations of the first `steps` steps, `[steps · E,
    /// obs_dim]`, step after step (each step's environments in order), when
    /// kept; `None` otherwise.
    pub fn raw_observations(&self, steps: usize) -> Result<Option<Tensor>> {
        let Some(raw) = &self.raw_obs else {
            return Ok(None);
        };
        let steps = dim(steps.min(self.shape.max_steps));
        Ok(Some(
            raw.f_narrow(0, 0, steps)
                .op("raw observations")?
                .f_reshape([-1, dim(self.shape.obs_dim)])
                .op("raw observations")?,
        ))
    }

    /// Checks that `step` has a column, before a staged step writes it at
    /// a device-side index (which the device cannot refuse cleanly).
    pub fn check_step(&self, step: usize) -> Result<()> {
        if step < self.shape.max_steps {
            Ok(())
        } else {
            Err(crate::Error::Buffer(format!(
                "step {step} is past the last column ({} steps per round)",
                self.shape.max_steps
            )))
        }
    }

    /// The host's half of a step a [`StepSink`] recorded: marks column
    /// `step` written (the device half was recorded by the step itself).
    pub fn mark_recorded(&mut self, step: usize) -> Result<()> {
        self.check_step(step)?;
        if let Some(flag) = self.written.get_mut(step) {
            *flag = true;
        }
        Ok(())
    }
}

impl StepSink for RolloutBuffer {
    fn record(&self, step: &StepRecord<'_>) -> tamiyo::Result<()> {
        self.record_step(step)
            .map_err(|error| tamiyo::Error::InvalidInput {
                field: "RolloutBuffer.record",
                reason: error.to_string(),
            })
    }

    fn memory_key(&self) -> Vec<usize> {
        let mut key = Vec::new();
        let mut add = |tensor: &Tensor| {
            key.push(tensor.data_ptr() as usize);
            key.extend(
                tensor
                    .size()
                    .iter()
                    .map(|&dim| usize::try_from(dim).unwrap_or(usize::MAX)),
            );
        };
        for tensor in [
            &self.obs,
            &self.blueprints,
            &self.values,
            &self.actions,
            &self.log_probs,
            &self.relevance,
            &self.slot_by_op,
        ] {
            add(tensor);
        }
        for head in &self.heads {
            add(head);
        }
        if let Some(raw) = &self.raw_obs {
            add(raw);
        }
        key
    }
}
