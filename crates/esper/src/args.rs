//! The `esper bench` command line: the workload, then
//! `--out PATH.json [--label LABEL] [--quick]` (the contract `cargo xtask
//! bench` and `scripts/bundle_run.sh` call every workload with) and the
//! options of the torch workloads (`--device`, and for `tolaria-reference`
//! `--modes`, `--epochs`, `--warmup-epochs`).
//!
//! The arguments arrive as the operating system's strings (`OsString`):
//! `--out` is a path and may be any bytes a path may be; every other value
//! must be UTF-8, and one that is not is a usage error naming its flag.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use leyline::baseline::file_name_problem;
use tolaria::reference::bench::Variant;
use torch_ext::DeviceChoice;

mod workload;
pub(crate) use workload::Workload;

/// A command line that does not follow the contract, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Usage(pub(crate) String);

impl fmt::Display for Usage {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{} (usage: esper bench <workload> --out PATH.json [--label LABEL] [--quick] ...; \
             see `esper help`)",
            self.0
        )
    }
}

impl std::error::Error for Usage {}

/// What `esper bench` was asked to run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BenchArgs {
    /// Which workload.
    pub(crate) workload: Workload,
    /// Where to write the record.
    pub(crate) out: PathBuf,
    /// Record label: `--label`, else the file stem of `--out`; a portable
    /// file name either way ([`file_name_problem`]).
    pub(crate) label: String,
    /// A smoke run with fewer iterations (not for committed records).
    pub(crate) quick: bool,
    /// `--device` (torch workloads only).
    pub(crate) device: DeviceChoice,
    /// `--modes` (`tolaria-reference` only; empty: its defaults).
    pub(crate) variants: Vec<Variant>,
    /// `--epochs` (`tolaria-reference` only).
    pub(crate) epochs: Option<usize>,
    /// `--warmup-epochs` (`tolaria-reference` only).
    pub(crate) warmup_epochs: Option<usize>,
    /// `--synthetic` (`tolaria-fmnist`, `tolaria-lm`): seeded images of the
    /// real size instead of the Fashion-MNIST files, or seeded text instead
    /// of the corpus.
    pub(crate) synthetic: bool,
    /// `--epoch-graph-steps N` (`tolaria-fmnist`, `tolaria-lm`): graph-epoch's
    /// steps per captured graph (0: the whole epoch as one graph).
    pub(crate) epoch_graph_steps: Option<usize>,
    /// `--variants a,b` (`simic-throughput`, `simic-cifar`): the variants
    /// by name (`simic::bench::SimicBenchOptions::variants`); empty: the
    /// defaults.
    pub(crate) simic_variants: Vec<String>,
    /// `--gpus 1,2` (`simic-throughput`, `simic-cifar`): measure at each
    /// GPU count, one process per GPU (data-parallel PPO); empty: the
    /// single-process run.
    pub(crate) gpus: Vec<usize>,
    /// `--torchrun` (with `--gpus`): also start each GPU count's ranks with
    /// torchrun (`torchrun --standalone --no-python`), as entries beside
    /// those of esper's own launcher.
    pub(crate) torchrun: bool,
    /// Unless `--no-concurrent` (with `--gpus`): after each count N > 1, N
    /// single-process benches at once, one per GPU, no group.
    pub(crate) concurrent: bool,
    /// `--rounds N` (the simic workloads): PPO rounds per variant (learning:
    /// training rounds); `None`: the workload's default.
    pub(crate) rounds: Option<usize>,
    /// `--ppo-epochs N` (`simic-learning`): passes over each round's rollout
    /// per PPO update; `None`: the bench's 4 (the reference's default is 1).
    pub(crate) ppo_epochs: Option<usize>,
    /// `--greedy-every N` (`simic-learning`): every N training rounds and
    /// after the last, the policy is also evaluated greedily on
    /// environments of its own (the greedy learning curve,
    /// `simic::bench::SimicBenchOptions::greedy_every`); `None`: no curve.
    pub(crate) greedy_every: Option<usize>,
    /// `--eval-environments N` (`simic-learning`): the shared evaluation
    /// environments, a multiple of 4
    /// (`simic::bench::SimicBenchOptions::eval_environments`); `None`: 12.
    pub(crate) eval_environments: Option<usize>,
    /// `--episode head|medium|short|N` (the simic workloads): epochs per
    /// episode; `None`: the reference HEAD's 150 (5 with `--quick`).
    pub(crate) episode: Option<u32>,
    /// `--seeds N` (`simic-learning`): independent training seeds of the
    /// protocol; `None`: its default.
    pub(crate) seeds: Option<usize>,
    /// `--task NAME` (`simic-learning`): the task (`fmnist-impaired` by
    /// default; `cifar10-impaired` for the capacity-starved CIFAR-10 host).
    pub(crate) task: Option<tolaria::task::Task>,
    /// Every `--set section.field=value` (`simic-learning`), in order:
    /// settings over the reference's defaults
    /// (`simic::vectorized::settings`); empty: the defaults.
    pub(crate) settings: Vec<String>,
    /// `--jobs N` (`simic-learning`): training seeds run in up to N
    /// processes at once on the same device; the baselines and the greedy
    /// evaluations run in this one, alone on the device.
    pub(crate) jobs: Option<usize>,
    /// `--job-devices LIST` (`simic-learning` with `--jobs`): the devices
    /// the training processes take, each started on the one that runs the
    /// fewest; empty: every one on `--device`.
    pub(crate) job_devices: Vec<torch_ext::DeviceChoice>,
    /// `--seed-index K` (`simic-learning`): train training seed K only and
    /// write its part (`simic::bench::SeedOutcome`, no greedy figures) to
    /// `--out` and its trainer beside it; what `--jobs` starts.
    pub(crate) seed_index: Option<usize>,
    /// `--evaluate` (with `--seed-index K`): evaluate seed K's trained
    /// policy, kept beside `--out`, and write its evaluated part to `--out`;
    /// what `--jobs` starts with several `--job-devices`.
    pub(crate) evaluate: bool,
    /// `--only-seeds LIST` (with `--jobs`): train and evaluate only these
    /// training seeds now; the parts stay, and the record is written once
    /// every seed has been evaluated (by this run or an earlier one). Empty:
    /// every seed.
    pub(crate) only_seeds: Vec<usize>,
    /// `--blueprint-room` (`simic-learning`): instead of training, no
    /// growth and max growth with each of the task's blueprints on the
    /// protocol's evaluation environments
    /// (`simic::bench::LearningSetup::blueprint_room`).
    pub(crate) blueprint_room: bool,
    /// `simic-growth` only: a trained policy (a PPO run directory or one of
    /// its checkpoints) drives the environments greedily instead of max
    /// growth (`simic::bench::Driver::Learned`).
    pub(crate) policy: Option<PathBuf>,
}

