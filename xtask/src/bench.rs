//! `cargo xtask bench`: builds release `esper` and runs the benchmark
//! workloads through it.
//!
//! Each workload is one row of [`WORKLOADS`], run as `esper bench <name>
//! --out baselines/perf/<name>/<label>.json --label <label> [--quick]` with
//! `ESPER_GIT_REV` set ([`crate::probe::git_rev`]); `esper` measures, probes
//! the machine and writes the record. `tolaria-reference` also runs the
//! Python peers ([`peers`]) when a python3 with torch is found, merging
//! their entries into the same record. After each workload a table is
//! printed; `--compare LABEL` adds before/after against a committed record
//! ([`compare`]).

mod compare;
pub(crate) mod peers;
mod report;

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

/// One benchmark workload: its record name, its Python peers and whether
/// the default set runs it on a machine without a GPU.
struct Workload {
    /// Record name (DESIGN.md §6), also `esper bench`'s workload argument.
    name: &'static str,
    /// Python peer script (relative to the root) merged into the record.
    python_peers: Option<&'static str>,
    /// `Some(why)` for a GPU-sized workload: the default set skips it on a
    /// machine without a GPU, saying why (`--workload NAME` or `--all` runs
    /// it anyway).
    gpu_sized: Option<&'static str>,
}

/// The workloads, in run order. Adding one is one line here and one
/// workload in `esper bench`.
const WORKLOADS: &[Workload] = &[
    Workload {
        name: "tolaria-reference",
        python_peers: Some("bench/python/tolaria_reference.py"),
        gpu_sized: None,
    },
    Workload {
        name: "nissa-emit",
        python_peers: None,
        gpu_sized: None,
    },
    Workload {
        name: "kasmina-prefetch",
        python_peers: None,
        gpu_sized: None,
    },
    Workload {
        name: "tolaria-fmnist",
        python_peers: Some("bench/python/tolaria_fmnist.py"),
        gpu_sized: Some(
            "trains the Fashion-MNIST CNN over all 60,000 images an epoch and runs its PyTorch peers: GPU-sized (over 10 minutes on a 2-core CPU)",
        ),
    },
    Workload {
        name: "tolaria-lm",
        python_peers: Some("bench/python/tolaria_lm.py"),
        gpu_sized: Some(
            "trains the language-model transformer over the whole fortunes corpus an epoch and runs its PyTorch peers (Inductor's among them): GPU-sized",
        ),
    },
    Workload {
        name: "tolaria-timeout",
        python_peers: None,
        gpu_sized: None,
    },
    Workload {
        name: "tolaria-rollback",
        python_peers: None,
        gpu_sized: None,
    },
    Workload {
        name: "simic-throughput",
        python_peers: None,
        gpu_sized: Some(
            "runs vectorized PPO rounds on Fashion-MNIST (each environment-epoch trains on 15,000 images and validates on 10,000): GPU-sized",
        ),
    },
    Workload {
        name: "simic-cifar",
        python_peers: None,
        gpu_sized: Some(
            "runs vectorized PPO rounds on CIFAR-10 at real size with the reference host: GPU-sized",
        ),
    },
    Workload {
        name: "simic-lm",
        python_peers: None,
        gpu_sized: Some(
            "runs vectorized PPO rounds of 150-epoch episodes on the language-model transformer: GPU-sized",
        ),
    },
    Workload {
        name: "simic-growth",
        python_peers: None,
        gpu_sized: Some(
            "runs 150-epoch episodes of the CIFAR-10 environments with every slot grown: GPU-sized",
        ),
    },
    Workload {
        name: "simic-learning",
        python_peers: None,
        gpu_sized: Some(
            "runs many PPO rounds beside the heuristic and no growth to measure learning: GPU-sized",
        ),
    },
    Workload {
        name: "ppo-cartpole",
        python_peers: None,
        gpu_sized: None,
    },
];

