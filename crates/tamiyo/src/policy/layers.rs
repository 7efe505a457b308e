//! The policy network's layers on tch's fallible calls, initialised as the
//! reference initialises them (reference §3.4): linear weights orthogonal
//! with a chosen gain and zero biases, LayerNorm weight 1 and bias 0, LSTM
//! weights orthogonal (gain 1) with zero biases except the forget gate's
//! slice, set to `1 + ln(layers)` in both bias vectors, as the reference's
//! `ResidualLSTM` does.

use tch::{Kind, Tensor, nn};

use crate::Result;
use crate::error::TorchResultExt;

/// Epsilon of the LayerNorms (PyTorch default).
pub const LAYER_NORM_EPS: f64 = 1e-5;

/// A fully connected layer with an orthogonal weight and a zero bias.
#[derive(Debug)]
pub(crate) struct Linear {
    weight: Tensor,
    bias: Tensor,
}

impl Linear {
    /// `input -> output`, weight orthogonal with `gain`.
    pub(crate) fn new(path: &nn::Path<'_>, input: i64, output: i64, gain: f64) -> Result<Linear> {
        Ok(Linear {
            weight: path
                .f_orthogonal("weight", &[output, input], gain)
                .op("linear weight")?,
            bias: path.f_zeros("bias", &[output]).op("linear bias")?,
        })
    }

    /// `[..., input] -> [..., output]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.f_linear(&self.weight, Some(&self.bias)).op("linear")
    }

    /// The weight (for tests of the initialisation).
    pub(crate) fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub(crate) fn bias(&self) -> &Tensor {
        &self.bias
    }
}

/// LayerNorm over the last dimension.
#[derive(Debug)]
pub(crate) struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    width: i64,
}

impl LayerNorm {
    pub(crate) fn new(path: &nn::Path<'_>, width: i64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: path.f_ones("weight", &[width]).op("layer norm weight")?,
            bias: path.f_zeros("bias", &[width]).op("layer norm bias")?,
            width,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.f_layer_norm(
            [self.width].as_slice(),
            Some(&self.weight),
            Some(&self.bias),
            LAYER_NORM_EPS,
            true,
        )
        .op("layer norm")
    }
}

/// One block of a multilayer perceptron: linear, optional LayerNorm,
/// optional ReLU.
#[derive(Debug)]
struct Block {
    linear: Linear,
    norm: Option<LayerNorm>,
    relu: bool,
}

/// A stack of [`Block`]s; the last has no activation.
#[derive(Debug)]
pub(crate) struct Mlp {
    blocks: Vec<Block>,
}

/// One layer of an [`Mlp`] to build: output width, LayerNorm or not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockSpec {
    pub(crate) output: i64,
    pub(crate) norm: bool,
}

impl Mlp {
    /// Blocks `input -> spec₀ -> spec₁ …`; hidden layers use ReLU and gain
    /// √2, the output layer no activation and `output_gain`.
    pub(crate) fn new(
        path: &nn::Path<'_>,
        input: i64,
        specs: &[BlockSpec],
        output_gain: f64,
    ) -> Result<Mlp> {
        let mut blocks = Vec::with_capacity(specs.len());
        let mut width = input;
        let last = specs.len().saturating_sub(1);
        for (index, spec) in specs.iter().enumerate() {
            let is_last = index == last;
            let layer = path.sub(index.to_string());
            let gain = if is_last {
                output_gain
            } else {
                std::f64::consts::SQRT_2
            };
            blocks.push(Block {
                linear: Linear::new(&layer, width, spec.output, gain)?,
                norm: if spec.norm {
                    Some(LayerNorm::new(&layer.sub("norm"), spec.output)?)
                } else {
                    None
                },
                relu: !is_last,
            });
            width = spec.output;
        }
        Ok(Mlp { blocks })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.shallow_clone();
        for block in &self.blocks {
            x = block.linear.forward(&x)?;
            if let Some(norm) = &block.norm {
                x = norm.forward(&x)?;
            }
            if block.relu {
                x = x.f_relu().op("relu")?;
            }
        }
        Ok(x)
    }

    /// [`Mlp::forward`] with dropout of probability `p` after the first
    /// block's activation, applied when `train`.
    pub(crate) fn forward_dropout_first(&self, x: &Tensor, p: f64, train: bool) -> Result<Tensor> {
        let mut x = x.shallow_clone();
        for (index, block) in self.blocks.iter().enumerate() {
            x = block.linear.forward(&x)?;
            if let Some(norm) = &block.norm {
                x = norm.forward(&x)?;
            }
            if block.relu {
                x = x.f_relu().op("relu")?;
            }
            if index == 0 && train && p > 0.0 {
                x = x.f_dropout(p, true).op("dropout")?;
            }
        }
        Ok(x)
    }

