//! The transformer host and its blueprints: sizes against the reference,
//! identity at birth, slot routing, and a morphogenetic transformer with
//! seeds (forward, attribution, export).

mod common;

use kasmina::Error;
use kasmina::attribution::{attribute_batch, counterfactual_contribution};
use kasmina::blueprint::Blueprint;
use kasmina::export::export_seed_states;
use kasmina::host::{Host, SlotId, Topology, TransformerHost, TransformerHostConfig};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use leyline::{AlphaAlgorithm, SeedStage};
use tch::{Device, Kind, Tensor};

/// The reference transformer table (ESPER_PYTHON_REFERENCE.md §2.6), dim 384.
const REFERENCE_PARAMS: [(&str, i64); 8] = [
    ("noop", 0),
    ("norm", 769),
    ("lora", 6_144),
    ("lora_large", 24_576),
    ("attention", 591_360),
    ("flex_attention", 591_360),
    ("mlp_small", 590_976),
    ("mlp", 1_181_568),
];

fn tokens(batch: i64, time: i64, vocab: i64) -> Tensor {
    tch::manual_seed(31);
    Tensor::randint(vocab, [batch, time], (Kind::Int64, Device::Cpu))
}

#[test]
fn transformer_blueprints_match_the_reference_table() {
    for (name, expected) in REFERENCE_PARAMS {
        let blueprint = Blueprint::from_name(Topology::Transformer, name).expect("known");
        assert_eq!(
            blueprint
                .param_count(Topology::Transformer, 384)
                .expect("transformer"),
            expected,
            "{name} formula"
        );
        let module = blueprint
            .build(Topology::Transformer, 384, Device::Cpu)
            .expect("build");
        assert_eq!(module.param_count(), expected, "{name} allocated");
    }
    assert_eq!(REFERENCE_PARAMS.len(), Blueprint::TRANSFORMER.len());
}

#[test]
fn blueprint_names_belong_to_one_topology() {
    assert!(matches!(
        Blueprint::from_name(Topology::Transformer, "conv_light"),
        Err(Error::UnknownBlueprint { .. })
    ));
    assert!(matches!(
        Blueprint::from_name(Topology::Cnn, "lora"),
        Err(Error::UnknownBlueprint { .. })
    ));
    assert_eq!(
        Blueprint::from_name(Topology::Transformer, "transformer:lora").ok(),
        Some(Blueprint::Lora)
    );
    assert!(Blueprint::from_name(Topology::Transformer, "cnn:lora").is_err());
    assert!(
        Blueprint::ConvLight
            .build(Topology::Transformer, 8, Device::Cpu)
            .is_err()
    );
    assert!(Blueprint::Mlp.param_count(Topology::Cnn, 8).is_err());
    for action in leyline::BlueprintAction::TRANSFORMER {
        assert_eq!(
            Blueprint::from_action(Topology::Transformer, *action)
                .expect("transformer")
                .name(),
            action.blueprint_id()
        );
    }
}

#[test]
fn transformer_blueprints_are_the_identity_at_birth() {
    tch::manual_seed(2);
    let x = Tensor::randn([2, 5, 32], (Kind::Float, Device::Cpu));
    for blueprint in Blueprint::TRANSFORMER {
        let module = blueprint
            .build(Topology::Transformer, 32, Device::Cpu)
            .expect("build");
        let y = module.forward(&x).expect("forward");
        assert!(y.equal(&x), "{blueprint} is the identity at birth");
        let wrong = Tensor::zeros([2, 32, 5, 5], (Kind::Float, Device::Cpu));
        assert!(matches!(
            module.forward(&wrong),
            Err(Error::ShapeMismatch { .. })
        ));
    }
    assert!(matches!(
        Blueprint::Attention.build(Topology::Transformer, 30, Device::Cpu),
        Err(Error::InvalidConfig { .. })
    ));
}

