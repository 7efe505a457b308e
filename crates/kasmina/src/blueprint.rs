//! Blueprints: the seed modules a slot can germinate (CNN topology).
//!
//! Each [`Blueprint`] builds a [`SeedModule`] that maps `[B, C, H, W]` to the
//! same shape, in its own `VarStore` (so the slot owns the parameters, their
//! optimizer and their device). Parameter counts follow the reference formulas
//! ([`Blueprint::param_count`], with `C` channels):
//!
//! | name | module | params |
//! |---|---|---|
//! | noop | identity | 0 |
//! | norm | `x + tanh(s) (GN(x) - x)`, `s` a scalar starting at 0 | 2C+1 |
//! | attention | squeeze-excitation `x sigma(FC2(ReLU(FC1(pool x))))`, r = max(1, C/4) | 2Cr+C |
//! | depthwise | `x + ReLU(GN(pw(dw3x3 x)))` | C²+11C |
//! | bottleneck | `x + GN(up(ReLU(conv3(ReLU(down x)))))`, b = max(8, C/4) | 2Cb+9b²+2C |
//! | conv_small | `x + ReLU(GN(conv1x1 x))` | C²+2C |
//! | conv_light | `x + ReLU(GN(conv3x3 x))` | 9C²+2C |
//! | conv_heavy | `x + B2(B1(x))`, each `B = ReLU(GN(conv3x3))` | 18C²+4C |
//!
//! Behaviour at birth (what the reference initialises, and what the tests check):
//! - identity: `noop`, `norm` (`s = 0`), `conv_small` (conv zero-initialised),
//!   `bottleneck` (`up` zero-initialised);
//! - near identity: `attention` scales every channel by `sigma(3) = 0.9526`
//!   (last FC weight 0, bias 3);
//! - residual `x + r(x)` with `r(x) >= 0`: `depthwise`, `conv_light`, `conv_heavy`.
//!
//! [`SeedModule::zero_init_final_affine`] zeroes the last convolution or
//! linear layer (weight and bias), which is what germination does for the
//! MULTIPLY blend: every residual seed then starts as the identity.
//!
//! GroupNorm groups ([`group_norm_groups`]): the largest of 32/16/8/4/2/1 that
//! divides `C` with at least 16 channels per group; failing that, the largest
//! of them that divides `C`.

use tch::{Device, Tensor, nn};

use crate::layers::{Conv2d, GroupNorm, Linear, fill_parameter};
use crate::{Error, Result};

/// Channels per GroupNorm group the blueprints aim for.
pub const TARGET_CHANNELS_PER_GROUP: i64 = 16;
/// Bias of the attention seed's last FC layer (sigma(3) ~ 0.95: near identity).
pub const ATTENTION_GATE_BIAS: f64 = 3.0;
/// Squeeze-excitation reduction of the attention seed.
pub const ATTENTION_REDUCTION: i64 = 4;
/// Channel reduction of the bottleneck seed.
pub const BOTTLENECK_REDUCTION: i64 = 4;
/// Smallest bottleneck width.
pub const BOTTLENECK_MIN_WIDTH: i64 = 8;

/// A CNN blueprint (the `topology:name` registry key is `cnn:<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Blueprint {
    /// Identity.
    Noop,
    /// GroupNorm mix with a tanh-bounded scale.
    Norm,
    /// Squeeze-excitation channel attention.
    Attention,
    /// Depthwise-separable residual.
    Depthwise,
    /// 1x1 -> 3x3 -> 1x1 bottleneck residual.
    Bottleneck,
    /// 1x1 conv residual.
    ConvSmall,
    /// 3x3 conv residual.
    ConvLight,
    /// Two 3x3 conv blocks as one residual.
    ConvHeavy,
}

