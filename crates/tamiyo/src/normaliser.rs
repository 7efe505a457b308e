//! [`RunningMeanStd`]: the running observation normaliser (reference §3.3,
//! the Python `RunningMeanStd`).
//!
//! Per feature, a running mean and variance, updated with a whole batch
//! `[n, dim]` of observations at a time from the batch's mean and population
//! variance:
//!
//! - with a momentum `m` (the reference's default 0.99), an EMA:
//!   `mean' = m·mean + (1−m)·μ_b`, `var' = m·var + (1−m)·σ²_b + m(1−m)(mean − μ_b)²`
//!   (the law of total variance for the two weighted parts);
//! - without one, Welford's parallel combination over every sample seen
//!   (count starting at epsilon).
//!
//! [`RunningMeanStd::normalize`] returns `clamp((x − mean) / sqrt(var + ε), ±clip)`
//! (epsilon 1e-4, clip 10). The state (mean, var, count) lives on the device
//! and an update reads back only the one finiteness flag below; the PPO
//! trainer freezes the normaliser during a rollout and updates it just
//! before the update (reference §3.3).
//! [`NormaliserState`] is the serde form for checkpoints (the one place the
//! state is read back).
//!
//! Batches are shape-checked (`[n ≥ 1, dim]`, floating point, same device).
//! An update is all or nothing: a batch holding a NaN or an infinity (or a
//! value beyond `f32`), or one whose moments would overflow `f32`, is
//! refused with [`Error::NonFinite`] naming it, and the state stays exactly
//! as it was, so a normaliser is never poisoned and its [`NormaliserState`]
//! always loads again. That check is the update's one read-back (one flag;
//! an update runs at the round's boundaries or once per rollout step, never
//! inside a captured graph). [`RunningMeanStd::normalize`] checks its input
//! only on the CPU (no device synchronisation on the per-step path);
//! observations are checked where they are encoded ([`crate::features`]).

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::error::{TorchResultExt, finite, shape_mismatch};
use crate::finite::{all_finite, check_finite, check_finite_on_host};
use crate::{Error, Result};

/// Widest observation the normaliser takes.
pub const MAX_DIM: usize = 1 << 20;

/// The normaliser's constants.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormaliserConfig {
    /// Added to the variance before the square root, and the initial count
    /// (1e-4).
    pub epsilon: f64,
    /// Normalised values are clamped to `±clip` (10).
    pub clip: f64,
    /// EMA momentum in `(0, 1)` (0.99); `None` for Welford's full-history
    /// moments.
    pub momentum: Option<f64>,
}

impl Default for NormaliserConfig {
    /// The reference's observation normaliser: epsilon 1e-4, clip 10, EMA
    /// momentum 0.99.
    fn default() -> Self {
        NormaliserConfig {
            epsilon: 1e-4,
            clip: 10.0,
            momentum: Some(0.99),
        }
    }
}

impl NormaliserConfig {
    /// Checks the constants: epsilon and clip > 0 and finite as f32s,
    /// momentum in `(0, 1)`.
    pub fn validate(&self) -> Result<()> {
        // The state is f32: a constant beyond f32's range would be an
        // infinity there (or a scalar libtorch refuses).
        let positive = |field: &'static str, value: f64| {
            if value.is_finite() && value > 0.0 && value <= f64::from(f32::MAX) {
                Ok(())
            } else {
                Err(Error::InvalidConfig {
                    field,
                    reason: format!("{value} is not a positive number finite as an f32"),
                })
            }
        };
        positive("NormaliserConfig.epsilon", self.epsilon)?;
        positive("NormaliserConfig.clip", self.clip)?;
        if let Some(momentum) = self.momentum
            && !(momentum > 0.0 && momentum < 1.0)
        {
            return Err(Error::InvalidConfig {
                field: "NormaliserConfig.momentum",
                reason: format!("{momentum} is outside (0, 1)"),
            });
        }
        Ok(())
    }
}

