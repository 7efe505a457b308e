//! Per-data-set pixel normalisation, applied once at load time.
//!
//! Raw pixels are bytes; loaders turn them into `f32` as
//! `(byte / 255 - mean[channel]) / std[channel]`.

use tch::{Kind, Tensor};

use super::{Result, torch_error};

/// Mean and standard deviation per channel of pixels scaled to `[0, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalisation {
    /// Mean per channel.
    pub mean: Vec<f32>,
    /// Standard deviation per channel.
    pub std: Vec<f32>,
}

impl Normalisation {
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
    pub fn identity(channels: usize) -> Self {
        Self {
            mean: vec![0.0; channels],
            std: vec![1.0; channels],
        }
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
