//! Tamiyo's factored action space: the eight heads, their options and what
//! each option means.
//!
//! [`HEAD_NAMES`] / [`ACTION_HEADS`] fix the head order everywhere (policy
//! outputs, masks, rollout buffers, [`crate::proto::AdaptationCommand`]).

use crate::{AlphaAlgorithm, AlphaCurve};

/// Number of action heads.
pub const NUM_ACTION_HEADS: usize = 8;

/// Default number of seed slots (r0c0, r0c1, r0c2); the slot head's size.
pub const DEFAULT_NUM_SLOTS: usize = 3;

/// One action head: its name and number of options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HeadSpec {
    /// Head name, as in [`HEAD_NAMES`].
    pub name: &'static str,
    /// Number of options. For `slot` this is [`DEFAULT_NUM_SLOTS`]; a run
    /// with another slot configuration sizes that head by its slot count.
    pub size: usize,
}

/// The action heads in contract order, with their sizes.
pub static ACTION_HEADS: [HeadSpec; NUM_ACTION_HEADS] = [
    HeadSpec {
        name: "slot",
        size: DEFAULT_NUM_SLOTS,
    },
    HeadSpec {
        name: "blueprint",
        size: BlueprintAction::ALL.len(),
    },
    HeadSpec {
        name: "style",
        size: GerminationStyle::ALL.len(),
    },
    HeadSpec {
        name: "tempo",
        size: TempoAction::ALL.len(),
    },
    HeadSpec {
        name: "alpha_target",
        size: AlphaTargetAction::ALL.len(),
    },
    HeadSpec {
        name: "alpha_speed",
        size: AlphaSpeedAction::ALL.len(),
    },
    HeadSpec {
        name: "alpha_curve",
        size: AlphaCurveAction::ALL.len(),
    },
    HeadSpec {
        name: "op",
        size: LifecycleOp::ALL.len(),
    },
];

/// Head names in contract order.
pub static HEAD_NAMES: [&str; NUM_ACTION_HEADS] = [
    "slot",
    "blueprint",
    "style",
    "tempo",
    "alpha_target",
    "alpha_speed",
    "alpha_curve",
    "op",
];

/// Index of a head in [`HEAD_NAMES`], or `None` for an unknown name.
pub fn head_index(name: &str) -> Option<usize> {
    HEAD_NAMES.iter().position(|head| *head == name)
}

contract_enum! {
    /// The lifecycle operation head.
    pub enum LifecycleOp {
        /// Do nothing this epoch.
        Wait = 0 => "WAIT",
        /// Germinate a blueprint in an empty slot.
        Germinate = 1 => "GERMINATE",
        /// Retarget a blending or holding seed's alpha.
        SetAlphaTarget = 2 => "SET_ALPHA_TARGET",
        /// Prune a seed (scheduled or immediate).
        Prune = 3 => "PRUNE",
        /// Fossilize a holding seed.
        Fossilize = 4 => "FOSSILIZE",
        /// Advance a seed one stage through its gate.
        Advance = 5 => "ADVANCE",
    }
}

impl LifecycleOp {
    /// Which heads causally matter for this op, as a mask in [`HEAD_NAMES`] order.
    pub fn relevant_heads(self) -> [bool; NUM_ACTION_HEADS] {
        // Order: slot, blueprint, style, tempo, alpha_target, alpha_speed, alpha_curve, op.
        match self {
            LifecycleOp::Wait => [false, false, false, false, false, false, false, true],
            LifecycleOp::Germinate => [true, true, true, true, true, false, false, true],
            LifecycleOp::SetAlphaTarget => [true, false, true, false, true, true, true, true],
            LifecycleOp::Prune => [true, false, false, false, false, true, true, true],
            LifecycleOp::Fossilize | LifecycleOp::Advance => {
                [true, false, false, false, false, false, false, true]
            }
        }
    }
}