/// Options of `cargo xtask bench`.
#[derive(Debug, Default)]
pub(crate) struct Options {
    pub(crate) label: Option<String>,
    pub(crate) workloads: Vec<String>,
    pub(crate) compare: Option<String>,
    /// `--compare A B`: the second label; a report of two committed
    /// labels instead of a run ([`report`]).
    pub(crate) compare_to: Option<String>,
    pub(crate) quick: bool,
    /// `--all`: run the GPU-sized workloads on a machine without a GPU too.
    pub(crate) all: bool,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |flag: &str| -> Result<String> {
                match args.next() {
                    Some(value) => Ok(value.clone()),
                    None => bail!("{flag} needs a value"),
                }
            };
            match arg.as_str() {
                "--label" => options.label = Some(value("--label")?),
                "--workload" => options.workloads.push(value("--workload")?),
                "--compare" => {
                    options.compare = Some(value("--compare")?);
                    if let Some(second) = args.clone().next().filter(|next| !next.starts_with("--"))
                    {
                        options.compare_to = Some(second.clone());
                        let _ = args.next();
                    }
                }
                "--quick" => options.quick = true,
                "--all" => options.all = true,
                other => bail!("unknown bench option `{other}` (see `cargo xtask help`)"),
            }
        }
        for name in &options.workloads {
            if !WORKLOADS.iter().any(|workload| workload.name == name) {
                let known: Vec<&str> = WORKLOADS.iter().map(|workload| workload.name).collect();
                bail!("unknown workload `{name}` (known: {})", known.join(", "));
            }
        }
        Ok(options)
    }
}

/// The workloads a run measures: those `--workload` names, else every one,
/// less the GPU-sized ones on a machine without a GPU (unless `--all`),
/// each skip printed with its reason.
fn select(options: &Options, gpu: bool) -> Vec<&'static Workload> {
    if !options.workloads.is_empty() {
        return WORKLOADS
            .iter()
            .filter(|workload| options.workloads.iter().any(|name| name == workload.name))
            .collect();
    }
    WORKLOADS
        .iter()
        .filter(|workload| match workload.gpu_sized {
            Some(why) if !gpu && !options.all => {
                eprintln!(
                    "==> [{}] skipped: no GPU here, and it {why} \
                     (`--workload {}` or `--all` runs it anyway)",
                    workload.name, workload.name
                );
                false
            }
            _ => true,
        })
        .collect()
}

