//! `esper train --controller ppo`: Tamiyo's policy trained by Simic's
//! vectorized PPO on the run's task.
//!
//! Each round builds `envs` fresh environments (the task's host with the
//! run's slots, each on its share of the training set, all validating on the
//! task's validation set), runs one episode of `epochs` epochs in every one
//! of them with the policy choosing the lifecycle operations, and makes one
//! PPO update (`simic::vectorized::Simic`). Into the run directory go
//! `config.toml`, `rounds.jsonl` (one line per round: mean episode reward,
//! final accuracies, live seeds, lifecycle counts, eps, the update's
//! figures), the telemetry (JSON lines), and after the last round (or a
//! Ctrl-C between rounds) the policy's weights as `policy.safetensors` and
//! the run picture ([`crate::plot_rounds`]), and checkpoints every
//! `checkpoint_every` rounds, after the last one and at a Ctrl-C
//! ([`super::ppo_checkpoint`]; `--resume RUN_DIR` continues from the
//! newest). With `--nproc N` this is one rank of N ([`super::ranks`]); rank
//! 0 alone writes the run directory.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use leyline::Telemetry;
use nissa::Hub;
use nissa::jsonl::JsonlConfig;
use simic::vectorized::{EnvSpec, RoundReport, Simic, SimicConfig};
use torch_ext::dist::ProcessGroup;

use super::args::{PolicyPrecisionChoice, RewardChoice};
use super::config::RunConfig;
use super::interrupt::Interrupt;
use super::ppo_checkpoint::{self, PpoLoaded};
use super::progress::RoundProgress;
use super::{CONFIG_NAME, Finished, TELEMETRY_DIR, create_run_dir, task, trainer_config};

/// The rounds log inside the run directory.
pub(crate) const ROUNDS_FILE: &str = "rounds.jsonl";

/// The policy's weights inside the run directory.
pub(crate) const POLICY_FILE: &str = "policy.safetensors";

/// Runs a PPO run of `config` (see the module docs).
pub(crate) fn run(config: &RunConfig, resume: Option<PpoLoaded>) -> Result<Finished> {
    let device = torch_ext::device::select(config.device_choice()?)
        .with_context(|| format!("selecting device {}", config.device))?;
    // A rank of `--nproc N` joins its group; rank 0 alone writes the run.
    let group = super::ranks::join_group(device)?;
    let device = group.as_ref().map_or(device, ProcessGroup::device);
    let lead = group.as_ref().is_none_or(|group| group.rank() == 0);
    if lead {
        println!(
            "esper train: task {}, controller ppo ({} environments x {} epochs, {} rounds), device \
         {}, run directory {}",
            config.task.name(),
            config.envs,
            config.epochs,
            config.rounds,
            torch_ext::DeviceChoice::of(device),
            config.run_dir.display()
        );
    }
    let data = task::load_data(config)?;
    let spec = EnvSpec::sharded(
        task::host_config(config.task),
        config.slots.clone(),
        &data.train,
        data.validation,
        config.envs,
    )
    .context("splitting the training set between the environments")?;
    let interrupt = Interrupt::install()?;
    if !lead {
        return rounds(config, device, &spec, None, group, &interrupt, None);
    }
    let mut jsonl = JsonlConfig::new(config.run_dir.join(TELEMETRY_DIR));
    match &resume {
        None => {
            create_run_dir(&config.run_dir)?;
            config.write(&config.run_dir.join(CONFIG_NAME))?;
        }
        Some(loaded) => {
            // Everything written after the checkpoint is written again.
            let round = loaded.manifest.round;
            ppo_checkpoint::rewind_rounds(
                &config.run_dir.join(ROUNDS_FILE),
                loaded.manifest.rounds_lines,
            )?;
            super::checkpoint::rewind_telemetry_to(&config.run_dir, &loaded.manifest.telemetry)?;
            jsonl.file_stem = format!("events-resumed-round-{round}");
            println!(
                "resuming {} after round {round} from {}",
                config.run_dir.display(),
                loaded.dir.display()
            );
        }
    }
    let mut hub = Hub::builder().jsonl(jsonl);
    if let Some(port) = config.metrics_port {
        hub = hub.prometheus_on_port(port);
    }
    let hub = hub.build().context("starting the telemetry hub")?;
    if let Some(addr) = hub.metrics_addr() {
        println!("telemetry: Prometheus metrics on http://{addr}/metrics");
    }
    let result = rounds(config, device, &spec, Some(&hub), group, &interrupt, resume);
    let flushed = hub.flush(Duration::from_secs(10));
    hub.close();
    if !flushed.is_complete() {
        eprintln!(
            "esper: {} telemetry packets were still pending when the run ended",
            flushed.pending
        );
    }
    result
}

