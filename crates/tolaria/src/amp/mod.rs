//! Training precision: automatic mixed precision (the autocast [`Precision`]
//! and a [`GradScaler`] whose whole state lives on the device), and the
//! process-wide TF32 and matmul settings every trainer applies once when it
//! starts ([`PrecisionConfig`], [`MatmulPrecision`], [`apply_precision`]).
//!
//! Used by the general step ([`crate::engine::model_step::ModelStep`]) on
//! every batch.
//!
//! [`Precision`] is the issue's `precision = "fp32" | "bf16" | "fp16"`:
//! the dtype autocast runs the forward pass in (TF32 and the matmul
//! precision are [`PrecisionConfig`]'s, applied whatever this is).
//! [`Precision::auto`] picks bf16 where the GPU supports it (compute
//! capability 8.0 and newer) and fp32 on the CPU.
//!
//! [`GradScaler`] is `torch.amp.GradScaler` built from the `_amp` ops: the
//! scale (`f32`, initially 2^16), the growth tracker (`i32`) and the
//! found-inf flag (`f32`) are 0-dim device tensors, so no per-step call reads
//! anything back and the step can be captured in a CUDA graph. One step is:
//!
//! 1. [`GradScaler::scale_loss`], then backward on the scaled loss;
//! 2. [`GradScaler::unscale_`]: clears found-inf, divides every gradient by
//!    the scale in place (`_amp_foreach_non_finite_check_and_unscale_`,
//!    through `torch_ext::fused::amp_unscale_`) and sets found-inf to 1 if
//!    any gradient holds an inf or NaN; clip gradients after this;
//! 3. the optimizer step given [`GradScaler::found_inf`] (torch-ext's fused
//!    SGD/AdamW skip the update when it is non-zero: pass it as their
//!    `found_inf` and leave their `grad_scale` unset, the gradients are
//!    already unscaled), or any other update multiplied by
//!    [`GradScaler::step_multiplier`];
//! 4. [`GradScaler::update`] (`_amp_update_scale_`): on inf/NaN the scale is
//!    multiplied by the backoff factor (0.5) and the tracker reset; after
//!    `growth_interval` (2000) clean steps in a row the scale is multiplied
//!    by the growth factor (2) and the tracker reset.
//!
//! bf16 and fp32 need no scaling: [`GradScaler::disabled`] (what
//! [`GradScaler::for_precision`] builds for them) takes the same calls, does
//! not scale, and its found-inf stays 0, so callers keep one code path.
//! [`GradScaler::state`] and [`GradScaler::load_state`] read and write the
//! scale and tracker at epoch boundaries (telemetry, checkpoints).

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, TorchResultExt};

mod matmul;
mod precision;
pub use matmul::{MatmulPrecision, PrecisionConfig, apply_precision};
pub use precision::Precision;

/// The initial scale of `torch.amp.GradScaler`: 2^16.
pub const DEFAULT_INIT_SCALE: f64 = 65_536.0;
/// The scale's growth factor after a run of clean steps.
pub const DEFAULT_GROWTH_FACTOR: f64 = 2.0;
/// The scale's backoff factor on a step with inf/NaN gradients.
pub const DEFAULT_BACKOFF_FACTOR: f64 = 0.5;
/// Clean steps in a row before the scale grows.
pub const DEFAULT_GROWTH_INTERVAL: u32 = 2000;

/// The [`GradScaler`]'s constants (`torch.amp.GradScaler`'s defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GradScalerConfig {
    /// The first scale: finite, `> 0`, and a finite `f32`.
    pub init_scale: f64,
    /// Multiplies the scale after `growth_interval` clean steps: finite,
    /// `> 1`.
    pub growth_factor: f64,
    /// Multiplies the scale on a step with inf/NaN gradients: in `(0, 1)`.
    pub backoff_factor: f64,
    /// Clean steps in a row before the scale grows: in `[1, i32::MAX]` (the
    /// tracker is an `i32` on the device).
    pub growth_interval: u32,
}

impl Default for GradScalerConfig {
    /// Initial scale 2^16, growth ×2 after 2000 clean steps, backoff ×0.5.
    fn default() -> Self {
        GradScalerConfig {
            init_scale: DEFAULT_INIT_SCALE,
            growth_factor: DEFAULT_GROWTH_FACTOR,
            backoff_factor: DEFAULT_BACKOFF_FACTOR,
            growth_interval: DEFAULT_GROWTH_INTERVAL,
        }
    }
}

