//! Every action-mask rule of reference §3.2 and §9 item 7, the HEAD "D3"
//! germination block, the invariants (no head without a valid action, WAIT
//! always valid), the narrowing by Kasmina's availability and the batched
//! tensors.

mod common;

use common::{R0C0, R0C1, R0C2, observation, seed, tiny_model, with_metrics};
use kasmina::host::Topology;
use kasmina::lifecycle::GerminationOptions;
use kasmina::model::OpAvailability;
use leyline::gate::thresholds::MIN_PRUNE_AGE;
use leyline::{
    AlphaMode, AlphaTargetAction, BlueprintAction, GerminationStyle, LifecycleOp, SeedStage,
};
use tamiyo::heads::{ALPHA_CURVE, ALPHA_SPEED, ALPHA_TARGET, BLUEPRINT, OP, SLOT, STYLE, TEMPO};
use tamiyo::masks::{
    ActionMasks, MaskConfig, MaskTensors, SlotMaskInfo, action_masks, compute_masks,
    observation_masks,
};
use tch::{Device, Kind};

fn info(stage: SeedStage, age: u32, mode: AlphaMode) -> Option<SlotMaskInfo> {
    Some(SlotMaskInfo {
        stage,
        epochs_total: age,
        alpha_mode: mode,
    })
}

fn held(stage: SeedStage) -> Option<SlotMaskInfo> {
    info(stage, 10, AlphaMode::Hold)
}

fn masks(slots: &[Option<SlotMaskInfo>]) -> ActionMasks {
    compute_masks(slots, &MaskConfig::default()).expect("masks")
}

fn ops(masks: &ActionMasks) -> Vec<LifecycleOp> {
    LifecycleOp::ALL
        .iter()
        .copied()
        .filter(|op| masks.allows(*op))
        .collect()
}

const STAGES: [SeedStage; 9] = [
    SeedStage::Germinated,
    SeedStage::Training,
    SeedStage::Blending,
    SeedStage::Holding,
    SeedStage::Fossilized,
    SeedStage::Pruned,
    SeedStage::Embargoed,
    SeedStage::Resetting,
    SeedStage::Dormant,
];

#[test]
fn every_head_has_its_size_and_a_valid_action_and_wait_is_always_valid() {
    let states: Vec<Option<SlotMaskInfo>> = std::iter::once(None)
        .chain(STAGES.iter().flat_map(|&stage| {
            [0, MIN_PRUNE_AGE].into_iter().flat_map(move |age| {
                [AlphaMode::Hold, AlphaMode::Up, AlphaMode::Down]
                    .into_iter()
                    .map(move |mode| info(stage, age, mode))
            })
        }))
        .collect();
    for a in &states {
        for b in &states {
            for config in [
                MaskConfig::default(),
                MaskConfig {
                    max_seeds: 1,
                    topology: Topology::Transformer,
                    disable_advance: true,
                    disable_set_alpha_target: true,
                    ..MaskConfig::default()
                },
            ] {
                let masks = compute_masks(&[*a, *b], &config).expect("masks");
                masks.check().expect("invariants");
                assert!(masks.allows(LifecycleOp::Wait));
                let sizes: Vec<usize> = masks.heads().iter().map(Vec::len).collect();
                assert_eq!(sizes, [2, 13, 4, 3, 3, 4, 5, 6]);
                assert_eq!(masks.slots_for(LifecycleOp::Wait), [true, true]);
                assert_eq!(masks.head(SLOT), [true, true], "every enabled slot");
                for head in [TEMPO, ALPHA_SPEED, ALPHA_CURVE] {
                    assert!(
                        masks.head(head).iter().all(|&v| v),
                        "head {head} is all valid"
                    );
                }
            }
        }
    }
}

