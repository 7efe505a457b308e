//! Trains CartPole-v1 with Simic's PPO and CleanRL's `ppo.py` recipe, and
//! reports the mean episodic return of the last 100 episodes.
//!
//! `cargo run -p simic --release --example cartpole -- [--seed N]
//! [--envs N] [--steps-per-rollout N] [--total-steps N] [--device cpu|cuda|auto]
//! [--json]`. The target is a mean return of at least 475 within 500 000
//! steps (CleanRL reports about 490).

use anyhow::{Context, bail};
use simic::cartpole::{CartpoleConfig, train_cartpole_with};

fn main() -> anyhow::Result<()> {
    let mut config = CartpoleConfig::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--seed" => config.seed = value()?.parse()?,
            "--envs" => config.n_envs = value()?.parse()?,
            "--steps-per-rollout" => config.steps_per_rollout = value()?.parse()?,
            "--total-steps" => config.total_steps = value()?.parse()?,
            "--device" => config.device = value()?.parse()?,
            "--json" => json = true,
            other => bail!("unknown argument {other}"),
        }
    }
    // The network is tiny: one thread avoids libtorch's parallel overhead.
    tch::set_num_threads(1);
    let report = train_cartpole_with(config, |record| {
        if record.update % 25 == 0 {
            eprintln!(
                "update {:4}  steps {:7}  episodes {:5}  mean return {:7.1}  kl {:.4}  clip {:.3}",
                record.update,
                record.steps,
                record.episodes,
                record.mean_return.unwrap_or(f64::NAN),
                record.approx_kl,
                record.clip_fraction,
            );
        }
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    println!(
        "CartPole-v1: mean return {:.1} over the last {} episodes (best {:.1}, first {:.1}); \
         {} steps, {} episodes, {:.1} s",
        report.mean_return,
        report.config.report_window,
        report.best_mean_return,
        report.initial_mean_return,
        report.steps,
        report.episodes,
        report.wall_time_s,
    );
    Ok(())
}