impl GradScalerConfig {
    /// Checks every value, naming the field.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming `amp.init_scale`,
    /// `amp.growth_factor`, `amp.backoff_factor` or `amp.growth_interval`.
    pub fn validate(&self) -> Result<()> {
        if !(positive_finite_f32(self.init_scale)) {
            return Err(invalid(
                "amp.init_scale",
                self.init_scale,
                "finite, > 0 and a finite f32",
            ));
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return Err(invalid(
                "amp.growth_factor",
                self.growth_factor,
                "finite and > 1",
            ));
        }
        if !(self.backoff_factor.is_finite()
            && self.backoff_factor > 0.0
            && self.backoff_factor < 1.0)
        {
            return Err(invalid(
                "amp.backoff_factor",
                self.backoff_factor,
                "finite and in (0, 1)",
            ));
        }
        if self.growth_interval == 0 || i32::try_from(self.growth_interval).is_err() {
            return Err(Error::InvalidConfig {
                field: "amp.growth_interval",
                reason: format!(
                    "{} is out of range: must be in [1, {}]",
                    self.growth_interval,
                    i32::MAX
                ),
            });
        }
        Ok(())
    }
}

/// What a [`GradScaler`] carries between runs: read back by
/// [`GradScaler::state`], written by [`GradScaler::load_state`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalerState {
    /// Whether the scaler scales (fp16); a disabled scaler reports scale 1.
    pub enabled: bool,
    /// The current loss scale.
    pub scale: f32,
    /// Clean steps since the scale last changed.
    pub growth_tracker: i32,
}

/// Where the scaler is in its step: `unscale_` must come once between two
/// `update`s. Host-side bookkeeping only (nothing read from the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Gradients not yet unscaled this step.
    Ready,
    /// `unscale_` ran; `update` is next.
    Unscaled,
}

/// `torch.amp.GradScaler` with its whole state on the device (see the
/// module documentation for one step's calls).
#[derive(Debug)]
pub struct GradScaler {
    enabled: bool,
    config: GradScalerConfig,
    device: Device,
    /// `f32` 0-dim: the loss scale.
    scale: Tensor,
    /// `f32` 0-dim: `1 / scale`, rewritten by every `unscale_`.
    inv_scale: Tensor,
    /// `i32` 0-dim: clean steps since the scale last changed.
    growth_tracker: Tensor,
    /// `f32` 0-dim: 1 when this step's gradients hold an inf or NaN.
    found_inf: Tensor,
    stage: Stage,
}

impl GradScaler {
    /// An enabled scaler (fp16) on `device`, scale `config.init_scale`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] from [`GradScalerConfig::validate`];
    /// [`Error::Torch`] when the state cannot be allocated on `device`.
    pub fn new(config: GradScalerConfig, device: Device) -> Result<GradScaler> {
        config.validate()?;
        GradScaler::build(true, config, config.init_scale, device)
    }

    /// A scaler that does not scale (fp32, bf16): scale 1, found-inf always
    /// 0, every call accepted, so callers keep one code path.
    ///
    /// # Errors
    /// [`Error::Torch`] when the state cannot be allocated on `device`.
    pub fn disabled(device: Device) -> Result<GradScaler> {
        GradScaler::build(false, GradScalerConfig::default(), 1.0, device)
    }

    /// The scaler `precision` needs: enabled for fp16, disabled otherwise
    /// (`config` is validated either way, so a bad configuration is refused
    /// whatever the precision).
    ///
    /// # Errors
    /// As [`GradScaler::new`].
    pub fn for_precision(
        precision: Precision,
        config: GradScalerConfig,
        device: Device,
    ) -> Result<GradScaler> {
        config.validate()?;
        if precision.needs_grad_scaling() {
            GradScaler::new(config, device)
        } else {
            let mut scaler = GradScaler::disabled(device)?;
            scaler.config = config;
            Ok(scaler)
        }
    }

    fn build(
        enabled: bool,
        config: GradScalerConfig,
        scale: f64,
        device: Device,
    ) -> Result<GradScaler> {
        let options = (Kind::Float, device);
        Ok(GradScaler {
            enabled,
            config,
            device,
            scale: Tensor::f_full([], scale, options).op("amp::GradScaler scale")?,
            inv_scale: Tensor::f_full([], 1.0 / scale, options).op("amp::GradScaler inv_scale")?,
            growth_tracker: Tensor::f_zeros([], (Kind::Int, device))
                .op("amp::GradScaler growth_tracker")?,
            found_inf: Tensor::f_zeros([], options).op("amp::GradScaler found_inf")?,
            stage: Stage::Ready,
        })
    }

    /// Whether this scaler scales (fp16).
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The constants it was built with.
    pub fn config(&self) -> &GradScalerConfig {
        &self.config
    }

