//! ESCROW (the reference's escrow attribution): a seed's credit moves
//! towards its target by clipped steps, a PRUNE and a negative contribution
//! take it back, a fossil keeps it, and the last step forfeits what is
//! still at risk; over an episode a held seed earns nothing where SHAPED
//! pays it at every step. The environment's bookkeeping is imitated here as
//! `Simic`'s environments do it (the credit after each step carried into
//! the next).

use leyline::{LifecycleOp, SeedStage};
use simic::Error;
use simic::rewards::{
    EscrowInputs, RewardBreakdown, RewardConfig, RewardInputs, RewardMode, SeedFacts, StagePoint,
    compute_reward,
};

#[track_caller]
fn assert_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() <= 1e-9 * (1.0 + expected.abs()),
        "got {actual}, expected {expected}"
    );
}

fn escrow_config() -> RewardConfig {
    RewardConfig {
        mode: RewardMode::Escrow,
        ..RewardConfig::default()
    }
}

/// A HOLDING seed (past the warm-up, so SHAPED's timing discount is 1)
/// with contribution `c` and progress `p`.
fn held(c: f64, p: f64) -> SeedFacts {
    SeedFacts {
        stage: SeedStage::Holding,
        epochs_in_stage: 1,
        age_epochs: 20,
        contribution: Some(c),
        progress: p,
        stage_improvement: 0.0,
        interaction_sum: 0.0,
    }
}

fn point(stage: SeedStage) -> Option<StagePoint> {
    Some(StagePoint {
        stage,
        epochs_in_stage: 1,
    })
}

/// One step on the targeted seed `seed` with the slot's `credit`, the clean
/// total large enough that no ratio penalty fires, the stable accuracy
/// equal to this epoch's.
fn step(
    config: &RewardConfig,
    op: LifecycleOp,
    seed: SeedFacts,
    after: SeedStage,
    credit: f64,
    terminal: bool,
) -> RewardBreakdown {
    let inputs = RewardInputs {
        op,
        seed: Some(seed),
        seed_after: point(after),
        val_acc: 80.0,
        clean_total: Some(10.0),
        epoch: 30,
        max_epochs: 40,
        terminal,
        escrow: Some(EscrowInputs {
            stable_val_acc: 80.0,
            credit,
            others_at_risk: 0.0,
        }),
        ..RewardInputs::default()
    };
    let breakdown = compute_reward(config, &inputs).expect("valid inputs");
    assert_close(breakdown.total, breakdown.component_sum());
    breakdown
}

#[test]
fn the_mode_is_named_escrow_and_needs_its_inputs() {
    let json = serde_json::to_string(&RewardMode::Escrow).unwrap();
    assert_eq!(json, "\"escrow\"");
    let refused = compute_reward(&escrow_config(), &RewardInputs::default()).unwrap_err();
    assert!(
        matches!(
            refused,
            Error::InvalidInput {
                field: "RewardInputs.escrow",
                ..
            }
        ),
        "{refused}"
    );
    // SHAPED ignores the escrow inputs.
    let shaped = compute_reward(
        &RewardConfig::default(),
        &RewardInputs {
            escrow: Some(EscrowInputs {
                stable_val_acc: 50.0,
                credit: 3.0,
                others_at_risk: 4.0,
            }),
            terminal: true,
            epoch: 1,
            ..RewardInputs::default()
        },
    )
    .unwrap();
    assert_eq!(shaped.escrow_forfeit, 0.0);
    assert_eq!(shaped.mode, RewardMode::Shaped);
}

