//! The protocol's checks that need no training: settings and the refusal
//! of parts of another run.

use super::*;

/// The quick protocol's options on the CPU: `seeds` training seeds and,
/// when given, episodes of `episode` epochs.
fn cpu_options(seeds: usize, episode: Option<u32>) -> SimicBenchOptions {
    let mut options = SimicBenchOptions::new(torch_ext::DeviceChoice::Cpu, true);
    options.seeds = seeds;
    if episode.is_some() {
        options.episode_length = episode;
    }
    options
}

/// The quick protocol on the CPU; its Fashion-MNIST subset comes from
/// the provisioned data set, as every data test's.
fn quick_setup() -> LearningSetup {
    let options = cpu_options(2, None);
    LearningSetup::new(&options, 1).expect("the quick protocol's setup")
}

/// The metrics of the entry `mode` of `run` (a panic names a missing one).
fn metrics_of(run: &SimicBenchRun, mode: &str) -> std::collections::BTreeMap<String, f64> {
    run.measurements
        .results
        .iter()
        .find(|entry| entry.mode == mode)
        .unwrap_or_else(|| panic!("no {mode} entry"))
        .metrics
        .clone()
}

fn evaluation() -> Evaluation {
    Evaluation {
        accuracies: vec![50.0; usize::try_from(EVAL_ROUNDS).unwrap() * 4],
        active_seeds: vec![0.0; usize::try_from(EVAL_ROUNDS).unwrap()],
        ..Evaluation::default()
    }
}

/// A baseline's figures with `accuracies` (one per environment, 4 to an
/// evaluation round) and nothing grown.
fn baseline_figures(baseline: Baseline, accuracies: Vec<f64>) -> BaselineFigures {
    let rounds = accuracies.len().div_ceil(4);
    BaselineFigures {
        baseline,
        accuracies,
        active: vec![0.0; rounds],
        germinations: 0,
        fossilizations: 0,
        missed: 0,
        refused: 0,
    }
}

/// The sum of the metrics whose names start with `prefix`.
fn sum_of(metrics: &std::collections::BTreeMap<String, f64>, prefix: &str) -> f64 {
    metrics
        .iter()
        .filter(|(key, _)| key.starts_with(prefix))
        .map(|(_, value)| value)
        .sum()
}

/// Baselines of `setup`'s run without figures (what the refusals and the
/// entry names need).
fn no_baselines(setup: &LearningSetup) -> Baselines {
    Baselines {
        setup: setup.describe(),
        figures: Vec::new(),
    }
}

fn outcome(setup: &LearningSetup, seed_index: usize) -> SeedOutcome {
    SeedOutcome {
        seed_index,
        setup: setup.describe(),
        rounds: Vec::new(),
        greedy: evaluation(),
        sampled: evaluation(),
        selected_round: None,
        selected: None,
    }
}

#[test]
fn settings_are_part_of_the_setup() {
    let mut options = SimicBenchOptions::new(torch_ext::DeviceChoice::Cpu, true);
    options.settings = vec!["reward.rent_weight=0".to_owned()];
    let setup = LearningSetup::new(&options, 1).expect("the quick protocol's setup");
    assert!(setup.describe().contains("reward.rent_weight=0"));
    assert_eq!(setup.config.reward.rent_weight, 0.0);
    options.settings = vec!["reward.rent_weight=-1".to_owned()];
    assert!(LearningSetup::new(&options, 1).is_err());
}

