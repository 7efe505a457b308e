//! Tensors of the wrong rank, width or batch size are typed
//! [`Error::ShapeMismatch`] errors raised before libtorch sees them (issue 9),
//! and caller-built masks never index out of bounds.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use common::{features, lone_slot, slot_config, walk_to};
use kasmina::Error;
use kasmina::attribution::{attribute_batch, counterfactual_contribution};
use kasmina::blend::{BlendAlpha, blend_gate, blend_multiply};
use kasmina::gate::GateMode;
use kasmina::host::{CnnHost, CnnHostConfig, Host, LinearHost, SlotId, Topology};
use kasmina::host::{TransformerHost, TransformerHostConfig};
use kasmina::lifecycle::GerminationOptions;
use kasmina::masks::{OwnerMask, ParamRange};
use kasmina::model::{MorphogeneticModel, OpAvailability};
use leyline::Telemetry;
use leyline::{LifecycleOp, SeedStage};
use tch::{Device, Kind, Tensor};

const R0C1: SlotId = SlotId { row: 0, col: 1 };

fn zeros(shape: &[i64]) -> Tensor {
    Tensor::zeros(shape, (Kind::Float, Device::Cpu))
}

fn shape_error<T: std::fmt::Debug>(what: &str, result: kasmina::Result<T>) {
    match result {
        Err(Error::ShapeMismatch { .. }) => {}
        other => panic!("{what}: expected ShapeMismatch, got {other:?}"),
    }
}

fn model_with_seed() -> MorphogeneticModel {
    tch::manual_seed(5);
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host");
    let mut model = MorphogeneticModel::new(
        host,
        &[R0C1],
        slot_config(GateMode::Permissive),
        Telemetry::disabled(),
    )
    .expect("model");
    model
        .germinate(R0C1, "conv_light", GerminationOptions::new("s"))
        .expect("germinate");
    model
        .advance_stage(R0C1, Some(SeedStage::Training))
        .expect("g1");
    model
}

#[test]
fn hosts_check_input_and_boundary_shapes() {
    let linear = LinearHost::reference(Device::Cpu).expect("host");
    for shape in [&[4i64][..], &[4, 15], &[4, 16, 1], &[]] {
        shape_error(
            &format!("linear {shape:?}"),
            linear.forward(&zeros(shape), true),
        );
    }
    let cnn = CnnHost::new(CnnHostConfig::fashion_mnist(), Device::Cpu).expect("host");
    // Boundary 1 is [B, 8, 28, 28]: a tensor of another width or size there.
    for shape in [&[2i64, 4, 28, 28][..], &[2, 8, 14, 14], &[2, 8, 28], &[8]] {
        shape_error(
            &format!("cnn boundary 1 {shape:?}"),
            cnn.forward_segment(&zeros(shape), 1, cnn.num_segments(), false),
        );
    }
    let transformer =
        TransformerHost::new(TransformerHostConfig::tiny(), Device::Cpu).expect("host");
    let hidden = [&[2i64, 4, 31][..], &[2, 17, 32], &[2, 32]];
    for shape in hidden {
        shape_error(
            &format!("transformer boundary 1 {shape:?}"),
            transformer.forward_segment(&zeros(shape), 1, 2, false),
        );
    }
}

#[test]
fn slot_forward_checks_features_and_alpha_override() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(
        &mut slot,
        "conv_light",
        GerminationOptions::new("s"),
        SeedStage::Blending,
    );
    let host = features(1); // [2, 4, 6, 6]
    for shape in [&[2i64, 3, 6, 6][..], &[2, 4, 6], &[4]] {
        shape_error(
            &format!("features {shape:?}"),
            slot.forward(&zeros(shape), None),
        );
    }
    for shape in [
        &[3i64, 1, 1, 1][..],
        &[2, 4, 1, 1],
        &[2, 1, 1],
        &[2, 1, 1, 1, 1],
    ] {
        let alpha = zeros(shape);
        shape_error(
            &format!("alpha override {shape:?}"),
            slot.forward(&host, Some(&alpha)),
        );
    }
    for shape in [&[2i64, 1, 1, 1][..], &[1, 1, 1, 1]] {
        let output = slot
            .forward(&host, Some(&zeros(shape)))
            .expect("per-sample alpha");
        assert_eq!(output.size(), host.size(), "alpha {shape:?}");
    }
    let empty = lone_slot(Topology::Cnn);
    shape_error("empty slot", empty.forward(&zeros(&[2, 3, 6, 6]), None));
}

