//! The pooling of the protocol's parts into its record (and into a
//! partial report): the refusals, the per-seed and over-seeds comparisons,
//! what an evaluated policy grew.

use super::*;

#[test]
fn parts_of_another_run_or_missing_seeds_are_refused() {
    let _rng = crate::global_rng_lock();
    let setup = quick_setup();
    let baselines = no_baselines(&setup);
    let mut quiet = |_: &str| {};
    let good = [outcome(&setup, 1), outcome(&setup, 0)];
    assert!(setup.report(&baselines, &good, &mut quiet).is_ok());
    let other_baselines = Baselines {
        setup: "another run".to_owned(),
        figures: Vec::new(),
    };
    assert!(
        setup.report(&other_baselines, &good, &mut quiet).is_err(),
        "baselines of another run were pooled"
    );
    let mut other = outcome(&setup, 1);
    other.setup = other
        .setup
        .replace("settings []", "settings [reward.rent_weight=0]");
    let mut short = outcome(&setup, 1);
    short.sampled.accuracies.pop();
    let mut nan = outcome(&setup, 1);
    nan.greedy.accuracies[0] = f64::NAN;
    for (name, parts) in [
        ("another run", vec![outcome(&setup, 0), other]),
        ("a seed twice", vec![outcome(&setup, 0), outcome(&setup, 0)]),
        ("a missing seed", vec![outcome(&setup, 0)]),
        (
            "a seed out of range",
            vec![outcome(&setup, 0), outcome(&setup, 2)],
        ),
        ("too few accuracies", vec![outcome(&setup, 0), short]),
        ("a NaN accuracy", vec![outcome(&setup, 0), nan]),
    ] {
        let error = setup.report(&baselines, &parts, &mut quiet);
        assert!(error.is_err(), "{name} was pooled");
    }
}

#[test]
fn baselines_fit_every_twin_weight_and_blueprint_exclusion_and_nothing_else() {
    let _rng = crate::global_rng_lock();
    let setup_of = |settings: &[&str]| {
        let mut options = cpu_options(2, None);
        options.settings = settings.iter().map(|s| (*s).to_owned()).collect();
        LearningSetup::new(&options, 1).expect("the quick protocol's setup")
    };
    let escrow = setup_of(&["reward.mode=escrow"]);
    let twin5 = setup_of(&["reward.mode=escrow", "reward.twin_delta_weight=5"]);
    let twin20 = setup_of(&["reward.twin_delta_weight=20", "reward.mode=escrow"]);
    let shaped = setup_of(&["reward.twin_delta_weight=5"]);
    // The baselines' setup leaves the twin out; the training's keeps it.
    assert_eq!(twin5.baselines_setup(), escrow.baselines_setup());
    assert!(twin5.describe().contains("reward.twin_delta_weight=5"));
    assert!(!twin5.baselines_setup().contains("twin"));
    assert_ne!(twin5.describe(), twin20.describe());
    // Baselines written with the twin's weight in their setup (before it
    // was left out of them) fit every weight, as today's do.
    let written_with_twin = Baselines {
        setup: twin5.describe(),
        figures: Vec::new(),
    };
    for setup in [&escrow, &twin5, &twin20] {
        assert!(setup.fits(&written_with_twin), "{}", setup.describe());
        assert!(setup.fits(&no_baselines(&escrow)), "{}", setup.describe());
    }
    // A blueprint taken out of the learned policy's masks changes no
    // baseline either.
    let no_conv_small = setup_of(&[
        "reward.mode=escrow",
        "blueprint.conv_small=false",
        "reward.twin_delta_weight=20",
    ]);
    assert_eq!(no_conv_small.baselines_setup(), escrow.baselines_setup());
    assert!(
        no_conv_small
            .describe()
            .contains("blueprint.conv_small=false")
    );
    assert!(no_conv_small.fits(&written_with_twin));
    // Another reward mode, or any other setting, is another run.
    assert!(!shaped.fits(&written_with_twin));
    assert!(!escrow.fits(&no_baselines(&shaped)));
    assert!(!escrow.fits(&Baselines {
        setup: "another run".to_owned(),
        figures: Vec::new(),
    }));
    // The pooling takes them: the seeds' parts must still be this run's.
    let mut quiet = |_: &str| {};
    let seeds = [outcome(&twin20, 0), outcome(&twin20, 1)];
    assert!(
        twin20
            .report(&written_with_twin, &seeds, &mut quiet)
            .is_ok()
    );
    let of_twin5 = [outcome(&twin5, 0), outcome(&twin5, 1)];
    assert!(
        twin20
            .report(&written_with_twin, &of_twin5, &mut quiet)
            .is_err(),
        "seeds trained with another twin weight were pooled"
    );
}