/// The normaliser's state on the host (checkpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormaliserState {
    /// The constants.
    pub config: NormaliserConfig,
    /// Running mean per feature.
    pub mean: Vec<f64>,
    /// Running variance per feature (≥ 0).
    pub var: Vec<f64>,
    /// Samples seen (plus epsilon).
    pub count: f64,
}

/// The running normaliser (see the module docs).
#[derive(Debug)]
pub struct RunningMeanStd {
    config: NormaliserConfig,
    dim: usize,
    mean: Tensor,
    var: Tensor,
    count: Tensor,
}

fn check_dim(dim: usize) -> Result<i64> {
    if (1..=MAX_DIM).contains(&dim) {
        Ok(i64::try_from(dim).unwrap_or(i64::MAX))
    } else {
        Err(Error::InvalidConfig {
            field: "RunningMeanStd.dim",
            reason: format!("{dim} is outside [1, {MAX_DIM}]"),
        })
    }
}

impl RunningMeanStd {
    /// A normaliser for `dim` features on `device`: mean 0, variance 1,
    /// count epsilon.
    pub fn new(dim: usize, config: NormaliserConfig, device: Device) -> Result<RunningMeanStd> {
        config.validate()?;
        let width = check_dim(dim)?;
        Ok(RunningMeanStd {
            config,
            dim,
            mean: Tensor::f_zeros([width], (Kind::Float, device)).op("normaliser mean")?,
            var: Tensor::f_ones([width], (Kind::Float, device)).op("normaliser var")?,
            count: Tensor::f_full([], config.epsilon, (Kind::Double, device))
                .op("normaliser count")?,
        })
    }

    /// Number of features.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The constants.
    pub fn config(&self) -> NormaliserConfig {
        self.config
    }

    /// The device the state lives on.
    pub fn device(&self) -> Device {
        self.mean.device()
    }

    /// The running mean, `[dim]` on the device.
    pub fn mean(&self) -> &Tensor {
        &self.mean
    }

    /// The running variance, `[dim]` on the device.
    pub fn var(&self) -> &Tensor {
        &self.var
    }

    fn check_batch(&self, what: &'static str, batch: &Tensor) -> Result<()> {
        let size = batch.size();
        let ok = matches!(size.as_slice(), [rows, width] if *rows >= 1
            && usize::try_from(*width).ok() == Some(self.dim));
        if !ok {
            return Err(shape_mismatch(
                what,
                format!("[n >= 1, {}]", self.dim),
                size,
            ));
        }
        if !batch.is_floating_point() {
            return Err(shape_mismatch(
                what,
                "a floating-point tensor",
                batch.kind(),
            ));
        }
        if batch.device() != self.device() {
            return Err(shape_mismatch(
                what,
                format!("a tensor on {:?}", self.device()),
                batch.device(),
            ));
        }
        Ok(())
    }

    /// Updates the moments with `batch` (`[n, dim]`, see the module docs).
    ///
    /// All or nothing: the new moments are computed aside, and only when
    /// the batch (as `f32`) and the new mean and variance are all finite do
    /// they replace the state; otherwise the call is
    /// [`Error::NonFinite`] naming `RunningMeanStd.update.batch` (a NaN or
    /// infinite observation, or one beyond `f32`), or
    /// `RunningMeanStd.update.mean` / `.var` (finite observations whose
    /// moments overflow `f32`), and the state is exactly as before. The check
    /// reads one flag back from the device.
    pub fn update(&mut self, batch: &Tensor) -> Result<()> {
        self.check_batch("RunningMeanStd.update", batch)?;
        let _guard = tch::no_grad_guard();
        let batch = batch.f_to_kind(Kind::Float).op("normaliser batch")?;
        let (mean, var, count) = self.moments_with(&batch)?;
        if !all_finite(&[&batch, &mean, &var])? {
            check_finite("RunningMeanStd.update.batch", &batch)?;
            check_finite("RunningMeanStd.update.mean", &mean)?;
            check_finite("RunningMeanStd.update.var", &var)?;
            return Err(Error::NonFinite {
                field: "RunningMeanStd.update",
                value: f64::NAN,
                index: Vec::new(),
            });
        }
        // In place: the moments keep their device memory, so a CUDA graph
        // that normalises with them (`GraphedAct::act_staged`) stays valid.
        self.mean.f_copy_(&mean).op("normaliser mean")?;
        self.var.f_copy_(&var).op("normaliser var")?;
        self.count.f_copy_(&count).op("normaliser count")?;
        Ok(())
    }