/// What a bench command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum BenchCommand {
    /// Run the benchmark.
    Run(Box<BenchArgs>),
    /// `-h` / `--help`: print usage and stop.
    Help,
}

fn usage(reason: impl Into<String>) -> Usage {
    Usage(reason.into())
}

/// Stores `value` in `slot`, refusing a second occurrence of `flag`.
fn once<T>(slot: &mut Option<T>, flag: &str, value: T) -> Result<(), Usage> {
    if slot.replace(value).is_some() {
        return Err(usage(format!("{flag} given twice")));
    }
    Ok(())
}

fn count(flag: &str, text: &str) -> Result<usize, Usage> {
    text.parse()
        .map_err(|error| usage(format!("{flag} {}: {error}", shown(text))))
}

/// `text` quoted, with control characters escaped.
fn shown(text: &str) -> String {
    format!("{text:?}")
}

/// A workload name or flag as text; one that is not UTF-8 becomes its lossy
/// spelling, which names no workload and no flag, so it is refused as
/// unknown (with the replacement characters showing where the bytes were).
fn utf8_word(arg: OsString) -> String {
    arg.into_string()
        .unwrap_or_else(|arg| arg.to_string_lossy().into_owned())
}

/// The label `--label` gave, else the file stem of `out`.
fn label_of(label: Option<String>, out: &Path) -> Result<String, Usage> {
    let label = match label {
        Some(label) => label,
        None => out
            .file_stem()
            .and_then(|stem| stem.to_str())
            .map(str::to_owned)
            .ok_or_else(|| usage("--label LABEL is required when --out has no UTF-8 file stem"))?,
    };
    match file_name_problem(&label) {
        None => Ok(label),
        Some(problem) => Err(usage(format!("--label {problem}"))),
    }
}

