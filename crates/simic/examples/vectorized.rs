//! A few rounds of vectorized PPO on a synthetic, Fashion-MNIST-shaped image
//! task: four environments, three slots, Tamiyo's policy choosing lifecycle
//! operations, one PPO update per round.
//!
//! `cargo run -p simic --release --example vectorized -- [--rounds N]
//! [--episode N] [--device cpu|cuda|auto]`

use anyhow::{Context, bail};
use kasmina::host::CnnHostConfig;
use leyline::Telemetry;
use simic::vectorized::{EnvSpec, Simic, SimicConfig};
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use torch_ext::DeviceChoice;

fn main() -> anyhow::Result<()> {
    let mut rounds = 3_usize;
    let mut episode = 10_u32;
    let mut device = DeviceChoice::Auto;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--rounds" => rounds = value()?.parse()?,
            "--episode" => episode = value()?.parse()?,
            "--device" => device = value()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    let device = torch_ext::device::select(device)?;
    let train = image_task(&ImageTaskOptions::fashion_like(4096, 1))?;
    let validation = image_task(&ImageTaskOptions::fashion_like(1024, 2))?;
    let mut config = SimicConfig::reference(episode);
    config.trainer.batch_size = 128;
    let spec = EnvSpec::sharded(
        CnnHostConfig::fashion_mnist(),
        vec!["r0c0".into(), "r0c1".into(), "r0c2".into()],
        &train,
        validation,
        config.n_envs,
    )?;
    let mut simic = Simic::new(config, 3, device, Telemetry::disabled())?;
    for round in 0..rounds {
        let report = simic.run_round(&spec, true)?;
        println!(
            "round {round}: {} env-epochs, mean episode reward {:.3}, final accuracies {:?}, \
             {:.2} live seeds per env, {} germinated, {} fossilized, {} pruned",
            report.env_epochs,
            report.mean_episode_reward,
            report.final_accuracies,
            report.mean_active_seeds,
            report.germinations,
            report.fossilizations,
            report.prunes
        );
    }
    if let Some(eps) = simic.eps() {
        println!("{eps:.2} environment-epochs per second");
    }
    Ok(())
}