    /// The output layer (for tests of the initialisation).
    pub(crate) fn output_layer(&self) -> Option<&Linear> {
        self.blocks.last().map(|block| &block.linear)
    }

    /// The linear layers, input to output.
    pub(crate) fn linears(&self) -> Vec<&Linear> {
        self.blocks.iter().map(|block| &block.linear).collect()
    }
}

/// cuDNN's mode number of an LSTM.
const CUDNN_LSTM_MODE: i64 = 2;

/// One single-layer LSTM (batch first) with its weights.
#[derive(Debug)]
pub(crate) struct LstmLayer {
    params: [Tensor; 4],
}

impl LstmLayer {
    /// An LSTM `hidden -> hidden` whose forget-gate biases are
    /// `forget_bias` (in both bias vectors).
    pub(crate) fn new(path: &nn::Path<'_>, hidden: i64, forget_bias: f64) -> Result<LstmLayer> {
        let gates = hidden.saturating_mul(4);
        let w_ih = path
            .f_orthogonal("weight_ih", &[gates, hidden], 1.0)
            .op("lstm weight")?;
        let w_hh = path
            .f_orthogonal("weight_hh", &[gates, hidden], 1.0)
            .op("lstm weight")?;
        let b_ih = path.f_zeros("bias_ih", &[gates]).op("lstm bias")?;
        let b_hh = path.f_zeros("bias_hh", &[gates]).op("lstm bias")?;
        // Gate order i, f, g, o: the forget gate is the second quarter.
        for bias in [&b_ih, &b_hh] {
            let _guard = tch::no_grad_guard();
            let mut forget = bias.f_narrow(0, hidden, hidden).op("forget bias")?;
            let _ = forget.f_fill_(forget_bias).op("forget bias")?;
        }
        // cuDNN wants the four tensors as views of one buffer; otherwise it
        // copies them into one at every call (and warns each time).
        if path.device().is_cuda() && tch::Cuda::cudnn_is_available() {
            let _guard = tch::no_grad_guard();
            let _ = Tensor::f_internal_cudnn_rnn_flatten_weight(
                &[&w_ih, &w_hh, &b_ih, &b_hh],
                4,
                hidden,
                CUDNN_LSTM_MODE,
                hidden,
                0,
                1,
                true,
                false,
            )
            .op("lstm flatten")?;
        }
        Ok(LstmLayer {
            params: [w_ih, w_hh, b_ih, b_hh],
        })
    }

    /// `x` `[B, T, H]` from state `h`, `c` (`[1, B, H]` each) to the
    /// outputs `[B, T, H]` and the final state.
    pub(crate) fn forward(&self, x: &Tensor, h: &Tensor, c: &Tensor) -> Result<[Tensor; 3]> {
        let params: Vec<&Tensor> = self.params.iter().collect();
        let (output, h, c) = x
            .f_lstm(&[h, c], &params, true, 1, 0.0, true, false, true)
            .op("lstm")?;
        Ok([output, h, c])
    }

    /// [`LstmLayer::forward`] in full precision whatever autocast is on:
    /// inputs, state and weights cast to `f64` (autocast never casts `f64`
    /// down, and libtorch's native LSTM, not oneDNN's, runs it), outputs
    /// cast back to `f32`. Gradients flow through the casts to the `f32`
    /// weights. The CPU fallback where oneDNN has no bf16 LSTM (see
    /// [`super::network::cpu_bf16_lstm_supported`]).
    pub(crate) fn forward_full_precision(
        &self,
        x: &Tensor,
        h: &Tensor,
        c: &Tensor,
    ) -> Result<[Tensor; 3]> {
        let wide = |t: &Tensor| t.f_to_kind(Kind::Double).op("lstm to f64");
        let params = self.params.iter().map(wide).collect::<Result<Vec<_>>>()?;
        let params: Vec<&Tensor> = params.iter().collect();
        let (output, h, c) = wide(x)?
            .f_lstm(
                &[&wide(h)?, &wide(c)?],
                &params,
                true,
                1,
                0.0,
                true,
                false,
                true,
            )
            .op("lstm (full precision)")?;
        let narrow = |t: &Tensor| t.f_to_kind(Kind::Float).op("lstm to f32");
        Ok([narrow(&output)?, narrow(&h)?, narrow(&c)?])
    }

    /// `[w_ih, w_hh, b_ih, b_hh]` (for tests of the initialisation).
    pub(crate) fn params(&self) -> &[Tensor; 4] {
        &self.params
    }
}

/// `x` as `f32` (logits and values leave the network in fp32).
pub(crate) fn to_f32(x: &Tensor) -> Result<Tensor> {
    if x.kind() == Kind::Float {
        Ok(x.shallow_clone())
    } else {
        x.f_to_kind(Kind::Float).op("to f32")
    }
}
