//! Small neural-network layers built on tch's fallible (`f_*`) calls.
//!
//! tch's `nn::conv2d` and friends panic when a variable cannot be created;
//! these layers return [`crate::Error`] instead, and their initialisation
//! matches PyTorch's defaults (so parameter counts and init distributions
//! follow the reference): convolution and linear weights and biases are
//! uniform in `±1/sqrt(fan_in)` (Kaiming-uniform with `a = sqrt(5)`), norm
//! weights are 1 and biases 0, BatchNorm running statistics start at 0 / 1.
//! Every layer registers its variables in the [`nn::Path`] it is built in, so
//! the owning `VarStore` holds them (and moves them between devices).
//!
//! Constructors bound their sizes (each dimension in `[1, MAX_FEATURES]`,
//! kernels in `[1, MAX_KERNEL_SIZE]`, at most `MAX_PARAMETERS` weights; see
//! [`crate::validate`]) before any variable is created.

#![warn(clippy::arithmetic_side_effects)]

use tch::{Tensor, nn};

use crate::Result;
use crate::validate::{MAX_FEATURES, MAX_KERNEL_SIZE, MAX_PARAMETERS, checked_product, size_in};

/// Epsilon of GroupNorm and BatchNorm (PyTorch default).
pub const NORM_EPS: f64 = 1e-5;
/// BatchNorm running-statistics momentum (PyTorch default).
pub const BATCH_NORM_MOMENTUM: f64 = 0.1;

fn fan_in_bound(fan_in: i64) -> f64 {
    1.0 / (fan_in.max(1) as f64).sqrt()
}

/// 2-D convolution with square kernel, stride 1 and "same" padding (`k / 2`).
#[derive(Debug)]
pub struct Conv2d {
    /// `[out, in / groups, k, k]`.
    pub weight: Tensor,
    /// `[out]`, when the layer has a bias.
    pub bias: Option<Tensor>,
    padding: i64,
    groups: i64,
}

impl Conv2d {
    /// A convolution `in_channels -> out_channels` with a `kernel x kernel`
    /// kernel, `groups` groups (1 = dense, `in_channels` = depthwise).
    pub fn new(
        path: &nn::Path<'_>,
        in_channels: i64,
        out_channels: i64,
        kernel: i64,
        groups: i64,
        bias: bool,
    ) -> Result<Conv2d> {
        size_in("Conv2d.in_channels", in_channels, 1, MAX_FEATURES)?;
        size_in("Conv2d.out_channels", out_channels, 1, MAX_FEATURES)?;
        size_in("Conv2d.kernel", kernel, 1, MAX_KERNEL_SIZE)?;
        size_in("Conv2d.groups", groups, 1, in_channels)?;
        let per_group = in_channels
            .checked_div(groups)
            .filter(|_| in_channels.checked_rem(groups) == Some(0))
            .filter(|_| out_channels.checked_rem(groups) == Some(0))
            .ok_or_else(|| crate::Error::InvalidConfig {
                reason: format!(
                    "conv {in_channels}->{out_channels} cannot be split into {groups} groups"
                ),
            })?;
        let weights = checked_product(
            "Conv2d (weights)",
            &[out_channels, per_group, kernel, kernel],
            MAX_PARAMETERS,
        )?;
        let fan_in = checked_product("Conv2d (fan in)", &[per_group, kernel, kernel], weights)?;
        let bound = fan_in_bound(fan_in);
        let weight = path.f_uniform(
            "weight",
            &[out_channels, per_group, kernel, kernel],
            -bound,
            bound,
        )?;
        let bias = if bias {
            Some(path.f_uniform("bias", &[out_channels], -bound, bound)?)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            padding: kernel.div_euclid(2),
            groups,
        })
    }

    /// # Shapes
    /// `[B, in, H, W] -> [B, out, H, W]`.
    ///
    /// A depthwise convolution (one input channel per group) on CUDA runs
    /// in NCHW whatever the input's layout: libtorch hands a channels-last
    /// depthwise convolution to cuDNN, whose first use of one in bf16 took
    /// 3 - 6 s in a process on the H100, and a contiguous one to its own
    /// depthwise kernel. The values are the same.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.groups == 1
            && self.padding == 1
            && self.bias.is_none()
            && self.weight.size().get(2..) == Some(&[3, 3][..])
        {
            // torch-ext's weight gradient on CUDA where it applies,
            // libtorch's conv2d otherwise.
            return Ok(torch_ext::nn::conv3x3(x, &self.weight)?);
        }
        if let Some((x, weight)) = self.depthwise_nchw(x)? {
            return Ok(x.f_conv2d(
                &weight,
                self.bias.as_ref(),
                [1, 1],
                [self.padding, self.padding],
                [1, 1],
                self.groups,
            )?);
        }
        Ok(x.f_conv2d(
            &self.weight,
            self.bias.as_ref(),
            [1, 1],
            [self.padding, self.padding],
            [1, 1],
            self.groups,
        )?)
    }

    /// For a depthwise convolution of a CUDA input: the input in NCHW and
    /// the weight with NCHW strides. With one input channel per group, a
    /// channels-last `[out, 1, k, k]` weight lies in memory exactly as a
    /// contiguous one; dropping the size-1 dimension and putting it back
    /// gives it contiguous strides as a view (no copy, and a backward of
    /// views only). `None` otherwise.
    fn depthwise_nchw(&self, x: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        let per_group = self.weight.size().get(1).copied().unwrap_or(0);
        if self.groups <= 1
            || per_group != 1
            || x.dim() != 4
            || !x.device().is_cuda()
            || !self.weight.is_contiguous()
        {
            return Ok(None);
        }
        let weight = self.weight.f_squeeze_dim(1)?.f_unsqueeze(1)?;
        Ok(Some((x.f_contiguous()?, weight)))
    }

    /// Sets weight (and bias) to zero.
    pub fn zero_(&mut self) -> Result<()> {
        zero_weight_and_bias(&mut self.weight, self.bias.as_mut())
    }

    /// Number of parameters.
    pub fn param_count(&self) -> i64 {
        weight_and_bias_count(&self.weight, self.bias.as_ref())
    }
}

