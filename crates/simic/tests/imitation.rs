//! The imitation warm-up ([`simic::vectorized::ImitationConfig`]) on the
//! CPU: the run's first updates are imitation rounds driven by the
//! demonstrator, whose every decision the policy's own masks allow (max
//! growth under the policy's mask rules, and the heuristic, whose ADVANCEs
//! are imitated as WAITs where the auto-forward flags advance every gate);
//! the policy's negative log-likelihood of the demonstrated actions falls
//! from update to update; an evaluation round in between takes none of the
//! imitation updates; the greedy policy then grows as its demonstrator
//! did; and once the imitation updates are spent, rounds are PPO rounds
//! again.

mod common;

use common::{ENVS, TURN, config, spec};
use leyline::Telemetry;
use simic::vectorized::{Demonstrator, ImitationConfig, Simic};
use tamiyo::policy::SampleMode;
use tch::Device;

/// Imitation updates of the run.
const IMITATION: u64 = 3;

#[test]
fn the_first_updates_imitate_the_demonstrator_and_the_greedy_policy_grows_as_it_did() {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = config(0.0);
    config.imitation = ImitationConfig {
        updates: IMITATION,
        demonstrator: Demonstrator::MaxGrowth,
        ..ImitationConfig::default()
    };
    let spec = spec();
    let mut simic = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let mut nll = Vec::new();
    for update in 0..IMITATION {
        let report = simic.run_round(&spec, true).expect("an imitation round");
        let figures = report.imitation.expect("the round imitates");
        assert_eq!(figures.demonstrator, Demonstrator::MaxGrowth);
        assert!(figures.imitated > 0, "update {update}: {figures:?}");
        assert_eq!(
            figures.not_imitable, 0,
            "max growth under the policy's own masks asks nothing the masks forbid"
        );
        assert!(report.germinations > 0, "the demonstrator drove the round");
        assert!(report.refused_decisions == 0);
        nll.push(report.ppo.expect("the round learned").policy_loss);
        if update == 0 {
            // An evaluation round between two imitation rounds: no update,
            // no imitation, and it does not use up an imitation update.
            simic.set_sample_mode(SampleMode::Stochastic);
            let evaluation = simic.evaluate_on(&spec, 7, 0).expect("evaluation");
            assert!(evaluation.imitation.is_none() && evaluation.ppo.is_none());
        }
    }
    println!("the demonstrated actions' negative log-likelihood per update: {nll:?}");
    let (first, last) = (nll[0], nll[nll.len() - 1]);
    assert!(
        first.is_finite() && last < 0.6 * first,
        "the demonstrated actions' negative log-likelihood per update: {nll:?}"
    );

    // The greedy policy, on environments it never saw, grows in every
    // environment as max growth does.
    simic.set_sample_mode(SampleMode::Greedy);
    let greedy = simic
        .evaluate_on(&spec, 1_234, 0)
        .expect("greedy evaluation");
    assert_eq!(greedy.outcomes.len(), ENVS);
    for (env, outcome) in greedy.outcomes.iter().enumerate() {
        assert!(
            !outcome.germinated.is_empty(),
            "environment {env} of the greedy read-out grew nothing: {:?}",
            greedy.actions
        );
    }

    // The imitation updates are spent: the next learning round is PPO's.
    simic.set_sample_mode(SampleMode::Stochastic);
    let report = simic.run_round(&spec, true).expect("a PPO round");
    assert!(report.imitation.is_none());
    assert!(report.ppo.is_some());
}

/// The reference's heuristic as the demonstrator, with the auto-forward
/// flags on (ADVANCE out of the action space): it grows on this task in a
/// 40-epoch episode, asks for ADVANCE at its gates, and every one of those
/// is imitated as the WAIT it amounts to; nothing it does is refused by the
/// policy's masks.
#[test]
fn the_heuristic_demonstrates_and_its_advances_are_imitated_as_waits() {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = config(0.0);
    config.episode_length = 40;
    assert!(config.masks.disable_advance);
    config.imitation = ImitationConfig {
        updates: 1,
        demonstrator: Demonstrator::Heuristic,
        ..ImitationConfig::default()
    };
    let mut simic = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let report = simic.run_round(&spec(), true).expect("an imitation round");
    let figures = report.imitation.expect("the round imitates");
    assert!(report.germinations > 0, "{:?}", report.actions);
    assert!(
        figures.advances_as_wait > 0 && figures.advances_as_wait < figures.imitated,
        "{figures:?}"
    );
    assert_eq!(figures.not_imitable, 0, "{figures:?}");
    assert!(report.ppo.is_some_and(|ppo| ppo.policy_loss.is_finite()));
}

/// A setting names the warm-up; a wrong name or value is refused and
/// leaves the configuration as it was.
#[test]
fn the_imitation_settings_set_the_warm_up_and_refuse_bad_values() {
    let mut config = config(0.0);
    simic::vectorized::settings::apply_all(
        &mut config,
        &[
            "imitation.updates=8".to_owned(),
            "imitation.demonstrator=heuristic".to_owned(),
            "imitation.epochs=16".to_owned(),
        ],
    )
    .expect("the settings apply");
    assert_eq!(
        config.imitation,
        ImitationConfig {
            updates: 8,
            demonstrator: Demonstrator::Heuristic,
            epochs: 16,
            ..ImitationConfig::default()
        }
    );
    // The anchor, with max growth: a heuristic demonstrator cannot label
    // the policy's states.
    let anchored = simic::vectorized::settings::apply_all(
        &mut config,
        &["imitation.anchor_weight=1.5".to_owned()],
    )
    .expect_err("an anchor to the heuristic")
    .to_string();
    assert!(anchored.contains("max_growth"), "{anchored}");
    simic::vectorized::settings::apply_all(
        &mut config,
        &[
            "imitation.demonstrator=max_growth".to_owned(),
            "imitation.anchor_weight=1.5".to_owned(),
            "imitation.anchor_decay=0.9".to_owned(),
        ],
    )
    .expect("the anchor's settings apply");
    assert_eq!(
        (
            config.imitation.anchor_weight,
            config.imitation.anchor_decay
        ),
        (1.5, 0.9)
    );
    for bad in [
        "imitation.updates=-1",
        "imitation.epochs=0",
        "imitation.updates=two",
        "imitation.demonstrator=oracle",
        "imitation.teacher=heuristic",
        "imitation.anchor_weight=-1",
        "imitation.anchor_weight=heavy",
        "imitation.anchor_decay=0",
        "imitation.anchor_decay=1.5",
        "imitation.demonstrator=heuristic",
    ] {
        let before = config.imitation;
        let error = simic::vectorized::settings::apply(&mut config, bad)
            .expect_err(bad)
            .to_string();
        assert!(error.contains(bad), "{bad}: {error}");
        assert_eq!(config.imitation, before);
    }
}