fn simic_config(config: &RunConfig) -> Result<SimicConfig> {
    let episode = u32::try_from(config.epochs).context("epochs does not fit u32")?;
    let mut simic = SimicConfig::reference(episode);
    simic.n_envs = config.envs;
    simic.max_seeds = config.max_seeds;
    simic.seed = config.seed;
    simic.env_devices = config.env_devices()?;
    simic.ppo.epochs = config.ppo_epochs;
    simic.ppo.learning_rate = config.ppo_learning_rate;
    simic.ppo.entropy_coef = config.entropy_coef;
    simic.prewarm_blueprints = config.prewarm_blueprints;
    simic.reward.mode = match config.reward_mode {
        RewardChoice::Shaped => simic::rewards::RewardMode::Shaped,
        RewardChoice::Sparse => simic::rewards::RewardMode::Sparse,
        RewardChoice::Minimal => simic::rewards::RewardMode::Minimal,
    };
    simic.policy_precision = match config.policy_precision {
        PolicyPrecisionChoice::Auto => None,
        PolicyPrecisionChoice::Fp32 => Some(tamiyo::policy::PolicyPrecision::Fp32),
        PolicyPrecisionChoice::Bf16 => Some(tamiyo::policy::PolicyPrecision::Bf16),
    };
    simic.trainer = tolaria::engine::trainer::ModelTrainerConfig {
        // Simic's environment settings: one warm-up step before a capture,
        // no cuDNN timing at every new step shape.
        graph_warmup_steps: simic.trainer.graph_warmup_steps,
        cudnn_benchmark: simic.trainer.cudnn_benchmark,
        ..trainer_config(config)
    };
    Ok(simic)
}

fn rounds(
    config: &RunConfig,
    device: tch::Device,
    spec: &EnvSpec,
    hub: Option<&Hub>,
    group: Option<ProcessGroup>,
    interrupt: &Interrupt,
    resume: Option<PpoLoaded>,
) -> Result<Finished> {
    let telemetry = hub.map_or_else(Telemetry::disabled, Hub::telemetry);
    let mut simic = Simic::new(simic_config(config)?, config.slots.len(), device, telemetry)?;
    let resumed = resume.is_some();
    if let Some(loaded) = resume {
        simic
            .import_state(&loaded.manifest.state, &loaded.tensors)
            .context("restoring the PPO checkpoint")?;
    }
    let ranked = group.is_some();
    if let Some(group) = group {
        simic
            .join(group)
            .context("joining the data-parallel group")?;
    }
    let (rank, world) = simic.rank_and_world();
    if rank != 0 {
        return follower_rounds(config, spec, &mut simic, interrupt);
    }
    let log_path = config.run_dir.join(ROUNDS_FILE);
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(resumed)
        .write(!resumed)
        .truncate(!resumed)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let first = usize::try_from(simic.rounds()).unwrap_or(usize::MAX);
    let mut lines = first;
    let mut saved_at = simic.rounds();
    let mut finished = Finished::Completed;
    let progress = RoundProgress::new(config.rounds, first);
    for round in first..config.rounds {
        // Every rank stops at the same boundary.
        if simic.any_rank(interrupt.requested())? {
            finished = Finished::Interrupted;
            break;
        }
        let report = simic
            .run_round(spec, true)
            .with_context(|| format!("round {round}"))?;
        if round == first
            && let Some(prewarm) = simic.prewarm().filter(|prewarm| prewarm.runs > 0)
        {
            progress.note(&format!(
                "blueprint warm-up before round {round}: {} passes in {:.0} ms (each blueprint's \
                 first use, paid once per process)",
                prewarm.runs, prewarm.ms
            ));
        }
        let line = round_line(&report, simic.eps());
        writeln!(log, "{line}")
            .and_then(|()| log.flush())
            .with_context(|| format!("writing {}", log_path.display()))?;
        lines = lines.saturating_add(1);
        let accuracy = if report.final_accuracies.is_empty() {
            f64::NAN
        } else {
            report.final_accuracies.iter().sum::<f64>() / report.final_accuracies.len() as f64
        };
        progress.round(
            &progress_line(&report, config.rounds, simic.eps()),
            &format!(
                "reward {:.3}, acc {accuracy:.1}%, seeds {:.2}, {:.1} eps",
                report.mean_episode_reward,
                report.mean_active_seeds,
                simic.eps().unwrap_or(0.0)
            ),
        );
        let done = round.saturating_add(1);
        if config.checkpoint_every > 0 && done % config.checkpoint_every == 0 {
            log.sync_all()
                .with_context(|| format!("syncing {}", log_path.display()))?;
            if let Some(hub) = hub {
                // Every packet of the rounds so far is in the files the
                // checkpoint measures.
                hub.flush(Duration::from_secs(10));
            }
            ppo_checkpoint::save(&config.run_dir, config, &simic, lines)?;
            saved_at = simic.rounds();
        }
    }
    progress.finish();
    if saved_at != simic.rounds() {
        log.sync_all()
            .with_context(|| format!("syncing {}", log_path.display()))?;
        if let Some(hub) = hub {
            // Every packet of the rounds so far is in the files the
            // checkpoint measures.
            hub.flush(Duration::from_secs(10));
        }
        ppo_checkpoint::save(&config.run_dir, config, &simic, lines)?;
    }
    if ranked {
        let parameters = simic.policy().var_store().trainable_variables();
        println!(
            "rank {rank} of {world}: policy fingerprint {}",
            super::ranks::fingerprint(&parameters)?
        );
    }
    save_policy(&simic, &config.run_dir)?;
    match crate::plot_rounds::read(&config.run_dir)
        .and_then(|points| crate::plot_rounds::draw_rounds(&config.run_dir, &points))
    {
        Ok((png, _)) => println!("picture: {}", png.display()),
        // The run itself succeeded; a picture that cannot be drawn is said, not fatal.
        Err(error) => eprintln!("esper: the run picture was not drawn: {error:#}"),
    }
    if finished == Finished::Interrupted {
        println!("interrupted: stopped between rounds; the policy so far is saved");
    }
    println!(
        "rounds: {}, policy: {}",
        log_path.display(),
        config.run_dir.join(POLICY_FILE).display()
    );
    Ok(finished)
}

