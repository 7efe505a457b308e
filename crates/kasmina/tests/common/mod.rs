//! Shared fixtures of the Kasmina integration tests: a lone slot at a tiny
//! CNN boundary and helpers that walk a seed through its lifecycle.

#![allow(dead_code, unreachable_pub)]

pub mod sgd;

use kasmina::gate::{GateMode, GateThresholds, QualityGates};
use kasmina::host::{InjectionSpec, SlotId, Surface, Topology};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use kasmina::slot::SeedSlot;
use leyline::SeedStage;
use leyline::Telemetry;
use tch::{Device, Kind, Tensor};

/// Epochs a test seed must spend in TRAINING (and strict BLENDING).
pub const TEST_STAGE_EPOCHS: u32 = 2;

/// A slot config with `mode` gates and short stage floors.
pub fn slot_config(mode: GateMode) -> SlotConfig {
    SlotConfig {
        gates: QualityGates {
            mode,
            thresholds: GateThresholds {
                min_stage_epochs: TEST_STAGE_EPOCHS,
                ..GateThresholds::default()
            },
        },
        ..SlotConfig::default()
    }
}

/// An injection spec r0c0 with `channels` channels at `size` x `size`.
pub fn spec(channels: i64, size: i64) -> InjectionSpec {
    InjectionSpec {
        slot_id: SlotId::new(0, 0),
        channels,
        spatial: (size, size),
        surface: Surface::PrePool,
        order: 0,
        boundary: 1,
    }
}

/// A lone CNN slot with 4 channels at 6x6, permissive short gates.
pub fn lone_slot(topology: Topology) -> SeedSlot {
    SeedSlot::new(
        spec(4, 6),
        topology,
        slot_config(GateMode::Permissive),
        Telemetry::disabled(),
    )
    .expect("slot")
}

/// Host features `[2, 4, 6, 6]` from a seeded generator.
pub fn features(seed: i64) -> Tensor {
    tch::manual_seed(seed);
    Tensor::randn([2, 4, 6, 6], (Kind::Float, Device::Cpu))
}

/// Germinates `blueprint` and walks the seed to `target` (GERMINATED,
/// TRAINING, BLENDING, HOLDING or FOSSILIZED) through the real gates,
/// feeding the measurements each gate needs.
pub fn walk_to(
    slot: &mut SeedSlot,
    blueprint: &str,
    options: GerminationOptions,
    target: SeedStage,
) {
    slot.germinate(blueprint, options, Device::Cpu)
        .expect("germinate");
    let path = [
        SeedStage::Training,
        SeedStage::Blending,
        SeedStage::Holding,
        SeedStage::Fossilized,
    ];
    for stage in path {
        if slot.stage() == Some(target) {
            return;
        }
        match stage {
            SeedStage::Training => {}
            SeedStage::Blending => {
                for _ in 0..TEST_STAGE_EPOCHS {
                    slot.step_epoch().expect("step");
                }
                slot.record_gradient_norms(1.0, 1.0, 100).expect("grads");
            }
            SeedStage::Holding => {
                while !slot.state().expect("state").alpha_controller().is_settled() {
                    slot.step_epoch().expect("step");
                }
            }
            SeedStage::Fossilized => {
                slot.set_counterfactual_contribution(2.0).expect("cf");
            }
            _ => unreachable!(),
        }
        let outcome = slot.advance_stage(Some(stage)).expect("advance");
        assert!(outcome.passed, "{stage}: {}", outcome.message);
        assert_eq!(slot.stage(), Some(stage));
    }
    assert_eq!(slot.stage(), Some(target));
}

/// Bitwise tensor equality (same shape and same values).
pub fn bitwise_equal(a: &Tensor, b: &Tensor) -> bool {
    a.size() == b.size() && a.equal(b)
}

/// `model.forward_with_alpha(x, overrides, train)` done by hand: the host
/// up to each active slot's boundary, the slot's own forward (its blend
/// alone), then the host on from there. Every host pool runs as its own
/// node, where the model's walk takes a pool right after a seed into the
/// seed's blend.
pub fn forward_by_hand(
    model: &MorphogeneticModel,
    x: &Tensor,
    overrides: &[Option<&Tensor>],
    train: bool,
) -> Tensor {
    let host = model.host();
    let mut boundary = 0;
    let mut features = x.shallow_clone();
    for (index, slot) in model.slots().iter().enumerate() {
        if !slot.is_active() {
            continue;
        }
        let target = slot.spec().boundary;
        features = host
            .forward_segment(&features, boundary, target, train)
            .expect("host to the slot");
        let alpha = overrides.get(index).copied().flatten();
        features = slot.forward(&features, alpha).expect("slot");
        boundary = target;
    }
    host.forward_segment(&features, boundary, host.num_segments(), train)
        .expect("host to the logits")
}
