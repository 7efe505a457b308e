//! `cargo xtask`: the project's automation, in plain Rust with light
//! dependencies (no tch).
//!
//! - `cargo xtask test`: provision libtorch and system packages if needed, then
//!   fmt, clippy (warnings denied), the whole test suite, the hostile-size
//!   tests again in release, the API docs (warnings denied), and the
//!   telemetry alert-rule check.
//! - `cargo xtask bench`: provision, build release `esper`, run every
//!   benchmark workload through `esper bench` and write
//!   `baselines/perf/<workload>/<label>.json` ([`bench`](mod@bench): running,
//!   `bench::peers`: the Python peers, `bench::compare`: tables and
//!   before/after).
//! - `cargo xtask parity`: a fresh CPU capture (`esper parity-capture`)
//!   compared with the committed baseline `baselines/parity/cpu.json`
//!   ([`parity`]); `--update` rewrites the baseline. `cargo xtask test`
//!   runs it too.
//! - `cargo xtask peers`: the Python peers' CPU check (`bench::peers::smoke`),
//!   also run by `cargo xtask test`.
//! - `cargo xtask bundle`: the bench bundle for the GPU machine (`bundle/`,
//!   [`bundle`]).
//! - [`probe`]: the revision, date and GPU presence, from commands.
//! - `cargo xtask provision`: only the provisioning step.

mod bench;
mod bundle;
mod consumer;
mod parity;
mod probe;
mod provision;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  test                     provision, then fmt + clippy (-D warnings) + every test + docs + rule checks
                           + parity + peers
  bench [options]          provision, build release, run the benchmark workloads
      --label LABEL        record label (default: <device>-<date>)
      --workload NAME      run one workload only (repeatable)
      --compare LABEL      print before/after against baselines/perf/<workload>/LABEL.json
      --compare A B        run nothing: write target/bench-compare/A-vs-B/report.md (markdown
                           tables, after/before ratios) and one latency SVG per workload, for
                           every workload with both committed labels
      --quick              fewer epochs (a smoke run; not for committed records)
      --all                on a machine without a GPU, run the GPU-sized workloads too
                           (tolaria-fmnist, tolaria-lm, simic-throughput, simic-cifar,
                           simic-lm, simic-growth, simic-learning; the default set skips
                           them there and says so)
  parity [--update]        compare a fresh CPU capture (debug `esper parity-capture`) with
                           baselines/parity/cpu.json: telemetry names a superset, figures within
                           the baseline's tolerance, timings reported as ratios; --update
                           rewrites the baseline
  peers                    check the Python peers on the CPU (tolaria_fmnist_check.py, then a few
                           eager steps of each peer on synthetic data, records read back); part
                           of test
  bundle                   build the GPU-machine bench bundle into bundle/ (release esper, GPU
                           test binaries, Python peers, run.sh; stripped, under 40 MB)
  provision                make sure libtorch and system packages are installed
  help                     this text

environment:
  ESPER_CACHE_DIR          where the libtorch venv lives (default: $XDG_CACHE_HOME/esper-rs
                           or ~/.cache/esper-rs)
  ESPER_PYTHON             python used to create the venv (default: python3)
";