#[test]
fn a_non_finite_per_sample_alpha_on_the_cpu_is_refused() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(
        &mut slot,
        "conv_light",
        GerminationOptions::new("s"),
        SeedStage::Blending,
    );
    let host = features(1); // [2, 4, 6, 6]
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let alpha = Tensor::from_slice(&[0.5f32, bad]).reshape([2, 1, 1, 1]);
        let err = slot.forward(&host, Some(&alpha)).unwrap_err();
        assert!(
            matches!(err, Error::NonFinite { field: "per-sample alpha", value }
                if value.is_nan() == bad.is_nan()),
            "{bad}: {err:?}"
        );
        let blended = blend_gate(
            &host,
            &host,
            &zeros(&[2, 1, 1, 1]),
            &BlendAlpha::PerSample(&alpha),
        );
        assert!(
            matches!(blended, Err(Error::NonFinite { .. })),
            "blend_gate {bad}: {blended:?}"
        );
    }
    // Finite values outside [0, 1] are clamped, as in the reference.
    let alpha = Tensor::from_slice(&[-3.0f32, 7.0]).reshape([2, 1, 1, 1]);
    let output = slot.forward(&host, Some(&alpha)).expect("finite alphas");
    assert_eq!(output.size(), host.size());
}

#[test]
fn blends_check_every_operand() {
    let host = features(1);
    let seed = features(2);
    shape_error(
        "multiply seed input",
        blend_multiply(&host, &seed, &zeros(&[2, 4, 6]), &BlendAlpha::Scalar(0.5)),
    );
    for shape in [&[2i64, 4, 6, 6][..], &[3, 1, 1, 1], &[2, 1]] {
        shape_error(
            &format!("gate {shape:?}"),
            blend_gate(&host, &seed, &zeros(shape), &BlendAlpha::Scalar(0.5)),
        );
    }
}

#[test]
fn model_services_check_their_tensors() {
    let mut model = model_with_seed();
    shape_error(
        "attribute 0-dim",
        attribute_batch(&model, &Tensor::from(1.0f32)),
    );
    shape_error(
        "attribute width",
        attribute_batch(&model, &zeros(&[2, 3, 28, 28])),
    );
    let x = zeros(&[4, 1, 28, 28]);
    let int_labels = |shape: &[i64]| Tensor::zeros(shape, (Kind::Int64, Device::Cpu));
    for labels in [int_labels(&[4, 1]), int_labels(&[5]), int_labels(&[2, 2])] {
        shape_error(
            &format!("labels {:?}", labels.size()),
            counterfactual_contribution(&model, R0C1, &x, &labels),
        );
    }
    let float_labels = zeros(&[4]);
    assert!(
        counterfactual_contribution(&model, R0C1, &x, &float_labels).is_err(),
        "float labels"
    );
    let overrides = [None, None];
    assert!(
        model.forward_with_alpha(&x, &overrides, false).is_err(),
        "more overrides than slots"
    );
    model.step_epoch().expect("tick");
    model.record_accuracy(30.0, 30.0).expect("accuracy");
    assert!(model.record_accuracy(f64::NAN, 50.0).is_err());
    assert!(model.record_accuracy(50.0, 101.0).is_err());
    let metrics = model
        .slot(R0C1)
        .expect("slot")
        .state()
        .expect("state")
        .metrics();
    assert_eq!((metrics.train_accuracy, metrics.val_accuracy), (30.0, 30.0));
}

#[test]
fn foreign_masks_and_short_op_lists_never_index_out_of_bounds() {
    let model = model_with_seed();
    let masks = model.seed_masks();
    let foreign = OwnerMask {
        owner: "r9c9".to_owned(),
        seed_id: None,
        ranges: vec![ParamRange {
            name: "x".to_owned(),
            range: masks.total..masks.total + 10,
        }],
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| masks.to_tensor(&foreign, Device::Cpu)));
    assert!(
        matches!(outcome, Ok(Err(_))),
        "a range past the layout must be an error"
    );
    let mut hostile = masks.clone();
    hostile.total = usize::MAX;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        hostile.to_tensor(&masks.host, Device::Cpu)
    }));
    assert!(
        matches!(outcome, Ok(Err(_))),
        "a usize::MAX layout must be an error"
    );

    let short = OpAvailability {
        ops: vec![],
        germinate_slots: vec![],
        fossilize_slots: vec![],
        prune_slots: vec![],
    };
    let outcome = catch_unwind(|| short.allows(LifecycleOp::Prune));
    assert!(matches!(outcome, Ok(false)), "short op list: {outcome:?}");
}