fn zero_weight_and_bias(weight: &mut Tensor, bias: Option<&mut Tensor>) -> Result<()> {
    zero_parameter(weight)?;
    if let Some(bias) = bias {
        zero_parameter(bias)?;
    }
    Ok(())
}

fn weight_and_bias_count(weight: &Tensor, bias: Option<&Tensor>) -> i64 {
    // Element counts of allocated tensors: far below i64::MAX.
    let count = |tensor: &Tensor| i64::try_from(tensor.numel()).unwrap_or(i64::MAX);
    count(weight).saturating_add(bias.map_or(0, count))
}

/// Fully connected layer.
#[derive(Debug)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
    /// `[out]`, when the layer has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A linear map `in_features -> out_features`.
    pub fn new(
        path: &nn::Path<'_>,
        in_features: i64,
        out_features: i64,
        bias: bool,
    ) -> Result<Linear> {
        size_in("Linear.in_features", in_features, 1, MAX_FEATURES)?;
        size_in("Linear.out_features", out_features, 1, MAX_FEATURES)?;
        checked_product(
            "Linear (weights)",
            &[in_features, out_features],
            MAX_PARAMETERS,
        )?;
        let bound = fan_in_bound(in_features);
        let weight = path.f_uniform("weight", &[out_features, in_features], -bound, bound)?;
        let bias = if bias {
            Some(path.f_uniform("bias", &[out_features], -bound, bound)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// Through `torch_ext::nn::linear` (on CUDA its own backward writes the
    /// weight and bias gradients in the parameters' dtype, the bias
    /// gradient from one column-sum kernel; libtorch's op elsewhere, with
    /// the same results up to float rounding).
    ///
    /// # Shapes
    /// `[..., in] -> [..., out]`.
    ///
    /// # Errors
    /// [`crate::Error::ShapeMismatch`] for an input whose last dimension is
    /// not `in`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let size = x.size();
        let inputs = self.weight.size().get(1).copied().unwrap_or(0);
        if size.last() != Some(&inputs) {
            let mut expected = vec![-1; size.len().saturating_sub(1)];
            expected.push(inputs);
            return Err(crate::Error::ShapeMismatch {
                op: "Linear input",
                expected,
                got: size,
            });
        }
        Ok(torch_ext::nn::linear(x, &self.weight, self.bias.as_ref())?)
    }

    /// This layer applied to each image's channel means, a CNN's
    /// classifier head, through `torch_ext::nn::pooled_linear` (on CUDA
    /// one kernel each way; libtorch's mean and [`Linear::forward`]'s op
    /// elsewhere, with the same results up to float rounding).
    ///
    /// # Shapes
    /// `[B, in, H, W] -> [B, out]`.
    ///
    /// # Errors
    /// [`crate::Error::ShapeMismatch`] for an input that is not 4-D with
    /// `in` channels.
    pub fn forward_pooled(&self, x: &Tensor) -> Result<Tensor> {
        let size = x.size();
        let inputs = self.weight.size().get(1).copied().unwrap_or(0);
        if size.len() != 4 || size.get(1) != Some(&inputs) {
            return Err(crate::Error::ShapeMismatch {
                op: "Linear pooled input",
                expected: vec![-1, inputs, -1, -1],
                got: size,
            });
        }
        Ok(torch_ext::nn::pooled_linear(
            x,
            &self.weight,
            self.bias.as_ref(),
        )?)
    }

    /// Sets weight (and bias) to zero.
    pub fn zero_(&mut self) -> Result<()> {
        zero_weight_and_bias(&mut self.weight, self.bias.as_mut())
    }

    /// Number of parameters.
    pub fn param_count(&self) -> i64 {
        weight_and_bias_count(&self.weight, self.bias.as_ref())
    }
}

/// Group normalisation with a per-channel affine.
#[derive(Debug)]
pub struct GroupNorm {
    /// `[C]`, initialised to 1.
    pub weight: Tensor,
    /// `[C]`, initialised to 0.
    pub bias: Tensor,
    groups: i64,
}

impl GroupNorm {
    /// GroupNorm over `channels` channels in `groups` groups.
    pub fn new(path: &nn::Path<'_>, groups: i64, channels: i64) -> Result<GroupNorm> {
        size_in("GroupNorm.channels", channels, 1, MAX_FEATURES)?;
        if groups < 1 || channels.checked_rem(groups) != Some(0) {
            return Err(crate::Error::InvalidConfig {
                reason: format!("GroupNorm: {channels} channels cannot form {groups} groups"),
            });
        }
        Ok(GroupNorm {
            weight: path.f_ones("weight", &[channels])?,
            bias: path.f_zeros("bias", &[channels])?,
            groups,
        })
    }

    /// Number of groups.
    pub fn groups(&self) -> i64 {
        self.groups
    }

    /// # Shapes
    /// `[B, C, ...] -> [B, C, ...]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.f_group_norm(
            self.groups,
            Some(&self.weight),
            Some(&self.bias),
            NORM_EPS,
            true,
        )?)
    }

    /// `relu(self.forward(x))`, as fused kernels on CUDA for a channels-last
    /// input (`torch_ext::nn::group_norm_relu`, which falls back to
    /// libtorch's ops where they do not apply; its fused output keeps `x`'s
    /// dtype).
    ///
    /// # Shapes
    /// `[B, C, H, W] -> [B, C, H, W]`.
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        Ok(torch_ext::nn::group_norm_relu(
            x,
            self.groups,
            &self.weight,
            &self.bias,
            NORM_EPS,
        )?)
    }

    /// `residual + self.forward_relu(x)`, a seed's residual block, with the
    /// add inside the fused forward kernel where it applies
    /// (`torch_ext::nn::group_norm_relu_add`: bit for bit the unfused sum).
    ///
    /// # Shapes
    /// `x`, `residual`: `[B, C, H, W] -> [B, C, H, W]`.
    pub fn forward_relu_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        Ok(torch_ext::nn::group_norm_relu_add(
            x,
            residual,
            self.groups,
            &self.weight,
            &self.bias,
            NORM_EPS,
        )?)
    }
}

