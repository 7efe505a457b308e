//! The `esper bench` options of `simic-learning` alone: PPO epochs,
//! settings and presets, jobs, greedy evaluations, evaluation environments
//! and the blueprint room, and their refusals elsewhere.

use super::{parse, run_args};
use crate::args::*;

#[test]
fn ppo_epochs_apply_to_simic_learning_only() {
    let args = run_args(&["simic-learning", "--out", "a.json", "--ppo-epochs", "4"]);
    assert_eq!(args.ppo_epochs, Some(4));
    assert_eq!(
        run_args(&["simic-learning", "--out", "a.json"]).ppo_epochs,
        None
    );
    for bad in [
        &["simic-learning", "--out", "a.json", "--ppo-epochs", "0"][..],
        &["simic-throughput", "--out", "a.json", "--ppo-epochs", "2"],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}

#[test]
fn settings_and_jobs_apply_to_simic_learning_only() {
    let args = run_args(&[
        "simic-learning",
        "--out",
        "a.json",
        "--set",
        "reward.rent_weight=0",
        "--set",
        "floor.op=0.05",
        "--jobs",
        "3",
    ]);
    assert_eq!(args.settings, ["reward.rent_weight=0", "floor.op=0.05"]);
    assert_eq!(args.jobs, Some(3));
    assert!(args.job_devices.is_empty());
    let args = run_args(&["simic-learning", "--out", "a.json", "--seed-index", "2"]);
    assert_eq!(args.seed_index, Some(2));
    assert!(args.settings.is_empty());
    let args = run_args(&[
        "simic-learning",
        "--out",
        "a.json",
        "--jobs",
        "4",
        "--job-devices",
        "cuda:0, cuda:1,cpu",
    ]);
    assert_eq!(
        args.job_devices,
        [
            torch_ext::DeviceChoice::Cuda(0),
            torch_ext::DeviceChoice::Cuda(1),
            torch_ext::DeviceChoice::Cpu
        ]
    );
    let args = run_args(&[
        "simic-learning",
        "--out",
        "a.json",
        "--seed-index",
        "1",
        "--evaluate",
    ]);
    assert!(args.evaluate);
    for bad in [
        &["simic-learning", "--out", "a.json", "--evaluate"][..],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--job-devices",
            "cuda:0",
        ],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--jobs",
            "2",
            "--job-devices",
            "cuda:0,gpu7",
        ],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--jobs",
            "2",
            "--job-devices",
            "",
        ],
        &["simic-learning", "--out", "a.json", "--set", "rent"],
        &["simic-learning", "--out", "a.json", "--jobs", "0"],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--jobs",
            "2",
            "--seed-index",
            "0",
        ],
        &[
            "simic-cifar",
            "--out",
            "a.json",
            "--set",
            "reward.rent_weight=0",
        ],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}

#[test]
fn a_preset_expands_before_the_settings() {
    let args = run_args(&[
        "simic-learning",
        "--out",
        "a.json",
        "--set",
        "reward.germination_delay_cost=-0.2",
        "--preset",
        "growth",
    ]);
    let growth = simic::vectorized::settings::GROWTH;
    assert_eq!(args.settings[..growth.len()], growth.map(str::to_owned));
    assert_eq!(
        args.settings[growth.len()..],
        ["reward.germination_delay_cost=-0.2"]
    );
    for bad in [
        &["simic-learning", "--out", "a.json", "--preset", "grow"][..],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--preset",
            "growth",
            "--preset",
            "growth",
        ],
        &["simic-cifar", "--out", "a.json", "--preset", "growth"],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}

#[test]
fn greedy_every_applies_to_simic_learning_only() {
    let args = run_args(&["simic-learning", "--out", "a.json", "--greedy-every", "5"]);
    assert_eq!(args.greedy_every, Some(5));
    assert_eq!(
        run_args(&["simic-learning", "--out", "a.json"]).greedy_every,
        None
    );
    for bad in [
        &["simic-learning", "--out", "a.json", "--greedy-every", "0"][..],
        &["simic-learning", "--out", "a.json", "--greedy-every", "x"],
        &["simic-throughput", "--out", "a.json", "--greedy-every", "2"],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--greedy-every",
            "2",
            "--greedy-every",
            "3",
        ],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}

#[test]
fn eval_environments_come_four_at_a_time_for_simic_learning_only() {
    let args = run_args(&[
        "simic-learning",
        "--out",
        "a.json",
        "--eval-environments",
        "24",
    ]);
    assert_eq!(args.eval_environments, Some(24));
    assert_eq!(
        run_args(&["simic-learning", "--out", "a.json"]).eval_environments,
        None
    );
    for bad in [
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--eval-environments",
            "0",
        ][..],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--eval-environments",
            "10",
        ],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--eval-environments",
            "404",
        ],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--eval-environments",
            "x",
        ],
        &[
            "simic-cifar",
            "--out",
            "a.json",
            "--eval-environments",
            "24",
        ],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}

#[test]
fn blueprint_room_is_simic_learning_without_training() {
    let args = run_args(&["simic-learning", "--out", "a.json", "--blueprint-room"]);
    assert!(args.blueprint_room);
    assert!(!run_args(&["simic-learning", "--out", "a.json"]).blueprint_room);
    // Settings and the task still apply: they shape the environments.
    let args = run_args(&[
        "simic-learning",
        "--out",
        "a.json",
        "--blueprint-room",
        "--preset",
        "growth",
        "--task",
        "cifar10-impaired",
    ]);
    assert!(args.blueprint_room && !args.settings.is_empty());
    for (flag, value) in [
        ("--jobs", Some("2")),
        ("--seeds", Some("3")),
        ("--rounds", Some("4")),
        ("--greedy-every", Some("2")),
        ("--ppo-epochs", Some("2")),
        ("--seed-index", Some("0")),
    ] {
        let mut line = vec![
            "simic-learning",
            "--out",
            "a.json",
            "--blueprint-room",
            flag,
        ];
        line.extend(value);
        match parse(&line) {
            Err(Usage(message)) => assert!(
                message.contains("--blueprint-room trains nothing"),
                "{flag}: {message}"
            ),
            _ => panic!("{flag} was taken with --blueprint-room"),
        }
    }
    for bad in [
        &["simic-throughput", "--out", "a.json", "--blueprint-room"][..],
        &[
            "simic-learning",
            "--out",
            "a.json",
            "--blueprint-room",
            "--blueprint-room",
        ],
    ] {
        assert!(matches!(parse(bad), Err(Usage(_))), "{bad:?}");
    }
}
