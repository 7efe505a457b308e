//! The twin-delta reward term (`reward.twin_delta_weight`, not the
//! reference's) end to end on the CPU: each environment trains a twin of its
//! host with no seed, and the term pays the step's accuracy change less the
//! twin's. Driven by scripted controllers, so the trajectories do not
//! depend on the reward: a host grown by no one is its twin to the bit and
//! the term pays nothing; under max growth the term's episode sum is the
//! final accuracy less the seedless host's.

mod common;

use common::{driven, mean};
use tch::Device;

#[test]
fn a_host_grown_by_no_one_is_its_twin_and_the_term_pays_nothing() {
    let plain = driven(Device::Cpu, 0.0, false);
    let twinned = driven(Device::Cpu, 1.0, false);
    assert_eq!(plain.final_accuracies, twinned.final_accuracies);
    assert_eq!(
        plain.mean_episode_reward.to_bits(),
        twinned.mean_episode_reward.to_bits(),
        "{} vs {}",
        plain.mean_episode_reward,
        twinned.mean_episode_reward
    );
}

#[test]
fn under_max_growth_the_term_sums_to_the_gain_over_the_seedless_host() {
    let plain = driven(Device::Cpu, 0.0, true);
    let twinned = driven(Device::Cpu, 2.0, true);
    let seedless = driven(Device::Cpu, 0.0, false);
    assert!(plain.germinations > 0, "max growth germinated nothing");
    // The twin leaves the host's training as it is.
    assert_eq!(plain.final_accuracies, twinned.final_accuracies);
    let gain = mean(&plain.final_accuracies) - mean(&seedless.final_accuracies);
    assert!(gain.abs() > 1e-9, "the seeds changed nothing: {gain}");
    // Σ_t 2·((acc_t − acc_{t−1}) − (twin_t − twin_{t−1})) over steps 2..L
    // = 2·((final − first) − (twin final − twin first)), and the first
    // step is before any seed: first = twin first.
    let paid = twinned.mean_episode_reward - plain.mean_episode_reward;
    assert!(
        (paid - 2.0 * gain).abs() < 1e-6,
        "the term paid {paid}, twice the gain is {}",
        2.0 * gain
    );
}

#[test]
fn the_term_pays_the_change_less_the_twins_and_refuses_bad_figures() {
    use simic::Error;
    use simic::rewards::{RewardConfig, RewardInputs, compute_reward};
    let base = RewardInputs {
        epoch: 12,
        max_epochs: 150,
        val_acc: 81.5,
        previous_val_acc: Some(80.0),
        twin_val_acc: Some((80.75, Some(80.0))),
        ..RewardInputs::default()
    };
    let pays = |config: &RewardConfig, inputs: &RewardInputs| {
        let breakdown = compute_reward(config, inputs).expect("valid inputs");
        assert!((breakdown.total - breakdown.component_sum()).abs() < 1e-9);
        breakdown.twin_delta
    };
    // Off by default, as at the reference.
    assert_eq!(pays(&RewardConfig::default(), &base), 0.0);
    let config = RewardConfig {
        twin_delta_weight: 2.0,
        ..RewardConfig::default()
    };
    // 2·((81.5 − 80) − (80.75 − 80)) = 1.5; the twin gaining more costs.
    assert!((pays(&config, &base) - 1.5).abs() < 1e-12);
    let behind = RewardInputs {
        twin_val_acc: Some((82.0, Some(80.0))),
        ..base.clone()
    };
    assert!((pays(&config, &behind) + 1.0).abs() < 1e-12);
    // Nothing to compare with: the episode's first step, or no twin.
    for inputs in [
        RewardInputs {
            previous_val_acc: None,
            twin_val_acc: Some((80.75, None)),
            ..base.clone()
        },
        RewardInputs {
            twin_val_acc: None,
            ..base.clone()
        },
    ] {
        assert_eq!(pays(&config, &inputs), 0.0);
    }
    // A negative weight, or a twin accuracy that is not one, is refused.
    let field = |error: Error| match error {
        Error::InvalidInput { field, .. } | Error::InvalidConfig { field, .. } => field,
        other => panic!("unexpected error {other}"),
    };
    let negative = RewardConfig {
        twin_delta_weight: -1.0,
        ..RewardConfig::default()
    };
    let error = compute_reward(&negative, &base).expect_err("a negative weight");
    assert_eq!(field(error), "RewardConfig.twin_delta_weight");
    for twin in [(f64::NAN, Some(80.0)), (80.0, Some(101.0)), (-1.0, None)] {
        let inputs = RewardInputs {
            twin_val_acc: Some(twin),
            ..base.clone()
        };
        let error = compute_reward(&config, &inputs).expect_err("a broken twin accuracy");
        assert_eq!(field(error), "RewardInputs.twin_val_acc", "{twin:?}");
    }
}