fn main() {
    if let Err(error) = run() {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_else(|| "help".to_owned());
    let rest: Vec<String> = args.collect();
    match command.as_str() {
        "test" => {
            if !rest.is_empty() {
                bail!("`cargo xtask test` takes no arguments\n\n{USAGE}");
            }
            let root = project_root()?;
            provision::ensure(&root)?;
            run_tests(&root)
        }
        "bench" => {
            let root = project_root()?;
            let options = bench::Options::parse(&rest)?;
            provision::ensure(&root)?;
            bench::run(&root, &options)
        }
        "parity" => {
            let root = project_root()?;
            let options = parity::Options::parse(&rest)?;
            provision::ensure(&root)?;
            parity::run(&root, options)
        }
        "peers" => {
            if !rest.is_empty() {
                bail!("`cargo xtask peers` takes no arguments\n\n{USAGE}");
            }
            let root = project_root()?;
            provision::ensure(&root)?;
            bench::peers::smoke(&root)
        }
        "bundle" => {
            let root = project_root()?;
            provision::ensure(&root)?;
            bundle::run(&root, &rest)
        }
        "provision" => {
            let root = project_root()?;
            provision::ensure(&root)
        }
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

/// The repository root (the parent of this crate's folder).
fn project_root() -> Result<PathBuf> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent folder")
}

/// A `cargo` command with the libtorch environment set explicitly (it is also
/// in `.cargo/config.toml`, so plain cargo works after provisioning).
pub(crate) fn cargo(root: &Path) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.current_dir(root);
    command.env("LIBTORCH", root.join(provision::TORCH_LINK).join("torch"));
    command.env("LIBTORCH_CXX11_ABI", "1");
    command
}

/// Runs a command, echoing it first, and fails when it fails.
pub(crate) fn run_step(name: &str, command: &mut Command) -> Result<()> {
    eprintln!("==> {name}");
    let status = command
        .status()
        .with_context(|| format!("could not start `{name}`"))?;
    if !status.success() {
        bail!("`{name}` failed ({status})");
    }
    Ok(())
}

/// The test targets that feed sizes and numbers near the integer and float
/// limits to every crate's entry points; `cargo xtask test` runs them in
/// release too.
const RELEASE_SIZE_TESTS: &[&str] = &[
    "-p",
    "leyline",
    "--test",
    "hostile_inputs",
    "-p",
    "nissa",
    "--test",
    "bad_input_hub",
    "-p",
    "kasmina",
    "--test",
    "hardening_sizes",
    "-p",
    "tolaria",
    "--test",
    "data_hostile",
    "--test",
    "hostile_input",
];

fn run_tests(root: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    run_step(
        "cargo fmt --all --check",
        cargo(root).args(["fmt", "--all", "--", "--check"]),
    )?;
    run_step(
        "cargo clippy --workspace --all-targets -- -D warnings",
        cargo(root).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run_step(
        "cargo test --workspace",
        cargo(root).args(["test", "--workspace"]),
    )?;
    // Release builds wrap on integer overflow where debug builds panic: the
    // tests of overflow-prone sizes run again in release, so both profiles
    // are shown to give the same typed errors.
    run_step(
        "cargo test --release (sizes near the integer limits)",
        cargo(root)
            .args(["test", "--release"])
            .args(RELEASE_SIZE_TESTS),
    )?;
    // The API docs the crates' users read: every intra-doc link resolves and
    // no doc comment is malformed.
    run_step(
        "cargo doc --workspace --no-deps (warnings denied)",
        cargo(root)
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    check_alert_rules(root)?;
    // What another team gets: packages that list, and a project outside the
    // workspace that builds against the crates and runs their examples.
    consumer::check_packages(root)?;
    consumer::run_consumer(root)?;
    // Telemetry names, deterministic figures and timings of a short seeded
    // CPU run against the committed baseline.
    parity::run(root, parity::Options::default())?;
    // The PyTorch peers the GPU bundle measures against: they still run.
    bench::peers::smoke(root)?;
    eprintln!(
        "==> all checks passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Validates the Prometheus alert rules with `promtool` (installed by
/// provisioning), then runs their unit tests (`*.test.yml`).
fn check_alert_rules(root: &Path) -> Result<()> {
    let rule_files = observability_files(root, ".rules.yml");
    if rule_files.is_empty() {
        bail!("no alert rules (*.rules.yml) under docs/observability");
    }
    let mut check = Command::new("promtool");
    check.args(["check", "rules"]).args(&rule_files);
    run_step("promtool check rules", &mut check)?;
    let rule_tests = observability_files(root, ".test.yml");
    if !rule_tests.is_empty() {
        // promtool resolves `rule_files` relative to the test file.
        let mut test = Command::new("promtool");
        test.args(["test", "rules"]).args(&rule_tests);
        run_step("promtool test rules", &mut test)?;
    }
    Ok(())
}

/// Files in `docs/observability` whose names end in `suffix`, sorted.
fn observability_files(root: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs/observability"))
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|path| {
                    path.file_name()
                        .and_then(|name| name.to_str())
                        .is_some_and(|name| name.ends_with(suffix))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}