/// Layer normalisation over the last dimension, with affine.
#[derive(Debug)]
pub struct LayerNorm {
    /// `[C]`, initialised to 1.
    pub weight: Tensor,
    /// `[C]`, initialised to 0.
    pub bias: Tensor,
    width: i64,
}

impl LayerNorm {
    /// LayerNorm over a last dimension of `width`.
    pub fn new(path: &nn::Path<'_>, width: i64) -> Result<LayerNorm> {
        size_in("LayerNorm.width", width, 1, MAX_FEATURES)?;
        Ok(LayerNorm {
            weight: path.f_ones("weight", &[width])?,
            bias: path.f_zeros("bias", &[width])?,
            width,
        })
    }

    /// As fused kernels on CUDA for a dense input (`torch_ext::nn::layer_norm`,
    /// which falls back to libtorch's op where they do not apply, with the
    /// same results up to float rounding).
    ///
    /// # Shapes
    /// `[..., C] -> [..., C]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let size = x.size();
        if size.last() != Some(&self.width) {
            let mut expected = vec![-1; size.len().saturating_sub(1)];
            expected.push(self.width);
            return Err(crate::Error::ShapeMismatch {
                op: "LayerNorm input",
                expected,
                got: size,
            });
        }
        Ok(torch_ext::nn::layer_norm(
            x,
            &self.weight,
            &self.bias,
            NORM_EPS,
        )?)
    }

    /// [`LayerNorm::forward`] for an output that feeds only linear layers:
    /// under CUDA `bf16` autocast, where those layers compute in `bf16`, the
    /// output comes in `bf16` from the normalisation's own kernel
    /// (`torch_ext::nn::layer_norm_bf16`: the values the layers would cast
    /// it to, without the cast's pass over the rows either way); otherwise
    /// exactly [`LayerNorm::forward`].
    ///
    /// # Shapes
    /// `[..., C] -> [..., C]`.
    pub fn forward_into_linear(&self, x: &Tensor) -> Result<Tensor> {
        let bf16_autocast = x.device().is_cuda()
            && torch_ext::autocast_state(torch_ext::AutocastDevice::Cuda)
                .is_ok_and(|state| state.enabled && state.dtype == tch::Kind::BFloat16);
        if !bf16_autocast || x.size().last() != Some(&self.width) {
            return self.forward(x);
        }
        Ok(torch_ext::nn::layer_norm_bf16(
            x,
            &self.weight,
            &self.bias,
            NORM_EPS,
        )?)
    }

    /// [`LayerNorm::forward_into_linear`] for a layer norm on a residual
    /// stream that goes on past it: `(stream, normed)`, where `stream` is
    /// `x` (a view, no copy) to use for the stream from here on. Under CUDA
    /// the two are one autograd node (`torch_ext::nn::layer_norm_fork`), so
    /// the stream's gradient is added into the input gradient inside the
    /// layer norm's backward kernel instead of by a separate sum; elsewhere
    /// `(x, forward_into_linear(x))`, with the same values and gradients.
    ///
    /// # Shapes
    /// `[..., C] -> ([..., C], [..., C])`.
    pub fn fork_into_linear(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        if !x.device().is_cuda() || x.size().last() != Some(&self.width) {
            return Ok((x.shallow_clone(), self.forward_into_linear(x)?));
        }
        let bf16_out = torch_ext::autocast_state(torch_ext::AutocastDevice::Cuda)
            .is_ok_and(|state| state.enabled && state.dtype == tch::Kind::BFloat16);
        Ok(torch_ext::nn::layer_norm_fork(
            x,
            &self.weight,
            &self.bias,
            NORM_EPS,
            bf16_out,
        )?)
    }
}

