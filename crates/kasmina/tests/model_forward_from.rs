//! `MorphogeneticModel::forward_from`: the forward pass started at a host
//! boundary with host activations the caller computed equals
//! `forward_with_alpha` from the input (with and without per-sample alpha
//! overrides, on CNN and transformer hosts, with a shared prefix replicated
//! along the batch), a seed's blend taken together with the host's pool
//! after it equals the blend then the pool, and bad boundaries, features
//! and overrides are typed errors. The copies of a channels-last batch stay channels-last.

mod common;

use common::{forward_by_hand, slot_config};
use kasmina::Error;
use kasmina::gate::GateMode;
use kasmina::groups::GroupKey;
use kasmina::host::{CnnHost, CnnHostConfig, SlotId, TransformerHost, TransformerHostConfig};
use kasmina::lifecycle::GerminationOptions;
use kasmina::model::MorphogeneticModel;
use leyline::{SeedStage, Telemetry};
use tch::{Device, Kind, Tensor};

const R0C0: SlotId = SlotId { row: 0, col: 0 };
const R1C0: SlotId = SlotId { row: 1, col: 0 };
const R0C1: SlotId = SlotId { row: 0, col: 1 };

/// Germinates `blueprint` in `slot`, moves it to TRAINING and sets `alpha`.
fn grow(model: &mut MorphogeneticModel, slot: SlotId, blueprint: &str, alpha: f64) {
    model
        .germinate(slot, blueprint, GerminationOptions::new(blueprint))
        .expect("germinate");
    assert!(
        model
            .advance_stage(slot, Some(SeedStage::Training))
            .expect("g1")
            .passed
    );
    model
        .slot_mut(slot)
        .expect("slot")
        .set_alpha(alpha)
        .expect("alpha");
}

/// Moves every seed parameter away from the identity it is born as.
fn perturb_seeds(model: &MorphogeneticModel) {
    tch::no_grad(|| {
        for parameter in model.parameters() {
            if matches!(parameter.group, GroupKey::Seed(_)) {
                let noise = Tensor::randn_like(&parameter.tensor);
                let _ = parameter
                    .tensor
                    .shallow_clone()
                    .f_add_(&noise)
                    .expect("add");
            }
        }
    });
}

/// A tiny Fashion-MNIST CNN with slots r0c0 (empty), r1c0 and r0c1 (two
/// perturbed seeds), so the first seed sits after an empty slot.
fn cnn_model() -> MorphogeneticModel {
    tch::manual_seed(41);
    let host = small_cnn_host();
    let mut model = MorphogeneticModel::new(
        host,
        &[R0C1, R0C0, R1C0],
        slot_config(GateMode::Permissive),
        Telemetry::disabled(),
    )
    .expect("model");
    grow(&mut model, R1C0, "conv_light", 0.5);
    grow(&mut model, R0C1, "conv_heavy", 0.75);
    perturb_seeds(&model);
    model
}

/// The tiny Fashion-MNIST CNN host of these tests (base 2 channels).
fn small_cnn_host() -> CnnHost {
    CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host")
}

/// The tiny transformer with slots r0c0 (empty) and r0c1 (a perturbed
/// `lora` seed at alpha 0.5).
fn lora_transformer(config: &TransformerHostConfig) -> MorphogeneticModel {
    let host = TransformerHost::new(config.clone(), Device::Cpu).expect("host");
    let mut model = MorphogeneticModel::new(
        host,
        &[SlotId::new(0, 0), SlotId::new(0, 1)],
        slot_config(GateMode::Permissive),
        Telemetry::disabled(),
    )
    .expect("model");
    grow(&mut model, SlotId::new(0, 1), "lora", 0.5);
    perturb_seeds(&model);
    model
}

fn images(batch: i64) -> Tensor {
    tch::manual_seed(42);
    Tensor::randn([batch, 1, 28, 28], (Kind::Float, Device::Cpu))
}

