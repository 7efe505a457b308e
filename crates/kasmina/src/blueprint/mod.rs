//! Blueprints: the seed modules a slot can germinate.
//!
//! The registry key is `topology:name` (`cnn:conv_light`,
//! `transformer:lora`): [`Blueprint::from_name`] resolves a name for a host
//! [`Topology`], and an unknown name (or one of the other topology) is an
//! error. Each blueprint builds a [`SeedModule`] that maps the features to the
//! same shape (`[B, C, H, W]` for CNN hosts, `[B, T, C]` for transformers), in
//! its own `VarStore` (so the slot owns the parameters and their device;
//! the trainer owns their optimizer state). Parameter counts follow the reference formulas
//! ([`Blueprint::param_count`]).
//!
//! CNN blueprints (`C` channels):
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
//! Transformer blueprints (`C` = model width; every final projection is
//! zero-initialised, so all of them are the identity at birth):
//!
//! | name | module | params (C = 384) |
//! |---|---|---|
//! | noop | identity | 0 |
//! | norm | `x + tanh(s) (LN(x) - x)` | 2C+1 (769) |
//! | lora | `x + up(down x)`, rank 8, no biases | 16C (6,144) |
//! | lora_large | rank 32 | 64C (24,576) |
//! | attention | `x + proj(causal SDPA(qkv x))`, 4 heads, biases | 4C²+4C (591,360) |
//! | flex_attention | the same module (the reference's cached block mask is a speed device) | 4C²+4C |
//! | mlp_small | `x + fc2(GELU(fc1 x))`, 2x expansion, biases | 4C²+3C (590,976) |
//! | mlp | 4x expansion | 8C²+5C (1,181,568) |
//!
//! CNN behaviour at birth (what the reference initialises, and what the tests check):
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
//!
//! Widths are bounded ([`Blueprint::check_dim`]): `C` in `[1, MAX_CHANNELS]`
//! and at most `MAX_PARAMETERS` parameters, checked before any variable is
//! created (so a hostile width is an error, never an overflow or a huge
//! allocation).

#![warn(clippy::arithmetic_side_effects)]

use tch::Device;

use crate::host::Topology;
use crate::validate::{MAX_CHANNELS, MAX_PARAMETERS, size_in};
use crate::{Error, Result};

mod network;

pub use network::SeedModule;

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
/// Rank of the `lora` transformer seed.
pub const LORA_RANK: i64 = 8;
/// Rank of the `lora_large` transformer seed.
pub const LORA_LARGE_RANK: i64 = 32;
/// Heads of the transformer `attention` seed.
pub const ATTENTION_SEED_HEADS: i64 = 4;

/// A blueprint (see the module tables for what each is per topology).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Blueprint {
    /// Identity (both topologies).
    Noop,
    /// Norm mix with a tanh-bounded scale (GroupNorm on CNN, LayerNorm on
    /// transformers).
    Norm,
    /// Squeeze-excitation (CNN) or an extra causal attention (transformer).
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
    /// Low-rank adapter, rank 8 (transformer).
    Lora,
    /// Low-rank adapter, rank 32 (transformer).
    LoraLarge,
    /// 2x MLP residual (transformer).
    MlpSmall,
    /// 4x MLP residual (transformer).
    Mlp,
    /// Causal attention (transformer; same module as `attention`).
    FlexAttention,
}

