//! Tests of the run configuration: defaults, file, flags, checks.

use proptest::strategy::Strategy as _;

use super::file::{nearest_key, parse_file};
use super::stamp::utc_stamp;
use super::*;

#[test]
fn an_unknown_key_names_its_nearest_spelling() {
    let error = parse_file("epoch = 3\n", "run.toml").expect_err("refused");
    assert_eq!(
        error.to_string(),
        "unknown key \"epoch\" in run.toml; did you mean \"epochs\"?"
    );
    assert_eq!(nearest_key("batchsize"), Some("batch_size"));
    assert_eq!(nearest_key("max-seed"), Some("max_seeds"));
    assert_eq!(nearest_key("Learning_Rate"), Some("learning_rate"));
    assert_eq!(nearest_key("colour"), None);
    let far = parse_file("colour = 1\n", "run.toml").expect_err("refused");
    assert!(far.to_string().contains("the valid keys are controller"));
}

#[test]
fn file_keys_take_dashes_and_types_are_checked() {
    let file = parse_file(
        "batch-size = 64\ntask = \"synthetic\"\ncheckpoint-every = 2\n",
        "a.toml",
    )
    .expect("ok");
    assert_eq!(file.batch_size, Some(64));
    assert_eq!(file.checkpoint_every, Some(2));
    assert_eq!(file.task, Some(TaskKind::Synthetic));
    let error = parse_file("epochs = \"many\"\n", "a.toml").expect_err("refused");
    assert!(format!("{error:#}").contains("epochs"), "{error:#}");
    assert!(parse_file("task = \"mnist\"\n", "a.toml").is_err());
    assert!(parse_file("batch_size = 1\nbatch-size = 2\n", "a.toml").is_err());
    let file = parse_file("policy-precision = \"fp32\"\n", "a.toml").expect("ok");
    assert_eq!(file.policy_precision, Some(PolicyPrecisionChoice::Fp32));
    assert!(parse_file("policy_precision = \"fp16\"\n", "a.toml").is_err());
}