    /// Where the moments live (the data pointers of the mean and the
    /// variance): [`RunningMeanStd::update`] keeps them; a reset or a
    /// restored state moves them, and a graph captured on the old ones must
    /// be captured again.
    pub fn memory_key(&self) -> [usize; 2] {
        [self.mean.data_ptr() as usize, self.var.data_ptr() as usize]
    }

    /// The moments after `batch` (`[n, dim]` f32), without touching the
    /// state: (mean, var, count).
    fn moments_with(&self, batch: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let rows = batch.size().first().copied().unwrap_or(1);
        let batch_mean = batch
            .f_mean_dim(0, false, Kind::Float)
            .op("normaliser batch mean")?;
        let batch_var = batch
            .f_var_correction(0, 0, false)
            .op("normaliser batch var")?;
        let delta = batch_mean.f_sub(&self.mean).op("normaliser delta")?;
        let delta_sq = delta.f_square().op("normaliser delta²")?;
        match self.config.momentum {
            Some(momentum) => {
                let rest = 1.0 - momentum;
                let mean = (self.mean.f_mul_scalar(momentum).op("ema mean")?)
                    .f_add(&batch_mean.f_mul_scalar(rest).op("ema mean")?)
                    .op("ema mean")?;
                let var = self
                    .var
                    .f_mul_scalar(momentum)
                    .op("ema var")?
                    .f_add(&batch_var.f_mul_scalar(rest).op("ema var")?)
                    .op("ema var")?
                    .f_add(&delta_sq.f_mul_scalar(momentum * rest).op("ema var")?)
                    .op("ema var")?;
                let count = self.count.f_add_scalar(rows).op("ema count")?;
                Ok((mean, var, count))
            }
            None => {
                // Welford's parallel combination, counts in f64 on the device.
                let count = self.count.f_to_kind(Kind::Float).op("welford count")?;
                let total = self.count.f_add_scalar(rows).op("welford total")?;
                let total_f = total.f_to_kind(Kind::Float).op("welford total")?;
                let batch_weight = Tensor::f_full([], rows, (Kind::Float, self.device()))
                    .op("welford rows")?
                    .f_div(&total_f)
                    .op("welford weight")?;
                let mean = self
                    .mean
                    .f_add(&delta.f_mul(&batch_weight).op("welford mean")?)
                    .op("welford mean")?;
                // m2 = var·count + var_b·rows + delta²·count·rows/total.
                let m2 = self
                    .var
                    .f_mul(&count)
                    .op("welford m2")?
                    .f_add(&batch_var.f_mul_scalar(rows).op("welford m2")?)
                    .op("welford m2")?
                    .f_add(
                        &delta_sq
                            .f_mul(&count)
                            .op("welford m2")?
                            .f_mul(&batch_weight)
                            .op("welford m2")?,
                    )
                    .op("welford m2")?;
                let var = m2.f_div(&total_f).op("welford var")?;
                Ok((mean, var, total))
            }
        }
    }

    /// `clamp((x − mean) / sqrt(var + ε), ±clip)` for `x` `[n, dim]` (a new
    /// tensor in `f32`).
    ///
    /// On the CPU a NaN or infinite `x` is [`Error::NonFinite`]
    /// (`RunningMeanStd.normalize.x`); on CUDA `x` is not read back (the
    /// per-step path: see [`crate::features`] for where observations are
    /// checked).
    pub fn normalize(&self, x: &Tensor) -> Result<Tensor> {
        self.check_batch("RunningMeanStd.normalize", x)?;
        check_finite_on_host("RunningMeanStd.normalize.x", x)?;
        let scale = self
            .var
            .f_add_scalar(self.config.epsilon)
            .op("normalise std")?
            .f_sqrt()
            .op("normalise std")?;
        x.f_to_kind(Kind::Float)
            .op("normalise input")?
            .f_sub(&self.mean)
            .op("normalise centre")?
            .f_div(&scale)
            .op("normalise scale")?
            .f_clamp(-self.config.clip, self.config.clip)
            .op("normalise clip")
    }