    /// The device its state lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The loss scale: an `f32` 0-dim device tensor (1 when disabled).
    pub fn scale(&self) -> &Tensor {
        &self.scale
    }

    /// The growth tracker: an `i32` 0-dim device tensor.
    pub fn growth_tracker(&self) -> &Tensor {
        &self.growth_tracker
    }

    /// The found-inf flag: an `f32` 0-dim device tensor, 1 after an
    /// [`GradScaler::unscale_`] that met an inf or NaN, else 0 (always 0 when
    /// disabled). Pass it as the fused optimizers' `found_inf` so they skip
    /// the step without a readback.
    pub fn found_inf(&self) -> &Tensor {
        &self.found_inf
    }

    /// [`GradScaler::found_inf`] when enabled, `None` when disabled: what to
    /// give the fused optimizers' `found_inf` option so a disabled scaler
    /// costs them nothing.
    pub fn optimizer_found_inf(&self) -> Option<&Tensor> {
        self.enabled.then_some(&self.found_inf)
    }

    /// `1 - found_inf` as a fresh `f32` 0-dim device tensor: multiply an
    /// update computed outside the fused optimizers by it to skip the step on
    /// inf/NaN without a readback.
    ///
    /// # Errors
    /// [`Error::Torch`] if the device operation fails.
    pub fn step_multiplier(&self) -> Result<Tensor> {
        self.found_inf
            .f_rsub_scalar(1.0)
            .op("amp::GradScaler::step_multiplier")
    }

