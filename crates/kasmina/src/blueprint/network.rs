//! The layers of each blueprint ([`SeedNetwork`]) and the built
//! [`SeedModule`] that owns them with their `VarStore`. Which layers, shapes
//! and initialisations each blueprint has is tabled in [`super`].

#![warn(clippy::arithmetic_side_effects)]

use tch::{Device, Tensor, nn};

use super::{
    ATTENTION_GATE_BIAS, ATTENTION_SEED_HEADS, Blueprint, LORA_LARGE_RANK, LORA_RANK,
    attention_width, bottleneck_width, group_norm_groups,
};
use crate::host::Topology;
use crate::layers::{Conv2d, GroupNorm, LayerNorm, Linear, causal_self_attention, fill_parameter};
use crate::validate::shape;
use crate::{Error, Result};

/// conv3x3 -> GroupNorm -> ReLU, the building block of conv_light/conv_heavy.
#[derive(Debug)]
struct SeedConvBlock {
    conv: Conv2d,
    norm: GroupNorm,
}

impl SeedConvBlock {
    fn new(path: &nn::Path<'_>, channels: i64) -> Result<SeedConvBlock> {
        Ok(SeedConvBlock {
            conv: Conv2d::new(&path.sub("conv"), channels, channels, 3, 1, false)?,
            norm: GroupNorm::new(&path.sub("gn"), group_norm_groups(channels), channels)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward_relu(&self.conv.forward(x)?)
    }

    /// `residual + self.forward(x)`, the add fused into the norm's kernel.
    fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        self.norm.forward_relu_add(&self.conv.forward(x)?, residual)
    }
}

/// The layers of one blueprint.
#[derive(Debug)]
enum SeedNetwork {
    Noop,
    Norm {
        norm: GroupNorm,
        scale: Tensor,
    },
    Attention {
        squeeze: Linear,
        excite: Linear,
    },
    Depthwise {
        depthwise: Conv2d,
        pointwise: Conv2d,
        norm: GroupNorm,
    },
    Bottleneck {
        down: Conv2d,
        conv: Conv2d,
        up: Conv2d,
        norm: GroupNorm,
    },
    ConvSmall {
        conv: Conv2d,
        norm: GroupNorm,
    },
    ConvLight {
        block: SeedConvBlock,
    },
    ConvHeavy {
        first: SeedConvBlock,
        second: SeedConvBlock,
    },
    LayerNormMix {
        norm: LayerNorm,
        scale: Tensor,
    },
    LowRank {
        down: Linear,
        up: Linear,
    },
    CausalAttention {
        qkv: Linear,
        proj: Linear,
        heads: i64,
    },
    Mlp {
        fc1: Linear,
        fc2: Linear,
    },
}

impl SeedNetwork {
    fn build(blueprint: Blueprint, root: &nn::Path<'_>, c: i64) -> Result<SeedNetwork> {
        let groups = group_norm_groups(c);
        Ok(match blueprint {
            Blueprint::Noop => SeedNetwork::Noop,
            Blueprint::Norm => SeedNetwork::Norm {
                norm: GroupNorm::new(&root.sub("norm"), groups, c)?,
                scale: root.f_zeros("scale", &[1])?,
            },
            Blueprint::Attention => {
                let r = attention_width(c);
                let squeeze = Linear::new(&root.sub("fc1"), c, r, false)?;
                let mut excite = Linear::new(&root.sub("fc2"), r, c, true)?;
                excite.zero_()?;
                if let Some(bias) = excite.bias.as_mut() {
                    fill_parameter(bias, ATTENTION_GATE_BIAS)?;
                }
                SeedNetwork::Attention { squeeze, excite }
            }
            Blueprint::Depthwise => SeedNetwork::Depthwise {
                depthwise: Conv2d::new(&root.sub("depthwise"), c, c, 3, c, false)?,
                pointwise: Conv2d::new(&root.sub("pointwise"), c, c, 1, 1, false)?,
                norm: GroupNorm::new(&root.sub("gn"), groups, c)?,
            },
            Blueprint::Bottleneck => {
                let b = bottleneck_width(c);
                let down = Conv2d::new(&root.sub("down"), c, b, 1, 1, false)?;
                let conv = Conv2d::new(&root.sub("conv"), b, b, 3, 1, false)?;
                let mut up = Conv2d::new(&root.sub("up"), b, c, 1, 1, false)?;
                up.zero_()?;
                SeedNetwork::Bottleneck {
                    down,
                    conv,
                    up,
                    norm: GroupNorm::new(&root.sub("gn"), groups, c)?,
                }
            }
            Blueprint::ConvSmall => {
                let mut conv = Conv2d::new(&root.sub("conv"), c, c, 1, 1, false)?;
                conv.zero_()?;
                SeedNetwork::ConvSmall {
                    conv,
                    norm: GroupNorm::new(&root.sub("gn"), groups, c)?,
                }
            }
            Blueprint::ConvLight => SeedNetwork::ConvLight {
                block: SeedConvBlock::new(&root.sub("enhance"), c)?,
            },
            Blueprint::ConvHeavy => SeedNetwork::ConvHeavy {
                first: SeedConvBlock::new(&root.sub("enhance0"), c)?,
                second: SeedConvBlock::new(&root.sub("enhance1"), c)?,
            },
            other => return Err(other.not_in(Topology::Cnn)),
        })
    }