pub(crate) fn run(root: &Path, options: &Options) -> Result<()> {
    if let (Some(before), Some(after)) = (&options.compare, &options.compare_to) {
        let workloads: Vec<&str> = WORKLOADS
            .iter()
            .map(|workload| workload.name)
            .filter(|name| {
                options.workloads.is_empty() || options.workloads.iter().any(|w| w == name)
            })
            .collect();
        let path = report::write(root, before, after, &workloads)?;
        eprintln!("==> wrote {}", path.display());
        return Ok(());
    }
    let started = std::time::Instant::now();
    let label = options
        .label
        .clone()
        .unwrap_or_else(crate::probe::default_label);
    let git_rev = crate::probe::git_rev(root);
    let selected = select(options, crate::probe::has_gpu());
    crate::run_step(
        "cargo build --release -p esper",
        crate::cargo(root).args(["build", "--release", "-p", "esper", "--bin", "esper"]),
    )?;
    let esper = root.join("target/release/esper");
    let mut written = Vec::new();
    for workload in selected {
        let out = root
            .join("baselines/perf")
            .join(workload.name)
            .join(format!("{label}.json"));
        let mut command = Command::new(&esper);
        command
            .args(["bench", workload.name])
            .arg("--out")
            .arg(&out)
            .args(["--label", &label])
            .env("ESPER_GIT_REV", &git_rev)
            .current_dir(root);
        if options.quick {
            command.arg("--quick");
        }
        crate::run_step(
            &format!(
                "[{}] {} bench {}",
                workload.name,
                esper.display(),
                workload.name
            ),
            &mut command,
        )?;
        if let Some(script) = workload.python_peers {
            peers::run(root, script, &out, options.quick)?;
        }
        let record = compare::read_record(&out)?;
        compare::print_table(&record);
        if let Some(before_label) = &options.compare {
            let before_path = out.with_file_name(format!("{before_label}.json"));
            match compare::read_record(&before_path) {
                Ok(before) => compare::print_comparison(&before, &record),
                Err(error) => eprintln!("==> no comparison: {error:#}"),
            }
        }
        written.push(out);
    }
    for path in &written {
        eprintln!("==> wrote {}", path.display());
    }
    eprintln!(
        "==> bench finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_takes_one_label_or_two() {
        let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let one = Options::parse(&args(&["--compare", "x", "--quick"])).expect("one");
        assert_eq!(one.compare.as_deref(), Some("x"));
        assert_eq!(one.compare_to, None);
        assert!(one.quick);
        let two = Options::parse(&args(&["--compare", "x", "y", "--workload", "simic-cifar"]))
            .expect("two");
        assert_eq!(two.compare.as_deref(), Some("x"));
        assert_eq!(two.compare_to.as_deref(), Some("y"));
        assert_eq!(two.workloads, ["simic-cifar"]);
    }

    fn parse(args: &[&str]) -> Result<Options> {
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        Options::parse(&args)
    }

    #[test]
    fn options_parse_known_flags() {
        let options = parse(&[
            "--label",
            "x",
            "--workload",
            "nissa-emit",
            "--compare",
            "y",
            "--quick",
        ])
        .expect("valid options");
        assert_eq!(options.label.as_deref(), Some("x"));
        assert_eq!(options.workloads, ["nissa-emit"]);
        assert_eq!(options.compare.as_deref(), Some("y"));
        assert!(options.quick);
    }

    #[test]
    fn options_reject_unknown_flags_workloads_and_missing_values() {
        for (args, expected) in [
            (&["--fast"][..], "unknown bench option"),
            (&["--workload", "simic-everything"], "unknown workload"),
            (&["--label"], "--label needs a value"),
        ] {
            let error = parse(args).err().map(|error| error.to_string());
            assert!(
                error.as_deref().is_some_and(|text| text.contains(expected)),
                "{args:?}: {error:?}"
            );
        }
    }

    #[test]
    fn without_a_gpu_the_default_set_skips_the_gpu_sized_workloads() {
        let names = |list: Vec<&Workload>| list.iter().map(|w| w.name).collect::<Vec<_>>();
        let default = Options::default();
        let cpu = names(select(&default, false));
        let gpu = names(select(&default, true));
        assert_eq!(gpu.len(), WORKLOADS.len(), "a GPU runs every workload");
        for workload in WORKLOADS {
            assert_eq!(
                cpu.contains(&workload.name),
                workload.gpu_sized.is_none(),
                "{}",
                workload.name
            );
        }
        assert!(cpu.contains(&"tolaria-reference") && !cpu.contains(&"tolaria-fmnist"));
        let all = names(select(&parse(&["--all"]).expect("--all"), false));
        assert_eq!(all.len(), WORKLOADS.len(), "--all runs every workload");
        let named = names(select(
            &parse(&["--workload", "simic-cifar"]).expect("named"),
            false,
        ));
        assert_eq!(named, ["simic-cifar"], "a named workload runs on the CPU");
    }

    #[test]
    fn every_workload_has_a_distinct_name() {
        let mut names: Vec<&str> = WORKLOADS.iter().map(|workload| workload.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), WORKLOADS.len());
    }

    #[test]
    fn every_workload_is_one_esper_bench_runs() {
        // xtask does not depend on esper; its usage text names each workload.
        let esper = include_str!("../../crates/esper/src/main.rs");
        for workload in WORKLOADS {
            assert!(
                esper.contains(&format!("\n      {} ", workload.name)),
                "`esper help` does not list {}",
                workload.name
            );
        }
    }
}
