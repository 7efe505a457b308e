//! [`PolicyNetwork`]: the factored recurrent actor-critic (reference §3.4,
//! HEAD `FactoredRecurrentActorCritic`).
//!
//! ```text
//! blueprint indices [B, S] -> embedding (14 x 4, N(0, 0.02); -1 -> null row 13) -> [B, 4S]
//! obs [B, D] ++ embeddings -> Linear(D + 4S -> feature) -> LayerNorm -> ReLU
//!   -> (Linear(feature -> hidden) when the widths differ)
//!   -> ResidualLSTM: per layer  x + LayerNorm(LSTM(x))          [B, hidden]
//!   -> one head per HEAD_NAMES entry: Linear(hidden -> hidden/2) -> ReLU -> Linear(-> n)
//!      (blueprint: hidden -> hidden -> hidden/2 -> 13)
//!   -> critic V(s): hidden -> hidden/2 (LN, ReLU) -> hidden/4 (LN, ReLU) -> hidden/8 (ReLU) -> 1
//! auxiliary heads (the PPO update only, [`PolicyNetwork::auxiliary`]):
//!   q_head Q(s, op): detached trunk ++ op one-hot -> as the critic -> 1
//!   contribution_predictor: trunk -> hidden/2 (LN, ReLU, dropout 0.1) -> hidden/4 (ReLU) -> num_slots
//! ```
//!
//! Initialisation: every linear weight orthogonal with gain √2 and a zero
//! bias, the heads' output layers gain 0.01, the critic's output layer gain
//! 0.1; LSTM weights orthogonal, forget-gate biases `1 + ln(layers)`.
//!
//! One call runs every environment of a batch: [`PolicyNetwork::forward`]
//! takes `[B, D]` observations, `[B, S]` blueprint indices and the LSTM state
//! `[layers, B, hidden]`, and returns fp32 logits per head, the value `[B]`
//! and the new state; [`PolicyNetwork::forward_sequence`] unrolls `[B, T, D]`
//! from a state (what the PPO update needs). Shapes, dtypes and devices are
//! checked before libtorch sees them. Blueprint indices are built and
//! checked on the host ([`crate::features`]); on the device an index outside
//! `[0, 13)` selects the null row, so a bad index can never fault a kernel.
//!
//! Precision ([`PolicyNetwork::set_precision`], reference §4.6): fp32 by
//! default; with [`PolicyPrecision::Bf16`] every forward (acting, the
//! bootstrap value and the PPO update's unroll) runs under bf16 autocast,
//! while logits, values and the LSTM state still leave the network in fp32,
//! so log-probabilities and the probability floors are computed in fp32.
//! The autocast cast cache is off, so a captured step casts the live weights
//! at every replay. fp16 is not offered: the policy's optimizer has no
//! gradient scaler. On a CPU whose oneDNN has no bf16 LSTM (no AVX-512:
//! [`cpu_bf16_lstm_supported`], probed once per process), the LSTM layers
//! of a bf16 forward run in full precision (inputs, state and weights cast
//! to `f64`, which autocast leaves alone; outputs back to `f32`) and the
//! rest in bf16, reported once as a `tracing` warning. The same fallback
//! applies when a caller opens its own CPU bf16 autocast region around an
//! fp32 forward, and always under a caller's CPU fp16 autocast region.
//!
//! Values: on the CPU, a NaN or infinite observation or LSTM state is
//! [`Error::NonFinite`] before anything runs, and masks with an all-false
//! row are [`Error::EmptyMask`] ([`MaskTensors::check`]). On CUDA the
//! per-step inputs are not read back (the step must neither synchronise nor
//! read back inside a graph capture); they are built from values checked on
//! the host ([`crate::features`], [`crate::masks`], [`crate::normaliser`]).

use tch::{Device, Kind, Tensor, nn};

mod auxiliary;
mod forward;
mod packed;
mod precision;
mod state;

pub use auxiliary::{AUXILIARY_OUTPUT_GAIN, AuxiliaryOutput, CONTRIBUTION_DROPOUT};