    #[expect(
        clippy::arithmetic_side_effects,
        reason = "c was checked by Blueprint::check_dim (<= MAX_CHANNELS): 4 c cannot overflow"
    )]
    fn build_transformer(blueprint: Blueprint, root: &nn::Path<'_>, c: i64) -> Result<SeedNetwork> {
        let low_rank = |rank: i64| -> Result<SeedNetwork> {
            let down = Linear::new(&root.sub("down"), c, rank, false)?;
            let mut up = Linear::new(&root.sub("up"), rank, c, false)?;
            up.zero_()?;
            Ok(SeedNetwork::LowRank { down, up })
        };
        let mlp = |expansion: i64| -> Result<SeedNetwork> {
            let fc1 = Linear::new(&root.sub("fc1"), c, expansion * c, true)?;
            let mut fc2 = Linear::new(&root.sub("fc2"), expansion * c, c, true)?;
            fc2.zero_()?;
            Ok(SeedNetwork::Mlp { fc1, fc2 })
        };
        Ok(match blueprint {
            Blueprint::Noop => SeedNetwork::Noop,
            Blueprint::Norm => SeedNetwork::LayerNormMix {
                norm: LayerNorm::new(&root.sub("norm"), c)?,
                scale: root.f_zeros("scale", &[1])?,
            },
            Blueprint::Lora => low_rank(LORA_RANK)?,
            Blueprint::LoraLarge => low_rank(LORA_LARGE_RANK)?,
            Blueprint::Attention | Blueprint::FlexAttention => {
                if c % ATTENTION_SEED_HEADS != 0 {
                    return Err(Error::InvalidConfig {
                        reason: format!(
                            "attention seed: width {c} is not divisible by {ATTENTION_SEED_HEADS} heads"
                        ),
                    });
                }
                let qkv = Linear::new(&root.sub("qkv"), c, 3 * c, true)?;
                let mut proj = Linear::new(&root.sub("proj"), c, c, true)?;
                proj.zero_()?;
                SeedNetwork::CausalAttention {
                    qkv,
                    proj,
                    heads: ATTENTION_SEED_HEADS,
                }
            }
            Blueprint::MlpSmall => mlp(2)?,
            Blueprint::Mlp => mlp(4)?,
            other => return Err(other.not_in(Topology::Transformer)),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            SeedNetwork::Noop => x.shallow_clone(),
            SeedNetwork::LayerNormMix { norm, scale } => {
                let mix = norm.forward(x)?.f_sub(x)?;
                x.f_add(&mix.f_mul(&scale.f_tanh()?)?)?
            }
            SeedNetwork::LowRank { down, up } => x.f_add(&up.forward(&down.forward(x)?)?)?,
            SeedNetwork::CausalAttention { qkv, proj, heads } => {
                x.f_add(&causal_self_attention(x, qkv, proj, *heads)?)?
            }
            SeedNetwork::Mlp { fc1, fc2 } => {
                x.f_add(&fc2.forward(&fc1.forward(x)?.f_gelu("none")?)?)?
            }
            SeedNetwork::Norm { norm, scale } => {
                let mix = norm.forward(x)?.f_sub(x)?;
                x.f_add(&mix.f_mul(&scale.f_tanh()?)?)?
            }
            SeedNetwork::Attention { squeeze, excite } => {
                // x * sigmoid(excite(relu(squeeze(mean_hw x)))): one kernel
                // forward and two backward on CUDA (libtorch's ops elsewhere).
                let Some(bias) = excite.bias.as_ref() else {
                    return Err(Error::InvalidConfig {
                        reason: "attention seed: the excite layer has no bias".to_owned(),
                    });
                };
                torch_ext::nn::squeeze_excite(x, &squeeze.weight, &excite.weight, bias)?
            }
            SeedNetwork::Depthwise {
                depthwise,
                pointwise,
                norm,
            } => {
                let residual = norm.forward(&pointwise.forward(&depthwise.forward(x)?)?)?;
                x.f_add(&residual.f_relu()?)?
            }
            SeedNetwork::Bottleneck {
                down,
                conv,
                up,
                norm,
            } => {
                let hidden = down.forward(x)?.f_relu()?;
                let hidden = conv.forward(&hidden)?.f_relu()?;
                x.f_add(&norm.forward(&up.forward(&hidden)?)?)?
            }
            SeedNetwork::ConvSmall { conv, norm } => norm.forward_relu_add(&conv.forward(x)?, x)?,
            SeedNetwork::ConvLight { block } => block.forward_add(x, x)?,
            SeedNetwork::ConvHeavy { first, second } => {
                second.forward_add(&first.forward(x)?, x)?
            }
        })
    }

    fn zero_init_final_affine(&mut self) -> Result<()> {
        match self {
            SeedNetwork::Noop | SeedNetwork::Norm { .. } => Ok(()),
            SeedNetwork::Attention { excite, .. } => excite.zero_(),
            SeedNetwork::Depthwise { pointwise, .. } => pointwise.zero_(),
            SeedNetwork::Bottleneck { up, .. } => up.zero_(),
            SeedNetwork::ConvSmall { conv, .. } => conv.zero_(),
            SeedNetwork::ConvLight { block } => block.conv.zero_(),
            SeedNetwork::ConvHeavy { second, .. } => second.conv.zero_(),
            SeedNetwork::LayerNormMix { .. } => Ok(()),
            SeedNetwork::LowRank { up, .. } => up.zero_(),
            SeedNetwork::CausalAttention { proj, .. } => proj.zero_(),
            SeedNetwork::Mlp { fc2, .. } => fc2.zero_(),
        }
    }
}