#[test]
fn training_taken_up_after_a_round_follows_the_uninterrupted_run() {
    let _rng = crate::global_rng_lock();
    let options = cpu_options(1, Some(2));
    let setup = LearningSetup::new(&options, 2).expect("the quick protocol's setup");
    let mut quiet = |_: &str| {};
    let trained = setup.train_policy(0, &mut quiet).expect("two rounds");
    let (whole, whole_curve) = (trained.simic, trained.curve);

    // The same seed stopped after its first round (the callback's error
    // stops it), its trainer saved there, then taken up in a new trainer.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut saved = 0;
    let stopped = setup.continue_policy(0, None, &mut quiet, &mut |simic, curve, _| {
        simic.save_checkpoint(dir.path(), "progress", serde_json::Map::new())?;
        saved = curve.len();
        Err(crate::Error::Checkpoint {
            field: "test",
            reason: "stopped after one round".to_owned(),
        })
    });
    assert!(stopped.is_err(), "the callback's error did not stop it");
    assert_eq!(saved, 1);
    let checkpoint =
        crate::checkpoint::read_checkpoint(&dir.path().join("progress")).expect("read back");
    assert_eq!(checkpoint.round, 1);
    let mut rounds_after = Vec::new();
    let resumed = setup
        .continue_policy(
            0,
            Some((&checkpoint, whole_curve[..1].to_vec())),
            &mut quiet,
            &mut |_, curve, _| {
                rounds_after.push(curve.len());
                Ok(())
            },
        )
        .expect("taken up");
    let (resumed, resumed_curve) = (resumed.simic, resumed.curve);
    assert_eq!(rounds_after, vec![2], "only the missing round ran");
    assert_eq!(resumed_curve, whole_curve);
    let (_, a) = whole.export_state().expect("state");
    let (_, b) = resumed.export_state().expect("state");
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x.equal(y), "{name} differs after the resume");
    }

    // A curve that disagrees with the checkpoint's round is refused.
    let refused = setup.continue_policy(
        0,
        Some((&checkpoint, Vec::new())),
        &mut quiet,
        &mut |_, _, _| Ok(()),
    );
    assert!(matches!(
        refused,
        Err(crate::Error::Checkpoint { field: "round", .. })
    ));
}

#[test]
fn the_imitation_warm_up_drives_the_first_rounds_of_the_protocol() {
    // Its rounds say what they imitated in the learning curve; the rounds
    // after it are PPO's and say nothing of it.
    let _rng = crate::global_rng_lock();
    let mut options = cpu_options(1, Some(3));
    options.settings = vec![
        "imitation.updates=1".to_owned(),
        "imitation.epochs=2".to_owned(),
    ];
    let setup = LearningSetup::new(&options, 2).expect("the quick protocol's setup");
    assert!(setup.describe().contains("imitation.updates=1"));
    let curve = setup
        .train_policy(0, &mut |_| {})
        .expect("an imitation round, then a PPO round")
        .curve;
    assert_eq!(curve.len(), 2);
    let first = &curve[0].metrics;
    let decisions = first["imitated_decisions"] + first["not_imitable_decisions"];
    // Four environments, three epochs: every decision demonstrated.
    assert_eq!(decisions, 12.0, "{first:?}");
    assert!(first.contains_key("advances_imitated_as_wait"));
    assert!(!curve[1].metrics.contains_key("imitated_decisions"));
}

#[test]
fn the_escrow_reward_trains_through_the_environments() {
    // The environments hand ESCROW its credits and stable accuracy: without
    // them every step's reward is refused and the round fails.
    let _rng = crate::global_rng_lock();
    let mut options = cpu_options(1, Some(3));
    options.settings = vec!["reward.mode=escrow".to_owned()];
    let setup = LearningSetup::new(&options, 1).expect("the quick protocol's setup");
    assert_eq!(setup.config.reward.mode, crate::rewards::RewardMode::Escrow);
    let curve = setup
        .train_policy(0, &mut |_| {})
        .expect("a round under ESCROW")
        .curve;
    assert_eq!(curve.len(), 1);
    let reward = curve[0].metrics["mean_episode_reward"];
    assert!(reward.is_finite(), "{reward}");
}