pub use precision::{PolicyPrecision, cpu_bf16_lstm_fallback_reason, cpu_bf16_lstm_supported};
pub use state::{LstmHealth, LstmState};

use super::layers::{BlockSpec, LayerNorm, Linear, LstmLayer, Mlp};
use crate::error::{TorchResultExt, shape_mismatch};
use crate::features::{BLUEPRINT_EMBED_DIM, NUM_BLUEPRINTS, layout};
use crate::heads::{BLUEPRINT, head_sizes};
use crate::{Error, Result};
use leyline::{DEFAULT_NUM_SLOTS, NUM_ACTION_HEADS};

#[cfg(doc)]
use crate::masks::MaskTensors;

/// Widest feature or hidden layer the network takes.
pub const MAX_WIDTH: i64 = 1 << 14;
/// Most residual LSTM layers.
pub const MAX_LSTM_LAYERS: usize = 16;
/// Standard deviation of the blueprint embedding's initialisation.
pub const EMBEDDING_INIT_STD: f64 = 0.02;
/// Gain of the heads' output layers.
pub const POLICY_OUTPUT_GAIN: f64 = 0.01;
/// Gain of the critic's output layer.
pub const VALUE_OUTPUT_GAIN: f64 = 0.1;

/// The network's sizes (serialised next to checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Slots per observation (the slot head's size).
    pub num_slots: usize,
    /// Width of the feature net (512 at HEAD).
    pub feature_dim: i64,
    /// LSTM hidden width (512 at HEAD).
    pub hidden_dim: i64,
    /// Residual LSTM layers (1 at HEAD).
    pub lstm_layers: usize,
}

impl Default for PolicyConfig {
    /// HEAD's defaults: three slots, feature and hidden width 512, one LSTM
    /// layer.
    fn default() -> Self {
        PolicyConfig {
            num_slots: DEFAULT_NUM_SLOTS,
            feature_dim: 512,
            hidden_dim: 512,
            lstm_layers: 1,
        }
    }
}

impl PolicyConfig {
    /// Checks the sizes: slots in `[1, MAX_SLOTS]`, feature width in
    /// `[1, MAX_WIDTH]`, hidden width in `[8, MAX_WIDTH]` (the critic narrows
    /// it by 8), layers in `[1, MAX_LSTM_LAYERS]`.
    pub fn validate(&self) -> Result<()> {
        layout(self.num_slots).map_err(|_| Error::InvalidConfig {
            field: "PolicyConfig.num_slots",
            reason: format!(
                "{} is outside [1, {}]",
                self.num_slots,
                crate::features::MAX_SLOTS
            ),
        })?;
        if !(1..=MAX_WIDTH).contains(&self.feature_dim) {
            return Err(Error::InvalidConfig {
                field: "PolicyConfig.feature_dim",
                reason: format!("{} is outside [1, {MAX_WIDTH}]", self.feature_dim),
            });
        }
        if !(8..=MAX_WIDTH).contains(&self.hidden_dim) {
            return Err(Error::InvalidConfig {
                field: "PolicyConfig.hidden_dim",
                reason: format!("{} is outside [8, {MAX_WIDTH}]", self.hidden_dim),
            });
        }
        if !(1..=MAX_LSTM_LAYERS).contains(&self.lstm_layers) {
            return Err(Error::InvalidConfig {
                field: "PolicyConfig.lstm_layers",
                reason: format!("{} is outside [1, {MAX_LSTM_LAYERS}]", self.lstm_layers),
            });
        }
        Ok(())
    }

    /// Observation width (`23 + 31 · num_slots`).
    pub fn obs_dim(&self) -> usize {
        layout(self.num_slots).map_or(0, |layout| layout.obs_dim())
    }
}

