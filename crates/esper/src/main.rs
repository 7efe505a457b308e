//! `esper`: the Esper-rs command-line program (thin: argument parsing,
//! machine probing, record writing and output; the work lives in the
//! library crates).
//!
//! `esper train` trains a host on a task while a controller grows it
//! ([`train`]: configuration, data and host, the epoch loop through
//! tolaria's `ModelTrainer`, progress, the run directory); `esper plot
//! RUN_DIR` draws a run's picture again ([`plot`]). Both parse their
//! options with clap.
//!
//! `esper bench <workload>` is the one program that runs every benchmark
//! workload and writes every baseline record: each workload's measuring code
//! is a library function returning figures (`tolaria::reference::bench::run`,
//! `nissa::bench::run_emit`, `kasmina::bench::run_prefetch`); this binary
//! parses the command line ([`args`]), probes the machine ([`probe`]), builds
//! the record and writes it ([`record`]), then prints a table ([`table`]).
//! It holds no measuring code, and the library crates neither probe the
//! machine nor write records: those two jobs are this binary's alone.
//!
//! ```text
//! esper train [--controller heuristic] [--task fmnist] [options]   (esper train --help)
//! esper plot RUN_DIR
//! esper bench <workload> --out PATH.json [--label LABEL] [--quick] [workload options]
//! esper parity-capture --out FILE.json
//! ```
//!
//! `esper parity-capture` records a short seeded CPU run for `cargo xtask
//! parity` ([`parity`]): telemetry names, deterministic figures, timings.

mod args;
mod bench;
mod launch;
mod learning_jobs;
mod parity;
mod plot;
mod plot_learning;
mod plot_rounds;
mod probe;
mod record;
mod scaling;
mod table;
mod train;

use std::ffi::OsString;

use anyhow::{Result, bail};
use clap::Parser;

use crate::args::{BenchArgs, BenchCommand};
use crate::parity::ParityArgs;
use crate::plot::PlotArgs;
use crate::train::Finished;
use crate::train::args::TrainArgs;
use crate::train::interrupt::EXIT_INTERRUPTED;

const USAGE: &str = "\
usage: esper <command> [options]

