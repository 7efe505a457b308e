//! The twin-delta reward term (`reward.twin_delta_weight`, not the
//! reference's) end to end on the CPU: each environment trains a twin of its
//! host with no seed, and the term pays the step's accuracy change less the
//! twin's. Driven by scripted controllers, so the trajectories do not
//! depend on the reward: a host grown by no one is its twin to the bit and
//! the term pays nothing; under max growth the term's episode sum is the
//! final accuracy less the seedless host's.

use kasmina::host::CnnHostConfig;
use leyline::Telemetry;
use simic::vectorized::{EnvSpec, RoundReport, Simic, SimicConfig};
use tamiyo::growth::{MaxGrowthController, NoGrowthController};
use tamiyo::masks::MaskConfig;
use tamiyo::policy::PolicyConfig;
use tch::Device;
use tolaria::controller::Controller;
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use tolaria::engine::trainer::ModelTrainerConfig;

const ENVS: usize = 2;
const EPISODE: u32 = 20;

fn spec() -> EnvSpec {
    let train = image_task(&ImageTaskOptions::fashion_like(256, 21)).expect("train data");
    let validation = image_task(&ImageTaskOptions::fashion_like(128, 22)).expect("validation");
    EnvSpec::sharded(
        CnnHostConfig::fashion_mnist(),
        vec!["r0c0".into(), "r0c1".into(), "r0c2".into()],
        &train,
        validation,
        ENVS,
    )
    .expect("spec")
}

fn config(twin_weight: f64) -> SimicConfig {
    let mut config = SimicConfig::reference(EPISODE);
    config.n_envs = ENVS;
    config.seed = 31;
    config.trainer = ModelTrainerConfig {
        batch_size: 64,
        ..ModelTrainerConfig::default()
    };
    config.policy = PolicyConfig {
        feature_dim: 32,
        hidden_dim: 32,
        ..PolicyConfig::default()
    };
    // Seeds that blend within the short episode (G2 holds a seed ten
    // TRAINING epochs).
    for setting in [
        "slot.auto_forward_g1=true",
        "slot.auto_forward_g2=true",
        "slot.auto_forward_g3=true",
    ] {
        simic::vectorized::settings::apply(&mut config, setting).expect(setting);
    }
    config.reward.twin_delta_weight = twin_weight;
    config
}

/// libtorch's generator is process-wide: runs take turns.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn driven(twin_weight: f64, grow: bool) -> RoundReport {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let config = config(twin_weight);
    let masks = MaskConfig {
        max_seeds: config.max_seeds,
        ..MaskConfig::default()
    };
    let mut simic = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let mut controllers: Vec<Box<dyn Controller>> = (0..ENVS)
        .map(|_| -> Box<dyn Controller> {
            if grow {
                Box::new(MaxGrowthController::new(masks))
            } else {
                Box::new(NoGrowthController)
            }
        })
        .collect();
    simic
        .drive_round(&spec(), &mut controllers)
        .expect("a driven round")
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

#[test]
fn a_host_grown_by_no_one_is_its_twin_and_the_term_pays_nothing() {
    let plain = driven(0.0, false);
    let twinned = driven(1.0, false);
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
    let plain = driven(0.0, true);
    let twinned = driven(2.0, true);
    let seedless = driven(0.0, false);
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