/// What one forward pass returns.
#[derive(Debug)]
pub struct PolicyOutput {
    /// Raw logits per head ([`leyline::HEAD_NAMES`] order), fp32,
    /// `[B, n]` (`[B, T, n]` for sequences).
    pub logits: [Tensor; NUM_ACTION_HEADS],
    /// Logits with the base masks applied (masked options at
    /// [`super::sampling::MASKED_LOGIT_VALUE`]), fp32; `None` from
    /// [`PolicyNetwork::forward_sequence`].
    pub masked_logits: Option<[Tensor; NUM_ACTION_HEADS]>,
    /// The critic's V(s), fp32, `[B]` (`[B, T]`).
    pub value: Tensor,
    /// The LSTM state after the last step.
    pub hidden: LstmState,
    /// The trunk's output `[B, T, hidden]` (the residual LSTM's), for
    /// [`PolicyNetwork::auxiliary`]; `Some` from
    /// [`PolicyNetwork::forward_sequence`] only.
    pub features: Option<Tensor>,
}

/// The policy network (see the module docs).
#[derive(Debug)]
pub struct PolicyNetwork {
    config: PolicyConfig,
    device: Device,
    obs_dim: i64,
    embedding: Tensor,
    feature: Linear,
    feature_norm: LayerNorm,
    input_proj: Option<Linear>,
    lstm: Vec<(LstmLayer, LayerNorm)>,
    heads: Vec<Mlp>,
    critic: Mlp,
    q_head: Mlp,
    contribution: Mlp,
    /// `[total]` i64: the head each packed logit belongs to.
    head_of: Tensor,
    precision: PolicyPrecision,
}