commands:
  train [options]           train a host while a controller grows it (`esper train --help`):
      --controller heuristic|ppo, --task fmnist|fmnist-impaired|cifar10|synthetic,
      --slots r0c1,r0c2, --max-seeds N, --epochs N, --batch-size N, --learning-rate LR,
      --device DEVICE, --precision auto|fp32|bf16|fp16, --seed N, --run-dir DIR,
      --config FILE.toml, --train-samples N, --data-dir DIR,
      --mode auto|eager|graph-step|graph-epoch (auto: graph-step on CUDA, eager on the CPU),
      --resume RUN_DIR
  plot RUN_DIR              draw a run's picture (run.png, run.svg) from its epochs.jsonl
                            (a PPO run's: from its rounds.jsonl)
  bench WORKLOAD            run one benchmark workload and write its baseline record
      --out PATH            where to write the JSON record (required)
      --label LABEL         record label (default: the file stem of --out)
      --quick               a smoke run with fewer iterations (not for records)
    workloads:
      tolaria-reference     every execution mode of the reference trainer
        --device DEVICE     auto (default), cpu, cuda or cuda:N
                            (the general trainer's eager, graph-step and graph-epoch always
                            run; --modes picks the hand-derived special step's variants)
        --modes LIST        comma-separated: fused-eager, fused-graph-step, fused-graph-epoch,
                            and the same with -autograd (default: the fused modes on CUDA,
                            fused-eager on the CPU)
        --epochs N          measured epochs (default 300, 30 with --quick; at least 200 for
                            records)
        --warmup-epochs N   unmeasured epochs first (default 20, 5 with --quick)
      nissa-emit            hot-path telemetry emit with a slow sink, exact drop accounting
                            (exits non-zero after writing when the accounting is not exact)
      kasmina-prefetch      germination requests through the async blueprint prefetcher
        --device DEVICE     auto (default), cpu, cuda or cuda:N
      tolaria-fmnist        the Fashion-MNIST CNN host with two blending seeds, general trainer,
                            fp32/bf16 x eager/graph-step/graph-epoch (fp32 eager on the CPU)
        --device DEVICE     auto (default), cpu, cuda or cuda:N
        --epochs N          measured epochs (default 5, 2 with --quick)
        --warmup-epochs N   unmeasured epochs first (default 2)
        --synthetic         seeded images of the real size instead of the data set
        --epoch-graph-steps N  graph-epoch's training steps per captured graph (default 4;
                            0: the whole epoch as one graph)
      tolaria-lm            the language-model task's transformer (fortunes corpus, byte tokens)
                            with mlp_small and attention seeds blending, general trainer, AdamW,
                            fp32/bf16 x eager/graph-step/graph-epoch (fp32 eager on the CPU)
        --device DEVICE     auto (default), cpu, cuda or cuda:N
        --epochs N          measured epochs (default 5, 2 with --quick)
        --warmup-epochs N   unmeasured epochs first (default 2, 1 with --quick)
        --synthetic         seeded text instead of the corpus
        --epoch-graph-steps N  as for tolaria-fmnist
      tolaria-timeout       drill: a controller slower than its deadline; WAIT and telemetry
        --device DEVICE     auto (default), cpu, cuda or cuda:N
      tolaria-rollback      drill: NaN weights -> governor rollback -> training goes on
        --device DEVICE     auto (default), cpu, cuda or cuda:N
      simic-throughput      vectorized PPO, 4 envs x 3 slots, Fashion-MNIST (ESPER_FASHION_MNIST_DIR)
        --device DEVICE     auto (default), cpu, cuda or cuda:N
      simic-cifar           vectorized PPO, 4 envs x 3 slots, CIFAR-10 binary files (ESPER_CIFAR10_DIR)
        --device DEVICE     auto (default), cpu, cuda or cuda:N
      simic-lm              vectorized PPO, 4 envs x 3 slots, the language-model task's transformer
                            host on the fortunes corpus (ESPER_TEXT_CORPUS_DIR), AdamW, batch 128
        --device DEVICE     auto (default), cpu, cuda or cuda:N
      simic-growth          the simic-cifar environments driven by the max-growth controller (the
                            policy steps, nothing learns): eps overall and by live seeds per
                            environment (eps_live_seeds_0..3), counterfactual ms, policy step;
                            --episode short for L = 25; with --gpus each rank drives its own
                            environments (nothing learns, no all-reduce)
        --policy PATH       drive with a trained policy instead, acting greedily: a run
                            directory of `esper train --controller ppo` (its newest checkpoint
                            that verifies) or one of its checkpoints/round-R folders; the
                            policy keeps its run's slot, blueprint and floor settings; one
                            process (not with --gpus)
        --device DEVICE     auto (default), cpu, cuda or cuda:N
        --variants LIST     (the three simic workloads) e.g. bf16-graph-step,fp32-eager (graph-epoch
                            is not one: seeds change the step's shape every few epochs);
                            suffixes -fp32-policy, -w<N> (N warm-up steps before a capture), -bench,
                            -no-prewarm (in this order)
        --rounds N          (every simic workload) PPO rounds per variant (default 3, 1 with
                            --quick)
        --episode L         (every simic workload) epochs per episode: head (150, the
                            default, as at the reference's HEAD), medium (50), short (25)
                            or a number (5 with --quick)
        --gpus LIST         (the simic throughput workloads) GPU counts, e.g. 1,2: each count runs one
                            process per GPU (data-parallel PPO over NCCL, Gloo on the CPU),
                            4 envs per GPU; every count is an entry of one record with eps
                            and scaling efficiency
        --torchrun          (with --gpus) also start each count's ranks with torchrun
                            (--standalone --no-python; `torchrun` on PATH or ESPER_TORCHRUN),
                            as entries dpN-VARIANT-torchrun beside the launcher's
        --no-concurrent     (with --gpus) skip the N single-process benches run at once, one
                            per GPU, after each count N > 1 (entry concurrentN-VARIANT: what
                            sharing the host costs apart from what the group costs)
      simic-learning        the learning protocol on an impaired host: baselines (no growth,
                            heuristic, germinate-once, max growth) on 12 shared evaluation
                            environments, PPO per training seed, the greedy policy on the
                            same environments, paired comparisons (95% CI, sign and
                            permutation tests) and the share of max growth's gain recovered
        --device DEVICE     auto (default), cpu, cuda or cuda:N
        --task NAME         fmnist-impaired (default) or cifar10-impaired
        --seeds N           independent training seeds (default 3, 1 with --quick)
        --rounds N          training rounds per seed (default 12, 2 with --quick)
        --ppo-epochs N      passes over each round's rollout per PPO update (default 4; the
                            reference's recurrent_n_epochs is 1; the KL early stop still
                            applies)
        --greedy-every N    every N training rounds and after the last, also evaluate the
                            policy greedily on environments of its own (the greedy learning
                            curve, in the rounds' entries; training is unchanged by it),
                            and evaluate the policy of its best point beside the final one
        --eval-environments N
                            the shared evaluation environments of the baselines and of every
                            learned policy, a multiple of 4 (default 12); another count is
                            another set of baselines
        --blueprint-room    instead of training: no growth and max growth with each of the
                            task's blueprints (NOOP excepted) on the same evaluation
                            environments, each paired against no growth and against max
                            growth's scripted blueprint (the room each blueprint leaves)
        --set KEY=VALUE     a setting over the reference's defaults, repeatable, in order:
                            reward.<field>, ppo.<field>, floor.<head> or slot.<field>, e.g.
                            reward.rent_weight=0, ppo.entropy_coef=0.1, floor.op=0.05
        --preset NAME       a named list of settings, applied before any --set: growth (no
                            parameter rent, floor.op=0.02, auto-forward, a germination
                            delay cost of -0.1), growth-imitate (growth, the ESCROW reward
                            with reward.twin_delta_weight=20, imitation.updates=8); the
                            record lists them in params.settings
        --jobs N            after the baselines, train the seeds in up to N processes at once
                            on the same device, then evaluate each trained policy here,
                            alone on the device; the record is the same pool; what it
                            finishes is kept in OUT.parts/ (a seed in training after each
                            round) and the same command run again after a stop measures
                            only what is missing
        --job-devices LIST  with --jobs: the devices the training processes take, e.g.
                            cuda:0,cuda:1,cuda:2,cuda:3; each starts on the one running the
                            fewest (default: all on --device); with several devices the
                            evaluations run there too, one at a time on each
        --seed-index K      train seed K only and write its part (learning curve, trained
                            policy) beside --out (what --jobs starts)
        --only-seeds LIST   with --jobs: train and evaluate only these seeds (e.g. 0,1) and keep
                            the parts; the record is written once every seed is evaluated
                            (an evaluated seed's small files, baselines.json, seed-K.json and
                            seed-K-evaluated.json, are all a later run needs)
        --evaluate          with --seed-index K: evaluate seed K's trained policy kept beside
                            --out and write its evaluations to --out (what --jobs starts, one
                            at a time on each device, when --job-devices names several)
      ppo-cartpole          the PPO update on CartPole-v1, 500k steps (50k with --quick)
        --device DEVICE     auto (default), cpu, cuda or cuda:N
  parity-capture --out FILE.json
                            record the parity capture (telemetry names, deterministic figures,
                            timings) of a short seeded CPU run; `cargo xtask parity` compares
                            it with baselines/parity/cpu.json
  help                      this text

environment (recorded, set by `cargo xtask bench` and the bench bundle):
  ESPER_GIT_REV             code revision (default: unknown)
  ESPER_TORCH_VERSION       torch version (default: read beside the loaded libtorch)
  ESPER_DRIVER_VERSION      GPU driver version (default: the driver's CUDA API level)
";

fn main() {
    if let Err(error) = run() {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

/// Parses the options after `esper <command>` with clap; on a usage error
/// or `--help`, prints clap's text and exits (status 2 or 0). The arguments
/// are the operating system's strings: a path need not be UTF-8, and clap
/// refuses any other value that is not with a usage error.
fn parse_or_exit<T: Parser>(command: &str, args: impl Iterator<Item = OsString>) -> T {
    let argv = std::iter::once(OsString::from(format!("esper {command}"))).chain(args);
    T::try_parse_from(argv).unwrap_or_else(|error| error.exit())
}

fn run() -> Result<()> {
    // `args_os`, not `args`: a Unix path may be any bytes, and `args` panics
    // on one that is not UTF-8.
    let mut args = std::env::args_os().skip(1);
    let command = args.next();
    let word = match &command {
        None => None,
        Some(word) => match word.to_str() {
            Some(word) => Some(word),
            None => bail!(
                "unknown command {:?} (not UTF-8)\n\n{USAGE}",
                word.to_string_lossy()
            ),
        },
    };
    match word {
        Some("train") => {
            let train_args: TrainArgs = parse_or_exit("train", args);
            if train::run(&train_args)? == Finished::Interrupted {
                std::process::exit(EXIT_INTERRUPTED);
            }
            Ok(())
        }
        // One rank of `esper bench ... --gpus`, started by the launcher.
        Some("bench-rank") => {
            scaling::run_rank_command(&parse_or_exit::<scaling::RankArgs>("bench-rank", args))
        }
        Some("plot") => plot::run(&parse_or_exit::<PlotArgs>("plot", args)),
        Some("parity-capture") => parity::run(&parse_or_exit::<ParityArgs>("parity-capture", args)),
        Some("bench") => match BenchArgs::parse(args)? {
            BenchCommand::Run(bench_args) => bench::run(&bench_args),
            BenchCommand::Help => {
                print!("{USAGE}");
                Ok(())
            }
        },
        Some("help" | "--help" | "-h") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}