/// One `[B, 1, …]` alpha of `value` (with `rank` dimensions in all).
fn alpha(batch: i64, rank: usize, value: f64) -> Tensor {
    let mut shape = vec![batch];
    shape.extend(std::iter::repeat_n(1, rank.saturating_sub(1)));
    Tensor::full(shape.as_slice(), value, (Kind::Float, Device::Cpu))
}

/// `forward_from(prefix at b, b)` equals `forward_with_alpha(x)` bit for
/// bit at every boundary up to the first seed.
fn assert_every_start_matches(
    model: &MorphogeneticModel,
    x: &Tensor,
    overrides: &[Option<&Tensor>],
) {
    let full = tch::no_grad(|| model.forward_with_alpha(x, overrides, false)).expect("full");
    for boundary in 0..=model.first_active_boundary() {
        let prefix =
            tch::no_grad(|| model.host().forward_segment(x, 0, boundary, false)).expect("prefix");
        let rest = tch::no_grad(|| model.forward_from(&prefix, boundary, overrides, false))
            .expect("forward_from");
        assert!(rest.equal(&full), "boundary {boundary}");
    }
}

#[test]
fn forward_from_a_cnn_boundary_equals_the_full_forward() {
    let model = cnn_model();
    let r1c0 = model.slot(R1C0).expect("r1c0").spec().boundary;
    let r0c0 = model.slot(R0C0).expect("r0c0").spec().boundary;
    // The empty r0c0 comes first and is skipped; the first seed is r1c0.
    assert!(r0c0 < r1c0);
    assert_eq!(model.first_active_boundary(), r1c0);
    let x = images(3);
    assert_every_start_matches(&model, &x, &[]);
    // Per-sample overrides: r1c0 switched off for sample 1 only, r0c1 at 0.25.
    let off_for_one = Tensor::from_slice(&[0.5f32, 0.0, 0.5]).reshape([3, 1, 1, 1]);
    let quarter = alpha(3, 4, 0.25);
    let overrides = [None, Some(&off_for_one), Some(&quarter)];
    assert_every_start_matches(&model, &x, &overrides);
    let plain = tch::no_grad(|| model.forward(&x, false)).expect("plain");
    let changed = tch::no_grad(|| model.forward_with_alpha(&x, &overrides, false)).expect("full");
    assert!(!changed.equal(&plain), "the overrides change the logits");
}

#[test]
fn a_seed_before_a_pool_blends_then_pools_as_the_slot_and_the_host_would() {
    let model = cnn_model();
    // r0c1 sits before block 1's pool, r1c0 after block 0's.
    let host = model.host();
    assert!(host.pools_after(model.slot(R0C1).expect("r0c1").spec().boundary));
    assert!(!host.pools_after(model.slot(R1C0).expect("r1c0").spec().boundary));
    let quarter = alpha(3, 4, 0.25);
    let above_one = alpha(3, 4, 1.5);
    let half = alpha(3, 4, 0.5);
    let configurations: [&[Option<&Tensor>]; 3] = [
        // r0c1 at its own scalar alpha, then per sample (clamped above 1).
        &[],
        &[None, None, Some(&quarter)],
        &[None, Some(&half), Some(&above_one)],
    ];
    for overrides in configurations {
        for train in [false, true] {
            let case = format!("{} overrides, train {train}", overrides.len());
            // One batch for both (the tests of this binary share the RNG).
            let batch = images(3);
            let input = batch.detach().set_requires_grad(true);
            let walked = model
                .forward_with_alpha(&input, overrides, train)
                .expect("walk");
            walked.sum(Kind::Float).backward();
            let by_hand_input = batch.detach().set_requires_grad(true);
            let by_hand = forward_by_hand(&model, &by_hand_input, overrides, train);
            by_hand.sum(Kind::Float).backward();
            assert!(walked.equal(&by_hand), "logits, {case}");
            assert!(
                input.grad().equal(&by_hand_input.grad()),
                "input gradient, {case}"
            );
        }
    }
}