#[test]
fn germinate_needs_an_empty_slot_under_the_seed_limit() {
    let m = masks(&[None, None, None]);
    assert_eq!(ops(&m), [LifecycleOp::Wait, LifecycleOp::Germinate]);
    assert_eq!(m.slots_for(LifecycleOp::Germinate), [true, true, true]);

    // Only the empty slots; a fossilized seed occupies its slot.
    let m = masks(&[held(SeedStage::Fossilized), None, held(SeedStage::Holding)]);
    assert_eq!(m.slots_for(LifecycleOp::Germinate), [false, true, false]);

    // All occupied: no germination.
    let m = masks(&[held(SeedStage::Fossilized), held(SeedStage::Fossilized)]);
    assert!(!m.allows(LifecycleOp::Germinate));

    // The seed limit counts live and fossilized seeds; 0 is unlimited.
    let slots = [held(SeedStage::Fossilized), held(SeedStage::Blending), None];
    for (max_seeds, allowed) in [(0, true), (1, false), (2, false), (3, true)] {
        let config = MaskConfig {
            max_seeds,
            ..MaskConfig::default()
        };
        let m = compute_masks(&slots, &config).expect("masks");
        assert_eq!(
            m.allows(LifecycleOp::Germinate),
            allowed,
            "max_seeds {max_seeds}"
        );
    }
}

#[test]
fn d3_blocks_germination_while_a_seed_develops_or_a_slot_clears() {
    for stage in STAGES {
        let m = masks(&[held(stage), None]);
        let blocks = matches!(
            stage,
            SeedStage::Germinated
                | SeedStage::Training
                | SeedStage::Pruned
                | SeedStage::Embargoed
                | SeedStage::Resetting
        );
        assert_eq!(m.allows(LifecycleOp::Germinate), !blocks, "{stage}");
        assert_eq!(
            m.slots_for(LifecycleOp::Germinate),
            [false, !blocks],
            "{stage}"
        );
    }
}

#[test]
fn advance_fossilize_prune_and_set_alpha_target_follow_the_stage() {
    for stage in STAGES {
        let m = masks(&[held(stage), None]);
        assert_eq!(
            m.allows(LifecycleOp::Advance),
            matches!(
                stage,
                SeedStage::Germinated | SeedStage::Training | SeedStage::Blending
            ),
            "ADVANCE from {stage}"
        );
        assert_eq!(
            m.allows(LifecycleOp::Fossilize),
            stage == SeedStage::Holding,
            "FOSSILIZE from {stage}"
        );
        assert_eq!(
            m.allows(LifecycleOp::Prune),
            matches!(
                stage,
                SeedStage::Germinated
                    | SeedStage::Training
                    | SeedStage::Blending
                    | SeedStage::Holding
            ),
            "PRUNE from {stage}"
        );
        assert_eq!(
            m.allows(LifecycleOp::SetAlphaTarget),
            matches!(stage, SeedStage::Blending | SeedStage::Holding),
            "SET_ALPHA_TARGET from {stage}"
        );
        // Each op targets exactly the slot holding the seed.
        for op in [
            LifecycleOp::Advance,
            LifecycleOp::Fossilize,
            LifecycleOp::Prune,
            LifecycleOp::SetAlphaTarget,
        ] {
            assert_eq!(m.slots_for(op), [m.allows(op), false], "{op} from {stage}");
        }
    }
    let config = MaskConfig {
        disable_advance: true,
        ..MaskConfig::default()
    };
    let m = compute_masks(&[held(SeedStage::Training)], &config).expect("masks");
    assert!(!m.allows(LifecycleOp::Advance));
}

#[test]
fn prune_needs_the_minimum_age_and_a_holding_alpha_controller() {
    assert_eq!(MIN_PRUNE_AGE, 5);
    let prunable = |age, mode, config: &MaskConfig| {
        compute_masks(&[info(SeedStage::Blending, age, mode)], config)
            .expect("masks")
            .allows(LifecycleOp::Prune)
    };
    let reference = MaskConfig::default();
    assert!(!prunable(4, AlphaMode::Hold, &reference));
    assert!(prunable(5, AlphaMode::Hold, &reference));
    assert!(!prunable(9, AlphaMode::Up, &reference));
    assert!(!prunable(9, AlphaMode::Down, &reference));
    let governor = MaskConfig {
        allow_governor_override: true,
        ..MaskConfig::default()
    };
    assert!(prunable(9, AlphaMode::Down, &governor));
    assert!(
        !prunable(4, AlphaMode::Down, &governor),
        "the age still counts"
    );
    // A fossilized seed is never prunable.
    assert!(!masks(&[held(SeedStage::Fossilized)]).allows(LifecycleOp::Prune));
}