#[test]
fn flags_override_the_file_and_the_file_overrides_defaults() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("run.toml");
    std::fs::write(&path, "epochs = 7\nbatch_size = 32\nslots = [\"r0c0\"]\n").expect("write");
    let args = TrainArgs {
        config: Some(path.clone()),
        epochs: Some(3),
        ..TrainArgs::default()
    };
    let config = RunConfig::resolve(&args).expect("resolved");
    assert_eq!(config.epochs, 3, "the flag wins");
    assert_eq!(config.batch_size, 32, "the file wins over the default");
    assert_eq!(config.slots, ["r0c0"]);
    assert_eq!(config.max_seeds, 1, "max_seeds defaults to the slot count");
    assert_eq!(config.learning_rate, DEFAULT_LEARNING_RATE);
    assert_eq!(config.train_samples, DEFAULT_FMNIST_TRAIN_SAMPLES);
    assert_eq!(config.checkpoint_every, DEFAULT_CHECKPOINT_EVERY);
    // The written file reads back as the same configuration; one written
    // before checkpoints existed reads with the default interval.
    let text = config.to_toml().expect("toml");
    let again: RunConfig = toml::from_str(&text).expect("parse");
    assert_eq!(again, config);
    let older: String = text
        .lines()
        .filter(|line| !line.starts_with("checkpoint_every"))
        .map(|line| format!("{line}\n"))
        .collect();
    let older: RunConfig = toml::from_str(&older).expect("parse");
    assert_eq!(older.checkpoint_every, DEFAULT_CHECKPOINT_EVERY);
    // One written before the policy's precision was a setting reads
    // with the reference's rule.
    assert_eq!(config.policy_precision, PolicyPrecisionChoice::Auto);
    let older: String = text
        .lines()
        .filter(|line| !line.starts_with("policy_precision"))
        .map(|line| format!("{line}\n"))
        .collect();
    let older: RunConfig = toml::from_str(&older).expect("parse");
    assert_eq!(older.policy_precision, PolicyPrecisionChoice::Auto);
    // The PPO settings default to the reference's; one written before
    // they were settings reads with those.
    assert_eq!(
        (
            config.ppo_epochs,
            config.ppo_learning_rate,
            config.entropy_coef
        ),
        (1, 3e-4, 0.05)
    );
    let older: String = text
        .lines()
        .filter(|line| {
            !line.starts_with("ppo_")
                && !line.starts_with("entropy_coef")
                && !line.starts_with("reward_mode")
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let older: RunConfig = toml::from_str(&older).expect("parse");
    assert_eq!(
        (
            older.ppo_epochs,
            older.ppo_learning_rate,
            older.entropy_coef
        ),
        (1, 3e-4, 0.05)
    );
    assert_eq!(older.reward_mode, RewardChoice::Shaped);
    // The blueprint warm-up is on unless a setting turns it off; a config
    // written before it was a setting reads with it on.
    assert!(config.prewarm_blueprints);
    let older: String = text
        .lines()
        .filter(|line| !line.starts_with("prewarm_blueprints"))
        .map(|line| format!("{line}\n"))
        .collect();
    let older: RunConfig = toml::from_str(&older).expect("parse");
    assert!(older.prewarm_blueprints);
    // A file and a flag set them.
    std::fs::write(
        &path,
        "ppo_epochs = 4\nentropy-coef = 0.1\nreward_mode = \"sparse\"\nprewarm_blueprints = false\n",
    )
    .expect("write");
    let args = TrainArgs {
        config: Some(path.clone()),
        ppo_learning_rate: Some(1e-4),
        ..TrainArgs::default()
    };
    let config = RunConfig::resolve(&args).expect("resolved");
    assert_eq!(
        (
            config.ppo_epochs,
            config.ppo_learning_rate,
            config.entropy_coef
        ),
        (4, 1e-4, 0.1)
    );
    assert_eq!(config.reward_mode, RewardChoice::Sparse);
    assert!(!config.prewarm_blueprints);
    // The flag wins over the file.
    let args = TrainArgs {
        config: Some(path.clone()),
        prewarm_blueprints: Some(true),
        ..TrainArgs::default()
    };
    assert!(
        RunConfig::resolve(&args)
            .expect("resolved")
            .prewarm_blueprints
    );
}

#[test]
fn bad_values_are_refused_with_their_name() {
    for (args, needle) in [
        (
            TrainArgs {
                epochs: Some(0),
                ..TrainArgs::default()
            },
            "epochs",
        ),
        (
            TrainArgs {
                slots: Some(vec!["x1".to_owned()]),
                ..TrainArgs::default()
            },
            "slots",
        ),
        (
            TrainArgs {
                slots: Some(vec!["r0c1".to_owned(), "r0c1".to_owned()]),
                ..TrainArgs::default()
            },
            "twice",
        ),
        (
            TrainArgs {
                device: Some("gpu".to_owned()),
                ..TrainArgs::default()
            },
            "device",
        ),
        (
            TrainArgs {
                learning_rate: Some(f64::NAN),
                ..TrainArgs::default()
            },
            "learning_rate",
        ),
        (
            TrainArgs {
                ppo_epochs: Some(0),
                ..TrainArgs::default()
            },
            "ppo_epochs",
        ),
        (
            TrainArgs {
                ppo_learning_rate: Some(-1.0),
                ..TrainArgs::default()
            },
            "ppo_learning_rate",
        ),
        (
            TrainArgs {
                entropy_coef: Some(f64::INFINITY),
                ..TrainArgs::default()
            },
            "entropy_coef",
        ),
    ] {
        let error = RunConfig::resolve(&args).expect_err("refused");
        assert!(format!("{error:#}").contains(needle), "{error:#}");
    }
}

#[test]
fn timestamps_are_utc_calendar_dates() {
    assert_eq!(utc_stamp(0), "1970-01-01_000000");
    assert_eq!(utc_stamp(951_782_400), "2000-02-29_000000");
    assert_eq!(utc_stamp(1_795_437_296), "2026-11-23_123456");
}

#[test]
fn the_mode_defaults_to_auto_graph_step_on_cuda_and_eager_on_the_cpu() {
    use tolaria::ExecutionMode;
    let config = RunConfig::resolve(&TrainArgs::default()).expect("resolved");
    assert_eq!(config.mode, ModeChoice::Auto);
    assert!(
        config.to_toml().expect("toml").contains("mode = \"auto\""),
        "config.toml records the choice"
    );
    assert_eq!(
        ModeChoice::Auto.resolve(tch::Device::Cuda(0)),
        ExecutionMode::GraphStep,
        "the fastest mode that applies on CUDA"
    );
    assert_eq!(
        ModeChoice::Auto.resolve(tch::Device::Cpu),
        ExecutionMode::Eager,
        "the graph modes need CUDA"
    );
    assert_eq!(
        ModeChoice::Eager.resolve(tch::Device::Cuda(0)),
        ExecutionMode::Eager,
        "eager stays the fallback to pick"
    );
    assert_eq!(
        ModeChoice::GraphEpoch.resolve(tch::Device::Cpu),
        ExecutionMode::GraphEpoch,
        "an explicit mode is kept (the trainer refuses it on the CPU)"
    );
    // A configuration written when eager was the default still reads.
    let text = config
        .to_toml()
        .expect("toml")
        .replace("mode = \"auto\"", "mode = \"eager\"");
    let older: RunConfig = toml::from_str(&text).expect("parse");
    assert_eq!(older.mode, ModeChoice::Eager);
}

#[test]
fn absurd_sizes_are_refused_with_their_name_and_limit() {
    let ppo = |args: TrainArgs| TrainArgs {
        controller: Some(ControllerKind::Ppo),
        ..args
    };
    for (args, needle) in [
        (
            TrainArgs {
                epochs: Some(MAX_EPOCHS + 1),
                ..TrainArgs::default()
            },
            "epochs 100001 is more than the 100000",
        ),
        (
            TrainArgs {
                epochs: Some(usize::MAX),
                ..TrainArgs::default()
            },
            "epochs",
        ),
        (
            TrainArgs {
                envs: Some(MAX_ENVS + 1),
                ..TrainArgs::default()
            },
            "envs 257",
        ),
        (
            ppo(TrainArgs {
                envs: Some(MAX_ENVS),
                epochs: Some(MAX_EPOCHS),
                ..TrainArgs::default()
            }),
            "environment-epochs",
        ),
        (
            TrainArgs {
                rounds: Some(MAX_ROUNDS + 1),
                ..TrainArgs::default()
            },
            "rounds",
        ),
        (
            TrainArgs {
                ppo_epochs: Some(MAX_PPO_EPOCHS + 1),
                ..TrainArgs::default()
            },
            "ppo_epochs",
        ),
        (
            TrainArgs {
                learning_rate: Some(1e9),
                ..TrainArgs::default()
            },
            "learning_rate 1000000000 must be",
        ),
        (
            TrainArgs {
                learning_rate: Some(1e-50),
                ..TrainArgs::default()
            },
            "as an f32",
        ),
        (
            TrainArgs {
                ppo_learning_rate: Some(f64::INFINITY),
                ..TrainArgs::default()
            },
            "ppo_learning_rate inf",
        ),
        (
            TrainArgs {
                slots: Some((0..=MAX_SLOTS).map(|i| format!("r0c{i}")).collect()),
                ..TrainArgs::default()
            },
            "more than the 64",
        ),
    ] {
        let error = RunConfig::resolve(&args).expect_err("refused");
        assert!(format!("{error:#}").contains(needle), "{needle}: {error:#}");
    }
    // The same sizes for a heuristic run: envs x epochs only bounds PPO.
    let config = RunConfig::resolve(&TrainArgs {
        envs: Some(MAX_ENVS),
        epochs: Some(MAX_EPOCHS),
        ..TrainArgs::default()
    })
    .expect("a heuristic run has no rollout");
    assert_eq!(config.epochs, MAX_EPOCHS);
}

#[cfg(unix)]
#[test]
fn a_run_directory_that_is_not_utf8_is_written_as_text_and_a_data_folder_refused() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let odd = PathBuf::from(OsStr::from_bytes(b"runs/r\xffn"));
    let config = RunConfig::resolve(&TrainArgs {
        run_dir: Some(odd.clone()),
        ..TrainArgs::default()
    })
    .expect("a run directory may be any path");
    assert_eq!(config.run_dir, odd);
    let text = config
        .to_text(&odd.join("config.toml"))
        .expect("written with a replacement character");
    assert!(text.contains("run_dir = \"runs/r\u{fffd}n\""), "{text}");
    let error = RunConfig::resolve(&TrainArgs {
        data_dir: Some(odd),
        ..TrainArgs::default()
    })
    .expect_err("the data folder is read back from config.toml");
    assert!(
        format!("{error:#}").contains("not valid UTF-8"),
        "{error:#}"
    );
    // A newline in a path does not end the header comment.
    let text = config.to_text(Path::new("a\nb/config.toml")).expect("text");
    let parsed: RunConfig = toml::from_str(&text).expect("still TOML");
    assert_eq!(parsed.epochs, config.epochs);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Hostile numbers in every numeric option resolve to a configuration
    /// within its limits or to an error naming what is wrong, never a
    /// panic.
    #[test]
    fn hostile_numbers_resolve_within_the_limits_or_are_refused(
        learning_rate in leyline::testing::extreme_f64(),
        ppo_learning_rate in leyline::testing::extreme_f64(),
        entropy_coef in leyline::testing::extreme_f64(),
        epochs in leyline::testing::extreme_usize(),
        batch_size in leyline::testing::extreme_usize(),
        envs in leyline::testing::extreme_usize(),
        rounds in leyline::testing::extreme_usize(),
        ppo_epochs in leyline::testing::extreme_usize(),
        max_seeds in leyline::testing::extreme_usize(),
        seed in leyline::testing::extreme_u64(),
        ppo in proptest::bool::ANY,
    ) {
        let args = TrainArgs {
            controller: Some(if ppo { ControllerKind::Ppo } else { ControllerKind::Heuristic }),
            learning_rate: Some(learning_rate),
            ppo_learning_rate: Some(ppo_learning_rate),
            entropy_coef: Some(entropy_coef),
            epochs: Some(epochs),
            batch_size: Some(batch_size),
            envs: Some(envs),
            rounds: Some(rounds),
            ppo_epochs: Some(ppo_epochs),
            max_seeds: Some(max_seeds),
            seed: Some(seed),
            ..TrainArgs::default()
        };
        match RunConfig::resolve(&args) {
            Ok(config) => {
                proptest::prop_assert!((1..=MAX_EPOCHS).contains(&config.epochs));
                proptest::prop_assert!(config.batch_size >= 1);
                proptest::prop_assert!((1..=MAX_ENVS).contains(&config.envs));
                proptest::prop_assert!((1..=MAX_ROUNDS).contains(&config.rounds));
                proptest::prop_assert!((1..=MAX_PPO_EPOCHS).contains(&config.ppo_epochs));
                for rate in [config.learning_rate, config.ppo_learning_rate] {
                    proptest::prop_assert!(rate.is_finite() && rate > 0.0);
                    proptest::prop_assert!(rate <= tolaria::optim::MAX_LEARNING_RATE);
                }
                proptest::prop_assert!(config.entropy_coef.is_finite());
                proptest::prop_assert!(config.entropy_coef >= 0.0);
                // What is accepted can be written and read back.
                let text = config.to_toml().expect("toml");
                let again: RunConfig = toml::from_str(&text).expect("parse");
                proptest::prop_assert_eq!(again, config);
            }
            Err(error) => proptest::prop_assert!(error.chain().count() > 0 && !error.to_string().is_empty()),
        }
    }

    /// Hostile strings as the values of `esper train`'s options parse to a
    /// usage error or to arguments that resolve or are refused, never a
    /// panic.
    #[test]
    fn hostile_strings_on_the_command_line_never_panic(
        flag in proptest::sample::select(vec![
            "--epochs", "--batch-size", "--learning-rate", "--seed", "--slots",
            "--device", "--max-seeds", "--train-samples", "--envs", "--rounds",
            "--ppo-learning-rate", "--entropy-coef", "--metrics-port", "--mode",
            "--precision", "--devices", "--checkpoint-every", "--prewarm-blueprints",
        ]),
        value in proptest::prop_oneof![
            leyline::testing::hostile_string(),
            proptest::sample::select(vec![
                "NaN", "nan", "inf", "-inf", "infinity", "1e309", "-1e309", "1e-320",
                "-0", "0", "-1", "18446744073709551615", "18446744073709551616",
                "99999999999999999999999", "0x10", "1_000", "r9c9", "r0c1,r0c1",
                "cuda:18446744073709551615", "65536", "auto",
            ]).prop_map(str::to_owned),
        ],
    ) {
        use clap::Parser;
        let argv = ["esper train", flag, value.as_str()];
        if let Ok(args) = TrainArgs::try_parse_from(argv) {
            match RunConfig::resolve(&args) {
                Ok(config) => proptest::prop_assert!(config.validate().is_ok()),
                Err(error) => proptest::prop_assert!(error.chain().count() > 0 && !error.to_string().is_empty()),
            }
        }
    }
}