    /// Back to mean 0, variance 1, count epsilon (all or nothing: the new
    /// state is allocated before it replaces the old).
    pub fn reset(&mut self) -> Result<()> {
        let fresh = RunningMeanStd::new(self.dim, self.config, self.device())?;
        *self = fresh;
        Ok(())
    }

    /// The state on the host (reads the device back once).
    pub fn state(&self) -> Result<NormaliserState> {
        let read = |what: &'static str, tensor: &Tensor| -> Result<Vec<f64>> {
            let host = tensor
                .f_to_kind(Kind::Double)
                .op("normaliser readback")?
                .f_to_device(Device::Cpu)
                .op("normaliser readback")?;
            let values = Vec::<f64>::try_from(&host).op("normaliser readback")?;
            if values.len() != self.dim {
                return Err(Error::Readback {
                    what,
                    expected: self.dim,
                    got: values.len(),
                });
            }
            Ok(values)
        };
        let count = self
            .count
            .f_to_device(Device::Cpu)
            .op("normaliser readback")?
            .f_double_value(&[])
            .op("normaliser readback")?;
        Ok(NormaliserState {
            config: self.config,
            mean: read("normaliser mean", &self.mean)?,
            var: read("normaliser var", &self.var)?,
            count,
        })
    }

    /// A normaliser from a saved state on `device`. The state is checked:
    /// constants valid, mean and var of one length in `[1, MAX_DIM]`, every
    /// value finite, variances ≥ 0, count ≥ epsilon.
    pub fn from_state(state: &NormaliserState, device: Device) -> Result<RunningMeanStd> {
        state.config.validate()?;
        check_dim(state.mean.len())?;
        if state.var.len() != state.mean.len() {
            return Err(Error::InvalidInput {
                field: "NormaliserState.var",
                reason: format!("{} values for {} means", state.var.len(), state.mean.len()),
            });
        }
        // The state lives on the device in f32: a value finite in f64 but
        // beyond f32 would become infinite there (and normalise to NaN).
        let fits_f32 = |value: f64| value.abs() <= f64::from(f32::MAX);
        for (index, value) in state.mean.iter().enumerate() {
            let value = *value;
            if !value.is_finite() {
                return Err(Error::NonFinite {
                    field: "NormaliserState.mean",
                    value,
                    index: vec![index],
                });
            }
            if !fits_f32(value) {
                return Err(Error::InvalidInput {
                    field: "NormaliserState.mean",
                    reason: format!("{value} (feature {index}) is not finite as an f32"),
                });
            }
        }
        for (index, value) in state.var.iter().enumerate() {
            let value = *value;
            if !value.is_finite() {
                return Err(Error::NonFinite {
                    field: "NormaliserState.var",
                    value,
                    index: vec![index],
                });
            }
            if !(fits_f32(value) && value >= 0.0) {
                return Err(Error::InvalidInput {
                    field: "NormaliserState.var",
                    reason: format!("{value} (feature {index}) is not a variance finite as an f32"),
                });
            }
        }
        finite("NormaliserState.count", state.count)?;
        if state.count < state.config.epsilon {
            return Err(Error::InvalidInput {
                field: "NormaliserState.count",
                reason: format!(
                    "{} is not a finite count of at least epsilon {}",
                    state.count, state.config.epsilon
                ),
            });
        }
        let load = |values: &[f64]| -> Result<Tensor> {
            Tensor::f_from_slice(values)
                .op("normaliser load")?
                .f_to_kind(Kind::Float)
                .op("normaliser load")?
                .f_to_device(device)
                .op("normaliser load")
        };
        let mean = load(&state.mean)?;
        let var = load(&state.var)?;
        Ok(RunningMeanStd {
            config: state.config,
            dim: state.mean.len(),
            mean,
            var,
            count: Tensor::f_full([], state.count, (Kind::Double, device)).op("normaliser load")?,
        })
    }
}