#[test]
fn the_greedy_curve_leaves_the_training_as_it_was() {
    // Two rounds with a greedy point after each against the same two
    // rounds without: the same learning curve apart from the points, and
    // the same trainer state to the bit.
    let _rng = crate::global_rng_lock();
    let mut options = cpu_options(1, Some(2));
    let plain = LearningSetup::new(&options, 2).expect("the quick protocol's setup");
    options.greedy_every = Some(1);
    let curved = LearningSetup::new(&options, 2).expect("the setup with a greedy curve");
    assert!(curved.describe().contains("greedy-every 1"));
    assert_ne!(plain.describe(), curved.describe());
    let mut lines = Vec::new();
    let mut quiet = |_: &str| {};
    let plain_run = plain.train_policy(0, &mut quiet).expect("two rounds");
    assert!(plain_run.selected.is_none());
    let curved_run = curved
        .train_policy(0, &mut |line: &str| lines.push(line.to_owned()))
        .expect("two rounds with the curve");
    let (a, plain_curve) = (plain_run.simic, plain_run.curve);
    let (b, curved_curve) = (curved_run.simic, curved_run.curve);
    assert_eq!(plain_curve.len(), 2);
    assert_eq!(curved_curve.len(), 2);
    let mut germinated = 0.0;
    for (round, (without, with)) in plain_curve.iter().zip(&curved_curve).enumerate() {
        // The training round's blueprint counts add up to its germinations.
        let sampled = sum_of(&without.metrics, "germinated_");
        assert_eq!(sampled, without.metrics["germinations"], "round {round}");
        germinated += sampled;
        let accuracy = with.metrics["greedy_accuracy_pct"];
        assert!((0.0..=100.0).contains(&accuracy), "{accuracy}");
        assert!(with.metrics.contains_key("greedy_fossilizations"));
        // The blueprint counts add up to the point's germinations.
        let by_blueprint = sum_of(&with.metrics, "greedy_germinated_");
        assert_eq!(
            by_blueprint, with.metrics["greedy_germinations"],
            "round {round}"
        );
        let mut stripped = with.clone();
        stripped
            .metrics
            .retain(|key, _| !key.starts_with("greedy_"));
        assert_eq!(&stripped, without, "round {round} changed");
        assert!(!without.metrics.contains_key("greedy_accuracy_pct"));
    }
    assert!(germinated > 0.0, "the untrained policy germinated nothing");
    assert_eq!(
        lines
            .iter()
            .filter(|line| line.contains("greedy curve after"))
            .count(),
        2,
        "{lines:?}"
    );
    let (state_a, a) = a.export_state().expect("state");
    let (state_b, b) = b.export_state().expect("state");
    assert_eq!(state_a, state_b, "the host-side state differs");
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x.equal(y), "{name} differs");
    }

    // A period of 0 is refused.
    options.greedy_every = Some(0);
    assert!(LearningSetup::new(&options, 2).is_err());
}

#[test]
fn the_greedy_curve_is_measured_every_n_rounds_and_after_the_last() {
    let _rng = crate::global_rng_lock();
    let mut options = cpu_options(1, Some(1));
    options.greedy_every = Some(2);
    let setup = LearningSetup::new(&options, 3).expect("the setup");
    let trained = setup.train_policy(0, &mut |_| {}).expect("three rounds");
    let curve = &trained.curve;
    let measured: Vec<bool> = curve
        .iter()
        .map(|entry| entry.metrics.contains_key("greedy_accuracy_pct"))
        .collect();
    assert_eq!(measured, vec![false, true, true]);
}

/// The curve's last best point: what `continue_policy` selects.
fn best_point(curve: &[ResultEntry]) -> (usize, f64) {
    let mut best: Option<(usize, f64)> = None;
    for (round, entry) in curve.iter().enumerate() {
        if let Some(accuracy) = entry.metrics.get("greedy_accuracy_pct").copied()
            && best.is_none_or(|(_, top)| accuracy >= top)
        {
            best = Some((round, accuracy));
        }
    }
    best.expect("a greedy point")
}