#[test]
fn what_an_evaluated_policy_grew_is_in_its_entry() {
    let _rng = crate::global_rng_lock();
    let setup = quick_setup();
    let baselines = no_baselines(&setup);
    let mut grown = outcome(&setup, 0);
    grown.greedy.germinated = [("conv_light".to_owned(), 5), ("norm".to_owned(), 2)]
        .into_iter()
        .collect();
    grown.greedy.fossilizations = 4;
    grown.greedy.prunes = 3;
    let run = setup
        .report(&baselines, &[grown, outcome(&setup, 1)], &mut |_: &str| {})
        .expect("pooled");
    let entry = |mode: &str| metrics_of(&run, mode);
    let greedy = entry("ppo-seed0-greedy-eval");
    assert_eq!(greedy["germinations"], 7.0);
    assert_eq!(greedy["germinated_conv_light"], 5.0);
    assert_eq!(greedy["germinated_norm"], 2.0);
    assert_eq!(greedy["fossilizations"], 4.0);
    assert_eq!(greedy["prunes"], 3.0);
    let other = entry("ppo-seed1-greedy-eval");
    assert_eq!(other["germinations"], 0.0);
    assert!(!other.contains_key("germinated_conv_light"));
    // A part written before these figures were kept still reads.
    let old = r#"{"accuracies":[1.0],"active_seeds":[0.0]}"#;
    let read: Evaluation = serde_json::from_str(old).expect("an older part reads");
    assert!(read.germinated.is_empty());
}

#[test]
fn the_selected_policys_evaluation_is_pooled_with_a_greedy_curve_only() {
    let _rng = crate::global_rng_lock();
    let mut options = cpu_options(2, None);
    options.greedy_every = Some(1);
    let setup = LearningSetup::new(&options, 1).expect("the setup");
    let baselines = no_baselines(&setup);
    let with_selection = |seed_index: usize| SeedOutcome {
        selected_round: Some(0),
        selected: Some(evaluation()),
        ..outcome(&setup, seed_index)
    };
    let run = setup
        .report(
            &baselines,
            &[with_selection(0), with_selection(1)],
            &mut |_: &str| {},
        )
        .expect("pooled");
    let modes: Vec<&str> = run
        .measurements
        .results
        .iter()
        .map(|entry| entry.mode.as_str())
        .collect();
    for wanted in [
        "ppo-seed0-selected-eval",
        "ppo-selected-eval",
        "compare-ppo-selected-vs-no-growth-seed1",
        "ppo-selected-recovered-fraction",
    ] {
        assert!(modes.contains(&wanted), "no {wanted} in {modes:?}");
    }
    let seed0 = metrics_of(&run, "ppo-seed0-selected-eval");
    assert_eq!(seed0["selected_round"], 0.0);
    assert!(run.measurements.params["greedy_curve"]["every_rounds"] == 1);

    // A seed without the selected evaluation in a run with a curve, and
    // one with it in a run without, are refused.
    let error = setup.report(
        &baselines,
        &[with_selection(0), outcome(&setup, 1)],
        &mut |_: &str| {},
    );
    assert!(
        error.is_err(),
        "a seed without its selected evaluation was pooled"
    );
    let plain = quick_setup();
    let plain_baselines = Baselines {
        setup: plain.describe(),
        figures: Vec::new(),
    };
    let stray = SeedOutcome {
        selected_round: Some(0),
        selected: Some(evaluation()),
        ..outcome(&plain, 1)
    };
    let error = plain.report(
        &plain_baselines,
        &[outcome(&plain, 0), stray],
        &mut |_: &str| {},
    );
    assert!(
        error.is_err(),
        "a selected evaluation without a curve was pooled"
    );
}

