//! Per-data-set pixel normalisation, applied once at load time.
//!
//! Raw pixels are bytes; loaders turn them into `f32` as
//! `(byte / 255 - mean[channel]) / std[channel]`. A [`Normalisation`] is
//! validated when it is built, so every normalised pixel is a finite `f32`.

use tch::{Kind, Tensor};

use super::limits::{MAX_CHANNELS, invalid_field};
use super::{Result, torch_error};

/// Mean and standard deviation per channel of pixels scaled to `[0, 1]`.
///
/// Built only through [`Normalisation::new`] (or the presets), which checks
/// that there are `1..=`[`MAX_CHANNELS`] channels, every mean is finite,
/// every standard deviation is finite and positive, and the normalised
/// values of bytes 0 and 255 are finite `f32`s.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalisation {
    mean: Vec<f32>,
    std: Vec<f32>,
}

impl Normalisation {
    /// A normalisation with `mean[c]` and `std[c]` for channel `c`.
    ///
    /// # Errors
    /// [`super::DataError::InvalidField`] naming `mean`, `std`, `mean[c]` or
    /// `std[c]` and the value: lengths that differ or lie outside
    /// `1..=`[`MAX_CHANNELS`], a NaN or infinite mean, a standard deviation
    /// that is not finite and positive, or a pair for which bytes 0 or 255
    /// would normalise to an infinity.
    pub fn new(mean: Vec<f32>, std: Vec<f32>) -> Result<Self> {
        const OP: &str = "Normalisation::new";
        if mean.is_empty() || mean.len() > MAX_CHANNELS {
            return Err(invalid_field(
                OP,
                "mean.len()",
                mean.len(),
                format!("1..={MAX_CHANNELS} channels"),
            ));
        }
        if std.len() != mean.len() {
            return Err(invalid_field(
                OP,
                "std.len()",
                std.len(),
                format!("{} (one per mean)", mean.len()),
            ));
        }
        for (channel, (&m, &s)) in mean.iter().zip(&std).enumerate() {
            if !m.is_finite() {
                return Err(invalid_field(
                    OP,
                    format!("mean[{channel}]"),
                    m,
                    "a finite value",
                ));
            }
            if !(s.is_finite() && s > 0.0) {
                return Err(invalid_field(
                    OP,
                    format!("std[{channel}]"),
                    s,
                    "a finite value above 0",
                ));
            }
            // (x - m) / s is monotone in x: the extremes bound every pixel.
            if !((0.0 - m) / s).is_finite() || !((1.0 - m) / s).is_finite() {
                return Err(invalid_field(
                    OP,
                    format!("std[{channel}]"),
                    s,
                    format!(
                        "a value for which (0 - {m}) / std and (1 - {m}) / std are finite f32s"
                    ),
                ));
            }
        }
        Ok(Self { mean, std })
    }

    /// Fashion-MNIST (one channel): mean 0.2860, std 0.3530.
    pub fn fashion_mnist() -> Self {
        Self {
            mean: vec![0.2860],
            std: vec![0.3530],
        }
    }

    /// CIFAR-10 (RGB): means (0.4914, 0.4822, 0.4465), stds (0.2470, 0.2435,
    /// 0.2616), as in the Python original.
    pub fn cifar10() -> Self {
        Self {
            mean: vec![0.4914, 0.4822, 0.4465],
            std: vec![0.2470, 0.2435, 0.2616],
        }
    }

    /// No normalisation beyond scaling bytes to `[0, 1]`: mean 0, std 1 for
    /// each of `channels` channels.
    ///
    /// # Errors
    /// [`super::DataError::InvalidField`] when `channels` is 0 or above
    /// [`MAX_CHANNELS`].
    pub fn identity(channels: usize) -> Result<Self> {
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(invalid_field(
                "Normalisation::identity",
                "channels",
                channels,
                format!("1..={MAX_CHANNELS}"),
            ));
        }
        Ok(Self {
            mean: vec![0.0; channels],
            std: vec![1.0; channels],
        })
    }

    /// Mean per channel.
    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    /// Standard deviation per channel.
    pub fn std(&self) -> &[f32] {
        &self.std
    }

    /// Number of channels this normalisation covers.
    pub fn channels(&self) -> usize {
        self.mean.len()
    }
}

/// Turns a byte tensor of shape `[N, C, H, W]` into normalised `f32`
/// (`(byte / 255 - mean[c]) / std[c]`), working in place on the float copy so
/// that the peak memory is one float tensor.
pub(crate) fn bytes_to_normalised_f32(
    bytes: &Tensor,
    normalisation: &Normalisation,
) -> Result<Tensor> {
    const OP: &str = "normalise pixels";
    let mut images = bytes.f_to_kind(Kind::Float).map_err(torch_error(OP))?;
    let _ = images.f_div_scalar_(255.0).map_err(torch_error(OP))?;
    // At most MAX_CHANNELS channels.
    let channels = normalisation.channels() as i64;
    let mean = Tensor::f_from_slice(&normalisation.mean)
        .and_then(|t| t.f_reshape([1, channels, 1, 1]))
        .map_err(torch_error(OP))?;
    let std = Tensor::f_from_slice(&normalisation.std)
        .and_then(|t| t.f_reshape([1, channels, 1, 1]))
        .map_err(torch_error(OP))?;
    let _ = images.f_sub_(&mean).map_err(torch_error(OP))?;
    let _ = images.f_div_(&std).map_err(torch_error(OP))?;
    Ok(images)
}
