//! Helpers shared by simic's tests: the GAE cases' ([`gae`]), the twin
//! tests' (`twin.rs` on the CPU, `gpu.rs` on a GPU) and the imitation
//! tests' (`imitation.rs`): a small synthetic image task, a round of
//! environments driven by a scripted controller, with or without the
//! twin-delta term.

#![allow(dead_code, unreachable_pub)]

pub mod gae;

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

/// Environments of a round.
pub const ENVS: usize = 2;
/// Epochs of an episode.
pub const EPISODE: u32 = 20;

/// Whether Fashion-MNIST is missing (then the caller skips, and this says
/// so): the simic benches' quick runs read it.
pub fn fashion_mnist_missing() -> bool {
    use tolaria::data::fashion_mnist::{FashionMnistOptions, data_dir};
    let dir = data_dir(&FashionMnistOptions::default());
    let missing = !dir.join("train-images-idx3-ubyte.gz").exists();
    if missing {
        eprintln!(
            "skipped: no Fashion-MNIST in {} (cargo xtask provision installs it)",
            dir.display()
        );
    }
    missing
}

/// The synthetic Fashion-MNIST-like task, sharded over `ENVS`
/// environments, with three slots.
pub fn spec() -> EnvSpec {
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

/// The reference's settings shrunk to `ENVS` environments of `EPISODE`
/// epochs and a small policy, the auto-forward flags on, the twin term at
/// `twin_weight`.
pub fn config(twin_weight: f64) -> SimicConfig {
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
pub static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One round of `ENVS` environments on `device` driven by max growth
/// (`grow`) or by no one, with the twin term at `twin_weight`.
pub fn driven(device: Device, twin_weight: f64, grow: bool) -> RoundReport {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let config = config(twin_weight);
    let masks = MaskConfig {
        max_seeds: config.max_seeds,
        ..MaskConfig::default()
    };
    let mut simic = Simic::new(config, 3, device, Telemetry::disabled()).expect("simic");
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

/// The mean of `values`.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}
