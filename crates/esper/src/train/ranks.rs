//! `esper train --controller ppo --nproc N`: the run as `N` data-parallel
//! ranks, one process per GPU (or `N` CPU processes with Gloo).
//!
//! The command a user types is the launcher ([`launch_ranks`]): it resolves
//! the configuration once, names the run directory for every rank, and
//! starts `esper train` again `N` times through [`crate::launch`]. Each of
//! those is a rank ([`join_group`]): it joins the c10d group from the
//! environment, takes `cuda:LOCAL_RANK` (or the CPU), and trains its own
//! environments while the ranks share one policy
//! (`simic::vectorized::Simic::join`). Rank 0 alone writes the run
//! directory (configuration, rounds, telemetry, policy); every rank prints
//! the fingerprint of its final policy, so identical parameters can be seen.
//! `--resume RUN_DIR --nproc N` ([`launch_resume`]) restarts the ranks of a
//! data-parallel run from rank 0's newest checkpoint, which carries every
//! rank's generators (`simic::vectorized::SimicState::rank_rngs`).

use std::ffi::OsString;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use torch_ext::dist::{DistBackend, ProcessGroup};
use torch_ext::launcher::RankEnv;

use super::Finished;
use super::args::{ControllerKind, TrainArgs};
use super::config::RunConfig;

/// Most ranks `--nproc` may start (one process each; on CUDA the machine's
/// GPU count bounds it further).
pub(crate) const MAX_NPROC: usize = 64;

/// The limit on the rendezvous and on every collective of a training run,
/// unless [`ENV_DIST_TIMEOUT`] says otherwise: a rank that died or hangs
/// ends every other rank's next collective with an error by then.
pub(crate) const DIST_TIMEOUT: Duration = Duration::from_secs(120);

/// Seconds of [`DIST_TIMEOUT`] for this process (a whole number from 1 to
/// [`MAX_DIST_TIMEOUT_S`]); every rank of a job should get the same.
pub(crate) const ENV_DIST_TIMEOUT: &str = "ESPER_DIST_TIMEOUT_S";

/// Largest [`ENV_DIST_TIMEOUT`]: one day.
pub(crate) const MAX_DIST_TIMEOUT_S: u64 = 86_400;

/// The collective timeout: [`ENV_DIST_TIMEOUT`] when set, else
/// [`DIST_TIMEOUT`]; a value that is not a whole number of seconds in range
/// is an error naming the variable.
pub(crate) fn dist_timeout() -> Result<Duration> {
    let Some(raw) = std::env::var_os(ENV_DIST_TIMEOUT) else {
        return Ok(DIST_TIMEOUT);
    };
    let text = raw.to_string_lossy();
    match text.trim().parse::<u64>() {
        Ok(seconds) if (1..=MAX_DIST_TIMEOUT_S).contains(&seconds) => {
            Ok(Duration::from_secs(seconds))
        }
        _ => bail!(
            "{ENV_DIST_TIMEOUT}={text:?} is not a whole number of seconds from 1 to \
             {MAX_DIST_TIMEOUT_S}"
        ),
    }
}

/// Whether this process is a rank started by a launcher (esper's own,
/// torchrun or Slurm's srun: `torch_ext::launcher`).
pub(crate) fn is_rank() -> bool {
    torch_ext::launcher::launched_as_rank()
}

/// The launcher: checks the configuration, then runs `nproc` ranks of this
/// same command line (without `--nproc`, with the resolved run directory).
pub(crate) fn launch_ranks(args: &TrainArgs, config: &RunConfig, nproc: usize) -> Result<Finished> {
    if config.controller != ControllerKind::Ppo {
        bail!("--nproc trains data-parallel PPO: it needs --controller ppo");
    }
    // The ranks read it; a bad value is refused here, before any starts.
    dist_timeout()?;
    if !config.devices.is_empty() {
        bail!(
            "--nproc gives each rank its own GPU (cuda:0..N-1); --devices spreads one process's \
             environments over GPUs: use one or the other"
        );
    }
    let device = torch_ext::device::select(config.device_choice()?)
        .with_context(|| format!("selecting device {}", config.device))?;
    if device.is_cuda() {
        let count = torch_ext::cuda::device_count();
        if nproc > count {
            bail!("--nproc {nproc} needs {nproc} GPUs; this machine has {count}");
        }
    }
    // The operating system's strings, passed on as they came (a path need
    // not be UTF-8).
    let mut child: Vec<OsString> = Vec::new();
    let mut skip = false;
    for arg in std::env::args_os().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        if arg == "--nproc" {
            skip = true;
            continue;
        }
        if arg
            .to_str()
            .is_some_and(|text| text.starts_with("--nproc="))
        {
            continue;
        }
        child.push(arg);
    }
    if args.run_dir.is_none() {
        child.push("--run-dir".into());
        child.push(config.run_dir.clone().into_os_string());
    }
    println!(
        "esper train: {nproc} ranks ({}), run directory {} (written by rank 0)",
        if device.is_cuda() {
            "one GPU each, NCCL"
        } else {
            "CPU, Gloo"
        },
        config.run_dir.display()
    );
    crate::launch::run_ranks(nproc, &child, crate::launch::GRACE)?;
    Ok(Finished::Completed)
}

/// The launcher of a resume: runs `nproc` ranks of `esper train --resume
/// run_dir`. Each rank restores the newest checkpoint rank 0 wrote that
/// verifies and restores (every rank reads the same files, so they choose
/// the same one) and takes its own generators from it; rank 0 alone cuts
/// the run's files back and writes on. A checkpoint of another group size
/// is refused before anything changes.
pub(crate) fn launch_resume(run_dir: &std::path::Path, nproc: usize) -> Result<Finished> {
    dist_timeout()?;
    let child: Vec<OsString> = vec!["train".into(), "--resume".into(), run_dir.into()];
    println!(
        "esper train: resuming {} as {nproc} ranks (rank 0 writes)",
        run_dir.display()
    );
    crate::launch::run_ranks(nproc, &child, crate::launch::GRACE)?;
    Ok(Finished::Completed)
}

/// A rank's group, joined from the launcher's environment on `device`'s
/// kind (`cuda:LOCAL_RANK` for CUDA); `None` outside a group.
pub(crate) fn join_group(device: tch::Device) -> Result<Option<ProcessGroup>> {
    let Some(env) = RankEnv::from_env(dist_timeout()?)? else {
        return Ok(None);
    };
    let rendezvous = env.rendezvous;
    // The rank's GPU is the process's current device from here on.
    let device = torch_ext::device::for_rank(device.is_cuda(), env.local_rank, rendezvous.rank)?;
    let group = ProcessGroup::new(&rendezvous, DistBackend::for_device(device), device)
        .with_context(|| {
            format!(
                "rank {} of {} joining its group",
                rendezvous.rank, rendezvous.world_size
            )
        })?;
    Ok(Some(group))
}

/// A 64-bit FNV-1a hash of the parameters' bytes (as f32, in order): equal
/// on every rank when the policies are bit-identical.
pub(crate) fn fingerprint(parameters: &[tch::Tensor]) -> Result<String> {
    let mut bytes = Vec::new();
    for parameter in parameters {
        let values = Vec::<f32>::try_from(
            &parameter
                .detach()
                .to_kind(tch::Kind::Float)
                .to_device(tch::Device::Cpu)
                .reshape([-1]),
        )
        .context("reading the policy's parameters")?;
        bytes.extend(
            values
                .iter()
                .flat_map(|value| value.to_bits().to_le_bytes()),
        );
    }
    let hash = durable::fnv1a64(&bytes);
    Ok(format!("{hash:016x}"))
}