impl Blueprint {
    /// Every CNN blueprint, in the reference table's order.
    pub const ALL: &'static [Blueprint] = &[
        Blueprint::Noop,
        Blueprint::Norm,
        Blueprint::Attention,
        Blueprint::Depthwise,
        Blueprint::Bottleneck,
        Blueprint::ConvSmall,
        Blueprint::ConvLight,
        Blueprint::ConvHeavy,
    ];

    /// Registry name (`conv_light`, ...), the leyline `blueprint_id`.
    pub fn name(self) -> &'static str {
        match self {
            Blueprint::Noop => "noop",
            Blueprint::Norm => "norm",
            Blueprint::Attention => "attention",
            Blueprint::Depthwise => "depthwise",
            Blueprint::Bottleneck => "bottleneck",
            Blueprint::ConvSmall => "conv_small",
            Blueprint::ConvLight => "conv_light",
            Blueprint::ConvHeavy => "conv_heavy",
        }
    }

    /// Looks a blueprint up by registry name (`conv_light` or `cnn:conv_light`).
    /// Unknown names (transformer-only blueprints included) are an error.
    pub fn from_name(name: &str) -> Result<Blueprint> {
        let bare = name.strip_prefix("cnn:").unwrap_or(name);
        Blueprint::ALL
            .iter()
            .copied()
            .find(|blueprint| blueprint.name() == bare)
            .ok_or_else(|| Error::UnknownBlueprint {
                name: name.to_owned(),
                known: Blueprint::ALL
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The blueprint a leyline blueprint action selects (CNN ones only).
    pub fn from_action(action: leyline::BlueprintAction) -> Result<Blueprint> {
        Blueprint::from_name(action.blueprint_id())
    }

    /// Parameter count of this blueprint at `channels` channels, by the
    /// reference formula (see the module table).
    pub fn param_count(self, channels: i64) -> i64 {
        let c = channels;
        match self {
            Blueprint::Noop => 0,
            Blueprint::Norm => 2 * c + 1,
            Blueprint::Attention => {
                let r = attention_width(c);
                2 * c * r + c
            }
            Blueprint::Depthwise => c * c + 11 * c,
            Blueprint::Bottleneck => {
                let b = bottleneck_width(c);
                2 * c * b + 9 * b * b + 2 * c
            }
            Blueprint::ConvSmall => c * c + 2 * c,
            Blueprint::ConvLight => 9 * c * c + 2 * c,
            Blueprint::ConvHeavy => 18 * c * c + 4 * c,
        }
    }

    /// The reference registry's rough estimate (used for masking heuristics).
    pub fn param_estimate(self) -> i64 {
        match self {
            Blueprint::Noop => 0,
            Blueprint::Norm => 100,
            Blueprint::Attention => 2000,
            Blueprint::Depthwise => 4800,
            Blueprint::Bottleneck => 12000,
            Blueprint::ConvSmall => 18000,
            Blueprint::ConvLight => 37000,
            Blueprint::ConvHeavy => 74000,
        }
    }

    /// Builds the seed module for `channels` channels on `device`, in a fresh
    /// `VarStore` (parameters drawn from tch's global generator).
    pub fn build(self, channels: i64, device: Device) -> Result<SeedModule> {
        if channels < 1 {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "blueprint {} needs channels >= 1, got {channels}",
                    self.name()
                ),
            });
        }
        let var_store = nn::VarStore::new(device);
        let network = {
            let root = var_store.root();
            SeedNetwork::build(self, &root, channels)?
        };
        Ok(SeedModule {
            blueprint: self,
            channels,
            var_store,
            network,
        })
    }
}

impl std::fmt::Display for Blueprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Squeeze-excitation width `max(1, C / 4)`.
pub fn attention_width(channels: i64) -> i64 {
    (channels / ATTENTION_REDUCTION).max(1)
}

/// Bottleneck width `max(8, C / 4)`.
pub fn bottleneck_width(channels: i64) -> i64 {
    (channels / BOTTLENECK_REDUCTION).max(BOTTLENECK_MIN_WIDTH)
}

/// GroupNorm group count for `channels` (see the module docs).
pub fn group_norm_groups(channels: i64) -> i64 {
    const CANDIDATES: [i64; 6] = [32, 16, 8, 4, 2, 1];
    CANDIDATES
        .iter()
        .copied()
        .find(|&g| channels % g == 0 && channels / g >= TARGET_CHANNELS_PER_GROUP)
        .or_else(|| CANDIDATES.iter().copied().find(|&g| channels % g == 0))
        .unwrap_or(1)
}

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
        Ok(self.norm.forward(&self.conv.forward(x)?)?.f_relu()?)
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
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            SeedNetwork::Noop => x.shallow_clone(),
            SeedNetwork::Norm { norm, scale } => {
                let mix = norm.forward(x)?.f_sub(x)?;
                x.f_add(&mix.f_mul(&scale.f_tanh()?)?)?
            }
            SeedNetwork::Attention { squeeze, excite } => {
                let (batch, channels, _, _) = x.size4()?;
                let pooled = x.f_mean_dim([2i64, 3].as_slice(), false, None)?; // [B, C]
                let hidden = squeeze.forward(&pooled)?.f_relu()?; // [B, r]
                let weights = excite
                    .forward(&hidden)?
                    .f_sigmoid()?
                    .f_reshape([batch, channels, 1, 1])?;
                x.f_mul(&weights)?
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
            SeedNetwork::ConvSmall { conv, norm } => {
                x.f_add(&norm.forward(&conv.forward(x)?)?.f_relu()?)?
            }
            SeedNetwork::ConvLight { block } => x.f_add(&block.forward(x)?)?,
            SeedNetwork::ConvHeavy { first, second } => {
                x.f_add(&second.forward(&first.forward(x)?)?)?
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
        }
    }
}

/// A built seed module: the blueprint's layers and the `VarStore` that owns
/// their parameters.
#[derive(Debug)]
pub struct SeedModule {
    blueprint: Blueprint,
    channels: i64,
    var_store: nn::VarStore,
    network: SeedNetwork,
}

impl SeedModule {
    /// The blueprint this module was built from.
    pub fn blueprint(&self) -> Blueprint {
        self.blueprint
    }

    /// Channel count the module expects.
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
        self.var_store
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum()
    }

    /// Zeroes the last convolution / linear layer (weight and bias), making
    /// every residual seed the identity (attention: a uniform 0.5 scale).
    pub fn zero_init_final_affine(&mut self) -> Result<()> {
        self.network.zero_init_final_affine()
    }

    /// # Shapes
    /// `[B, C, H, W] -> [B, C, H, W]`; any other rank or channel count is a
    /// [`Error::ShapeMismatch`].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let size = x.size();
        if size.len() != 4 || size[1] != self.channels {
            return Err(Error::ShapeMismatch {
                op: "seed forward",
                expected: vec![-1, self.channels, -1, -1],
                got: size,
            });
        }
        self.network.forward(x)
    }
}
