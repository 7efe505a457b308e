//! `esper`: the Esper-rs command-line program (thin: argument parsing,
//! machine probing, record writing and output; the work lives in the
//! library crates).
//!
//! `esper bench <workload>` is the one program that runs every benchmark
//! workload and writes every baseline record: each workload's measuring code
//! is a library function returning figures (`tolaria::bench::run`,
//! `nissa::bench::run_emit`, `kasmina::bench::run_prefetch`); this binary
//! parses the command line ([`args`]), probes the machine ([`probe`]), builds
//! the record and writes it ([`record`]), then prints a table ([`table`]).
//! It holds no measuring code, and the library crates neither probe the
//! machine nor write records: those two jobs are this binary's alone.
//!
//! ```text
//! esper bench <workload> --out PATH.json [--label LABEL] [--quick] [workload options]
//! ```

mod args;
mod bench;
mod probe;
mod record;
mod table;

use anyhow::{Result, bail};

use crate::args::{BenchArgs, BenchCommand};

const USAGE: &str = "\
usage: esper <command> [options]

commands:
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
      tolaria-timeout       drill: a controller slower than its deadline; WAIT and telemetry
        --device DEVICE     auto (default), cpu, cuda or cuda:N
      tolaria-rollback      drill: NaN weights -> governor rollback -> training goes on
        --device DEVICE     auto (default), cpu, cuda or cuda:N
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

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
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