/// A built seed module: the blueprint's layers and the `VarStore` that owns
/// their parameters.
#[derive(Debug)]
pub struct SeedModule {
    blueprint: Blueprint,
    topology: Topology,
    channels: i64,
    var_store: nn::VarStore,
    network: SeedNetwork,
}

impl SeedModule {
    /// Builds `blueprint` at width `dim` in a fresh `VarStore` on `device`
    /// (the width was checked by [`Blueprint::check_dim`]).
    pub(super) fn build(
        blueprint: Blueprint,
        topology: Topology,
        dim: i64,
        device: Device,
    ) -> Result<SeedModule> {
        let var_store = nn::VarStore::new(device);
        let network = {
            let root = var_store.root();
            match topology {
                Topology::Cnn => SeedNetwork::build(blueprint, &root, dim)?,
                Topology::Transformer => SeedNetwork::build_transformer(blueprint, &root, dim)?,
            }
        };
        Ok(SeedModule {
            blueprint,
            topology,
            channels: dim,
            var_store,
            network,
        })
    }

    /// The blueprint this module was built from.
    pub fn blueprint(&self) -> Blueprint {
        self.blueprint
    }

    /// Host topology the module was built for.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// Channel count (model width) the module expects.
    pub fn channels(&self) -> i64 {
        self.channels
    }

    /// Device of the parameters.
    pub fn device(&self) -> Device {
        self.var_store.device()
    }

    /// The `VarStore` owning the parameters (the gated-blend module, when a
    /// slot adds one, lives in it too under `gate.`).
    pub fn var_store(&self) -> &nn::VarStore {
        &self.var_store
    }

    /// Number of trainable parameters actually allocated.
    pub fn param_count(&self) -> i64 {
        crate::validate::element_count(&self.var_store.trainable_variables())
    }

    /// Zeroes the last convolution / linear layer (weight and bias), making
    /// every residual seed the identity (attention: a uniform 0.5 scale).
    pub fn zero_init_final_affine(&mut self) -> Result<()> {
        self.network.zero_init_final_affine()
    }

    /// # Shapes
    /// CNN `[B, C, H, W] -> [B, C, H, W]`; transformer `[B, T, C] -> [B, T, C]`;
    /// any other rank or width is a [`Error::ShapeMismatch`].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.channels;
        let expected = match self.topology {
            Topology::Cnn => vec![-1, c, -1, -1],
            Topology::Transformer => vec![-1, -1, c],
        };
        shape("seed forward", &x.size(), &expected)?;
        self.network.forward(x)
    }
}