#[test]
fn every_seeds_attribution_and_a_stable_window_of_zero_are_refused() {
    let config = RewardConfig {
        attribute_all_seeds: true,
        ..escrow_config()
    };
    let error = config.validate().unwrap_err();
    assert!(
        matches!(
            error,
            Error::InvalidConfig {
                field: "RewardConfig.attribute_all_seeds",
                ..
            }
        ),
        "{error}"
    );
    let config = RewardConfig {
        escrow_stable_window: 0,
        ..escrow_config()
    };
    assert!(config.validate().is_err());
    let config = RewardConfig {
        escrow_delta_clip: f64::NAN,
        ..escrow_config()
    };
    assert!(config.validate().is_err());
    // A non-finite credit is refused, naming the field.
    let inputs = RewardInputs {
        escrow: Some(EscrowInputs {
            stable_val_acc: 50.0,
            credit: f64::INFINITY,
            others_at_risk: 0.0,
        }),
        ..RewardInputs::default()
    };
    let error = compute_reward(&escrow_config(), &inputs).unwrap_err();
    assert!(
        matches!(
            error,
            Error::InvalidInput {
                field: "RewardInputs.escrow.credit",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn the_credit_moves_to_its_target_by_clipped_steps() {
    // c = 25 ≥ p = 4: the target is √(4·25) = 10, reached by steps of at
    // most 2.
    let config = escrow_config();
    let mut credit = 0.0;
    let mut paid = Vec::new();
    for _ in 0..7 {
        let b = step(
            &config,
            LifecycleOp::Wait,
            held(25.0, 4.0),
            SeedStage::Holding,
            credit,
            false,
        );
        paid.push(b.attribution);
        credit = b.escrow_credit;
    }
    let expected = [2.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0];
    for (got, want) in paid.iter().zip(expected) {
        assert_close(*got, want);
    }
    assert_close(credit, 10.0);
    // Without a clip the whole change is paid at once; c < p pays c.
    let unclipped = RewardConfig {
        escrow_delta_clip: 0.0,
        ..escrow_config()
    };
    let b = step(
        &unclipped,
        LifecycleOp::Wait,
        held(3.0, 9.0),
        SeedStage::Holding,
        0.0,
        false,
    );
    assert_close(b.attribution, 3.0);
    assert_close(b.escrow_credit, 3.0);
}

#[test]
fn progress_is_taken_at_the_stable_accuracy() {
    // Progress 6 at this epoch's accuracy, 2 at the stable one (4 points
    // lower): the target is √(2·8) = 4, not √(6·8).
    let inputs = RewardInputs {
        op: LifecycleOp::Wait,
        seed: Some(held(8.0, 6.0)),
        seed_after: point(SeedStage::Holding),
        val_acc: 80.0,
        clean_total: Some(10.0),
        epoch: 30,
        max_epochs: 40,
        escrow: Some(EscrowInputs {
            stable_val_acc: 76.0,
            credit: 0.0,
            others_at_risk: 0.0,
        }),
        ..RewardInputs::default()
    };
    let config = RewardConfig {
        escrow_delta_clip: 0.0,
        ..escrow_config()
    };
    let b = compute_reward(&config, &inputs).unwrap();
    assert_close(b.attribution, 4.0);
    // No progress at the stable accuracy: the target is 0.
    let lower = RewardInputs {
        escrow: Some(EscrowInputs {
            stable_val_acc: 70.0,
            credit: 1.5,
            others_at_risk: 0.0,
        }),
        ..inputs
    };
    let b = compute_reward(&config, &lower).unwrap();
    assert_close(b.attribution, -1.5);
    assert_close(b.escrow_credit, 0.0);
}

#[test]
fn a_prune_and_a_harmful_seed_take_the_credit_back_and_a_fossil_keeps_it() {
    let config = escrow_config();
    let pruned = step(
        &config,
        LifecycleOp::Prune,
        held(5.0, 5.0),
        SeedStage::Pruned,
        3.0,
        false,
    );
    assert_close(pruned.attribution, -3.0);
    assert_close(pruned.escrow_credit, 0.0);
    // c < 0 pays the harm and the credit back.
    let harmful = step(
        &config,
        LifecycleOp::Wait,
        held(-2.0, 5.0),
        SeedStage::Holding,
        3.0,
        false,
    );
    assert_close(harmful.attribution, -2.0 - 3.0);
    assert_close(harmful.escrow_credit, 0.0);
    // A fossil earns nothing more and keeps its credit.
    let mut fossil = held(9.0, 9.0);
    fossil.stage = SeedStage::Fossilized;
    let kept = step(
        &config,
        LifecycleOp::Wait,
        fossil,
        SeedStage::Fossilized,
        4.0,
        false,
    );
    assert_eq!(kept.attribution, 0.0);
    assert_close(kept.escrow_credit, 4.0);
    // An unmeasured contribution leaves the credit as it is.
    let mut unmeasured = held(0.0, 5.0);
    unmeasured.contribution = None;
    let unchanged = step(
        &config,
        LifecycleOp::Wait,
        unmeasured,
        SeedStage::Holding,
        4.0,
        false,
    );
    assert_eq!(unchanged.attribution, 0.0);
    assert_close(unchanged.escrow_credit, 4.0);
}

#[test]
fn the_last_step_forfeits_every_credit_still_at_risk() {
    let config = escrow_config();
    let inputs = |after: SeedStage, others: f64| RewardInputs {
        op: LifecycleOp::Wait,
        seed: Some(held(25.0, 4.0)),
        seed_after: point(after),
        val_acc: 80.0,
        clean_total: Some(10.0),
        epoch: 40,
        max_epochs: 40,
        terminal: true,
        escrow: Some(EscrowInputs {
            stable_val_acc: 80.0,
            credit: 10.0,
            others_at_risk: others,
        }),
        ..RewardInputs::default()
    };
    // Held to the end: its own credit and the others' are forfeited.
    let held_to_end = compute_reward(&config, &inputs(SeedStage::Holding, 2.5)).unwrap();
    assert_close(held_to_end.escrow_forfeit, -(10.0 + 2.5));
    // A fossil's own credit is kept; the others' still go.
    let fossilized = compute_reward(&config, &inputs(SeedStage::Fossilized, 2.5)).unwrap();
    assert_close(fossilized.escrow_forfeit, -2.5);
    // Before the last step nothing is forfeited.
    let earlier = RewardInputs {
        terminal: false,
        epoch: 39,
        ..inputs(SeedStage::Holding, 2.5)
    };
    assert_eq!(
        compute_reward(&config, &earlier).unwrap().escrow_forfeit,
        0.0
    );
}

/// The attribution (and forfeit) one seed earns over an episode of `steps`
/// WAITs on it, fossilized after step `fossilize_at` if given.
fn episode_attribution(config: &RewardConfig, steps: u32, fossilize_at: Option<u32>) -> f64 {
    let mut credit = 0.0;
    let mut earned = 0.0;
    for index in 1..=steps {
        let fossil = fossilize_at.is_some_and(|at| index > at);
        let mut seed = held(25.0, 4.0);
        let mut op = LifecycleOp::Wait;
        if fossil {
            seed.stage = SeedStage::Fossilized;
        } else if fossilize_at == Some(index) {
            op = LifecycleOp::Fossilize;
        }
        let after = if fossilize_at.is_some_and(|at| index >= at) {
            SeedStage::Fossilized
        } else {
            SeedStage::Holding
        };
        let b = step(config, op, seed, after, credit, index == steps);
        earned += b.attribution + b.ratio_penalty + b.escrow_forfeit;
        credit = if config.mode == RewardMode::Escrow {
            b.escrow_credit
        } else {
            0.0
        };
    }
    earned
}

#[test]
fn over_an_episode_a_held_seed_earns_nothing_and_a_fossil_its_credit() {
    let shaped = RewardConfig::default();
    let escrow = escrow_config();
    // SHAPED pays the harmonic mean 2·4·25/29 at every step it is held: the
    // longer it is held, the more it earns.
    let per_step = 2.0 * 4.0 * 25.0 / 29.0;
    assert_close(episode_attribution(&shaped, 20, None), 20.0 * per_step);
    assert_close(episode_attribution(&shaped, 40, None), 40.0 * per_step);
    // ESCROW: held to the end, the credit is forfeited.
    assert_close(episode_attribution(&escrow, 20, None), 0.0);
    assert_close(episode_attribution(&escrow, 40, None), 0.0);
    // Fossilized once the credit reached its target (10), it keeps it,
    // however long the episode goes on.
    assert_close(episode_attribution(&escrow, 20, Some(8)), 10.0);
    assert_close(episode_attribution(&escrow, 40, Some(8)), 10.0);
}
