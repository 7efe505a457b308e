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
//! newest that verifies and restores). With `--nproc N` this is one rank of
//! N ([`super::ranks`]); rank 0 alone writes the run directory.
//!
//! As for heuristic runs, nothing is written before everything is built:
//! the data loaded and sharded, one environment's host and trainer built
//! (and dropped) to see that the environments can train, the PPO trainer
//! built, and for `--resume` the checkpoint restored into it. A refused run
//! leaves no run directory; a resume that restores no checkpoint leaves the
//! run directory as it was.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use leyline::Telemetry;
use simic::vectorized::{EnvSpec, Simic, SimicConfig};
use tolaria::engine::trainer::ModelTrainer;
use torch_ext::dist::ProcessGroup;

use super::args::{PolicyPrecisionChoice, RewardChoice};
use super::checkpoint::TelemetryRewind;
use super::config::RunConfig;
use super::deferred::Deferred;
use super::interrupt::Interrupt;
use super::ppo_checkpoint::{self, PpoLoaded, RoundsRewind};
use super::{
    CONFIG_NAME, Finished, check_batches, check_metrics_port, close_hub, create_run_dir,
    select_device, start_hub, task, trainer_config, write_config,
};

mod report;
mod rounds;

use rounds::rounds;

/// The rounds log inside the run directory.
pub(crate) const ROUNDS_FILE: &str = "rounds.jsonl";
/// The first environment's latest episode, epoch by epoch, in the lines of
/// `epochs.jsonl` (rewritten after every round; drawn as `episode.png`).
pub(crate) const EPISODE_FILE: &str = "episode.jsonl";

/// The policy's weights inside the run directory.
pub(crate) const POLICY_FILE: &str = "policy.safetensors";

/// Where a PPO run trains: its device, its group (one rank of `--nproc`),
/// and its environments' data.
struct Setup {
    device: tch::Device,
    group: Option<ProcessGroup>,
    /// Rank 0 (or the only process): the one that writes the run.
    lead: bool,
    spec: EnvSpec,
}

