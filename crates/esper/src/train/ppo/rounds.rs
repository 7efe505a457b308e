//! The rounds of a PPO run: rank 0 runs them writing the rounds log, the
//! episode, the checkpoints and the policy; any other rank runs them and
//! writes nothing.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use nissa::Hub;
use simic::vectorized::{EnvSpec, Simic};
use torch_ext::dist::ProcessGroup;

use super::report::{progress_line, round_line, write_episode};
use super::{EPISODE_FILE, POLICY_FILE, ROUNDS_FILE};
use crate::train::config::RunConfig;
use crate::train::interrupt::Interrupt;
use crate::train::progress::RoundProgress;
use crate::train::{Finished, epoch_log, ppo_checkpoint, ranks};

pub(super) fn rounds(
    config: &RunConfig,
    spec: &EnvSpec,
    hub: Option<&Hub>,
    group: Option<ProcessGroup>,
    interrupt: &Interrupt,
    mut simic: Simic,
    resumed: bool,
) -> Result<Finished> {
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
        write_episode(&config.run_dir, &report)?;
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
            ranks::fingerprint(&parameters)?
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
    match epoch_log::read_file(&config.run_dir, EPISODE_FILE)
        .and_then(|records| crate::plot::draw_episode(&config.run_dir, &records))
    {
        Ok((png, _)) => println!("episode picture: {}", png.display()),
        Err(error) => eprintln!("esper: the episode picture was not drawn: {error:#}"),
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
    let first = usize::try_from(simic.rounds()).unwrap_or(usize::MAX);
    for round in first..config.rounds {
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
        ranks::fingerprint(&parameters)?
    );
    Ok(finished)
}

fn save_policy(simic: &Simic, run_dir: &Path) -> Result<()> {
    let path = run_dir.join(POLICY_FILE);
    simic
        .policy()
        .var_store()
        .save(&path)
        .with_context(|| format!("saving the policy to {}", path.display()))
}