contract_enum! {
    /// The blueprint head.
    pub enum BlueprintAction {
        /// Identity seed.
        Noop = 0 => "NOOP",
        /// 3x3 conv residual.
        ConvLight = 1 => "CONV_LIGHT",
        /// Squeeze-excitation (CNN) or extra attention (transformer).
        Attention = 2 => "ATTENTION",
        /// Normalisation mix.
        Norm = 3 => "NORM",
        /// Depthwise-separable residual.
        Depthwise = 4 => "DEPTHWISE",
        /// Bottleneck residual.
        Bottleneck = 5 => "BOTTLENECK",
        /// 1x1 conv residual.
        ConvSmall = 6 => "CONV_SMALL",
        /// Two 3x3 conv residuals.
        ConvHeavy = 7 => "CONV_HEAVY",
        /// Low-rank adapter, rank 8.
        Lora = 8 => "LORA",
        /// Low-rank adapter, rank 32.
        LoraLarge = 9 => "LORA_LARGE",
        /// 2x MLP.
        MlpSmall = 10 => "MLP_SMALL",
        /// 4x MLP.
        Mlp = 11 => "MLP",
        /// Attention with a cached block mask.
        FlexAttention = 12 => "FLEX_ATTENTION",
    }
}

impl BlueprintAction {
    /// Registry name of the blueprint (lower snake case, e.g. `conv_light`).
    pub fn blueprint_id(self) -> &'static str {
        match self {
            BlueprintAction::Noop => "noop",
            BlueprintAction::ConvLight => "conv_light",
            BlueprintAction::Attention => "attention",
            BlueprintAction::Norm => "norm",
            BlueprintAction::Depthwise => "depthwise",
            BlueprintAction::Bottleneck => "bottleneck",
            BlueprintAction::ConvSmall => "conv_small",
            BlueprintAction::ConvHeavy => "conv_heavy",
            BlueprintAction::Lora => "lora",
            BlueprintAction::LoraLarge => "lora_large",
            BlueprintAction::MlpSmall => "mlp_small",
            BlueprintAction::Mlp => "mlp",
            BlueprintAction::FlexAttention => "flex_attention",
        }
    }

    /// Blueprints that exist for CNN hosts.
    pub const CNN: &'static [BlueprintAction] = &[
        BlueprintAction::Noop,
        BlueprintAction::Norm,
        BlueprintAction::Attention,
        BlueprintAction::ConvLight,
        BlueprintAction::Depthwise,
        BlueprintAction::Bottleneck,
        BlueprintAction::ConvSmall,
        BlueprintAction::ConvHeavy,
    ];

    /// Blueprints that exist for transformer hosts.
    pub const TRANSFORMER: &'static [BlueprintAction] = &[
        BlueprintAction::Noop,
        BlueprintAction::Norm,
        BlueprintAction::Attention,
        BlueprintAction::Lora,
        BlueprintAction::LoraLarge,
        BlueprintAction::MlpSmall,
        BlueprintAction::Mlp,
        BlueprintAction::FlexAttention,
    ];
}

contract_enum! {
    /// The germination style head: alpha curve plus blend algorithm.
    pub enum GerminationStyle {
        /// Linear schedule, ADD blend.
        LinearAdd = 0 => "LINEAR_ADD",
        /// Linear schedule, MULTIPLY blend.
        LinearMultiply = 1 => "LINEAR_MULTIPLY",
        /// Sigmoid schedule, ADD blend.
        SigmoidAdd = 2 => "SIGMOID_ADD",
        /// Gated blend (linear schedule, GATE algorithm).
        GatedGate = 3 => "GATED_GATE",
    }
}

impl GerminationStyle {
    /// The alpha curve and blend algorithm this style selects.
    pub fn curve_and_algorithm(self) -> (AlphaCurve, AlphaAlgorithm) {
        match self {
            GerminationStyle::LinearAdd => (AlphaCurve::Linear, AlphaAlgorithm::Add),
            GerminationStyle::LinearMultiply => (AlphaCurve::Linear, AlphaAlgorithm::Multiply),
            GerminationStyle::SigmoidAdd => (AlphaCurve::Sigmoid, AlphaAlgorithm::Add),
            GerminationStyle::GatedGate => (AlphaCurve::Linear, AlphaAlgorithm::Gate),
        }
    }
}