fn as_i64(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl PolicyNetwork {
    /// Builds the network's variables under `path` (see the module docs for
    /// the initialisation; seed libtorch's generator first for a
    /// reproducible one).
    pub fn new(path: &nn::Path<'_>, config: PolicyConfig) -> Result<PolicyNetwork> {
        config.validate()?;
        let obs_dim = as_i64(config.obs_dim());
        let embed_width = as_i64(BLUEPRINT_EMBED_DIM.saturating_mul(config.num_slots));
        let hidden = config.hidden_dim;
        let half = hidden / 2;
        let embedding = path
            .sub("blueprint_embedding")
            .f_randn(
                "weight",
                &[
                    as_i64(NUM_BLUEPRINTS.saturating_add(1)),
                    as_i64(BLUEPRINT_EMBED_DIM),
                ],
                0.0,
                EMBEDDING_INIT_STD,
            )
            .op("blueprint embedding")?;
        let feature_path = path.sub("feature_net");
        let feature = Linear::new(
            &feature_path,
            obs_dim.saturating_add(embed_width),
            config.feature_dim,
            std::f64::consts::SQRT_2,
        )?;
        let feature_norm = LayerNorm::new(&feature_path.sub("norm"), config.feature_dim)?;
        let input_proj = if config.feature_dim == hidden {
            None
        } else {
            Some(Linear::new(
                &path.sub("lstm_input_proj"),
                config.feature_dim,
                hidden,
                std::f64::consts::SQRT_2,
            )?)
        };
        let forget_bias = 1.0 + (config.lstm_layers as f64).ln();
        let lstm = (0..config.lstm_layers)
            .map(|layer| {
                let layer_path = path.sub("lstm").sub(layer.to_string());
                Ok((
                    LstmLayer::new(&layer_path, hidden, forget_bias)?,
                    LayerNorm::new(&layer_path.sub("norm"), hidden)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let heads_path = path.sub("heads");
        let heads = head_sizes(config.num_slots)
            .iter()
            .enumerate()
            .map(|(head, size)| {
                let name = leyline::HEAD_NAMES.get(head).copied().unwrap_or("head");
                let output = BlockSpec {
                    output: as_i64(*size),
                    norm: false,
                };
                let plain = |output: i64| BlockSpec {
                    output,
                    norm: false,
                };
                let specs: Vec<BlockSpec> = if head == BLUEPRINT {
                    vec![plain(hidden), plain(half), output]
                } else {
                    vec![plain(half), output]
                };
                Mlp::new(&heads_path.sub(name), hidden, &specs, POLICY_OUTPUT_GAIN)
            })
            .collect::<Result<Vec<_>>>()?;
        let normed = |output: i64| BlockSpec { output, norm: true };
        let critic = Mlp::new(
            &path.sub("state_value_head"),
            hidden,
            &[
                normed(half),
                normed(hidden / 4),
                BlockSpec {
                    output: hidden / 8,
                    norm: false,
                },
                BlockSpec {
                    output: 1,
                    norm: false,
                },
            ],
            VALUE_OUTPUT_GAIN,
        )?;
        // Built after every other variable, so the others draw the same
        // initial values as before the auxiliary heads existed.
        let (q_head, contribution) = auxiliary::build(path, &config, hidden)?;
        let owners: Vec<i64> = head_sizes(config.num_slots)
            .iter()
            .enumerate()
            .flat_map(|(head, size)| std::iter::repeat_n(as_i64(head), *size))
            .collect();
        let head_of = Tensor::f_from_slice(&owners)
            .op("head index")?
            .f_to_device(path.device())
            .op("head index")?;
        Ok(PolicyNetwork {
            head_of,
            config,
            device: path.device(),
            obs_dim,
            embedding,
            feature,
            feature_norm,
            input_proj,
            lstm,
            heads,
            critic,
            q_head,
            contribution,
            precision: PolicyPrecision::Fp32,
        })
    }

    /// The forward passes' precision.
    pub fn precision(&self) -> PolicyPrecision {
        self.precision
    }

    /// Sets the forward passes' precision (see the module docs). A policy
    /// step captured in a CUDA graph keeps the precision it was captured
    /// with: capture after setting it.
    pub fn set_precision(&mut self, precision: PolicyPrecision) {
        self.precision = precision;
    }

    /// The autocast region of one forward pass, if the precision asks for
    /// one; the cast cache is off so a captured pass reads the live weights.
    fn autocast(&self) -> Result<Option<torch_ext::AutocastGuard>> {
        if self.precision == PolicyPrecision::Fp32 {
            return Ok(None);
        }
        let device = if self.device.is_cuda() {
            torch_ext::AutocastDevice::Cuda
        } else {
            torch_ext::AutocastDevice::Cpu
        };
        torch_ext::AutocastGuard::with_cache(device, Kind::BFloat16, false)
            .map(Some)
            .map_err(|source| Error::Device {
                op: "policy autocast",
                source,
            })
    }

    /// The sizes.
    pub fn config(&self) -> PolicyConfig {
        self.config
    }

    /// The device the variables live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A zero LSTM state for `batch` environments.
    pub fn initial_state(&self, batch: usize) -> Result<LstmState> {
        LstmState::zeros(
            self.config.lstm_layers,
            batch,
            self.config.hidden_dim,
            self.device,
        )
    }

    fn check(&self, what: &'static str, tensor: &Tensor, shape: &[i64], kind: Kind) -> Result<()> {
        if tensor.size() != shape || tensor.kind() != kind || tensor.device() != self.device {
            return Err(shape_mismatch(
                what,
                format!("{kind:?} {shape:?} on {:?}", self.device),
                (tensor.kind(), tensor.size(), tensor.device()),
            ));
        }
        Ok(())
    }

    /// Output-layer weight of head `head` (for tests of the
    /// initialisation).
    pub fn head_output_weight(&self, head: usize) -> Option<&Tensor> {
        self.heads
            .get(head)
            .and_then(Mlp::output_layer)
            .map(Linear::weight)
    }

    /// Output-layer weight of the critic.
    pub fn value_output_weight(&self) -> Option<&Tensor> {
        self.critic.output_layer().map(Linear::weight)
    }

    /// `[w_ih, w_hh, b_ih, b_hh]` of LSTM layer `layer`.
    pub fn lstm_parameters(&self, layer: usize) -> Option<&[Tensor; 4]> {
        self.lstm.get(layer).map(|(lstm, _)| lstm.params())
    }

    /// The blueprint embedding table `[14, 4]`.
    pub fn blueprint_embedding(&self) -> &Tensor {
        &self.embedding
    }
}