#[test]
fn the_comparisons_are_made_over_the_training_seeds_too() {
    // Two seeds, 12 environments each: seed 0 two points above no growth
    // everywhere, seed 1 one point below. Pooled over the 24 environments
    // the mean gain is +0.5; over the seeds it is the mean of +2 and -1.
    let _rng = crate::global_rng_lock();
    let setup = quick_setup();
    let environments = usize::try_from(EVAL_ROUNDS).unwrap() * 4;
    let figures = |baseline: Baseline, accuracy: f64| {
        baseline_figures(baseline, vec![accuracy; environments])
    };
    let baselines = Baselines {
        setup: setup.describe(),
        figures: vec![
            figures(Baseline::NoGrowth, 50.0),
            figures(Baseline::MaxGrowth, 52.0),
        ],
    };
    let at = |seed_index: usize, accuracy: f64| {
        let mut outcome = outcome(&setup, seed_index);
        outcome.greedy.accuracies = vec![accuracy; environments];
        outcome
    };
    let run = setup
        .report(&baselines, &[at(0, 52.0), at(1, 49.0)], &mut |_: &str| {})
        .expect("pooled");
    let metrics = |mode: &str| metrics_of(&run, mode);
    let pooled = metrics("compare-ppo-vs-no-growth");
    assert_eq!(pooled["pairs"], 24.0);
    assert!((pooled["mean_diff_pct"] - 0.5).abs() < 1e-9);
    let seeds = metrics("compare-ppo-vs-no-growth-over-seeds");
    assert_eq!(seeds["pairs"], 2.0);
    assert!((seeds["mean_diff_pct"] - 0.5).abs() < 1e-9);
    assert_eq!((seeds["wins"], seeds["losses"]), (1.0, 1.0));
    // One win and one loss of two: nothing to reject; the pooled sign test
    // (12 wins, 12 losses) says the same, but its interval is far narrower.
    assert_eq!(seeds["sign_test_p"], 1.0);
    assert!(
        seeds["ci95_high_pct"] - seeds["ci95_low_pct"]
            > pooled["ci95_high_pct"] - pooled["ci95_low_pct"]
    );
    assert!(metrics("compare-ppo-sampled-vs-max-growth-over-seeds")["pairs"] == 2.0);
    // With the environment as the unit the seeds are averaged first: 50.5
    // against 50 on each of the 12 environments.
    let environments_pairs = metrics("compare-ppo-vs-no-growth-over-environments");
    assert_eq!(environments_pairs["pairs"], 12.0);
    assert!((environments_pairs["mean_diff_pct"] - 0.5).abs() < 1e-9);
    assert_eq!(environments_pairs["wins"], 12.0);
}