impl BenchArgs {
    /// Parses the arguments after `esper bench`: the workload name, then the
    /// options, each at most once. `--out` must not be empty; the label must
    /// be a portable file name, since it becomes one. An option that does not
    /// apply to the workload is refused.
    pub(crate) fn parse<I, S>(args: I) -> Result<BenchCommand, Usage>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let mut args = args.into_iter().map(Into::into);
        let workload = match args.next().map(utf8_word) {
            None => return Err(usage("`esper bench` needs a workload name")),
            Some(flag) if flag == "-h" || flag == "--help" => return Ok(BenchCommand::Help),
            Some(name) => Workload::from_name(&name).ok_or_else(|| {
                let known: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
                usage(format!(
                    "unknown workload {} (known: {})",
                    shown(&name),
                    known.join(", ")
                ))
            })?,
        };
        let mut out: Option<PathBuf> = None;
        let mut label: Option<String> = None;
        let mut quick = false;
        let mut device: Option<DeviceChoice> = None;
        let mut variants: Option<Vec<Variant>> = None;
        let mut epochs: Option<usize> = None;
        let mut warmup_epochs: Option<usize> = None;
        let mut synthetic = false;
        let mut epoch_graph_steps: Option<usize> = None;
        let mut simic_variants: Option<Vec<String>> = None;
        let mut gpus: Option<Vec<usize>> = None;
        let mut torchrun = false;
        let mut no_concurrent = false;
        let mut rounds: Option<usize> = None;
        let mut ppo_epochs: Option<usize> = None;
        let mut greedy_every: Option<usize> = None;
        let mut eval_environments: Option<usize> = None;
        let mut episode: Option<u32> = None;
        let mut seeds: Option<usize> = None;
        let mut task: Option<tolaria::task::Task> = None;
        let mut sets: Vec<String> = Vec::new();
        let mut preset: Option<String> = None;
        let mut jobs: Option<usize> = None;
        let mut job_devices: Option<Vec<torch_ext::DeviceChoice>> = None;
        let mut seed_index: Option<usize> = None;
        let mut evaluate = false;
        let mut only_seeds: Option<Vec<usize>> = None;
        let mut blueprint_room = false;
        let mut policy: Option<PathBuf> = None;
        while let Some(arg) = args.next() {
            let arg = utf8_word(arg);
            let flag = arg.as_str();
            let torch_only = matches!(flag, "--device");
            let tolaria_only = matches!(flag, "--modes");
            let epoch_flags = matches!(flag, "--epochs" | "--warmup-epochs");
            let fmnist_only = matches!(flag, "--synthetic" | "--epoch-graph-steps");
            let simic_only = matches!(
                flag,
                "--variants" | "--gpus" | "--torchrun" | "--no-concurrent"
            );
            let rounds_flag = matches!(flag, "--rounds" | "--episode");
            let learning_only = matches!(
                flag,
                "--ppo-epochs"
                    | "--greedy-every"
                    | "--eval-environments"
                    | "--seeds"
                    | "--task"
                    | "--set"
                    | "--preset"
                    | "--jobs"
                    | "--job-devices"
                    | "--seed-index"
                    | "--evaluate"
                    | "--only-seeds"
                    | "--blueprint-room"
            );
            if (flag == "--policy" && workload != Workload::SimicGrowth)
                || (torch_only && !workload.uses_torch())
                || (learning_only && workload != Workload::SimicLearning)
                || (rounds_flag
                    && !matches!(
                        workload,
                        Workload::SimicThroughput
                            | Workload::SimicCifar
                            | Workload::SimicLm
                            | Workload::SimicGrowth
                            | Workload::SimicLearning
                    ))
                || (simic_only
                    && !matches!(
                        workload,
                        Workload::SimicThroughput
                            | Workload::SimicCifar
                            | Workload::SimicLm
                            | Workload::SimicGrowth
                    ))
                || (tolaria_only && workload != Workload::TolariaReference)
                || (epoch_flags
                    && !matches!(
                        workload,
                        Workload::TolariaReference | Workload::TolariaFmnist | Workload::TolariaLm
                    ))
                || (fmnist_only
                    && !matches!(workload, Workload::TolariaFmnist | Workload::TolariaLm))
            {
                return Err(usage(format!(
                    "{flag} does not apply to {}",
                    workload.name()
                )));
            }
            let mut raw_value = || {
                args.next()
                    .ok_or_else(|| usage(format!("{flag} needs a value")))
            };
            // Every value but --out's path is text.
            let mut value = || {
                raw_value()?.into_string().map_err(|text| {
                    usage(format!(
                        "{flag}: the value {} is not valid UTF-8",
                        shown(&text.to_string_lossy())
                    ))
                })
            };
            match flag {
                "--out" => {
                    let path = raw_value()?;
                    if path.is_empty() {
                        return Err(usage("--out needs a path"));
                    }
                    once(&mut out, flag, PathBuf::from(path))?;
                }
                "--policy" => {
                    let path = raw_value()?;
                    if path.is_empty() {
                        return Err(usage("--policy needs a path"));
                    }
                    once(&mut policy, flag, PathBuf::from(path))?;
                }
                "--label" => once(&mut label, flag, value()?)?,
                "--quick" => quick = true,
                "--synthetic" => synthetic = true,
                "--torchrun" => torchrun = true,
                "--no-concurrent" => no_concurrent = true,
                "--device" => {
                    let text = value()?;
                    let choice = text
                        .parse::<DeviceChoice>()
                        .map_err(|error| usage(format!("--device: {error}")))?;
                    once(&mut device, flag, choice)?;
                }
                "--modes" => {
                    let mut parsed = Vec::new();
                    for name in value()?.split(',').filter(|name| !name.is_empty()) {
                        parsed.push(
                            Variant::from_name(name)
                                .ok_or_else(|| usage(format!("unknown mode {}", shown(name))))?,
                        );
                    }
                    once(&mut variants, flag, parsed)?;
                }
                "--variants" => {
                    let names: Vec<String> = value()?
                        .split(',')
                        .filter(|name| !name.is_empty())
                        .map(str::to_owned)
                        .collect();
                    once(&mut simic_variants, flag, names)?;
                }
                "--gpus" => {
                    let mut counts = Vec::new();
                    for text in value()?.split(',').filter(|text| !text.is_empty()) {
                        let n = count(flag, text)?;
                        if n == 0 {
                            return Err(usage("--gpus: a GPU count must be at least 1"));
                        }
                        counts.push(n);
                    }
                    if counts.is_empty() {
                        return Err(usage("--gpus needs counts, e.g. 1,2"));
                    }
                    once(&mut gpus, flag, counts)?;
                }
                "--epochs" => once(&mut epochs, flag, count(flag, &value()?)?)?,
                "--rounds" => {
                    let n = count(flag, &value()?)?;
                    if n == 0 {
                        return Err(usage("--rounds must be at least 1"));
                    }
                    once(&mut rounds, flag, n)?;
                }
                "--warmup-epochs" => once(&mut warmup_epochs, flag, count(flag, &value()?)?)?,
                "--epoch-graph-steps" => {
                    once(&mut epoch_graph_steps, flag, count(flag, &value()?)?)?;
                }
                "--ppo-epochs" => {
                    let n = count(flag, &value()?)?;
                    if n == 0 {
                        return Err(usage("--ppo-epochs must be at least 1"));
                    }
                    once(&mut ppo_epochs, flag, n)?;
                }
                "--greedy-every" => {
                    let n = count(flag, &value()?)?;
                    if n == 0 {
                        return Err(usage("--greedy-every must be at least 1"));
                    }
                    once(&mut greedy_every, flag, n)?;
                }
                "--eval-environments" => {
                    let n = count(flag, &value()?)?;
                    simic::bench::check_eval_environments(n)
                        .map_err(|error| usage(format!("--eval-environments: {error}")))?;
                    once(&mut eval_environments, flag, n)?;
                }
                "--episode" => {
                    let n = simic::vectorized::Episode::parse_epochs(&value()?)
                        .map_err(|error| usage(format!("--episode: {error}")))?;
                    once(&mut episode, flag, n)?;
                }
                "--task" => {
                    let name = value()?;
                    let parsed = tolaria::task::Task::from_name(&name).ok_or_else(|| {
                        usage(format!(
                            "unknown task {} (fmnist, fmnist-impaired, cifar10, \
                             cifar10-impaired, synthetic)",
                            shown(&name)
                        ))
                    })?;
                    once(&mut task, flag, parsed)?;
                }
                "--seeds" => {
                    let n = count(flag, &value()?)?;
                    if n == 0 {
                        return Err(usage("--seeds must be at least 1"));
                    }
                    once(&mut seeds, flag, n)?;
                }
                "--set" => {
                    let setting = value()?;
                    if !setting.contains('=') {
                        return Err(usage(format!(
                            "--set {}: expected section.field=value",
                            shown(&setting)
                        )));
                    }
                    sets.push(setting);
                }
                "--preset" => once(&mut preset, flag, value()?)?,
                "--jobs" => {
                    let n = count(flag, &value()?)?;
                    if n == 0 {
                        return Err(usage("--jobs must be at least 1"));
                    }
                    once(&mut jobs, flag, n)?;
                }
                "--job-devices" => {
                    let list = value()?;
                    let devices = list
                        .split(',')
                        .map(|name| {
                            name.trim().parse::<torch_ext::DeviceChoice>().map_err(|_| {
                                usage(format!(
                                    "--job-devices takes a comma-separated list of devices \
                                     (cpu, cuda, cuda:N), not {}",
                                    shown(&list)
                                ))
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    once(&mut job_devices, flag, devices)?;
                }
                "--evaluate" => {
                    if std::mem::replace(&mut evaluate, true) {
                        return Err(usage("--evaluate given twice"));
                    }
                }
                "--seed-index" => once(&mut seed_index, flag, count(flag, &value()?)?)?,
                "--blueprint-room" => {
                    if std::mem::replace(&mut blueprint_room, true) {
                        return Err(usage("--blueprint-room given twice"));
                    }
                }
                "--only-seeds" => {
                    let list = value()?;
                    let mut seeds = list
                        .split(',')
                        .map(|index| count(flag, index.trim()))
                        .collect::<Result<Vec<_>, _>>()?;
                    seeds.sort_unstable();
                    seeds.dedup();
                    once(&mut only_seeds, flag, seeds)?;
                }
                "-h" | "--help" => return Ok(BenchCommand::Help),
                other => return Err(usage(format!("unknown argument {}", shown(other)))),
            }
        }
        let out = out.ok_or_else(|| usage("--out PATH.json is required"))?;
        let label = label_of(label, &out)?;
        if jobs.is_some() && seed_index.is_some() {
            return Err(usage("--jobs and --seed-index exclude each other"));
        }
        if evaluate && seed_index.is_none() {
            return Err(usage("--evaluate needs --seed-index"));
        }
        if job_devices.is_some() && jobs.is_none() {
            return Err(usage("--job-devices needs --jobs"));
        }
        if only_seeds.is_some() && jobs.is_none() {
            return Err(usage("--only-seeds needs --jobs"));
        }
        if blueprint_room {
            // The room trains nothing: the flags of training have no meaning.
            let training = [
                ("--jobs", jobs.is_some()),
                ("--seed-index", seed_index.is_some()),
                ("--only-seeds", only_seeds.is_some()),
                ("--greedy-every", greedy_every.is_some()),
                ("--seeds", seeds.is_some()),
                ("--rounds", rounds.is_some()),
                ("--ppo-epochs", ppo_epochs.is_some()),
            ];
            if let Some((flag, _)) = training.iter().find(|(_, given)| *given) {
                return Err(usage(format!(
                    "--blueprint-room trains nothing; {flag} does not apply"
                )));
            }
        }
        if policy.is_some() && gpus.is_some() {
            return Err(usage(
                "--policy drives one process; --gpus measures max growth on several",
            ));
        }
        if torchrun && gpus.is_none() {
            return Err(usage("--torchrun needs --gpus"));
        }
        if no_concurrent && gpus.is_none() {
            return Err(usage("--no-concurrent needs --gpus"));
        }
        // The preset's settings first, so that every --set wins over them.
        let mut settings: Vec<String> = match &preset {
            Some(name) => simic::vectorized::settings::preset(name)
                .map_err(|error| usage(error.to_string()))?
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            None => Vec::new(),
        };
        settings.extend(sets);
        Ok(BenchCommand::Run(Box::new(BenchArgs {
            workload,
            out,
            label,
            quick,
            device: device.unwrap_or_default(),
            variants: variants.unwrap_or_default(),
            epochs,
            warmup_epochs,
            synthetic,
            epoch_graph_steps,
            simic_variants: simic_variants.unwrap_or_default(),
            gpus: gpus.unwrap_or_default(),
            torchrun,
            concurrent: !no_concurrent,
            rounds,
            ppo_epochs,
            greedy_every,
            eval_environments,
            episode,
            seeds,
            task,
            settings,
            jobs,
            job_devices: job_devices.unwrap_or_default(),
            seed_index,
            evaluate,
            only_seeds: only_seeds.unwrap_or_default(),
            blueprint_room,
            policy,
        })))
    }
}

#[cfg(test)]
mod tests;
