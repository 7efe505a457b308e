//! The `esper bench` command line's contract: every workload's options,
//! where they apply, and the refusals.

use proptest::strategy::Strategy as _;

use super::*;

mod learning;

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

fn parse(args: &[&str]) -> Result<BenchCommand, Usage> {
    BenchArgs::parse(strings(args))
}

fn run_args(args: &[&str]) -> BenchArgs {
    match parse(args) {
        Ok(BenchCommand::Run(args)) => *args,
        other => panic!("{args:?} gave {other:?}"),
    }
}

#[test]
fn bench_args_follow_the_contract() {
    let args = run_args(&["nissa-emit", "--label", "x", "--out", "a/b.json", "--quick"]);
    assert_eq!(args.workload, Workload::NissaEmit);
    assert_eq!(args.out, PathBuf::from("a/b.json"));
    assert_eq!(args.label, "x");
    assert!(args.quick);
    assert_eq!(args.device, DeviceChoice::Auto);
    assert_eq!(parse(&["--help"]), Ok(BenchCommand::Help));
    assert_eq!(
        parse(&["kasmina-prefetch", "--out", "a.json", "-h"]),
        Ok(BenchCommand::Help)
    );
    for bad in [
        &[][..],
        &["nissa-emit", "--out"],
        &["nissa-emit", "--label", "x"],
        &["nissa-emit", "--out", "a.json", "--label", "x", "--fast"],
        &["simic-everything", "--out", "a.json"],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}

#[test]
fn rounds_apply_to_the_simic_workloads_only() {
    let args = run_args(&["simic-learning", "--out", "a.json", "--rounds", "24"]);
    assert_eq!(args.rounds, Some(24));
    let args = run_args(&["simic-cifar", "--out", "a.json", "--rounds", "5"]);
    assert_eq!(args.rounds, Some(5));
    assert_eq!(run_args(&["simic-cifar", "--out", "a.json"]).rounds, None);
    for bad in [
        &["simic-cifar", "--out", "a.json", "--rounds", "0"][..],
        &["simic-cifar", "--out", "a.json", "--rounds", "x"],
        &[
            "simic-cifar",
            "--out",
            "a.json",
            "--rounds",
            "2",
            "--rounds",
            "3",
        ],
        &["tolaria-fmnist", "--out", "a.json", "--rounds", "2"],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}

#[test]
fn torchrun_goes_with_gpus_on_the_scaling_workloads_only() {
    let args = run_args(&[
        "simic-throughput",
        "--out",
        "a.json",
        "--gpus",
        "1,4",
        "--torchrun",
    ]);
    assert!(args.torchrun);
    assert_eq!(args.gpus, [1, 4]);
    assert!(!run_args(&["simic-throughput", "--out", "a.json", "--gpus", "2"]).torchrun);
    // The concurrent single processes run unless --no-concurrent says not.
    assert!(run_args(&["simic-throughput", "--out", "a.json", "--gpus", "2"]).concurrent);
    let args = [
        "simic-growth",
        "--out",
        "a.json",
        "--gpus",
        "2",
        "--no-concurrent",
    ];
    assert!(!run_args(&args).concurrent);
    assert!(matches!(
        parse(&["simic-throughput", "--out", "a.json", "--no-concurrent"]),
        Err(Usage(_))
    ));
    for bad in [
        &["simic-throughput", "--out", "a.json", "--torchrun"][..],
        &["simic-learning", "--out", "a.json", "--torchrun"],
        &[
            "tolaria-fmnist",
            "--out",
            "a.json",
            "--gpus",
            "2",
            "--torchrun",
        ],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}

#[test]
fn every_workload_is_named_by_its_crate() {
    for workload in Workload::ALL {
        assert_eq!(Workload::from_name(workload.name()), Some(workload));
    }
    let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
    assert_eq!(
        names,
        [
            "tolaria-reference",
            "nissa-emit",
            "kasmina-prefetch",
            "tolaria-fmnist",
            "tolaria-lm",
            "tolaria-timeout",
            "tolaria-rollback",
            "simic-throughput",
            "simic-cifar",
            "simic-lm",
            "simic-growth",
            "simic-learning",
            "ppo-cartpole",
        ]
    );
}

#[test]
fn the_label_defaults_to_the_file_stem_of_out() {
    let args = run_args(&["tolaria-reference", "--out", "out/cpu-2026.json"]);
    assert_eq!(args.label, "cpu-2026");
    // A stem that is no portable file name needs an explicit label.
    assert!(parse(&["nissa-emit", "--out", "out/.json"]).is_err());
    assert!(parse(&["nissa-emit", "--out", "out/a b.json"]).is_err());
    let args = run_args(&["nissa-emit", "--out", "out/a b.json", "--label", "ok"]);
    assert_eq!(args.label, "ok");
}

#[test]
fn bench_args_refuse_bad_labels_and_repeated_options() {
    for bad in [
        &["nissa-emit", "--out", "a.json", "--label", "../x"][..],
        &["nissa-emit", "--out", "a.json", "--label", ""],
        &["nissa-emit", "--out", "a.json", "--label", "a/b"],
        &[
            "nissa-emit",
            "--out",
            "a.json",
            "--out",
            "b.json",
            "--label",
            "x",
        ],
        &[
            "nissa-emit",
            "--out",
            "a.json",
            "--label",
            "x",
            "--label",
            "y",
        ],
        &["nissa-emit", "--out", "", "--label", "x"],
        &[
            "tolaria-reference",
            "--out",
            "a.json",
            "--device",
            "cpu",
            "--device",
            "cpu",
        ],
        &[
            "tolaria-reference",
            "--out",
            "a.json",
            "--epochs",
            "1",
            "--epochs",
            "2",
        ],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
    assert_eq!(
        run_args(&["nissa-emit", "--out", "a.json", "--label", "cpu-2026"]).label,
        "cpu-2026"
    );
}

#[test]
fn tolaria_options_parse_and_apply_only_where_they_mean_something() {
    let args = run_args(&[
        "tolaria-reference",
        "--out",
        "k.json",
        "--device",
        "cuda:1",
        "--modes",
        "fused-eager,fused-graph-step-autograd",
        "--epochs",
        "2",
        "--warmup-epochs",
        "0",
    ]);
    assert_eq!(args.device, DeviceChoice::Cuda(1));
    let modes: Vec<String> = args.variants.iter().map(Variant::name).collect();
    assert_eq!(modes, ["fused-eager", "fused-graph-step-autograd"]);
    assert_eq!((args.epochs, args.warmup_epochs), (Some(2), Some(0)));
    assert_eq!(
        run_args(&["kasmina-prefetch", "--out", "k.json", "--device", "cpu"]).device,
        DeviceChoice::Cpu
    );
    for bad in [
        &["nissa-emit", "--out", "a.json", "--device", "cpu"][..],
        &["kasmina-prefetch", "--out", "a.json", "--modes", "eager"],
        &["nissa-emit", "--out", "a.json", "--epochs", "3"],
        &["tolaria-reference", "--out", "a.json", "--device", "gpu"],
        &["tolaria-reference", "--out", "a.json", "--modes", "graph"],
        &["tolaria-reference", "--out", "a.json", "--epochs", "-1"],
        &[
            "tolaria-reference",
            "--out",
            "a.json",
            "--epoch-graph-steps",
            "1",
        ],
        &[
            "simic-growth",
            "--out",
            "a.json",
            "--epoch-graph-steps",
            "1",
        ],
        &[
            "tolaria-fmnist",
            "--out",
            "a.json",
            "--epoch-graph-steps",
            "-1",
        ],
        &[
            "tolaria-fmnist",
            "--out",
            "a.json",
            "--epoch-graph-steps",
            "2",
            "--epoch-graph-steps",
            "3",
        ],
    ] {
        let error = parse(bad).expect_err("refused");
        assert!(!error.0.is_empty(), "{bad:?}");
    }
    // Graph-epoch's graph size: the general-path benches only; 0 is the
    // whole epoch as one graph.
    for (workload, steps) in [("tolaria-fmnist", "0"), ("tolaria-lm", "16")] {
        let args = run_args(&[workload, "--out", "a.json", "--epoch-graph-steps", steps]);
        assert_eq!(args.epoch_graph_steps, steps.parse().ok());
    }
    assert_eq!(
        run_args(&["tolaria-fmnist", "--out", "a.json"]).epoch_graph_steps,
        None
    );
}

#[cfg(unix)]
#[test]
fn a_path_that_is_not_utf8_is_taken_and_other_values_are_refused() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let odd = OsStr::from_bytes(b"out/r\xffn.json").to_owned();
    let args = |rest: Vec<OsString>| {
        let mut all: Vec<OsString> = vec!["nissa-emit".into(), "--out".into(), odd.clone()];
        all.extend(rest);
        BenchArgs::parse(all)
    };
    match args(vec!["--label".into(), "ok".into()]) {
        Ok(BenchCommand::Run(run)) => assert_eq!(run.out.as_os_str(), odd),
        other => panic!("the path is kept as it is: {other:?}"),
    }
    let error = args(Vec::new()).expect_err("no label from a stem that is not text");
    assert!(error.0.contains("UTF-8 file stem"), "{error}");
    let error = args(vec!["--label".into(), odd.clone()]).expect_err("a label is text");
    assert!(
        error.0.contains("--label: the value") && error.0.contains("UTF-8"),
        "{error}"
    );
    let error = args(vec![odd.clone()]).expect_err("not a flag");
    assert!(error.0.contains("unknown argument"), "{error}");
    let error = BenchArgs::parse([odd.clone()]).expect_err("not a workload");
    assert!(error.0.contains("unknown workload"), "{error}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// Any bytes in any position (the operating system's strings on
    /// Unix) give a run, help or a usage error, never a panic.
    #[cfg(unix)]
    #[test]
    fn bench_args_from_arbitrary_bytes(
        words in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::collection::vec(proptest::num::u8::ANY, 0..12),
                proptest::sample::select(vec![
                    "nissa-emit", "tolaria-reference", "--out", "--label", "--device",
                    "--epochs", "--modes", "--quick", "--gpus", "x.json",
                ])
                .prop_map(|word| word.as_bytes().to_vec()),
            ],
            0..7,
        ),
    ) {
        use std::os::unix::ffi::OsStringExt;
        let args: Vec<OsString> = words.into_iter().map(OsString::from_vec).collect();
        match BenchArgs::parse(args) {
            Ok(BenchCommand::Run(run)) => {
                proptest::prop_assert!(!run.out.as_os_str().is_empty());
                proptest::prop_assert!(file_name_problem(&run.label).is_none());
            }
            Ok(BenchCommand::Help) => {}
            Err(Usage(reason)) => proptest::prop_assert!(!reason.is_empty()),
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Moved from leyline with the parsing: any strings in the label,
    /// out and extra positions give a run, help or a usage error, never a
    /// panic, and a run carries exactly the label given.
    #[test]
    fn bench_args_from_hostile_strings(
        label in leyline::testing::hostile_string(),
        out in leyline::testing::hostile_string(),
        extra in proptest::option::of(leyline::testing::hostile_string()),
    ) {
        let mut args = strings(&["nissa-emit", "--out"]);
        args.extend([out.clone(), "--label".to_owned(), label.clone()]);
        args.extend(extra.clone());
        let parsed = BenchArgs::parse(args);
        let extra_ok = extra.as_deref().is_none_or(|arg| arg == "--quick");
        let help = extra.as_deref().is_some_and(|arg| arg == "-h" || arg == "--help");
        let label_ok = file_name_problem(&label).is_none();
        if out.is_empty() {
            proptest::prop_assert!(matches!(parsed, Err(Usage(_))));
        } else if help {
            proptest::prop_assert_eq!(parsed, Ok(BenchCommand::Help));
        } else if label_ok && extra_ok {
            let is_run = matches!(parsed, Ok(BenchCommand::Run(ref run)) if run.label == label);
            proptest::prop_assert!(is_run);
        } else {
            proptest::prop_assert!(matches!(parsed, Err(Usage(_))));
        }
    }
}