/// 2-D batch normalisation with running statistics (non-trainable buffers).
#[derive(Debug)]
pub struct BatchNorm2d {
    /// `[C]`, initialised to 1.
    pub weight: Tensor,
    /// `[C]`, initialised to 0.
    pub bias: Tensor,
    /// `[C]` running mean (buffer).
    pub running_mean: Tensor,
    /// `[C]` running variance (buffer).
    pub running_var: Tensor,
}

impl BatchNorm2d {
    /// BatchNorm over `channels` channels.
    pub fn new(path: &nn::Path<'_>, channels: i64) -> Result<BatchNorm2d> {
        size_in("BatchNorm2d.channels", channels, 1, MAX_FEATURES)?;
        Ok(BatchNorm2d {
            weight: path.f_ones("weight", &[channels])?,
            bias: path.f_zeros("bias", &[channels])?,
            running_mean: path.f_zeros_no_train("running_mean", &[channels])?,
            running_var: path.f_ones_no_train("running_var", &[channels])?,
        })
    }

    /// Batch statistics (and a running-statistics update) when `train`,
    /// running statistics otherwise.
    ///
    /// # Shapes
    /// `[B, C, H, W] -> [B, C, H, W]`.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        Ok(x.f_batch_norm(
            Some(&self.weight),
            Some(&self.bias),
            Some(&self.running_mean),
            Some(&self.running_var),
            train,
            BATCH_NORM_MOMENTUM,
            NORM_EPS,
            true,
        )?)
    }
    /// `relu(self.forward(x, train))`, as fused kernels on CUDA in training
    /// and in evaluation (`torch_ext::nn::batch_norm_relu`, which falls back
    /// to libtorch's ops where they do not apply).
    ///
    /// # Shapes
    /// `[B, C, H, W] -> [B, C, H, W]`.
    pub fn forward_relu(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        Ok(torch_ext::nn::batch_norm_relu(
            x,
            &self.weight,
            &self.bias,
            Some(&self.running_mean),
            Some(&self.running_var),
            train,
            BATCH_NORM_MOMENTUM,
            NORM_EPS,
        )?)
    }

    /// `max_pool2x2(self.forward_relu(x, train))`: on CUDA in training one
    /// autograd node whose kernels never write the full-size activation
    /// (`torch_ext::nn::batch_norm_relu_pool2x2`, which falls back to the
    /// two ops where it does not apply).
    ///
    /// # Shapes
    /// `[B, C, H, W] -> [B, C, H / 2, W / 2]`.
    pub fn forward_relu_pool(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        Ok(torch_ext::nn::batch_norm_relu_pool2x2(
            x,
            &self.weight,
            &self.bias,
            Some(&self.running_mean),
            Some(&self.running_var),
            train,
            BATCH_NORM_MOMENTUM,
            NORM_EPS,
        )?)
    }
}