contract_enum! {
    /// The blend tempo head.
    pub enum TempoAction {
        /// 3 epochs.
        Fast = 0 => "FAST",
        /// 5 epochs.
        Standard = 1 => "STANDARD",
        /// 8 epochs.
        Slow = 2 => "SLOW",
    }
}

impl TempoAction {
    /// Blend length in epochs.
    pub fn epochs(self) -> u32 {
        match self {
            TempoAction::Fast => 3,
            TempoAction::Standard => 5,
            TempoAction::Slow => 8,
        }
    }
}

contract_enum! {
    /// The alpha target head.
    pub enum AlphaTargetAction {
        /// 0.5.
        Half = 0 => "HALF",
        /// 0.7.
        Seventy = 1 => "SEVENTY",
        /// 1.0.
        Full = 2 => "FULL",
    }
}

impl AlphaTargetAction {
    /// Target amplitude.
    pub fn alpha(self) -> f64 {
        match self {
            AlphaTargetAction::Half => 0.5,
            AlphaTargetAction::Seventy => 0.7,
            AlphaTargetAction::Full => 1.0,
        }
    }
}

contract_enum! {
    /// The alpha speed head.
    pub enum AlphaSpeedAction {
        /// 0 ticks (snap).
        Instant = 0 => "INSTANT",
        /// 3 ticks.
        Fast = 1 => "FAST",
        /// 5 ticks.
        Medium = 2 => "MEDIUM",
        /// 8 ticks.
        Slow = 3 => "SLOW",
    }
}

impl AlphaSpeedAction {
    /// Schedule length in controller ticks.
    pub fn ticks(self) -> u32 {
        match self {
            AlphaSpeedAction::Instant => 0,
            AlphaSpeedAction::Fast => 3,
            AlphaSpeedAction::Medium => 5,
            AlphaSpeedAction::Slow => 8,
        }
    }
}

contract_enum! {
    /// The alpha curve head.
    pub enum AlphaCurveAction {
        /// Linear.
        Linear = 0 => "LINEAR",
        /// Cosine.
        Cosine = 1 => "COSINE",
        /// Sigmoid, steepness 6.
        SigmoidGentle = 2 => "SIGMOID_GENTLE",
        /// Sigmoid, steepness 12.
        Sigmoid = 3 => "SIGMOID",
        /// Sigmoid, steepness 24.
        SigmoidSharp = 4 => "SIGMOID_SHARP",
    }
}

impl AlphaCurveAction {
    /// The controller curve and its sigmoid steepness.
    pub fn curve_and_steepness(self) -> (AlphaCurve, f64) {
        match self {
            AlphaCurveAction::Linear => {
                (AlphaCurve::Linear, crate::alpha::DEFAULT_SIGMOID_STEEPNESS)
            }
            AlphaCurveAction::Cosine => {
                (AlphaCurve::Cosine, crate::alpha::DEFAULT_SIGMOID_STEEPNESS)
            }
            AlphaCurveAction::SigmoidGentle => (AlphaCurve::Sigmoid, 6.0),
            AlphaCurveAction::Sigmoid => (AlphaCurve::Sigmoid, 12.0),
            AlphaCurveAction::SigmoidSharp => (AlphaCurve::Sigmoid, 24.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_order_and_sizes_match_the_reference() {
        let names: Vec<&str> = ACTION_HEADS.iter().map(|head| head.name).collect();
        assert_eq!(names, HEAD_NAMES);
        let sizes: Vec<usize> = ACTION_HEADS.iter().map(|head| head.size).collect();
        assert_eq!(sizes, [3, 13, 4, 3, 3, 4, 5, 6]);
        assert_eq!(head_index("op"), Some(7));
        assert_eq!(head_index("nope"), None);
    }

    #[test]
    fn wait_only_needs_the_op_head() {
        let mask = LifecycleOp::Wait.relevant_heads();
        assert_eq!(mask.iter().filter(|&&m| m).count(), 1);
        assert!(mask[head_index("op").unwrap_or(usize::MAX)]);
    }
}