#[test]
fn twin_seeds_count_once_over_the_environments() {
    // Two training seeds whose policies reach the same accuracies (they
    // acted alike): the pooled pairs hold every outcome twice, the pairs
    // over the environments once, with the same mean and a wider interval.
    let _rng = crate::global_rng_lock();
    let setup = quick_setup();
    let environments = usize::try_from(EVAL_ROUNDS).unwrap() * 4;
    let figures = baseline_figures;
    let baselines = Baselines {
        setup: setup.describe(),
        figures: vec![
            figures(Baseline::NoGrowth, vec![50.0; environments]),
            figures(Baseline::MaxGrowth, vec![51.0; environments]),
        ],
    };
    // Gains of +1.5 and -0.5 on alternate environments: mean +0.5.
    let accuracies: Vec<f64> = (0..environments)
        .map(|environment| if environment % 2 == 0 { 51.5 } else { 49.5 })
        .collect();
    let at = |seed_index: usize| {
        let mut outcome = outcome(&setup, seed_index);
        outcome.greedy.accuracies = accuracies.clone();
        outcome
    };
    let run = setup
        .report(&baselines, &[at(0), at(1)], &mut |_: &str| {})
        .expect("pooled");
    let metrics = |mode: &str| metrics_of(&run, mode);
    let pooled = metrics("compare-ppo-vs-no-growth");
    let environments_pairs = metrics("compare-ppo-vs-no-growth-over-environments");
    assert_eq!(pooled["pairs"], 24.0);
    assert_eq!(environments_pairs["pairs"], 12.0);
    assert!((environments_pairs["mean_diff_pct"] - 0.5).abs() < 1e-9);
    assert_eq!(
        (environments_pairs["wins"], environments_pairs["losses"]),
        (6.0, 6.0)
    );
    assert!(
        environments_pairs["ci95_high_pct"] - environments_pairs["ci95_low_pct"]
            > pooled["ci95_high_pct"] - pooled["ci95_low_pct"]
    );
    assert!(environments_pairs["permutation_p"] > pooled["permutation_p"]);
    // The second seed's entry names its twin.
    assert_eq!(
        metrics("ppo-seed1-greedy-eval")["same_outcome_as_seed"],
        0.0
    );
}

#[test]
fn the_seeds_evaluated_so_far_pool_into_a_partial_report() {
    let _rng = crate::global_rng_lock();
    let setup = quick_setup();
    let baselines = no_baselines(&setup);
    let mut quiet = |_: &str| {};
    // Seed 1 alone: pooled, and said to be partial.
    let run = setup
        .report_partial(&baselines, &[outcome(&setup, 1)], &mut quiet)
        .expect("seed 1 pooled");
    assert_eq!(run.measurements.params["partial"], true);
    assert_eq!(
        run.measurements.params["evaluated_seeds"],
        serde_json::json!([1])
    );
    assert!(metrics_of(&run, "ppo-seed1-greedy-eval").contains_key("final_accuracy_pct"));
    assert!(
        run.measurements
            .results
            .iter()
            .all(|entry| !entry.mode.contains("seed0")),
        "a seed not given was pooled"
    );
    // Every seed: the record's figures, not partial.
    let every = [outcome(&setup, 0), outcome(&setup, 1)];
    let whole = setup
        .report_partial(&baselines, &every, &mut quiet)
        .expect("both seeds pooled");
    assert_eq!(whole.measurements.params["partial"], false);
    let record = setup
        .report(&baselines, &every, &mut quiet)
        .expect("the record");
    // (As JSON: a comparison without baselines holds NaN, which is not
    // equal to itself.)
    let json = |run: &SimicBenchRun| serde_json::to_value(&run.measurements.results).expect("JSON");
    assert_eq!(json(&whole), json(&record));
    // The refusals that still hold.
    let mut other = outcome(&setup, 1);
    other.setup = "another run".to_owned();
    for (name, parts) in [
        ("nothing", vec![]),
        ("a seed twice", vec![outcome(&setup, 1), outcome(&setup, 1)]),
        ("a seed out of range", vec![outcome(&setup, 2)]),
        ("another run", vec![other]),
    ] {
        assert!(
            setup
                .report_partial(&baselines, &parts, &mut quiet)
                .is_err(),
            "{name} was pooled"
        );
    }
}