#[test]
fn the_selected_policy_is_the_curves_best_point_and_survives_a_resume() {
    let _rng = crate::global_rng_lock();
    let mut options = cpu_options(1, Some(2));
    options.greedy_every = Some(1);
    let setup = LearningSetup::new(&options, 3).expect("the setup");
    let mut quiet = |_: &str| {};
    let mut whole = setup.train_policy(0, &mut quiet).expect("three rounds");
    let selected = whole.selected.take().expect("a selected point");
    assert_eq!(
        (selected.round, selected.accuracy),
        best_point(&whole.curve)
    );

    // Stopped after two rounds, the progress saved with its selected
    // point, then taken up: the same selection and the same state.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let stopped = setup.continue_policy(0, None, &mut quiet, &mut |simic, curve, best| {
        let mut extra = serde_json::Map::new();
        let more = match best {
            Some(best) => best.to_checkpoint(&mut extra)?,
            None => Vec::new(),
        };
        simic.save_checkpoint_with(dir.path(), "progress", extra, &more)?;
        if curve.len() == 2 {
            return Err(crate::Error::Checkpoint {
                field: "test",
                reason: "stopped after two rounds".to_owned(),
            });
        }
        Ok(())
    });
    assert!(stopped.is_err());
    let checkpoint =
        crate::checkpoint::read_checkpoint(&dir.path().join("progress")).expect("read back");
    assert!(
        checkpoint
            .tensors
            .iter()
            .any(|(name, _)| name.starts_with(SELECTED_PREFIX))
    );
    let mut resumed = setup
        .continue_policy(
            0,
            Some((&checkpoint, whole.curve[..2].to_vec())),
            &mut quiet,
            &mut |_, _, _| Ok(()),
        )
        .expect("taken up");
    assert_eq!(resumed.curve, whole.curve);
    let again = resumed.selected.take().expect("a selected point");
    assert_eq!(
        (again.round, again.accuracy),
        (selected.round, selected.accuracy)
    );
    selected.apply(&mut whole.simic).expect("applied");
    again.apply(&mut resumed.simic).expect("applied");
    let (_, a) = whole.simic.export_state().expect("state");
    let (_, b) = resumed.simic.export_state().expect("state");
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(
            x.equal(y),
            "{name} of the selected policy differs after the resume"
        );
    }

    // A curve whose best point is not the checkpoint's selection is refused.
    let mut other = whole.curve[..2].to_vec();
    for entry in &mut other {
        if let Some(accuracy) = entry.metrics.get_mut("greedy_accuracy_pct") {
            *accuracy = -1.0;
        }
    }
    other[0]
        .metrics
        .insert("greedy_accuracy_pct".to_owned(), 101.0);
    let refused =
        setup.continue_policy(0, Some((&checkpoint, other)), &mut quiet, &mut |_, _, _| {
            Ok(())
        });
    assert!(matches!(
        refused,
        Err(crate::Error::Checkpoint {
            field: "selected",
            ..
        })
    ));
}

#[test]
fn a_checkpoint_with_more_tensors_refuses_the_trainers_names_and_repeats() {
    let _rng = crate::global_rng_lock();
    let options = cpu_options(1, None);
    let setup = LearningSetup::new(&options, 1).expect("the setup");
    let simic = setup.simic(0).expect("a trainer");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let one = || tch::Tensor::from_slice(&[1.0f32, 2.0]);
    for (name, more) in [
        ("a trainer's name", vec![("policy/x".to_owned(), one())]),
        (
            "an optimizer's name",
            vec![("optimizer/0".to_owned(), one())],
        ),
        (
            "a repeated name",
            vec![("mine/a".to_owned(), one()), ("mine/a".to_owned(), one())],
        ),
    ] {
        let refused = simic.save_checkpoint_with(dir.path(), "c", serde_json::Map::new(), &more);
        assert!(
            matches!(refused, Err(crate::Error::Checkpoint { field: "more", .. })),
            "{name}: {refused:?}"
        );
        assert!(!dir.path().join("c").exists(), "{name} left a checkpoint");
    }
    let written = simic
        .save_checkpoint_with(
            dir.path(),
            "c",
            serde_json::Map::new(),
            &[("mine/a".to_owned(), one())],
        )
        .expect("written");
    let read = crate::checkpoint::read_checkpoint(&written).expect("read back");
    let mine = read
        .tensors
        .iter()
        .find(|(name, _)| name == "mine/a")
        .expect("the caller's tensor");
    assert!(mine.1.equal(&one()));
}

mod pooling;