#[test]
fn a_shared_prefix_replicated_along_the_batch_serves_every_configuration() {
    let model = cnn_model();
    let x = images(2);
    let boundary = model.first_active_boundary();
    let prefix =
        tch::no_grad(|| model.host().forward_segment(&x, 0, boundary, false)).expect("prefix");
    // Block 0: r1c0 off; block 1: r0c1 off (both others at their own alpha).
    let replicated = prefix.repeat([2, 1, 1, 1]);
    let r1c0 = Tensor::from_slice(&[0.0f32, 0.0, 0.5, 0.5]).reshape([4, 1, 1, 1]);
    let r0c1 = Tensor::from_slice(&[0.75f32, 0.75, 0.0, 0.0]).reshape([4, 1, 1, 1]);
    let fused = tch::no_grad(|| {
        model.forward_from(
            &replicated,
            boundary,
            &[None, Some(&r1c0), Some(&r0c1)],
            false,
        )
    })
    .expect("fused");
    let off = alpha(2, 4, 0.0);
    let first = tch::no_grad(|| model.forward_with_alpha(&x, &[None, Some(&off)], false))
        .expect("r1c0 off");
    let second = tch::no_grad(|| model.forward_with_alpha(&x, &[None, None, Some(&off)], false))
        .expect("r0c1 off");
    let tolerance = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
    assert!(tolerance(&fused.narrow(0, 0, 2), &first) < 1e-5);
    assert!(tolerance(&fused.narrow(0, 2, 2), &second) < 1e-5);
    assert!(tolerance(&first, &second) > 1e-3, "the blocks differ");
}

#[test]
fn without_a_seed_the_start_may_be_the_logits() {
    let mut model = cnn_model();
    for slot in [R1C0, R0C1] {
        model
            .prune(slot, "test", kasmina::lifecycle::PruneInitiator::Policy)
            .expect("prune");
    }
    assert_eq!(model.active_seed_count(), 0);
    let segments = model.host().num_segments();
    assert_eq!(model.first_active_boundary(), segments);
    let x = images(2);
    assert_every_start_matches(&model, &x, &[]);
    let logits = tch::no_grad(|| model.forward(&x, false)).expect("logits");
    let again = tch::no_grad(|| model.forward_from(&logits, segments, &[], false)).expect("same");
    assert!(again.equal(&logits));
}

#[test]
fn forward_from_a_transformer_boundary_equals_the_full_forward() {
    tch::manual_seed(43);
    let config = TransformerHostConfig::tiny();
    let model = lora_transformer(&config);
    assert_eq!(model.first_active_boundary(), 3);
    let x = Tensor::randint(config.vocab_size, [2, 6], (Kind::Int64, Device::Cpu));
    assert_every_start_matches(&model, &x, &[]);
    let quarter = alpha(2, 3, 0.25);
    assert_every_start_matches(&model, &x, &[None, Some(&quarter)]);
}

#[test]
fn bad_boundaries_features_and_overrides_are_typed_errors() {
    let model = cnn_model();
    let x = images(2);
    let first = model.first_active_boundary();
    let segments = model.host().num_segments();
    let prefix =
        tch::no_grad(|| model.host().forward_segment(&x, 0, first, false)).expect("prefix");
    // Past the first seed: it would be skipped.
    let later = tch::no_grad(|| model.host().forward_segment(&x, 0, first + 1, false))
        .expect("later prefix");
    assert!(matches!(
        model.forward_from(&later, first + 1, &[], false),
        Err(Error::OutOfRange {
            field: "forward_from.boundary",
            ..
        })
    ));
    // Past the logits.
    assert!(matches!(
        model.forward_from(&prefix, segments + 1, &[], false),
        Err(Error::OutOfRange {
            field: "forward_from.boundary",
            ..
        })
    ));
    // Features of another boundary (the input at the first seed's boundary).
    assert!(matches!(
        model.forward_from(&x, first, &[], false),
        Err(Error::ShapeMismatch { .. })
    ));
    // More overrides than slots.
    let none: Vec<Option<&Tensor>> = vec![None; 4];
    assert!(matches!(
        model.forward_from(&prefix, first, &none, false),
        Err(Error::OutOfRange {
            field: "forward_from.overrides",
            ..
        })
    ));
    // An override whose batch is not the features' batch.
    let wrong_batch = alpha(3, 4, 0.5);
    assert!(matches!(
        model.forward_from(&prefix, first, &[None, Some(&wrong_batch)], false),
        Err(Error::ShapeMismatch { .. })
    ));
}