#[test]
fn set_alpha_target_needs_a_holding_controller() {
    let m = masks(&[info(SeedStage::Blending, 10, AlphaMode::Up)]);
    assert!(!m.allows(LifecycleOp::SetAlphaTarget));
    let m = masks(&[info(SeedStage::Holding, 10, AlphaMode::Hold)]);
    assert!(m.allows(LifecycleOp::SetAlphaTarget));
    let config = MaskConfig {
        disable_set_alpha_target: true,
        ..MaskConfig::default()
    };
    let m =
        compute_masks(&[info(SeedStage::Holding, 10, AlphaMode::Hold)], &config).expect("masks");
    assert!(!m.allows(LifecycleOp::SetAlphaTarget));
}

#[test]
fn blueprints_are_the_topology_set_without_noop() {
    let allowed = |topology| {
        let config = MaskConfig {
            topology,
            ..MaskConfig::default()
        };
        let m = compute_masks(&[None], &config).expect("masks");
        BlueprintAction::ALL
            .iter()
            .copied()
            .filter(|b| m.head(BLUEPRINT)[b.value() as usize])
            .collect::<Vec<_>>()
    };
    let cnn = allowed(Topology::Cnn);
    assert_eq!(cnn.len(), 7);
    assert!(!cnn.contains(&BlueprintAction::Noop));
    assert!(cnn.iter().all(|b| BlueprintAction::CNN.contains(b)));
    let transformer = allowed(Topology::Transformer);
    assert_eq!(transformer.len(), 7);
    assert!(transformer.contains(&BlueprintAction::Lora));
    assert!(!transformer.contains(&BlueprintAction::ConvLight));
}

#[test]
fn style_and_alpha_target_open_only_when_germination_or_retargeting_is_possible() {
    let only = |mask: &[bool], index: i32| {
        mask.iter()
            .enumerate()
            .all(|(i, &v)| v == (i == index as usize))
    };
    // Germination possible.
    let m = masks(&[None]);
    assert!(m.head(STYLE).iter().all(|&v| v) && m.head(ALPHA_TARGET).iter().all(|&v| v));
    // Retargeting possible (HOLDING, controller holding), germination not.
    let m = masks(&[held(SeedStage::Holding)]);
    assert!(!m.allows(LifecycleOp::Germinate));
    assert!(m.head(STYLE).iter().all(|&v| v));
    // Neither: one option each.
    let m = masks(&[held(SeedStage::Training)]);
    assert!(only(m.head(STYLE), GerminationStyle::SigmoidAdd.value()));
    assert!(only(m.head(ALPHA_TARGET), AlphaTargetAction::Full.value()));
}

#[test]
fn observations_and_kasmina_availability_give_the_masks() {
    // From an exported observation: r0c0 TRAINING (age 6), r0c1 empty.
    let slots = [R0C0, R0C1];
    let training = with_metrics(seed("s", R0C0, "norm", SeedStage::Training), |m| {
        m.epochs_total = 6;
    });
    let obs = observation(6, 1.0, 50.0, vec![training], &slots);
    let m = observation_masks(&obs, &MaskConfig::default()).expect("masks");
    assert_eq!(
        ops(&m),
        [LifecycleOp::Wait, LifecycleOp::Prune, LifecycleOp::Advance]
    );

    // Kasmina forbids pruning there: the masks follow.
    let availability = OpAvailability {
        ops: vec![true, false, false, false, false, true],
        germinate_slots: vec![false, false],
        fossilize_slots: vec![false, false],
        prune_slots: vec![false, false],
    };
    let narrowed = action_masks(&obs, &availability, &MaskConfig::default()).expect("masks");
    narrowed.check().expect("invariants");
    assert_eq!(ops(&narrowed), [LifecycleOp::Wait, LifecycleOp::Advance]);
    assert_eq!(narrowed.slots_for(LifecycleOp::Prune), [false, false]);
    let short = OpAvailability {
        prune_slots: vec![true],
        ..availability
    };
    assert!(action_masks(&obs, &short, &MaskConfig::default()).is_err());

    // A real model: the reference rules and Kasmina agree on a fresh seed.
    let mut model = tiny_model(&[R0C0, R0C1, R0C2]);
    model
        .germinate(R0C1, "conv_light", GerminationOptions::new("seed-1"))
        .expect("germinate");
    let obs =
        tolaria::controller::EpochObservation::from_model(&model, 0, common::metrics(1.0, 10.0))
            .expect("observation");
    let m = action_masks(&obs, &model.op_availability(3), &MaskConfig::default()).expect("masks");
    // GERMINATED blocks germination (D3); too young to prune.
    assert_eq!(ops(&m), [LifecycleOp::Wait, LifecycleOp::Advance]);
    assert_eq!(m.slots_for(LifecycleOp::Advance), [false, true, false]);

    // A seed in a slot the observation does not list is an error.
    let stray = observation(
        0,
        1.0,
        50.0,
        vec![seed("x", R0C2, "norm", SeedStage::Training)],
        &slots,
    );
    assert!(observation_masks(&stray, &MaskConfig::default()).is_err());
}

