//! Tests of the run configuration: defaults, file, flags, checks.

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