/// Zeroes a parameter in place without recording the write in autograd.
pub fn zero_parameter(parameter: &mut Tensor) -> Result<()> {
    let _guard = tch::no_grad_guard();
    let _zeroed = parameter.f_zero_()?;
    Ok(())
}

/// Fills a parameter in place with `value` without recording the write in autograd.
pub fn fill_parameter(parameter: &mut Tensor, value: f64) -> Result<()> {
    let _guard = tch::no_grad_guard();
    let _filled = parameter.f_fill_(value)?;
    Ok(())
}

/// Multi-head causal self-attention: `proj(SDPA(q, k, v, causal))` with
/// `q, k, v` from one `qkv` projection, through
/// `torch_ext::nn::causal_attention` (on CUDA in bf16, for short sequences,
/// one kernel each way over the packed projection; libtorch's fused SDPA
/// otherwise).
///
/// # Shapes
/// `[B, T, C] -> [B, T, C]`; `qkv: C -> 3C`, `proj: C -> C`, `C % heads == 0`.
pub fn causal_self_attention(
    x: &Tensor,
    qkv: &Linear,
    proj: &Linear,
    heads: i64,
) -> Result<Tensor> {
    let size = x.size();
    let &[_, _, width] = size.as_slice() else {
        return Err(crate::Error::ShapeMismatch {
            op: "attention input",
            expected: vec![-1, -1, -1],
            got: size,
        });
    };
    if heads < 1 || width.checked_rem(heads) != Some(0) {
        return Err(crate::Error::InvalidConfig {
            reason: format!("attention: width {width} is not divisible by {heads} heads"),
        });
    }
    let projected = qkv.forward(x)?; // [B, T, 3C]
    let merged = torch_ext::nn::causal_attention(&projected, heads)?; // [B, T, C]
    proj.forward(&merged)
}