/// `forward_from_replicated(prefix, k, b)` equals `forward_from` on the
/// prefix repeated `k` times, within rounding (the first seed runs on one
/// copy instead of all of them), at every boundary up to the first seed.
fn assert_replicated_matches(
    model: &MorphogeneticModel,
    x: &Tensor,
    replicas: i64,
    overrides: &[Option<&Tensor>],
) {
    for boundary in 0..=model.first_active_boundary() {
        let prefix =
            tch::no_grad(|| model.host().forward_segment(x, 0, boundary, false)).expect("prefix");
        let mut repeats = vec![replicas];
        repeats.extend(std::iter::repeat_n(1, prefix.dim() - 1));
        let copied = prefix.repeat(repeats.as_slice());
        let want = tch::no_grad(|| model.forward_from(&copied, boundary, overrides, false))
            .expect("forward_from");
        let got = tch::no_grad(|| {
            model.forward_from_replicated(&prefix, replicas, boundary, overrides, false)
        })
        .expect("forward_from_replicated");
        assert_eq!(got.size(), want.size(), "boundary {boundary}");
        let gap = (&got - &want).abs().max().double_value(&[]);
        assert!(gap < 1e-5, "boundary {boundary}: {gap}");
    }
}

#[test]
fn the_replicated_forward_runs_the_first_seed_once_and_gives_every_copy() {
    let model = cnn_model();
    let x = images(2);
    // Three copies: r1c0 off in the first, r0c1 off in the second, the
    // third as the controller set them.
    let r1c0 = Tensor::from_slice(&[0.0f32, 0.0, 0.5, 0.5, 0.5, 0.5]).reshape([6, 1, 1, 1]);
    let r0c1 = Tensor::from_slice(&[0.75f32, 0.75, 0.0, 0.0, 0.75, 0.75]).reshape([6, 1, 1, 1]);
    let overrides = [None, Some(&r1c0), Some(&r0c1)];
    assert_replicated_matches(&model, &x, 3, &overrides);
    assert_replicated_matches(&model, &x, 1, &[]);
    // The copies differ where their alphas do.
    let prefix = tch::no_grad(|| {
        model
            .host()
            .forward_segment(&x, 0, model.first_active_boundary(), false)
    })
    .expect("prefix");
    let logits = tch::no_grad(|| {
        model.forward_from_replicated(&prefix, 3, model.first_active_boundary(), &overrides, false)
    })
    .expect("replicated");
    let gap = (logits.narrow(0, 0, 2) - logits.narrow(0, 2, 2))
        .abs()
        .max()
        .double_value(&[]);
    assert!(gap > 1e-3, "the copies differ");

    // Without a seed the copies are made at the logits.
    let mut bare = cnn_model();
    for slot in [R1C0, R0C1] {
        bare.prune(slot, "test", kasmina::lifecycle::PruneInitiator::Policy)
            .expect("prune");
    }
    assert_replicated_matches(&bare, &x, 4, &[]);
}