impl Setup {
    /// Selects the device, joins the group (a rank of `--nproc N`), loads
    /// the data, shards it, and builds one environment's trainer to see
    /// that the environments can train (see [`check_environment`]).
    fn new(config: &RunConfig) -> Result<Setup> {
        let device = select_device(config)?;
        // A rank of `--nproc N` joins its group; rank 0 alone writes the run.
        let group = super::ranks::join_group(device)?;
        let device = group.as_ref().map_or(device, ProcessGroup::device);
        let lead = group.as_ref().is_none_or(|group| group.rank() == 0);
        if lead {
            println!(
                "esper train: task {}, controller ppo ({} environments x {} epochs, {} rounds), \
                 device {}, run directory {}",
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
            config.task.task().host(),
            config.slots.clone(),
            &data.train,
            data.validation,
            config.envs,
        )
        .context("splitting the training set between the environments")?;
        check_environment(config, device, &spec)?;
        Ok(Setup {
            device,
            group,
            lead,
            spec,
        })
    }
}

/// Builds the host and the trainer of one environment, as a round will,
/// and drops them: a slot the host lacks, a batch larger than an
/// environment's share of the data, or a precision or graph mode the device
/// cannot run is refused now, before the run directory is written, instead
/// of in the first round.
fn check_environment(config: &RunConfig, device: tch::Device, spec: &EnvSpec) -> Result<()> {
    let env_device = config.env_devices()?.first().copied().unwrap_or(device);
    let shard = spec
        .train
        .first()
        .context("the environments have no training data")?;
    check_batches(config, shard).context("each environment trains on its share of the data")?;
    let model = task::build_model(config, env_device, Telemetry::disabled())?;
    ModelTrainer::new(
        model,
        shard,
        Some(&spec.validation),
        simic_config(config, env_device)?.trainer,
        Telemetry::disabled(),
    )
    .context("setting up an environment's trainer")?;
    Ok(())
}

/// The PPO trainer of `config` (its telemetry held until the hub starts;
/// none on a rank other than 0), with `resume` restored into it when given.
fn build_simic(
    config: &RunConfig,
    setup: &Setup,
    resume: Option<&PpoLoaded>,
) -> Result<(Simic, Deferred)> {
    let held = Deferred::new();
    let telemetry = if setup.lead {
        held.telemetry()
    } else {
        Telemetry::disabled()
    };
    let env_device = config
        .env_devices()?
        .first()
        .copied()
        .unwrap_or(setup.device);
    let mut simic = Simic::new(
        simic_config(config, env_device)?,
        config.slots.len(),
        setup.device,
        telemetry,
    )?;
    if let Some(loaded) = resume {
        simic
            .import_state(&loaded.manifest.state, &loaded.tensors)
            .context("restoring the PPO checkpoint")?;
        // A data-parallel run's checkpoint continues only as a group of its
        // size (checked here, before any file is cut back).
        let world = setup.group.as_ref().map_or(1, ProcessGroup::world_size);
        match simic.restored_group_size() {
            Some(ranks) if ranks != world => bail!(
                "it was written by a data-parallel run of {ranks} ranks; resume it with \
                 `esper train --resume {} --nproc {ranks}` (or as {ranks} ranks of torchrun or \
                 srun), not as {world}",
                loaded
                    .dir
                    .parent()
                    .and_then(Path::parent)
                    .unwrap_or(Path::new("."))
                    .display()
            ),
            None if world > 1 => bail!(
                "it was written by one process; resume it as one process, not as {world} ranks"
            ),
            _ => {}
        }
    }
    Ok((simic, held))
}

/// Runs a fresh PPO run of `config` (see the module docs): everything is
/// built before the run directory is written.
pub(crate) fn run(config: &RunConfig) -> Result<Finished> {
    let setup = Setup::new(config)?;
    let (simic, held) = build_simic(config, &setup, None)?;
    let interrupt = Interrupt::install()?;
    if setup.lead {
        check_metrics_port(config.metrics_port)?;
        let text = config.to_text(&config.run_dir.join(CONFIG_NAME))?;
        create_run_dir(&config.run_dir)?;
        write_config(&config.run_dir, &text)?;
    }
    go(config, setup, simic, &held, &interrupt, None)
}

/// A PPO checkpoint restored into a fresh trainer, with what cutting the
/// run's files back to it will do (not done yet).
struct PpoRestored {
    dir: PathBuf,
    round: u64,
    rounds: RoundsRewind,
    telemetry: TelemetryRewind,
}

/// A checkpoint that verifies, with the run's configuration in `run_dir`.
fn verified(run_dir: &Path, folder: &Path) -> Result<(PpoLoaded, RunConfig)> {
    let loaded = ppo_checkpoint::verify(folder)?;
    let mut config = loaded.manifest.config.clone();
    config.run_dir = run_dir.to_owned();
    config.validate().context("its configuration")?;
    Ok((loaded, config))
}

/// `esper train --resume RUN_DIR` of a PPO run: the newest of `candidates`
/// (newest first) that verifies and restores; a damaged one, or one that
/// cannot be restored, is skipped with a warning, and when none restores
/// nothing in the run directory changes.
pub(crate) fn resume(run_dir: &Path, candidates: &[PathBuf]) -> Result<Finished> {
    let mut warnings = Vec::new();
    let mut rest = candidates.iter();
    let (first, config) = loop {
        let Some(folder) = rest.next() else {
            print_warnings(&warnings);
            bail!(
                "no PPO checkpoint in {} verifies; nothing in {} was changed",
                run_dir.join(super::checkpoint::DIR).display(),
                run_dir.display()
            );
        };
        match verified(run_dir, folder) {
            Ok(pair) => break pair,
            Err(error) => warnings.push(format!(
                "skipping the damaged checkpoint {}: {error:#}",
                folder.display()
            )),
        }
    };
    if usize::try_from(first.manifest.round).unwrap_or(usize::MAX) >= config.rounds {
        print_warnings(&warnings);
        println!(
            "the run in {} is complete ({} of {} rounds); nothing to resume",
            run_dir.display(),
            first.manifest.round,
            config.rounds
        );
        return Ok(Finished::Completed);
    }
    let setup = Setup::new(&config)?;
    let mut next = Some(first);
    loop {
        let loaded = match next.take() {
            Some(loaded) => loaded,
            None => {
                let Some(folder) = rest.next() else {
                    break;
                };
                match verified(run_dir, folder) {
                    Ok((loaded, other)) if other == config => loaded,
                    Ok(_) => {
                        warnings.push(format!(
                            "skipping the checkpoint {}, written with another configuration than \
                             the newer ones",
                            folder.display()
                        ));
                        continue;
                    }
                    Err(error) => {
                        warnings.push(format!(
                            "skipping the damaged checkpoint {}: {error:#}",
                            folder.display()
                        ));
                        continue;
                    }
                }
            }
        };
        // Rank 0 alone cuts the files back (and plans it); the other ranks
        // only restore, so they never read a file rank 0 is rewriting.
        let planned = if setup.lead {
            RoundsRewind::plan(&run_dir.join(ROUNDS_FILE), loaded.manifest.rounds_lines).and_then(
                |rounds| {
                    TelemetryRewind::plan(run_dir, &loaded.manifest.telemetry)
                        .map(|telemetry| Some((rounds, telemetry)))
                },
            )
        } else {
            Ok(None)
        };
        let planned = match planned {
            Ok(planned) => planned,
            Err(error) => {
                warnings.push(format!(
                    "skipping the checkpoint {}, which does not match the run's files: {error:#}",
                    loaded.dir.display()
                ));
                continue;
            }
        };
        match build_simic(&config, &setup, Some(&loaded)) {
            Ok((simic, held)) => {
                print_warnings(&warnings);
                check_metrics_port(config.metrics_port)?;
                let interrupt = Interrupt::install()?;
                let restored = planned.map(|(rounds, telemetry)| PpoRestored {
                    dir: loaded.dir,
                    round: loaded.manifest.round,
                    rounds,
                    telemetry,
                });
                return go(&config, setup, simic, &held, &interrupt, restored);
            }
            Err(error) => warnings.push(format!(
                "skipping the checkpoint {}, which verifies but could not be restored: {error:#}",
                loaded.dir.display()
            )),
        }
    }
    print_warnings(&warnings);
    bail!(
        "no PPO checkpoint in {} verifies and restores; nothing in {} was changed",
        run_dir.join(super::checkpoint::DIR).display(),
        run_dir.display()
    )
}

fn print_warnings(warnings: &[String]) {
    for warning in warnings {
        eprintln!("esper: warning: {warning}");
    }
}

/// Cuts the run's files back to `restored` (when resuming), starts the hub
/// and runs the rounds; a rank other than 0 writes nothing.
fn go(
    config: &RunConfig,
    setup: Setup,
    simic: Simic,
    held: &Deferred,
    interrupt: &Interrupt,
    restored: Option<PpoRestored>,
) -> Result<Finished> {
    let Setup {
        spec, group, lead, ..
    } = setup;
    if !lead {
        return rounds(config, &spec, None, group, interrupt, simic, false);
    }
    let stem = match restored {
        None => None,
        Some(restored) => {
            // Everything written after the checkpoint is written again.
            restored.rounds.apply()?;
            restored.telemetry.apply()?;
            println!(
                "resuming {} after round {} from {}",
                config.run_dir.display(),
                restored.round,
                restored.dir.display()
            );
            Some(format!("events-resumed-round-{}", restored.round))
        }
    };
    let resumed = stem.is_some();
    let hub = start_hub(config, stem, held)?;
    let result = rounds(config, &spec, Some(&hub), group, interrupt, simic, resumed);
    close_hub(&hub);
    result
}

/// Simic's configuration for `config`, its environments training on
/// `env_device` (where `--mode auto` is resolved).
fn simic_config(config: &RunConfig, env_device: tch::Device) -> Result<SimicConfig> {
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
        RewardChoice::Escrow => simic::rewards::RewardMode::Escrow,
    };
    simic.policy_precision = match config.policy_precision {
        PolicyPrecisionChoice::Auto => None,
        PolicyPrecisionChoice::Fp32 => Some(tamiyo::policy::PolicyPrecision::Fp32),
        PolicyPrecisionChoice::Bf16 => Some(tamiyo::policy::PolicyPrecision::Bf16),
    };
    simic.trainer = tolaria::engine::trainer::ModelTrainerConfig {
        // Simic's environment settings: one warm-up step before a capture,
        // no cuDNN timing at every new step shape, no side stream for the
        // weight gradients (the environments' steps overlap already).
        graph_warmup_steps: simic.trainer.graph_warmup_steps,
        cudnn_benchmark: simic.trainer.cudnn_benchmark,
        overlap_weight_grads: simic.trainer.overlap_weight_grads,
        ..trainer_config(config, env_device)
    };
    // The run's settings last, so that they win over the flags above.
    simic::vectorized::settings::apply_all(&mut simic, &config.settings)
        .context("applying the run's settings")?;
    Ok(simic)
}