#[test]
fn two_seeds_that_acted_alike_are_named() {
    let _rng = crate::global_rng_lock();
    let setup = quick_setup();
    let baselines = no_baselines(&setup);
    let mut lines = Vec::new();
    let mut different = outcome(&setup, 1);
    different.sampled.accuracies[0] = 51.0;
    let run = setup
        .report(
            &baselines,
            &[outcome(&setup, 0), different],
            &mut |line: &str| lines.push(line.to_owned()),
        )
        .expect("pooled");
    // The greedy evaluations are the same accuracy for accuracy, the
    // sampled ones are not.
    assert_eq!(
        metrics_of(&run, "ppo-seed1-greedy-eval").get("same_outcome_as_seed"),
        Some(&0.0)
    );
    assert!(!metrics_of(&run, "ppo-seed0-greedy-eval").contains_key("same_outcome_as_seed"));
    assert!(!metrics_of(&run, "ppo-seed1-sampled-eval").contains_key("same_outcome_as_seed"));
    assert!(
        lines
            .iter()
            .any(|line| line.contains("seeds 0 and 1: the same greedy accuracy")),
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|line| line.contains("the same sampled")),
        "{lines:?}"
    );
}

#[test]
fn the_heuristic_and_germinate_once_are_compared_with_no_growth() {
    let _rng = crate::global_rng_lock();
    let setup = quick_setup();
    let environments = usize::try_from(EVAL_ROUNDS).unwrap() * 4;
    let figures = baseline_figures;
    // The heuristic one point above no growth everywhere; germinate-once
    // half a point below in every environment but the first, a tie.
    let mut once = vec![49.5; environments];
    once[0] = 50.0;
    let baselines = Baselines {
        setup: setup.describe(),
        figures: vec![
            figures(Baseline::NoGrowth, vec![50.0; environments]),
            figures(Baseline::Heuristic, vec![51.0; environments]),
            figures(Baseline::GerminateOnce, once),
            figures(Baseline::MaxGrowth, vec![52.0; environments]),
        ],
    };
    let run = setup
        .report(
            &baselines,
            &[outcome(&setup, 0), outcome(&setup, 1)],
            &mut |_: &str| {},
        )
        .expect("pooled");
    let heuristic = metrics_of(&run, "compare-heuristic-vs-no-growth");
    assert!((heuristic["mean_diff_pct"] - 1.0).abs() < 1e-9);
    assert_eq!(heuristic["wins"], environments as f64);
    let once = metrics_of(&run, "compare-germinate-once-vs-no-growth");
    assert_eq!(
        (once["wins"], once["losses"], once["ties"]),
        (0.0, (environments - 1) as f64, 1.0)
    );
    assert!(once["mean_diff_pct"] < 0.0);
    assert!(
        run.measurements
            .results
            .iter()
            .all(|entry| entry.mode != "compare-no-growth-vs-no-growth"),
        "no growth was compared with itself"
    );
}