#[test]
fn the_replicated_forward_on_a_transformer_and_its_refusals() {
    tch::manual_seed(44);
    let config = TransformerHostConfig::tiny();
    let model = lora_transformer(&config);
    let x = Tensor::randint(config.vocab_size, [2, 6], (Kind::Int64, Device::Cpu));
    let half = Tensor::from_slice(&[0.0f32, 0.0, 1.0, 1.0]).reshape([4, 1, 1]);
    assert_replicated_matches(&model, &x, 2, &[None, Some(&half)]);

    let first = model.first_active_boundary();
    let prefix =
        tch::no_grad(|| model.host().forward_segment(&x, 0, first, false)).expect("prefix");
    // Training mode, no copies, a start past the first seed, an override of
    // the wrong batch (one copy's, not all of them).
    assert!(matches!(
        model.forward_from_replicated(&prefix, 2, first, &[], true),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        model.forward_from_replicated(&prefix, 0, first, &[], false),
        Err(Error::OutOfRange {
            field: "forward_from_replicated.replicas",
            ..
        })
    ));
    assert!(matches!(
        model.forward_from_replicated(&prefix, 2, first + 1, &[], false),
        Err(Error::OutOfRange {
            field: "forward_from_replicated.boundary",
            ..
        })
    ));
    let one_copy = alpha(2, 3, 0.5);
    assert!(
        model
            .forward_from_replicated(&prefix, 2, first, &[None, Some(&one_copy)], false)
            .is_err()
    );
}

#[test]
fn the_replicated_forward_serves_every_blend_algorithm() {
    for algorithm in [
        leyline::AlphaAlgorithm::Add,
        leyline::AlphaAlgorithm::Multiply,
        leyline::AlphaAlgorithm::Gate,
    ] {
        tch::manual_seed(45);
        let mut model = MorphogeneticModel::new(
            small_cnn_host(),
            &[R0C1, R1C0],
            slot_config(GateMode::Permissive),
            Telemetry::disabled(),
        )
        .expect("model");
        let options = GerminationOptions {
            algorithm,
            ..GerminationOptions::new("seed")
        };
        model
            .germinate(R1C0, "conv_light", options)
            .expect("germinate");
        assert!(
            model
                .advance_stage(R1C0, Some(SeedStage::Training))
                .expect("g1")
                .passed
        );
        model
            .slot_mut(R1C0)
            .expect("slot")
            .set_alpha(0.6)
            .expect("alpha");
        perturb_seeds(&model);
        let x = images(2);
        let r1c0 = Tensor::from_slice(&[0.0f32, 0.0, 0.6, 0.6, 1.0, 1.0]).reshape([6, 1, 1, 1]);
        assert_replicated_matches(&model, &x, 3, &[None, Some(&r1c0)]);
    }
}

#[test]
fn replicated_copies_keep_the_channels_last_layout() {
    tch::manual_seed(45);
    let nchw = Tensor::randn([3, 4, 5, 6], (Kind::Float, Device::Cpu));
    let nhwc = torch_ext::memory::contiguous_channels_last(&nchw).expect("channels-last");
    for replicas in [1, 4] {
        let plain = kasmina::blend::replicate_batch(&nchw, replicas).expect("replicate");
        let kept = kasmina::blend::replicate_batch(&nhwc, replicas).expect("replicate");
        let want = nchw.repeat([replicas, 1, 1, 1]);
        assert!(plain.equal(&want), "{replicas} contiguous copies");
        assert!(kept.equal(&want), "{replicas} channels-last copies");
        assert!(plain.is_contiguous(), "a contiguous batch stays contiguous");
        assert!(
            torch_ext::memory::is_channels_last(&kept).expect("layout"),
            "{replicas} copies of a channels-last batch are channels-last"
        );
    }
    // Other ranks and a replica count below one.
    let tokens = Tensor::randn([2, 3, 4], (Kind::Float, Device::Cpu));
    let copies = kasmina::blend::replicate_batch(&tokens, 2).expect("replicate");
    assert!(copies.equal(&tokens.repeat([2, 1, 1])));
    assert!(matches!(
        kasmina::blend::replicate_batch(&tokens, 0),
        Err(Error::OutOfRange { .. })
    ));
}