#[test]
fn tiny_host_shapes_slots_and_routing() {
    tch::manual_seed(4);
    let config = TransformerHostConfig::tiny();
    let host = TransformerHost::new(config.clone(), Device::Cpu).expect("host");
    assert_eq!(host.param_count(), config.param_count().expect("count"));
    assert_eq!(host.topology(), Topology::Transformer);
    let ids: Vec<(String, usize, i64)> = host
        .injection_specs()
        .iter()
        .map(|s| (s.slot_id.to_string(), s.boundary, s.channels))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("r0c0".to_owned(), 2, 32),
            ("r0c1".to_owned(), 3, 32),
            ("r0c2".to_owned(), 4, 32)
        ]
    );
    let x = tokens(3, 10, config.vocab_size);
    let logits = host.forward(&x, false).expect("forward");
    assert_eq!(logits.size(), vec![3, 10, config.vocab_size]);
    let mut features = x.shallow_clone();
    let mut boundary = 0;
    for spec in host.injection_specs() {
        features = host
            .forward_segment(&features, boundary, spec.boundary, false)
            .expect("segment");
        assert_eq!(features.size(), vec![3, 10, 32]);
        boundary = spec.boundary;
    }
    let routed = host
        .forward_segment(&features, boundary, host.num_segments(), false)
        .expect("head");
    assert!(routed.equal(&logits));
    let too_long = tokens(1, config.block_size + 1, config.vocab_size);
    assert!(matches!(
        host.forward(&too_long, false),
        Err(Error::ShapeMismatch { .. })
    ));
    let floats = Tensor::zeros([1, 4], (Kind::Float, Device::Cpu));
    assert!(matches!(
        host.forward(&floats, false),
        Err(Error::ShapeMismatch { .. })
    ));
}

#[test]
fn reference_host_has_about_thirty_million_parameters() {
    // 50257 x 384 tied embedding, 256 x 384 positions, 6 blocks of
    // 1,774,464, final LayerNorm 768: the reference's "about 30.0M".
    assert_eq!(
        TransformerHostConfig::reference()
            .param_count()
            .expect("count"),
        30_044_544
    );
    let bad = TransformerHostConfig {
        n_layer: 4,
        ..TransformerHostConfig::reference()
    };
    assert!(matches!(
        TransformerHost::new(bad, Device::Cpu),
        Err(Error::OutOfRange {
            field: "TransformerHostConfig.num_segments",
            ..
        })
    ));
}

#[test]
fn a_morphogenetic_transformer_grows_seeds() {
    tch::manual_seed(6);
    let config = TransformerHostConfig::tiny();
    let host = TransformerHost::new(config.clone(), Device::Cpu).expect("host");
    let slots = [SlotId::new(0, 0), SlotId::new(0, 1)];
    let mut model =
        MorphogeneticModel::new(host, &slots, SlotConfig::default(), Telemetry::disabled())
            .expect("model");
    let x = tokens(4, 12, config.vocab_size);
    let plain = model.forward(&x, false).expect("plain");
    model
        .germinate(slots[0], "lora", GerminationOptions::new("lora"))
        .expect("germinate lora");
    model
        .germinate(
            slots[1],
            "mlp_small",
            GerminationOptions::new("mlp").with_algorithm(AlphaAlgorithm::Gate),
        )
        .expect("germinate mlp");
    assert!(matches!(
        model.germinate(
            SlotId::new(0, 2),
            "conv_light",
            GerminationOptions::new("x")
        ),
        Err(Error::UnknownSlot { .. })
    ));
    for slot in slots {
        model
            .advance_stage(slot, Some(SeedStage::Training))
            .expect("g1");
    }
    assert!(model.forward(&x, false).expect("incubating").equal(&plain));
    // Train the seeds one step so they stop being identities.
    let targets = tokens(4, 12, config.vocab_size);
    let logits = model.forward(&x, true).expect("forward");
    logits
        .reshape([-1, config.vocab_size])
        .cross_entropy_for_logits(&targets.reshape([-1]))
        .backward();
    common::sgd::GroupSgd::new(0.01, 0.9).step(&mut model);
    for slot in slots {
        model
            .slot_mut(slot)
            .expect("slot")
            .set_alpha(0.5)
            .expect("alpha");
    }
    let blended = model.forward(&x, false).expect("blended");
    assert!(!blended.equal(&plain));
    let attribution = attribute_batch(&model, &x).expect("attribution");
    assert_eq!(attribution.influence.size(), vec![4, 2]);
    assert!(attribution.influence.min().double_value(&[]) > 0.0);
    assert!(
        (&attribution.output - &blended)
            .abs()
            .max()
            .double_value(&[])
            < 1e-5
    );
    let contribution = counterfactual_contribution(&model, slots[0], &x, &targets).expect("cf");
    assert!(contribution.is_finite());
    let messages = export_seed_states(&model).expect("export");
    let blueprints: Vec<&str> = messages.iter().map(|m| m.blueprint_id.as_str()).collect();
    assert_eq!(blueprints, ["lora", "mlp_small"]);
    let masks = model.seed_masks();
    assert_eq!(
        masks.seeds[0].numel() as i64,
        Blueprint::Lora
            .param_count(Topology::Transformer, 32)
            .expect("lora")
    );
}