#[test]
fn baselines_fit_a_longer_or_otherwise_trained_policy() {
    let _rng = crate::global_rng_lock();
    let setup_of =
        |rounds: usize, ppo_epochs: Option<usize>, greedy: Option<usize>, settings: &[&str]| {
            let mut options = cpu_options(2, None);
            options.ppo_epochs = ppo_epochs;
            options.greedy_every = greedy;
            options.settings = settings.iter().map(|s| (*s).to_owned()).collect();
            LearningSetup::new(&options, rounds).expect("the quick protocol's setup")
        };
    let short = setup_of(1, None, None, &["reward.mode=escrow"]);
    let long = setup_of(
        3,
        Some(2),
        Some(1),
        &[
            "reward.mode=escrow",
            "ppo.entropy_coef=0.01",
            "floor.op=0.05",
        ],
    );
    // The training differs; the baselines do not.
    assert_ne!(short.describe(), long.describe());
    assert_eq!(short.baselines_setup(), long.baselines_setup());
    for field in ["rounds", "ppo-epochs", "greedy-every", "ppo.", "floor."] {
        assert!(
            !long.baselines_setup().contains(field),
            "{field} in {}",
            long.baselines_setup()
        );
    }
    assert!(long.fits(&no_baselines(&short)));
    assert!(short.fits(&no_baselines(&long)));
    // A slot setting changes what the baselines' controllers do.
    let auto = setup_of(
        3,
        None,
        None,
        &["reward.mode=escrow", "slot.auto_forward_g1=true"],
    );
    assert!(!auto.fits(&no_baselines(&short)));
    // The setup committed with the six-seed runs' baselines (40 rounds, 4
    // PPO epochs, a greedy point every 8) fits a run of 80 rounds without
    // the curve, with an imitation warm-up.
    let committed = "task fmnist-impaired episode 150 rounds 40 ppo-epochs 4 greedy-every 8 \
                     quick false settings [reward.rent_weight=0 floor.op=0.02 \
                     slot.auto_forward_g1=true reward.mode=escrow reward.twin_delta_weight=5]";
    let longer = "task fmnist-impaired episode 150 rounds 80 ppo-epochs 4 quick false settings \
                  [reward.rent_weight=0 floor.op=0.02 slot.auto_forward_g1=true reward.mode=escrow \
                  reward.twin_delta_weight=20 blueprint.conv_small=false \
                  imitation.updates=8 imitation.demonstrator=heuristic]";
    assert_eq!(without_policy_only(committed), without_policy_only(longer));
    assert_eq!(
        without_policy_only(committed),
        "task fmnist-impaired episode 150 quick false settings [reward.rent_weight=0 \
         slot.auto_forward_g1=true reward.mode=escrow]"
    );
    assert_ne!(
        without_policy_only(committed),
        without_policy_only(&committed.replace("episode 150", "episode 25"))
    );
}

#[test]
fn more_evaluation_environments_are_another_set_of_baselines_and_more_pairs() {
    let _rng = crate::global_rng_lock();
    let twelve = quick_setup();
    let mut options = cpu_options(2, None);
    options.eval_environments = Some(24);
    let twenty_four = LearningSetup::new(&options, 1).expect("the setup on 24 environments");
    // The default reads as before; another count is part of the setup and
    // of the baselines' (they are measured on those environments).
    assert!(!twelve.describe().contains("eval-environments"));
    assert!(twenty_four.describe().contains("eval-environments 24"));
    assert!(
        twenty_four
            .baselines_setup()
            .contains("eval-environments 24")
    );
    assert_eq!(twenty_four.eval_environments(), 24);
    assert!(!twenty_four.fits(&no_baselines(&twelve)));
    assert!(!twelve.fits(&no_baselines(&twenty_four)));
    // Each seed's evaluation must cover the 24, and is pooled as 24 pairs.
    let mut quiet = |_: &str| {};
    let short = [outcome(&twenty_four, 0), outcome(&twenty_four, 1)];
    assert!(
        twenty_four
            .report(&no_baselines(&twenty_four), &short, &mut quiet)
            .is_err(),
        "12 accuracies pooled in a run of 24 environments"
    );
    let at = |seed_index: usize| {
        let mut outcome = outcome(&twenty_four, seed_index);
        for evaluation in [&mut outcome.greedy, &mut outcome.sampled] {
            evaluation.accuracies = vec![51.0; 24];
            evaluation.active_seeds = vec![0.0; 6];
        }
        outcome
    };
    let figures = |baseline: Baseline| baseline_figures(baseline, vec![50.0; 24]);
    let baselines = Baselines {
        setup: twenty_four.baselines_setup(),
        figures: vec![figures(Baseline::NoGrowth), figures(Baseline::MaxGrowth)],
    };
    let run = twenty_four
        .report(&baselines, &[at(0), at(1)], &mut quiet)
        .expect("pooled");
    assert_eq!(metrics_of(&run, "compare-ppo-vs-no-growth")["pairs"], 48.0);
    assert_eq!(
        metrics_of(&run, "compare-ppo-vs-no-growth-over-environments")["pairs"],
        24.0
    );
    assert_eq!(run.measurements.params["eval_environments"], 24);
}
