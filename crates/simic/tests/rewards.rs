//! Simic's rewards (reference §4.4, tests of §9 items 12 and 16): PBRS
//! telescoping and potentials, anti-gaming rules, hand-computed SHAPED
//! totals, SPARSE and MINIMAL, the episode rules and the reward normaliser.

use leyline::{LifecycleOp, SeedStage};
use proptest::prelude::*;
use simic::Error;
use simic::rewards::{
    RewardBreakdown, RewardConfig, RewardInputs, RewardMode, RewardNormaliser,
    RewardNormaliserConfig, RewardNormaliserState, SeedFacts, SlotFacts, StagePoint,
    apply_governor_rollback, auto_prune_penalty, compute_reward, pbrs_term, potential,
    sparse_reward, timing_discount,
};

const TOLERANCE: f64 = 1e-12;

fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() <= TOLERANCE * (1.0 + expected.abs())
}

#[track_caller]
fn assert_close(actual: f64, expected: f64) {
    assert!(close(actual, expected), "got {actual}, expected {expected}");
}

/// Computes a reward and checks that its total is the sum of its components.
#[track_caller]
fn reward(config: &RewardConfig, inputs: &RewardInputs) -> RewardBreakdown {
    let breakdown = compute_reward(config, inputs).expect("valid reward inputs");
    assert_close(breakdown.total, breakdown.component_sum());
    breakdown
}

fn seed(stage: SeedStage, epochs_in_stage: u32, age_epochs: u32) -> SeedFacts {
    SeedFacts {
        stage,
        epochs_in_stage,
        age_epochs,
        contribution: None,
        progress: 0.0,
        stage_improvement: 0.0,
        interaction_sum: 0.0,
    }
}

fn point(stage: SeedStage, epochs_in_stage: u32) -> Option<StagePoint> {
    Some(StagePoint {
        stage,
        epochs_in_stage,
    })
}

fn slot(stage: Option<SeedStage>, alpha: f64, params: u64) -> SlotFacts {
    SlotFacts {
        stage,
        alpha,
        params,
        previous_alpha: alpha,
        previous_params: params,
    }
}

fn field_of(error: Error) -> &'static str {
    match error {
        Error::InvalidInput { field, .. } | Error::InvalidConfig { field, .. } => field,
        other => panic!("unexpected error {other}"),
    }
}

// ---------------------------------------------------------------- config --

#[test]
fn default_config_is_the_reference_and_validates() {
    let config = RewardConfig::default();
    config.validate().unwrap();
    assert_eq!(config.mode, RewardMode::Shaped);
    assert_eq!(config.gamma, 0.995);
    assert_eq!(config.pbrs_weight, 0.3);
    assert_eq!(config.epoch_progress_bonus, 0.3);
    assert_eq!(config.max_progress_bonus, 2.0);
    assert_eq!(config.terminal_acc_weight, 0.05);
    assert_eq!(config.rollback_death_penalty, -10.0);
    assert_eq!(config.min_prune_age, 5);
}

#[test]
fn invalid_config_names_the_field() {
    let cases: Vec<(RewardConfig, &str)> = vec![
        (
            RewardConfig {
                gamma: 1.5,
                ..RewardConfig::default()
            },
            "RewardConfig.gamma",
        ),
        (
            RewardConfig {
                pbrs_weight: f64::NAN,
                ..RewardConfig::default()
            },
            "RewardConfig.pbrs_weight",
        ),
        (
            RewardConfig {
                germinate_cost: 0.15,
                ..RewardConfig::default()
            },
            "RewardConfig.germinate_cost",
        ),
        (
            RewardConfig {
                param_budget: 0,
                ..RewardConfig::default()
            },
            "RewardConfig.param_budget",
        ),
        (
            RewardConfig {
                germination_discount_floor: 1.2,
                ..RewardConfig::default()
            },
            "RewardConfig.germination_discount_floor",
        ),
    ];
    for (config, field) in cases {
        assert_eq!(field_of(config.validate().unwrap_err()), field);
        let inputs = RewardInputs::default();
        assert_eq!(
            field_of(compute_reward(&config, &inputs).unwrap_err()),
            field
        );
    }
    let mut falling = RewardConfig::default();
    falling.stage_potentials.holding = 3.0;
    assert_eq!(
        field_of(falling.validate().unwrap_err()),
        "RewardConfig.stage_potentials.holding"
    );
}

