//! The contribution predictor's targets of one round: per environment, step
//! and slot, the counterfactual contribution measured at that step (in
//! percentage points) and whether one was measured. Kept on the host and
//! uploaded once per round with the other host-side decisions.

use tch::{Device, Kind, Tensor};

use crate::error::TorchResultExt;
use crate::{Error, Result};

/// Host-side `[E, T, S]` targets and their mask.
#[derive(Debug)]
pub(super) struct ContributionTargets {
    n_envs: usize,
    max_steps: usize,
    num_slots: usize,
    values: Vec<f32>,
    known: Vec<bool>,
}

impl ContributionTargets {
    pub(super) fn new(n_envs: usize, max_steps: usize, num_slots: usize) -> ContributionTargets {
        let cells = n_envs.saturating_mul(max_steps).saturating_mul(num_slots);
        ContributionTargets {
            n_envs,
            max_steps,
            num_slots,
            values: vec![0.0; cells],
            known: vec![false; cells],
        }
    }

    pub(super) fn clear(&mut self) {
        self.values.fill(0.0);
        self.known.fill(false);
    }

    /// Records `env`'s contributions at `step`, one entry per slot (`None`:
    /// not measured). Every value must be finite and inside the `f32`
    /// range; all are checked before any is written.
    pub(super) fn record(&mut self, step: usize, env: usize, values: &[Option<f64>]) -> Result<()> {
        if step >= self.max_steps || env >= self.n_envs {
            return Err(Error::Buffer(format!(
                "no contribution cell for environment {env} step {step} ({} environments, {} \
                 steps)",
                self.n_envs, self.max_steps
            )));
        }
        if values.len() != self.num_slots {
            return Err(Error::Buffer(format!(
                "{} contributions for {} slots",
                values.len(),
                self.num_slots
            )));
        }
        // Kept as f32: a value outside its range would become infinite.
        if let Some(bad) = values
            .iter()
            .flatten()
            .find(|value| !(value.is_finite() && value.abs() <= f64::from(f32::MAX)))
        {
            return Err(Error::InvalidInput {
                field: "RolloutBuffer.record_contributions",
                reason: format!(
                    "contribution {bad} for environment {env} at step {step} is not a finite f32"
                ),
            });
        }
        let start = env
            .checked_mul(self.max_steps)
            .and_then(|row| row.checked_add(step))
            .and_then(|cell| cell.checked_mul(self.num_slots))
            .ok_or_else(|| Error::Buffer("contribution cell index overflows".to_owned()))?;
        for (slot, value) in values.iter().enumerate() {
            let cell = start.saturating_add(slot);
            if let (Some(target), Some(known)) =
                (self.values.get_mut(cell), self.known.get_mut(cell))
            {
                *target = value.unwrap_or(0.0) as f32;
                *known = value.is_some();
            }
        }
        Ok(())
    }

    /// `[E, T, S]` f32 targets and f32 mask (1 measured, 0 not) on `device`.
    pub(super) fn upload(&self, device: Device) -> Result<(Tensor, Tensor)> {
        let shape = [self.n_envs, self.max_steps, self.num_slots]
            .map(|size| i64::try_from(size).unwrap_or(i64::MAX));
        let values = Tensor::f_from_slice(&self.values)
            .op("contribution upload")?
            .f_view(shape)
            .op("contribution upload")?
            .f_to_device(device)
            .op("contribution upload")?;
        let known: Vec<f32> = self
            .known
            .iter()
            .map(|&known| f32::from(u8::from(known)))
            .collect();
        let mask = Tensor::f_from_slice(&known)
            .op("contribution upload")?
            .f_view(shape)
            .op("contribution upload")?
            .f_to_kind(Kind::Float)
            .op("contribution upload")?
            .f_to_device(device)
            .op("contribution upload")?;
        Ok((values, mask))
    }
}