#[test]
fn masks_stack_into_boolean_tensors() {
    let envs = [
        masks(&[None, held(SeedStage::Holding)]),
        masks(&[held(SeedStage::Training), None]),
    ];
    let tensors = MaskTensors::from_masks(&envs, Device::Cpu).expect("tensors");
    tensors.check(2, 2, Device::Cpu).expect("shapes");
    assert_eq!(tensors.slot_by_op.size(), [2, 6, 2]);
    for (head, mask) in tensors.heads.iter().enumerate() {
        assert_eq!(mask.kind(), Kind::Bool);
        for (env, masks) in envs.iter().enumerate() {
            let row = Vec::<bool>::try_from(mask.get(env as i64)).expect("row");
            assert_eq!(row, masks.head(head), "head {head} env {env}");
        }
    }
    for (env, masks) in envs.iter().enumerate() {
        for (op_index, row) in masks.slot_by_op().iter().enumerate() {
            let got =
                Vec::<bool>::try_from(tensors.slot_by_op.get(env as i64).get(op_index as i64))
                    .expect("row");
            assert_eq!(&got, row);
        }
    }
    assert_eq!(
        Vec::<bool>::try_from(tensors.heads[OP].get(1)).expect("ops"),
        [true, false, false, true, false, true],
        "a TRAINING seed 10 epochs old: WAIT, PRUNE, ADVANCE"
    );
    assert!(tensors.check(3, 2, Device::Cpu).is_err());
    assert!(MaskTensors::from_masks(&[], Device::Cpu).is_err());
    let mixed = [masks(&[None]), masks(&[None, None])];
    assert!(MaskTensors::from_masks(&mixed, Device::Cpu).is_err());
}

/// An excluded blueprint is never offered, the others are, and excluding
/// every blueprint of the topology is an error, not an empty head.
#[test]
fn excluded_blueprints_leave_the_blueprint_head() {
    let index = |blueprint: BlueprintAction| usize::try_from(blueprint.value()).unwrap();
    let config = MaskConfig::default().excluding(BlueprintAction::ConvSmall);
    assert!(config.excludes(BlueprintAction::ConvSmall));
    let masks = compute_masks(&[None, None, None], &config).unwrap();
    let head = masks.head(BLUEPRINT);
    assert!(!head[index(BlueprintAction::ConvSmall)]);
    assert!(!head[index(BlueprintAction::Noop)]);
    for blueprint in BlueprintAction::CNN {
        if !matches!(
            blueprint,
            BlueprintAction::Noop | BlueprintAction::ConvSmall
        ) {
            assert!(head[index(*blueprint)], "{blueprint:?}");
        }
    }
    assert!(masks.allows(LifecycleOp::Germinate));
    masks.check().unwrap();
    // Back in, as by default.
    let back = config.including(BlueprintAction::ConvSmall);
    assert_eq!(back, MaskConfig::default());
    // A transformer blueprint excluded on a CNN host changes nothing.
    let other = MaskConfig::default().excluding(BlueprintAction::Lora);
    assert_eq!(
        compute_masks(&[None], &other).unwrap().head(BLUEPRINT),
        compute_masks(&[None], &MaskConfig::default())
            .unwrap()
            .head(BLUEPRINT)
    );
    // Nothing left to germinate: a clear error.
    for topology in [Topology::Cnn, Topology::Transformer] {
        let every = match topology {
            Topology::Cnn => BlueprintAction::CNN,
            Topology::Transformer => BlueprintAction::TRANSFORMER,
        };
        let none_left = every.iter().fold(
            MaskConfig {
                topology,
                ..MaskConfig::default()
            },
            |config, blueprint| config.excluding(*blueprint),
        );
        let error = compute_masks(&[None], &none_left).unwrap_err();
        assert!(error.to_string().contains("excluded"), "{error}");
    }
}