#[test]
fn the_help_states_the_limits_the_checks_apply() {
    use clap::CommandFactory;
    let help = TrainArgs::command().render_long_help().to_string();
    for limit in [
        format!("1 to {MAX_EPOCHS}"),
        format!("1 to {MAX_ENVS}"),
        format!("at most {MAX_ROUND_STEPS}"),
        format!("1 to {MAX_ROUNDS}"),
        format!("at most {}", tolaria::optim::MAX_LEARNING_RATE),
    ] {
        assert!(help.contains(&limit), "{limit:?} in {help}");
    }
    for stale in ["issue", "not implemented"] {
        assert!(!help.contains(stale), "{stale:?} in {help}");
    }
}

#[test]
fn a_preset_and_settings_resolve_in_order_and_only_for_ppo() {
    let args = TrainArgs {
        controller: Some(ControllerKind::Ppo),
        preset: Some("growth".to_owned()),
        settings: vec!["reward.germination_delay_cost=-0.2".to_owned()],
        ..TrainArgs::default()
    };
    let config = RunConfig::resolve(&args).expect("resolved");
    let growth = simic::vectorized::settings::GROWTH;
    assert_eq!(config.settings.len(), growth.len() + 1);
    assert_eq!(config.settings[..growth.len()], growth.map(str::to_owned));
    assert_eq!(
        config.settings.last().map(String::as_str),
        Some("reward.germination_delay_cost=-0.2"),
        "--set comes after the preset, so it wins"
    );
    // Written and read back, the settings are the configuration's.
    let again: RunConfig = toml::from_str(&config.to_toml().expect("toml")).expect("parse");
    assert_eq!(again, config);
    // A file's settings apply when no flag gives any.
    let file = parse_file("settings = [\"reward.rent_weight=0\"]\n", "a.toml").expect("ok");
    assert_eq!(file.settings, Some(vec!["reward.rent_weight=0".to_owned()]));

    let unknown = TrainArgs {
        preset: Some("grow".to_owned()),
        ..args.clone()
    };
    let error = format!(
        "{:#}",
        RunConfig::resolve(&unknown).expect_err("unknown preset")
    );
    assert!(error.contains("growth"), "{error}");
    let wrong = TrainArgs {
        preset: None,
        settings: vec!["reward.rent_weight=-1".to_owned()],
        ..args.clone()
    };
    let error = format!("{:#}", RunConfig::resolve(&wrong).expect_err("bad value"));
    assert!(error.contains("rent_weight"), "{error}");
    let heuristic = TrainArgs {
        controller: Some(ControllerKind::Heuristic),
        ..args
    };
    let error = format!("{:#}", RunConfig::resolve(&heuristic).expect_err("not ppo"));
    assert!(error.contains("--controller ppo only"), "{error}");
}