    /// `loss * scale` on the device (the loss itself, shallow-cloned, when
    /// disabled). Call backward on the result.
    ///
    /// # Errors
    /// [`Error::GradScaler`] naming `loss` when it is not floating-point or
    /// not on the scaler's device; [`Error::Torch`] if the product fails.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        self.check_tensor("loss", loss)?;
        if !self.enabled {
            return Ok(loss.shallow_clone());
        }
        loss.f_mul(&self.scale).op("amp::GradScaler::scale_loss")
    }

    /// Divides every gradient by the scale in place and sets
    /// [`GradScaler::found_inf`] to 1 if any holds an inf or NaN (0
    /// otherwise). Once per step, before the optimizer step and before
    /// gradient clipping. A no-op when disabled.
    ///
    /// # Errors
    /// [`Error::GradScaler`] naming `unscale_` when called twice without an
    /// [`GradScaler::update`] in between, or `grads` when a gradient is
    /// undefined, not floating-point or not on the scaler's device (checked
    /// before anything is changed); [`Error::Torch`] / [`Error::TorchExt`] if
    /// a device operation fails.
    pub fn unscale_(&mut self, grads: &[Tensor]) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        if self.stage == Stage::Unscaled {
            return Err(Error::GradScaler {
                field: "unscale_",
                reason: "called twice since the last update(); the gradients are already \
                         unscaled"
                    .to_owned(),
            });
        }
        for grad in grads {
            self.check_tensor("grads", grad)?;
        }
        let _ = self
            .found_inf
            .f_zero_()
            .op("amp::GradScaler found_inf.zero_")?;
        let _ = self
            .scale
            .f_reciprocal_out(&self.inv_scale)
            .op("amp::GradScaler inv_scale")?;
        torch_ext::fused::amp_unscale_(grads, &mut self.found_inf, &self.inv_scale)?;
        self.stage = Stage::Unscaled;
        Ok(())
    }

    /// Updates the scale on the device from this step's found-inf
    /// (`_amp_update_scale_`): on inf/NaN, scale × backoff and tracker reset;
    /// otherwise tracker + 1, and when it reaches `growth_interval`, scale ×
    /// growth (kept only if finite) and tracker reset. Once per step, after
    /// the optimizer step. A no-op when disabled.
    ///
    /// # Errors
    /// [`Error::GradScaler`] naming `update` when no [`GradScaler::unscale_`]
    /// ran since the last update (there is no inf check to act on);
    /// [`Error::Torch`] if the device operation fails.
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        if self.stage != Stage::Unscaled {
            return Err(Error::GradScaler {
                field: "update",
                reason: "no unscale_() since the last update(): no inf/NaN check was recorded"
                    .to_owned(),
            });
        }
        let _ = self
            .scale
            .f_internal_amp_update_scale_(
                &self.growth_tracker,
                &self.found_inf,
                self.config.growth_factor,
                self.config.backoff_factor,
                i64::from(self.config.growth_interval),
            )
            .op("amp::GradScaler::update")?;
        self.stage = Stage::Ready;
        Ok(())
    }

    /// Forgets a step begun but not finished (an `unscale_` without its
    /// `update`), e.g. when a CUDA-graph capture of the step failed part-way:
    /// nothing ran on the device, so the next step starts afresh. The
    /// device state (scale, tracker) is untouched.
    pub fn abandon_step(&mut self) {
        self.stage = Stage::Ready;
    }

    /// Reads the scale and tracker back to the host: for telemetry and
    /// checkpoints at epoch boundaries, never inside a step.
    ///
    /// # Errors
    /// [`Error::Torch`] if the readback fails; [`Error::GradScaler`] if the
    /// tracker does not fit an `i32` (it cannot, being an `i32` tensor).
    pub fn state(&self) -> Result<ScalerState> {
        let scale = self
            .scale
            .f_double_value(&[])
            .op("amp::GradScaler::state scale")?;
        let tracker = self
            .growth_tracker
            .f_int64_value(&[])
            .op("amp::GradScaler::state growth_tracker")?;
        let growth_tracker = i32::try_from(tracker).map_err(|_| Error::GradScaler {
            field: "growth_tracker",
            reason: format!("read back {tracker}, which does not fit an i32"),
        })?;
        Ok(ScalerState {
            enabled: self.enabled,
            // The tensor is f32: this narrows nothing.
            scale: scale as f32,
            growth_tracker,
        })
    }

    /// Writes a saved state to the device and clears found-inf, after
    /// checking it: the scale finite and `> 0`, the tracker `>= 0`. A
    /// disabled scaler checks the state and keeps scale 1 (like
    /// `torch.amp.GradScaler`, which ignores a state loaded while disabled).
    ///
    /// # Errors
    /// [`Error::GradScaler`] naming `scale` or `growth_tracker` for a bad
    /// value, or `enabled` when an enabled scaler is given a disabled
    /// scaler's state (it holds no scale to resume); [`Error::Torch`] if a
    /// device write fails. Nothing is written on error.
    pub fn load_state(&mut self, state: &ScalerState) -> Result<()> {
        if !(state.scale.is_finite() && state.scale > 0.0) {
            return Err(Error::GradScaler {
                field: "scale",
                reason: format!("{} must be finite and > 0", state.scale),
            });
        }
        if state.growth_tracker < 0 {
            return Err(Error::GradScaler {
                field: "growth_tracker",
                reason: format!("{} must be >= 0", state.growth_tracker),
            });
        }
        if !self.enabled {
            return Ok(());
        }
        if !state.enabled {
            return Err(Error::GradScaler {
                field: "enabled",
                reason: "the state was saved by a disabled scaler (fp32/bf16) and holds no \
                         scale for this fp16 scaler"
                    .to_owned(),
            });
        }
        let _ = self
            .scale
            .f_fill_(f64::from(state.scale))
            .op("amp::GradScaler::load_state scale")?;
        let _ = self
            .inv_scale
            .f_fill_(1.0 / f64::from(state.scale))
            .op("amp::GradScaler::load_state inv_scale")?;
        let _ = self
            .growth_tracker
            .f_fill_(i64::from(state.growth_tracker))
            .op("amp::GradScaler::load_state growth_tracker")?;
        let _ = self
            .found_inf
            .f_zero_()
            .op("amp::GradScaler::load_state found_inf")?;
        self.stage = Stage::Ready;
        Ok(())
    }

    /// Metadata checks only (no readback): defined, floating-point, on the
    /// scaler's device.
    fn check_tensor(&self, field: &'static str, tensor: &Tensor) -> Result<()> {
        if !tensor.defined() {
            return Err(Error::GradScaler {
                field,
                reason: "an undefined tensor (a parameter without a gradient?)".to_owned(),
            });
        }
        if !tensor.is_floating_point() {
            return Err(Error::GradScaler {
                field,
                reason: format!("dtype {:?} is not floating-point", tensor.kind()),
            });
        }
        if tensor.device() != self.device {
            return Err(Error::GradScaler {
                field,
                reason: format!(
                    "on {:?}, the scaler's state is on {:?}",
                    tensor.device(),
                    self.device
                ),
            });
        }
        Ok(())
    }
}

fn positive_finite_f32(value: f64) -> bool {
    // Narrowing on purpose: the device holds the scale in f32, so a value
    // beyond f32's range must be refused here.
    let narrowed = value as f32;
    value.is_finite() && value > 0.0 && narrowed.is_finite() && narrowed > 0.0
}

fn invalid(field: &'static str, value: f64, requirement: &str) -> Error {
    Error::InvalidConfig {
        field,
        reason: format!("{value} is out of range: must be {requirement}"),
    }
}