impl Blueprint {
    /// Every blueprint.
    pub const ALL: &'static [Blueprint] = &[
        Blueprint::Noop,
        Blueprint::Norm,
        Blueprint::Attention,
        Blueprint::Depthwise,
        Blueprint::Bottleneck,
        Blueprint::ConvSmall,
        Blueprint::ConvLight,
        Blueprint::ConvHeavy,
        Blueprint::Lora,
        Blueprint::LoraLarge,
        Blueprint::MlpSmall,
        Blueprint::Mlp,
        Blueprint::FlexAttention,
    ];

    /// The transformer blueprints, in the reference table's order.
    pub const TRANSFORMER: &'static [Blueprint] = &[
        Blueprint::Noop,
        Blueprint::Norm,
        Blueprint::Lora,
        Blueprint::LoraLarge,
        Blueprint::Attention,
        Blueprint::FlexAttention,
        Blueprint::MlpSmall,
        Blueprint::Mlp,
    ];

    /// The CNN blueprints, in the reference table's order.
    pub const CNN: &'static [Blueprint] = &[
        Blueprint::Noop,
        Blueprint::Norm,
        Blueprint::Attention,
        Blueprint::Depthwise,
        Blueprint::Bottleneck,
        Blueprint::ConvSmall,
        Blueprint::ConvLight,
        Blueprint::ConvHeavy,
    ];

    /// The leyline blueprint action this blueprint is (the one mapping
    /// between the two; names and ids come from leyline).
    pub fn action(self) -> leyline::BlueprintAction {
        use leyline::BlueprintAction as Action;
        match self {
            Blueprint::Noop => Action::Noop,
            Blueprint::Norm => Action::Norm,
            Blueprint::Attention => Action::Attention,
            Blueprint::Depthwise => Action::Depthwise,
            Blueprint::Bottleneck => Action::Bottleneck,
            Blueprint::ConvSmall => Action::ConvSmall,
            Blueprint::ConvLight => Action::ConvLight,
            Blueprint::ConvHeavy => Action::ConvHeavy,
            Blueprint::Lora => Action::Lora,
            Blueprint::LoraLarge => Action::LoraLarge,
            Blueprint::MlpSmall => Action::MlpSmall,
            Blueprint::Mlp => Action::Mlp,
            Blueprint::FlexAttention => Action::FlexAttention,
        }
    }

    /// Registry name (`conv_light`, ...), the leyline `blueprint_id`.
    pub fn name(self) -> &'static str {
        self.action().blueprint_id()
    }

    /// The blueprints that exist for `topology`.
    pub fn for_topology(topology: Topology) -> &'static [Blueprint] {
        match topology {
            Topology::Cnn => Blueprint::CNN,
            Topology::Transformer => Blueprint::TRANSFORMER,
        }
    }

    /// Whether this blueprint exists for `topology`.
    pub fn exists_in(self, topology: Topology) -> bool {
        Blueprint::for_topology(topology).contains(&self)
    }

    fn known_names(topology: Topology) -> String {
        let prefix = match topology {
            Topology::Cnn => "cnn",
            Topology::Transformer => "transformer",
        };
        let names: Vec<&str> = Blueprint::for_topology(topology)
            .iter()
            .map(|b| b.name())
            .collect();
        format!("{prefix}: {}", names.join(", "))
    }

    /// Looks a blueprint up for `topology` by registry name (`conv_light`,
    /// or the full key `cnn:conv_light`). Unknown names and names (or keys)
    /// of the other topology are [`Error::UnknownBlueprint`].
    pub fn from_name(topology: Topology, name: &str) -> Result<Blueprint> {
        let prefix = match topology {
            Topology::Cnn => "cnn:",
            Topology::Transformer => "transformer:",
        };
        let bare = name.strip_prefix(prefix).unwrap_or(name);
        Blueprint::for_topology(topology)
            .iter()
            .copied()
            .find(|blueprint| blueprint.name() == bare)
            .ok_or_else(|| Error::UnknownBlueprint {
                name: name.to_owned(),
                known: Blueprint::known_names(topology),
            })
    }

    /// The blueprint a leyline blueprint action selects for `topology`.
    pub fn from_action(topology: Topology, action: leyline::BlueprintAction) -> Result<Blueprint> {
        Blueprint::from_name(topology, action.blueprint_id())
    }

    pub(crate) fn not_in(self, topology: Topology) -> Error {
        Error::UnknownBlueprint {
            name: self.name().to_owned(),
            known: Blueprint::known_names(topology),
        }
    }

    /// Parameter count at width `dim` (channels) on `topology`, by the
    /// reference formula (see the module tables). `dim` must be in
    /// `[1, MAX_CHANNELS]` (which keeps every formula far from overflow).
    #[expect(
        clippy::arithmetic_side_effects,
        reason = "c is checked to [1, MAX_CHANNELS = 2^16] first: every formula stays below 2^37"
    )]
    pub fn param_count(self, topology: Topology, dim: i64) -> Result<i64> {
        if !self.exists_in(topology) {
            return Err(self.not_in(topology));
        }
        let c = size_in("blueprint width", dim, 1, MAX_CHANNELS)?;
        Ok(match (topology, self) {
            (_, Blueprint::Noop) => 0,
            (_, Blueprint::Norm) => 2 * c + 1,
            (Topology::Cnn, Blueprint::Attention) => {
                let r = attention_width(c);
                2 * c * r + c
            }
            (_, Blueprint::Depthwise) => c * c + 11 * c,
            (_, Blueprint::Bottleneck) => {
                let b = bottleneck_width(c);
                2 * c * b + 9 * b * b + 2 * c
            }
            (_, Blueprint::ConvSmall) => c * c + 2 * c,
            (_, Blueprint::ConvLight) => 9 * c * c + 2 * c,
            (_, Blueprint::ConvHeavy) => 18 * c * c + 4 * c,
            (_, Blueprint::Lora) => 2 * c * LORA_RANK,
            (_, Blueprint::LoraLarge) => 2 * c * LORA_LARGE_RANK,
            (Topology::Transformer, Blueprint::Attention) | (_, Blueprint::FlexAttention) => {
                4 * c * c + 4 * c
            }
            (_, Blueprint::MlpSmall) => 4 * c * c + 3 * c,
            (_, Blueprint::Mlp) => 8 * c * c + 5 * c,
        })
    }

    /// The reference registry's rough estimate (CNN entries at C = 64,
    /// transformer ones at C = 384).
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
            Blueprint::Lora => 6144,
            Blueprint::LoraLarge => 24576,
            Blueprint::MlpSmall => 590_976,
            Blueprint::Mlp => 1_181_568,
            Blueprint::FlexAttention => 591_360,
        }
    }

    /// Checks that this blueprint exists for `topology` and can be built at
    /// width `dim`: `dim` in `[1, MAX_CHANNELS]` and at most `MAX_PARAMETERS`
    /// parameters. Returns the parameter count.
    pub fn check_dim(self, topology: Topology, dim: i64) -> Result<i64> {
        size_in(
            "blueprint parameters",
            self.param_count(topology, dim)?,
            0,
            MAX_PARAMETERS,
        )
    }

    /// Builds the seed module for width `dim` on `topology` and `device`, in
    /// a fresh `VarStore` (parameters drawn from tch's global generator),
    /// once [`Blueprint::check_dim`] accepts the width.
    pub fn build(self, topology: Topology, dim: i64, device: Device) -> Result<SeedModule> {
        self.check_dim(topology, dim)?;
        SeedModule::build(self, topology, dim, device)
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
        .find(|&g| {
            channels.checked_rem(g) == Some(0)
                && channels.checked_div(g) >= Some(TARGET_CHANNELS_PER_GROUP)
        })
        .or_else(|| {
            CANDIDATES
                .iter()
                .copied()
                .find(|&g| channels.checked_rem(g) == Some(0))
        })
        .unwrap_or(1)
}