#[test]
fn config_and_mode_serde() {
    for (mode, text) in [
        (RewardMode::Shaped, "\"shaped\""),
        (RewardMode::Sparse, "\"sparse\""),
        (RewardMode::Minimal, "\"minimal\""),
    ] {
        assert_eq!(serde_json::to_string(&mode).unwrap(), text);
        assert_eq!(serde_json::from_str::<RewardMode>(text).unwrap(), mode);
    }
    let config = RewardConfig::default();
    let text = serde_json::to_string(&config).unwrap();
    assert_eq!(serde_json::from_str::<RewardConfig>(&text).unwrap(), config);
    // Missing fields take the defaults; unknown ones are refused.
    let sparse: RewardConfig = serde_json::from_str(r#"{"mode":"sparse"}"#).unwrap();
    assert_eq!(sparse.mode, RewardMode::Sparse);
    assert_eq!(sparse.pbrs_weight, 0.3);
    assert!(serde_json::from_str::<RewardConfig>(r#"{"pbrs_wieght":0.3}"#).is_err());
}

// ------------------------------------------------------------------ PBRS --

const LIFECYCLE: [SeedStage; 5] = [
    SeedStage::Germinated,
    SeedStage::Training,
    SeedStage::Blending,
    SeedStage::Holding,
    SeedStage::Fossilized,
];

#[test]
fn potentials_are_monotone_and_zero_outside_the_lifecycle() {
    let config = RewardConfig::default();
    for epochs in 0..15 {
        for pair in LIFECYCLE.windows(2) {
            assert!(
                potential(&config, pair[0], epochs) <= potential(&config, pair[1], epochs),
                "{:?} -> {:?} at {epochs} epochs",
                pair[0],
                pair[1]
            );
        }
        for stage in LIFECYCLE {
            assert!(potential(&config, stage, epochs) <= potential(&config, stage, epochs + 1));
        }
        for stage in [
            SeedStage::Unknown,
            SeedStage::Dormant,
            SeedStage::Pruned,
            SeedStage::Embargoed,
            SeedStage::Resetting,
        ] {
            assert_eq!(potential(&config, stage, epochs), 0.0);
        }
    }
    // +0.3 per epoch, capped at +2.0.
    assert_close(potential(&config, SeedStage::Training, 3), 2.9);
    assert_close(potential(&config, SeedStage::Training, 7), 4.0);
    assert_close(potential(&config, SeedStage::Training, 50), 4.0);
}

#[test]
fn stage_increments_blending_leads_and_fossilized_is_smallest() {
    let config = RewardConfig::default();
    let base = |stage| potential(&config, stage, 0);
    let germinated = base(SeedStage::Germinated) - base(SeedStage::Dormant);
    let training = base(SeedStage::Training) - base(SeedStage::Germinated);
    let blending = base(SeedStage::Blending) - base(SeedStage::Training);
    let holding = base(SeedStage::Holding) - base(SeedStage::Blending);
    let fossilized = base(SeedStage::Fossilized) - base(SeedStage::Holding);
    assert_close(blending, 1.5);
    // BLENDING's increment beats every increment outside the value-creation
    // phases. HOLDING's (2.0, 3.5 -> 5.5) is larger still: with the
    // reference's own potentials "BLENDING has the largest increment" holds
    // only against GERMINATED, TRAINING and FOSSILIZED, which is what the
    // reference's test checks too.
    assert!(blending > germinated && blending > training && blending > fossilized);
    assert!(blending.max(holding) >= germinated.max(training).max(fossilized));
    for increment in [germinated, training, blending, holding] {
        assert!(fossilized > 0.0 && fossilized < increment);
    }
}

/// One lifecycle walk step: stay a further epoch in the stage, or move to
/// one of the stage's successors (RESETTING -> DORMANT empties the slot).
fn walk(start_epochs: u32, moves: &[(bool, u8)]) -> Vec<Option<StagePoint>> {
    let mut current: Option<StagePoint> = None;
    let mut states = vec![current];
    for (index, &(advance, pick)) in moves.iter().enumerate() {
        current = match current {
            None if advance => point(
                SeedStage::Germinated,
                if index == 0 { start_epochs } else { 0 },
            ),
            None => None,
            Some(at) => {
                let successors = at.stage.successors();
                if advance && !successors.is_empty() {
                    let next = successors[usize::from(pick) % successors.len()];
                    if next == SeedStage::Dormant {
                        None
                    } else {
                        point(next, 0)
                    }
                } else {
                    point(at.stage, at.epochs_in_stage + 1)
                }
            }
        };
        states.push(current);
    }
    states
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// §9 item 12: over any lifecycle walk, the γ-discounted sum of the PBRS
    /// components of the steps' rewards is `w·(γ^n·φ_final − φ_initial)`.
    #[test]
    fn pbrs_telescopes(
        start_epochs in 0u32..4,
        moves in prop::collection::vec((any::<bool>(), any::<u8>()), 1..80),
    ) {
        let config = RewardConfig::default();
        let states = walk(start_epochs, &moves);
        let steps = states.len() - 1;
        let mut discounted = 0.0;
        let mut weight = 1.0;
        for t in 0..steps {
            let inputs = RewardInputs {
                seed: states[t].map(|at| seed(at.stage, at.epochs_in_stage, 5)),
                seed_after: states[t + 1],
                val_acc: 50.0,
                epoch: 1,
                max_epochs: 1,
                ..RewardInputs::default()
            };
            let pbrs = reward(&config, &inputs).pbrs;
            prop_assert!(close(pbrs, pbrs_term(&config, states[t], states[t + 1])));
            discounted += weight * pbrs;
            weight *= config.gamma;
        }
        let phi = |state: Option<StagePoint>| {
            state.map_or(0.0, |at| potential(&config, at.stage, at.epochs_in_stage))
        };
        let expected = config.pbrs_weight
            * (config.gamma.powi(steps as i32) * phi(states[steps]) - phi(states[0]));
        prop_assert!(
            (discounted - expected).abs() <= 1e-9 * (1.0 + expected.abs()),
            "sum {discounted} vs telescoped {expected}"
        );
    }
}

#[test]
fn germination_earns_and_pruning_costs_potential() {
    let config = RewardConfig::default();
    // After the warm-up: 0.3 * (0.995 * phi(GERMINATED, 0) - 0) = 0.3 * 0.995 * 1.0.
    let germinate = |epoch| RewardInputs {
        op: LifecycleOp::Germinate,
        seed_after: point(SeedStage::Germinated, 0),
        val_acc: 40.0,
        epoch,
        max_epochs: 25,
        ..RewardInputs::default()
    };
    let late = reward(&config, &germinate(12));
    assert_close(late.pbrs, 0.3 * 0.995);
    assert_close(late.op_cost, -0.15);
    // Before it, discounted by 0.4 + 0.6 * 4/10 = 0.64.
    let early = reward(&config, &germinate(4));
    assert_close(early.pbrs, 0.3 * 0.995 * 0.64);
    assert!(early.pbrs > 0.0);
    // A prune drops the potential to 0: 0.3 * (0 - (2.0 + 0.3 * 3)).
    let prune = RewardInputs {
        op: LifecycleOp::Prune,
        seed: Some(seed(SeedStage::Training, 3, 10)),
        seed_after: point(SeedStage::Pruned, 0),
        val_acc: 40.0,
        epoch: 12,
        max_epochs: 25,
        ..RewardInputs::default()
    };
    let pruned = reward(&config, &prune);
    assert_close(pruned.pbrs, -0.3 * 2.9);
    assert!(pruned.pbrs < 0.0);
}

// ----------------------------------------------------------- anti-gaming --

fn holding_step(op: LifecycleOp, contribution: f64, clean_total: f64) -> RewardInputs {
    RewardInputs {
        op,
        seed: Some(SeedFacts {
            contribution: Some(contribution),
            progress: 2.0,
            interaction_sum: 3.0,
            ..seed(SeedStage::Holding, 5, 20)
        }),
        seed_after: if op == LifecycleOp::Fossilize {
            point(SeedStage::Fossilized, 0)
        } else {
            point(SeedStage::Holding, 6)
        },
        val_acc: 60.0,
        clean_total: Some(clean_total),
        epoch: 30,
        max_epochs: 50,
        ..RewardInputs::default()
    }
}

#[test]
fn ransomware_is_not_rewarded_and_gets_no_synergy() {
    let config = RewardConfig::default();
    // Honest seed: c = 5, T = +2 (ratio 2.5, no penalty); p = 2 < c, so the
    // harmonic mean 2*2*5/7 is paid in full.
    let honest = reward(&config, &holding_step(LifecycleOp::Wait, 5.0, 2.0));
    assert_close(honest.attribution, 20.0 / 7.0);
    assert_close(honest.synergy, 0.1 * (0.5f64 * 3.0).tanh());
    // Ransomware: the same seed with the host worse off than without seeds
    // (T = -2): the attribution is discounted by 1/(1 + e^6) and synergy
    // withheld.
    let ransomware = reward(&config, &holding_step(LifecycleOp::Wait, 5.0, -2.0));
    assert_close(ransomware.attribution_discount, 1.0 / (1.0 + 6.0f64.exp()));
    assert_close(ransomware.attribution, 20.0 / 7.0 / (1.0 + 6.0f64.exp()));
    assert!(ransomware.attribution < 0.01 * honest.attribution);
    assert_eq!(ransomware.synergy, 0.0);
    assert!(ransomware.total < honest.total);
    // Fossilizing it: no attribution, -0.5 - min(0.2 * 2, 1) - 0.3 for the
    // signature (c > 0.1, T < -0.2), no bonus.
    let fossilize = reward(&config, &holding_step(LifecycleOp::Fossilize, 5.0, -2.0));
    assert_eq!(fossilize.attribution, 0.0);
    assert_eq!(fossilize.synergy, 0.0);
    assert_close(fossilize.fossilize_shaping, -0.5 - 0.4 - 0.3);
    assert!(fossilize.ransomware_signature, "{fossilize:?}");
    assert_eq!(fossilize.fossilize_bonus, 0.0);
    assert!(fossilize.total < 0.0);
}

#[test]
fn quick_fossilization_is_discounted_by_legitimacy() {
    let config = RewardConfig::default();
    let fossilize_after = |epochs_in_holding| {
        let mut inputs = holding_step(LifecycleOp::Fossilize, 3.0, 2.0);
        if let Some(facts) = inputs.seed.as_mut() {
            facts.epochs_in_stage = epochs_in_holding;
        }
        reward(&config, &inputs)
    };
    let bonus = 3.0 * (1.0f64 / 3.0).tanh();
    // One epoch in HOLDING: legitimacy 1/5.
    let rushed = fossilize_after(1);
    assert!(!rushed.ransomware_signature, "an honest fossil: {rushed:?}");
    assert_close(rushed.fossilize_shaping, (0.5 + 0.1 * 3.0) * 0.2);
    assert_close(rushed.fossilize_bonus, bonus * 0.2);
    // Five or more: full legitimacy.
    for epochs in [5, 9] {
        let patient = fossilize_after(epochs);
        assert_close(patient.fossilize_shaping, 0.5 + 0.1 * 3.0);
        assert_close(patient.fossilize_bonus, bonus);
    }
    assert!(rushed.total < fossilize_after(5).total);
    // A fossilize the gate refused is shaped as invalid and earns no bonus.
    let mut refused = holding_step(LifecycleOp::Fossilize, 3.0, 2.0);
    refused.op_succeeded = false;
    refused.seed_after = point(SeedStage::Holding, 6);
    let refused = reward(&config, &refused);
    assert_close(refused.fossilize_shaping, -1.0);
    assert_eq!(refused.fossilize_bonus, 0.0);
}

#[test]
fn high_contribution_to_total_ratio_is_penalised() {
    let config = RewardConfig::default();
    let penalty = |c: f64, total: f64| {
        reward(&config, &holding_step(LifecycleOp::Wait, c, total)).ratio_penalty
    };
    // Ratio 4 is below the threshold 5.
    assert_eq!(penalty(4.0, 1.0), 0.0);
    // Ratio 8: -min(0.3, 0.1 * (8 - 5) / 5).
    assert_close(penalty(4.0, 0.5), -0.06);
    // Ratio 40: capped at -0.3.
    assert_close(penalty(8.0, 0.2), -0.3);
    // T <= 0.1: -0.3 * min(1, c / 10).
    assert_close(penalty(5.0, 0.05), -0.15);
    assert_close(penalty(12.0, 0.0), -0.3);
    // Contributions up to 1 point are never suspicious.
    assert_eq!(penalty(1.0, 0.01), 0.0);
    // The penalty stays a penalty on PRUNE (applied after the sign flip).
    let prune = reward(&config, &holding_step(LifecycleOp::Prune, 8.0, 0.2));
    assert_close(prune.ratio_penalty, -0.3);
    assert!(prune.attribution < 0.0);
}

#[test]
fn warnings_follow_the_reference() {
    let config = RewardConfig::default();
    // HOLDING indecision from the 2nd epoch: -min(0.1 + 0.05 * (e - 2), 0.3).
    for (epochs, expected) in [(1, 0.0), (2, -0.1), (4, -0.2), (6, -0.3), (12, -0.3)] {
        let mut inputs = holding_step(LifecycleOp::Wait, 3.0, 2.0);
        if let Some(facts) = inputs.seed.as_mut() {
            facts.epochs_in_stage = epochs;
        }
        assert_close(reward(&config, &inputs).holding_warning, expected);
        inputs.op = LifecycleOp::Fossilize;
        assert_eq!(reward(&config, &inputs).holding_warning, 0.0);
    }
    // BLENDING with T < 0: -(0.1 + min(0.05 * e, 0.3)).
    for (epochs, total, expected) in [(2, -1.0, -0.2), (10, -1.0, -0.4), (2, 1.0, 0.0)] {
        let inputs = RewardInputs {
            seed: Some(seed(SeedStage::Blending, epochs, 20)),
            seed_after: point(SeedStage::Blending, epochs + 1),
            val_acc: 50.0,
            clean_total: Some(total),
            epoch: 30,
            max_epochs: 50,
            ..RewardInputs::default()
        };
        assert_close(reward(&config, &inputs).blending_warning, expected);
    }
}

#[test]
fn prune_shaping_cases() {
    let config = RewardConfig::default();
    let prune = |stage, age, contribution: Option<f64>| {
        let inputs = RewardInputs {
            op: LifecycleOp::Prune,
            seed: Some(SeedFacts {
                contribution,
                ..seed(stage, 6, age)
            }),
            seed_after: point(SeedStage::Pruned, 0),
            val_acc: 50.0,
            clean_total: Some(1.0),
            epoch: 30,
            max_epochs: 50,
            ..RewardInputs::default()
        };
        reward(&config, &inputs).prune_shaping
    };
    // Age 2, three epochs short of MIN_PRUNE_AGE 5: -0.3 * 3.
    assert_close(prune(SeedStage::Training, 2, Some(-3.0)), -0.9);
    assert_close(prune(SeedStage::Training, 8, Some(-3.0)), 0.15);
    assert_close(prune(SeedStage::Training, 8, Some(-0.2)), 0.1);
    assert_close(prune(SeedStage::Training, 8, Some(2.0)), -0.4);
    assert_close(prune(SeedStage::Training, 8, Some(20.0)), -0.9);
    assert_eq!(prune(SeedStage::Training, 8, None), 0.0);
    assert_close(prune(SeedStage::Fossilized, 8, Some(2.0)), -1.0);
    let empty = RewardInputs {
        op: LifecycleOp::Prune,
        val_acc: 50.0,
        epoch: 3,
        max_epochs: 50,
        ..RewardInputs::default()
    };
    assert_close(reward(&config, &empty).prune_shaping, -0.2);
}

// ----------------------------------------------- hand-computed totals --

#[test]
fn hand_computed_wait_on_a_blending_seed() {
    // WAIT, BLENDING seed 3 epochs in stage, germinated at epoch 20 - 15 = 5,
    // c = 2, p = 3, T = 2.5; one slot in BLENDING (alpha 0.3 -> 0.5, 2,000
    // params) on a 10,000-parameter host.
    //
    // attribution: c < p so c = 2; timing 0.4 + 0.6 * 5/10 = 0.7 -> 1.4
    // ratio: c/T = 0.8 < 5 -> 0; no warning (T >= 0); no synergy (I = 0)
    // pbrs: 0.3 * (0.995 * (3.5 + 1.2) - (3.5 + 0.9)) = 0.3 * 0.2765 = 0.08295
    // rent: effective 0.0039 * 10,000 + 0.5 * 2,000 = 1,039, g = 0.1039,
    //       -min(0.5 * ln(1.1039), 1.5) = -0.0494247...
    // shock: -0.1958 * 0.2^2 * 2,000 / 10,000 = -0.0015664
    // occupancy: one occupied slot is free -> 0
    // total = 1.4 + 0.08295 - 0.5 ln(1.1039) - 0.0015664 = 1.4319589...
    let config = RewardConfig::default();
    let inputs = RewardInputs {
        seed: Some(SeedFacts {
            contribution: Some(2.0),
            progress: 3.0,
            stage_improvement: 1.0,
            ..seed(SeedStage::Blending, 3, 15)
        }),
        seed_after: point(SeedStage::Blending, 4),
        val_acc: 70.0,
        clean_total: Some(2.5),
        host_params: 10_000,
        slots: vec![
            SlotFacts {
                previous_alpha: 0.3,
                ..slot(Some(SeedStage::Blending), 0.5, 2_000)
            },
            slot(None, 0.0, 0),
        ],
        occupied_slots: 1,
        epoch: 20,
        max_epochs: 25,
        ..RewardInputs::default()
    };
    let b = reward(&config, &inputs);
    assert_close(b.timing_discount, 0.7);
    assert_close(b.attribution, 1.4);
    assert_eq!(b.ratio_penalty, 0.0);
    assert_close(b.pbrs, 0.08295);
    assert_close(b.growth_ratio, 0.1039);
    assert_close(b.rent, -0.5 * 1.1039f64.ln());
    assert_close(b.alpha_shock, -0.0015664);
    assert_eq!(b.occupancy, 0.0);
    assert_close(b.total, 1.4 + 0.08295 - 0.5 * 1.1039f64.ln() - 0.0015664);
    assert!((b.total - 1.4319589).abs() < 1e-6);
}

#[test]
fn hand_computed_fossilize_at_the_last_epoch() {
    // FOSSILIZE at epoch 40 of 40 of a HOLDING seed 3 epochs in stage,
    // germinated at epoch 10, c = 4, p = 5, T = 6, val_acc 80; the slot now
    // FOSSILIZED at alpha 1 with 1,000 params, one fossil.
    //
    // attribution: c < p -> 4 (timing 1, germinated at the warm-up)
    // ratio: 4/6 < 5 -> 0; HOLDING warning exempt for FOSSILIZE
    // pbrs: 0.3 * (0.995 * 6.0 - (5.5 + 0.9)) = 0.3 * -0.43 = -0.129
    // rent: 0.0039 * 10,000 + 1,000 = 1,039 -> -0.5 ln(1.1039)
    // fossil maintenance -0.002; FOSSILIZE cost -0.01
    // legitimacy 3/5 = 0.6: shaping (0.5 + 0.1 * 4) * 0.6 = 0.54,
    //   bonus 3 tanh(1/3) * 0.6 = 0.5787229...
    // terminal 0.05 * 80 = 4
    // total = 4 - 0.129 - 0.5 ln(1.1039) - 0.002 - 0.01 + 0.54
    //         + 1.8 tanh(1/3) + 4 = 8.9282982...
    let config = RewardConfig::default();
    let inputs = RewardInputs {
        op: LifecycleOp::Fossilize,
        seed: Some(SeedFacts {
            contribution: Some(4.0),
            progress: 5.0,
            stage_improvement: 0.5,
            ..seed(SeedStage::Holding, 3, 30)
        }),
        seed_after: point(SeedStage::Fossilized, 0),
        val_acc: 80.0,
        clean_total: Some(6.0),
        host_params: 10_000,
        slots: vec![slot(Some(SeedStage::Fossilized), 1.0, 1_000)],
        occupied_slots: 1,
        fossil_count: 1,
        epoch: 40,
        max_epochs: 40,
        terminal: true,
        ..RewardInputs::default()
    };
    let b = reward(&config, &inputs);
    assert_close(b.attribution, 4.0);
    assert_eq!(b.holding_warning, 0.0);
    assert_close(b.pbrs, -0.129);
    assert_close(b.rent, -0.5 * 1.1039f64.ln());
    assert_eq!(b.alpha_shock, 0.0);
    assert_close(b.fossil_maintenance, -0.002);
    assert_close(b.op_cost, -0.01);
    assert_close(b.fossilize_shaping, 0.54);
    assert_close(b.fossilize_bonus, 1.8 * (1.0f64 / 3.0).tanh());
    assert_close(b.terminal, 4.0);
    let expected = 4.0 - 0.129 - 0.5 * 1.1039f64.ln() - 0.002 - 0.01
        + 0.54
        + 1.8 * (1.0f64 / 3.0).tanh()
        + 4.0;
    assert_close(b.total, expected);
    assert!((b.total - 8.9282982).abs() < 1e-6);
}

#[test]
fn hand_computed_prune_of_a_hurting_seed() {
    // PRUNE of a TRAINING seed (6 epochs in stage, age 8) with c = -1.2; no
    // all-off measurement, so T = 60 - min(61.2) = -1.2. Another slot holds a
    // fossil (500 params); 2 occupied slots, 1 fossil.
    //
    // attribution: c < 0 -> -1.2, flipped by the PRUNE -> +1.2
    // synergy: none (discount 1/(1 + e^3.6) < 0.5)
    // pbrs: 0.3 * (0 - (2.0 + 1.8)) = -1.14
    // rent: 0.0039 * 10,000 + 500 = 539, g = 0.0539 -> -0.5 ln(1.0539)
    // occupancy: -0.01 * (2 - 1); fossil maintenance -0.002
    // PRUNE cost -0.005; prune shaping: age 8 >= 5, c < -0.5 -> +0.15
    // total = 1.2 - 1.14 - 0.5 ln(1.0539) - 0.01 - 0.002 - 0.005 + 0.15
    //       = 0.1667512...
    let config = RewardConfig::default();
    let inputs = RewardInputs {
        op: LifecycleOp::Prune,
        seed: Some(SeedFacts {
            contribution: Some(-1.2),
            progress: -0.5,
            stage_improvement: -1.0,
            interaction_sum: 2.0,
            ..seed(SeedStage::Training, 6, 8)
        }),
        seed_after: point(SeedStage::Pruned, 0),
        val_acc: 60.0,
        clean_total: None,
        solo_off_accuracies: vec![61.2],
        host_params: 10_000,
        slots: vec![
            slot(Some(SeedStage::Pruned), 0.0, 0),
            slot(Some(SeedStage::Fossilized), 1.0, 500),
        ],
        occupied_slots: 2,
        fossil_count: 1,
        epoch: 12,
        max_epochs: 25,
        ..RewardInputs::default()
    };
    let b = reward(&config, &inputs);
    assert_close(b.clean_total.unwrap(), 60.0 - 61.2);
    assert_close(b.attribution, 1.2);
    assert_eq!(b.synergy, 0.0);
    assert_close(b.pbrs, -1.14);
    assert_close(b.rent, -0.5 * 1.0539f64.ln());
    assert_close(b.occupancy, -0.01);
    assert_close(b.fossil_maintenance, -0.002);
    assert_close(b.op_cost, -0.005);
    assert_close(b.prune_shaping, 0.15);
    let expected = 1.2 - 1.14 - 0.5 * 1.0539f64.ln() - 0.01 - 0.002 - 0.005 + 0.15;
    assert_close(b.total, expected);
    assert!((b.total - 0.1667512).abs() < 1e-6);
}

#[test]
fn hand_computed_early_germination() {
    // GERMINATE into an empty slot at epoch 4: PBRS 0.3 * 0.995 * 1.0 times
    // the timing discount 0.4 + 0.6 * 4/10 = 0.64 -> 0.191040, cost -0.15;
    // total 0.041040. Into an occupied slot: -0.15 - 0.3 and no germination
    // bonus (the slot's potential is unchanged: 0.3 * (0.995 - 1) * 2.9).
    let config = RewardConfig::default();
    assert_close(timing_discount(&config, 4), 0.64);
    let mut inputs = RewardInputs {
        op: LifecycleOp::Germinate,
        seed_after: point(SeedStage::Germinated, 0),
        val_acc: 50.0,
        host_params: 10_000,
        slots: vec![slot(None, 0.0, 0)],
        epoch: 4,
        max_epochs: 25,
        ..RewardInputs::default()
    };
    let b = reward(&config, &inputs);
    assert_close(b.pbrs, 0.19104);
    assert_close(b.total, 0.19104 - 0.15);
    inputs.seed = Some(seed(SeedStage::Training, 3, 5));
    inputs.seed_after = point(SeedStage::Training, 3);
    let occupied = reward(&config, &inputs);
    assert_close(occupied.op_cost, -0.45);
    assert_close(occupied.pbrs, 0.3 * (0.995 - 1.0) * 2.9);
}

// ------------------------------------------------------- other modes --

#[test]
fn sparse_reward_formula() {
    let config = RewardConfig {
        mode: RewardMode::Sparse,
        ..RewardConfig::default()
    };
    let step = |terminal, committed, fossil_params, op| RewardInputs {
        op,
        seed: Some(seed(SeedStage::Training, 2, 3)),
        seed_after: point(SeedStage::Pruned, 0),
        val_acc: 75.0,
        committed_val_acc: committed,
        fossil_params,
        auto_prunes: 2,
        epoch: if terminal { 25 } else { 10 },
        max_epochs: 25,
        terminal,
        ..RewardInputs::default()
    };
    // Not terminal: nothing, whatever the op (no shaping, no auto-prune).
    let quiet = reward(&config, &step(false, None, 0, LifecycleOp::Prune));
    assert_eq!(quiet.total, 0.0);
    assert_eq!(quiet.mode, RewardMode::Sparse);
    // 72/100 - 0.1 * 100,000/500,000 = 0.70.
    let last = reward(&config, &step(true, Some(72.0), 100_000, LifecycleOp::Wait));
    assert_close(last.terminal, 0.70);
    assert_close(last.total, 0.70);
    // Clamped to [-1, 1].
    let full = step(true, Some(100.0), 0, LifecycleOp::Wait);
    assert_close(reward(&config, &full).total, 1.0);
    let bloated = step(true, Some(100.0), 20_000_000, LifecycleOp::Wait);
    assert_close(reward(&config, &bloated).total, -1.0);
    assert_close(sparse_reward(&config, &bloated).unwrap(), -1.0);
    // Scaled.
    let scaled = RewardConfig {
        sparse_reward_scale: 2.0,
        ..config.clone()
    };
    let last = step(true, Some(72.0), 100_000, LifecycleOp::Wait);
    assert_close(reward(&scaled, &last).total, 1.4);
    // The terminal step needs the committed accuracy.
    let missing = step(true, None, 0, LifecycleOp::Wait);
    assert_eq!(
        field_of(compute_reward(&config, &missing).unwrap_err()),
        "RewardInputs.committed_val_acc"
    );
}

#[test]
fn minimal_reward_formula() {
    let config = RewardConfig {
        mode: RewardMode::Minimal,
        ..RewardConfig::default()
    };
    let prune = |age, terminal| RewardInputs {
        op: LifecycleOp::Prune,
        seed: Some(seed(SeedStage::Training, 1, age)),
        seed_after: point(SeedStage::Pruned, 0),
        val_acc: 75.0,
        committed_val_acc: Some(72.0),
        fossil_params: 100_000,
        epoch: 25,
        max_epochs: 25,
        terminal,
        ..RewardInputs::default()
    };
    // Prune before age 5: -0.1.
    assert_close(reward(&config, &prune(3, false)).total, -0.1);
    assert_eq!(reward(&config, &prune(5, false)).total, 0.0);
    // At the terminal step: sparse 0.70 - 0.1.
    let last = reward(&config, &prune(4, true));
    assert_close(last.terminal, 0.70);
    assert_close(last.prune_shaping, -0.1);
    assert_close(last.total, 0.60);
    // A refused prune is no prune.
    let mut refused = prune(3, false);
    refused.op_succeeded = false;
    assert_eq!(reward(&config, &refused).total, 0.0);
}

// ------------------------------------------------------ episode rules --

#[test]
fn governor_rollback_forfeits_and_punishes_the_last_transition() {
    let config = RewardConfig::default();
    let normaliser = RewardNormaliserConfig::default();
    let mut rewards = vec![0.5, 1.0, -0.3, 2.0];
    let outcome = apply_governor_rollback(&config, &normaliser, &mut rewards).unwrap();
    assert_eq!(rewards, vec![0.0, 0.0, 0.0, -10.0]);
    assert!(outcome.penalised);
    assert_eq!(outcome.forfeited, 3);
    assert_eq!(outcome.penalty, -10.0);
    // Clipped to the normaliser's clip.
    let tight = RewardNormaliserConfig {
        clip: 5.0,
        ..normaliser
    };
    let mut single = vec![3.0];
    let outcome = apply_governor_rollback(&config, &tight, &mut single).unwrap();
    assert_eq!(single, vec![-5.0]);
    assert_eq!(outcome.forfeited, 0);
    // Nothing to punish before the first transition.
    let mut empty: Vec<f64> = Vec::new();
    let outcome = apply_governor_rollback(&config, &normaliser, &mut empty).unwrap();
    assert!(!outcome.penalised);
    // An invalid config is refused and the rewards are left alone.
    let mut kept = vec![1.0, 2.0];
    let invalid = RewardConfig {
        rollback_death_penalty: 10.0,
        ..RewardConfig::default()
    };
    assert!(apply_governor_rollback(&invalid, &normaliser, &mut kept).is_err());
    assert_eq!(kept, vec![1.0, 2.0]);
}

#[test]
fn auto_prune_penalty_per_seed() {
    let config = RewardConfig::default();
    assert_close(auto_prune_penalty(&config, 2), -0.4);
    assert_eq!(auto_prune_penalty(&config, 0), 0.0);
    let inputs = RewardInputs {
        val_acc: 50.0,
        auto_prunes: 1,
        epoch: 3,
        max_epochs: 10,
        ..RewardInputs::default()
    };
    let b = reward(&config, &inputs);
    assert_close(b.auto_prune, -0.2);
    assert_close(b.total, -0.2);
}

// -------------------------------------------------------- validation --

#[test]
fn non_finite_and_out_of_range_inputs_are_refused() {
    let config = RewardConfig::default();
    let base = RewardInputs {
        seed: Some(SeedFacts {
            contribution: Some(1.0),
            ..seed(SeedStage::Blending, 2, 8)
        }),
        seed_after: point(SeedStage::Blending, 3),
        val_acc: 50.0,
        slots: vec![slot(Some(SeedStage::Blending), 0.5, 100)],
        occupied_slots: 1,
        epoch: 3,
        max_epochs: 10,
        ..RewardInputs::default()
    };
    reward(&config, &base);
    let with_seed = |edit: fn(&mut SeedFacts)| {
        let mut inputs = base.clone();
        if let Some(facts) = inputs.seed.as_mut() {
            edit(facts);
        }
        inputs
    };
    let cases: Vec<(RewardInputs, &str)> = vec![
        (
            RewardInputs {
                val_acc: f64::NAN,
                ..base.clone()
            },
            "RewardInputs.val_acc",
        ),
        (
            RewardInputs {
                val_acc: 101.0,
                ..base.clone()
            },
            "RewardInputs.val_acc",
        ),
        (
            RewardInputs {
                clean_total: Some(f64::INFINITY),
                ..base.clone()
            },
            "RewardInputs.clean_total",
        ),
        (
            RewardInputs {
                solo_off_accuracies: vec![40.0, f64::NAN],
                ..base.clone()
            },
            "RewardInputs.solo_off_accuracies",
        ),
        (
            with_seed(|facts| facts.contribution = Some(f64::NAN)),
            "RewardInputs.seed.contribution",
        ),
        (
            with_seed(|facts| facts.progress = f64::NEG_INFINITY),
            "RewardInputs.seed.progress",
        ),
        (
            with_seed(|facts| facts.interaction_sum = f64::NAN),
            "RewardInputs.seed.interaction_sum",
        ),
        (
            RewardInputs {
                slots: vec![slot(Some(SeedStage::Blending), 1.5, 100)],
                ..base.clone()
            },
            "RewardInputs.slots.alpha",
        ),
        (
            RewardInputs {
                epoch: 11,
                ..base.clone()
            },
            "RewardInputs.epoch",
        ),
        (
            RewardInputs {
                max_epochs: 0,
                epoch: 0,
                ..base.clone()
            },
            "RewardInputs.max_epochs",
        ),
        (
            RewardInputs {
                fossil_count: 2,
                ..base.clone()
            },
            "RewardInputs.fossil_count",
        ),
    ];
    for (inputs, field) in cases {
        let error = compute_reward(&config, &inputs).unwrap_err();
        assert!(matches!(error, Error::InvalidInput { .. }), "{error}");
        assert_eq!(field_of(error), field);
    }
}

// --------------------------------------------------------- normaliser --

/// Sample standard deviation, two-pass.
fn sample_std(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let squares: f64 = values.iter().map(|v| (v - mean) * (v - mean)).sum();
    (squares / (n - 1.0)).sqrt()
}

#[test]
fn normaliser_divides_by_the_running_std_without_shifting() {
    let mut normaliser = RewardNormaliser::new(RewardNormaliserConfig::default()).unwrap();
    assert_eq!(normaliser.std(), None);
    // First reward: no spread yet, only clipped.
    assert_eq!(normaliser.update_and_normalise(25.0).unwrap(), 10.0);
    let rewards = [25.0, -3.0, 0.5, 4.0, 4.0, -1.25, 60.0, 0.0];
    for seen in 2..=rewards.len() {
        let reward = rewards[seen - 1];
        let normalised = normaliser.update_and_normalise(reward).unwrap();
        let std = sample_std(&rewards[..seen]);
        assert!((normaliser.std().unwrap() - std).abs() <= 1e-12 * std);
        assert!((normalised - (reward / std).clamp(-10.0, 10.0)).abs() <= 1e-12);
    }
    // Zero stays zero (no mean shift) and the sign is kept.
    assert_eq!(normaliser.normalise(0.0).unwrap(), 0.0);
    assert!(normaliser.normalise(-1.0).unwrap() < 0.0);
    // normalise() does not update.
    let count = normaliser.count();
    normaliser.normalise(3.0).unwrap();
    assert_eq!(normaliser.count(), count);
}

#[test]
fn normaliser_refuses_non_finite_rewards_and_keeps_its_state() {
    let mut normaliser = RewardNormaliser::new(RewardNormaliserConfig::default()).unwrap();
    normaliser.update_and_normalise(1.0).unwrap();
    normaliser.update_and_normalise(3.0).unwrap();
    let before = normaliser.state();
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let error = normaliser.update_and_normalise(bad).unwrap_err();
        assert_eq!(field_of(error), "RewardNormaliser.reward");
        assert!(normaliser.normalise(bad).is_err());
    }
    // A finite reward whose square overflows is refused too.
    assert!(normaliser.update_and_normalise(f64::MAX).is_err());
    assert_eq!(normaliser.state(), before);
}

#[test]
fn normaliser_state_round_trips_and_bad_states_are_refused() {
    let mut normaliser = RewardNormaliser::new(RewardNormaliserConfig::default()).unwrap();
    for reward in [0.2, -1.0, 5.0, 0.7] {
        normaliser.update_and_normalise(reward).unwrap();
    }
    let text = serde_json::to_string(&normaliser.state()).unwrap();
    let state: RewardNormaliserState = serde_json::from_str(&text).unwrap();
    let mut restored = RewardNormaliser::from_state(state).unwrap();
    assert_eq!(restored, normaliser);
    assert_eq!(
        restored.update_and_normalise(2.0).unwrap(),
        normaliser.update_and_normalise(2.0).unwrap()
    );
    let good = normaliser.state();
    for (bad, field) in [
        (
            RewardNormaliserState { m2: -1.0, ..good },
            "RewardNormaliserState.m2",
        ),
        (
            RewardNormaliserState {
                mean: f64::NAN,
                ..good
            },
            "RewardNormaliserState.mean",
        ),
        (
            RewardNormaliserState { count: 0, ..good },
            "RewardNormaliserState.count",
        ),
        (
            RewardNormaliserState { count: 1, ..good },
            "RewardNormaliserState.m2",
        ),
        (
            RewardNormaliserState {
                config: RewardNormaliserConfig {
                    clip: 0.0,
                    epsilon: 1e-8,
                },
                ..good
            },
            "RewardNormaliserConfig.clip",
        ),
    ] {
        assert_eq!(
            field_of(RewardNormaliser::from_state(bad).unwrap_err()),
            field
        );
    }
    assert!(serde_json::from_str::<RewardNormaliserState>(r#"{"count":1}"#).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Welford's running std matches the two-pass sample std of every reward
    /// seen, and the output is the clipped quotient.
    #[test]
    fn normaliser_matches_the_direct_std(rewards in prop::collection::vec(-50.0f64..50.0, 2..60)) {
        let mut normaliser = RewardNormaliser::new(RewardNormaliserConfig::default()).unwrap();
        let mut last = 0.0;
        for &reward in &rewards {
            last = normaliser.update_and_normalise(reward).unwrap();
        }
        let std = sample_std(&rewards);
        let running = normaliser.std().unwrap();
        prop_assert!((running - std).abs() <= 1e-9 * (1.0 + std));
        let expected = (rewards[rewards.len() - 1] / std.max(1e-8)).clamp(-10.0, 10.0);
        prop_assert!((last - expected).abs() <= 1e-9 * (1.0 + expected.abs()));
    }
}

#[test]
fn germination_delay_costs_only_an_offered_germination_not_taken() {
    let base = RewardInputs {
        epoch: 12,
        max_epochs: 150,
        val_acc: 80.0,
        germination_offered: true,
        ..RewardInputs::default()
    };
    // Off by default, as at the reference.
    assert_eq!(
        reward(&RewardConfig::default(), &base).germination_delay,
        0.0
    );

    let config = RewardConfig {
        germination_delay_cost: -0.1,
        ..RewardConfig::default()
    };
    let waited = reward(&config, &base);
    assert_close(waited.germination_delay, -0.1);
    assert_close(
        waited.total,
        reward(&RewardConfig::default(), &base).total - 0.1,
    );
    // Germinating pays its op cost and shaping but no delay.
    let germinated = RewardInputs {
        op: LifecycleOp::Germinate,
        seed_after: point(SeedStage::Germinated, 0),
        ..base.clone()
    };
    assert_eq!(reward(&config, &germinated).germination_delay, 0.0);
    // A refused GERMINATE is carried out as WAIT and pays.
    let refused = RewardInputs {
        op_succeeded: false,
        ..base.clone()
    };
    assert_close(reward(&config, &refused).germination_delay, -0.1);
    // Nothing when germination was not offered, nor at the last step.
    let blocked = RewardInputs {
        germination_offered: false,
        ..base.clone()
    };
    assert_eq!(reward(&config, &blocked).germination_delay, 0.0);
    let last = RewardInputs {
        epoch: 150,
        terminal: true,
        ..base.clone()
    };
    assert_eq!(reward(&config, &last).germination_delay, 0.0);
    // A positive cost is refused, naming the field.
    let wrong = RewardConfig {
        germination_delay_cost: 0.1,
        ..RewardConfig::default()
    };
    let error = compute_reward(&wrong, &base).expect_err("a positive cost is refused");
    assert_eq!(field_of(error), "RewardConfig.germination_delay_cost");
}

#[test]
fn the_accuracy_delta_pays_the_accuracy_gained_since_the_last_step() {
    let base = RewardInputs {
        epoch: 12,
        max_epochs: 150,
        val_acc: 81.5,
        previous_val_acc: Some(80.0),
        ..RewardInputs::default()
    };
    // Off by default, as at the reference.
    assert_eq!(reward(&RewardConfig::default(), &base).accuracy_delta, 0.0);
    let config = RewardConfig {
        accuracy_delta_weight: 2.0,
        ..RewardConfig::default()
    };
    let gained = reward(&config, &base);
    assert_close(gained.accuracy_delta, 3.0);
    assert_close(
        gained.total,
        reward(&RewardConfig::default(), &base).total + 3.0,
    );
    // A loss costs, and the first step (nothing to compare with) pays nothing.
    let lost = RewardInputs {
        val_acc: 79.0,
        ..base.clone()
    };
    assert_close(reward(&config, &lost).accuracy_delta, -2.0);
    let first = RewardInputs {
        previous_val_acc: None,
        ..base.clone()
    };
    assert_eq!(reward(&config, &first).accuracy_delta, 0.0);
    // Over an episode the term telescopes to w·(last − first accuracy).
    let accuracies = [10.0, 42.0, 40.5, 77.0, 85.25];
    let total: f64 = accuracies
        .windows(2)
        .map(|pair| {
            let step = RewardInputs {
                val_acc: pair[1],
                previous_val_acc: Some(pair[0]),
                ..base.clone()
            };
            reward(&config, &step).accuracy_delta
        })
        .sum();
    assert_close(total, 2.0 * (85.25 - 10.0));
    // A negative weight, or an accuracy outside [0, 100], is refused.
    let wrong = RewardConfig {
        accuracy_delta_weight: -1.0,
        ..RewardConfig::default()
    };
    let error = compute_reward(&wrong, &base).expect_err("a negative weight is refused");
    assert_eq!(field_of(error), "RewardConfig.accuracy_delta_weight");
    let outside = RewardInputs {
        previous_val_acc: Some(101.0),
        ..base.clone()
    };
    let error = compute_reward(&config, &outside).expect_err("an accuracy above 100");
    assert_eq!(field_of(error), "RewardInputs.previous_val_acc");
}

#[test]
fn every_live_seed_is_attributed_when_asked_and_only_the_targeted_one_by_default() {
    // A BLENDING seed that adds 4 points, 10 points of progress since it
    // germinated at epoch 20: its attribution is min(c, p) = 4.
    let blending = SeedFacts {
        contribution: Some(4.0),
        progress: 10.0,
        ..seed(SeedStage::Blending, 3, 20)
    };
    // A HOLDING seed with c = 6 ≥ p = 3: the harmonic mean, 4.
    let holding = SeedFacts {
        contribution: Some(6.0),
        progress: 3.0,
        ..seed(SeedStage::Holding, 2, 30)
    };
    let fossil = SeedFacts {
        contribution: Some(9.0),
        progress: 20.0,
        ..seed(SeedStage::Fossilized, 5, 60)
    };
    let base = RewardInputs {
        op: LifecycleOp::Wait,
        seed: Some(blending),
        seed_after: point(SeedStage::Blending, 4),
        other_seeds: vec![holding, fossil],
        val_acc: 80.0,
        clean_total: Some(12.0),
        epoch: 40,
        max_epochs: 150,
        ..RewardInputs::default()
    };
    // The reference pays the targeted seed alone.
    let reference = reward(&RewardConfig::default(), &base);
    assert_eq!(reference.other_attribution, 0.0);
    assert_close(reference.attribution, 4.0);
    let all = RewardConfig {
        attribute_all_seeds: true,
        ..RewardConfig::default()
    };
    let paid = reward(&all, &base);
    // The HOLDING seed is paid what it would earn as the targeted seed of a
    // WAIT; the fossil is paid nothing.
    let as_targeted = reward(
        &RewardConfig::default(),
        &RewardInputs {
            seed: Some(holding),
            seed_after: point(SeedStage::Holding, 3),
            other_seeds: Vec::new(),
            ..base.clone()
        },
    );
    assert_close(as_targeted.attribution, 4.0);
    assert_close(
        paid.other_attribution,
        as_targeted.attribution + as_targeted.ratio_penalty,
    );
    assert_close(paid.attribution, reference.attribution);
    assert_close(paid.total, reference.total + paid.other_attribution);
    // A PRUNE of the targeted seed flips its own attribution, not theirs.
    let pruned = reward(
        &all,
        &RewardInputs {
            op: LifecycleOp::Prune,
            seed_after: None,
            ..base.clone()
        },
    );
    assert_close(pruned.attribution, -4.0);
    assert_close(pruned.other_attribution, paid.other_attribution);
    // The other seeds' values are checked like the targeted seed's.
    let broken = RewardInputs {
        other_seeds: vec![SeedFacts {
            progress: f64::NAN,
            ..holding
        }],
        ..base.clone()
    };
    let error = compute_reward(&all, &broken).expect_err("a NaN progress is refused");
    assert_eq!(field_of(error), "RewardInputs.other_seeds.progress");
    let error = compute_reward(&RewardConfig::default(), &broken)
        .expect_err("refused whether or not the rule reads them");
    assert_eq!(field_of(error), "RewardInputs.other_seeds.progress");
}