/// A rank other than 0: the same rounds, nothing written.
fn follower_rounds(
    config: &RunConfig,
    spec: &EnvSpec,
    simic: &mut Simic,
    interrupt: &Interrupt,
) -> Result<Finished> {
    let (rank, world) = simic.rank_and_world();
    let mut finished = Finished::Completed;
    for round in 0..config.rounds {
        if simic.any_rank(interrupt.requested())? {
            finished = Finished::Interrupted;
            break;
        }
        simic
            .run_round(spec, true)
            .with_context(|| format!("rank {rank}: round {round}"))?;
    }
    let parameters = simic.policy().var_store().trainable_variables();
    println!(
        "rank {rank} of {world}: policy fingerprint {}",
        super::ranks::fingerprint(&parameters)?
    );
    Ok(finished)
}

fn round_line(report: &RoundReport, eps: Option<f64>) -> serde_json::Value {
    let finite = |value: f64| value.is_finite().then_some(value);
    serde_json::json!({
        "round": report.round,
        "env_epochs": report.env_epochs,
        "mean_episode_reward": finite(report.mean_episode_reward),
        "final_accuracies": report.final_accuracies,
        "mean_active_seeds": finite(report.mean_active_seeds),
        "germinations": report.germinations,
        "fossilizations": report.fossilizations,
        "prunes": report.prunes,
        "rollbacks": report.rollbacks,
        "actions": actions_json(&report.actions),
        "eps": eps.and_then(finite),
        "policy_inference_ms": finite(report.inference_ms),
        "round_ms": finite(report.timings.total_ms),
        "ppo": report.ppo.as_ref().map(|ppo| serde_json::json!({
            "policy_loss": finite(ppo.policy_loss),
            "value_loss": finite(ppo.value_loss),
            "q_loss": finite(ppo.q_loss),
            "contribution_loss": finite(ppo.contribution_loss),
            "approx_kl": finite(ppo.approx_kl),
            "clip_fraction": finite(ppo.clip_fraction),
            "epochs_run": ppo.epochs_run,
            "early_stopped": ppo.early_stopped,
        })),
    })
}

/// The round's decision analytics: ops chosen and carried out by name,
/// blueprints germinated, forced steps and the episodes' outcomes.
fn actions_json(actions: &simic::vectorized::ActionDistribution) -> serde_json::Value {
    let ops = |counts: &simic::vectorized::OpCounts| {
        leyline::LifecycleOp::ALL
            .iter()
            .map(|&op| (op.name().to_owned(), serde_json::json!(counts.get(op))))
            .collect::<serde_json::Map<_, _>>()
    };
    serde_json::json!({
        "steps": actions.steps,
        "forced_steps": actions.forced_steps,
        "chosen": ops(&actions.chosen),
        "executed": ops(&actions.executed),
        "germinated": actions.germinated,
        "outcomes": actions.outcomes,
    })
}

fn progress_line(report: &RoundReport, rounds: usize, eps: Option<f64>) -> String {
    let accuracy = if report.final_accuracies.is_empty() {
        f64::NAN
    } else {
        report.final_accuracies.iter().sum::<f64>() / report.final_accuracies.len() as f64
    };
    // The share of decisions per chosen op, ops never chosen left out.
    let chosen = leyline::LifecycleOp::ALL
        .iter()
        .filter(|&&op| report.actions.chosen.get(op) > 0)
        .map(|&op| {
            format!(
                "{} {:.0}%",
                op.name(),
                100.0 * report.actions.chosen_fraction(op)
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "round {}/{rounds}: reward {:.3}, final accuracy {accuracy:.2}%, live seeds {:.2}, \
         germinated {} fossilized {} pruned {}, chose {chosen}, {:.1} eps",
        report.round.saturating_add(1),
        report.mean_episode_reward,
        report.mean_active_seeds,
        report.germinations,
        report.fossilizations,
        report.prunes,
        eps.unwrap_or(0.0)
    )
}

fn save_policy(simic: &Simic, run_dir: &Path) -> Result<()> {
    let path = run_dir.join(POLICY_FILE);
    simic
        .policy()
        .var_store()
        .save(&path)
        .with_context(|| format!("saving the policy to {}", path.display()))
}
