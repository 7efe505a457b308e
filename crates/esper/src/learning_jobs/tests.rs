//! The child processes' command line and device choice.

use super::{child_args, least_busy};
use crate::args::{BenchArgs, BenchCommand};

#[test]
fn a_child_is_started_with_the_runs_learning_options() {
    let words = [
        "simic-learning",
        "--out",
        "r.json",
        "--rounds",
        "7",
        "--ppo-epochs",
        "2",
        "--greedy-every",
        "3",
        "--seeds",
        "4",
        "--set",
        "reward.mode=escrow",
        "--jobs",
        "2",
    ];
    let Ok(BenchCommand::Run(parent)) = BenchArgs::parse(words.iter().map(|w| w.to_string()))
    else {
        panic!("the parent's command line did not parse");
    };
    let child = child_args(
        &parent,
        torch_ext::DeviceChoice::Cpu,
        7,
        1,
        false,
        std::path::Path::new("part.json"),
    );
    let child: Vec<String> = child
        .into_iter()
        .map(|word| word.into_string().expect("utf-8"))
        .collect();
    let Ok(BenchCommand::Run(read)) = BenchArgs::parse(child.iter().skip(1).cloned()) else {
        panic!("the child's command line did not parse: {child:?}");
    };
    assert_eq!(read.greedy_every, Some(3));
    assert_eq!(read.ppo_epochs, Some(2));
    assert_eq!(read.rounds, Some(7));
    assert_eq!(read.seeds, Some(4));
    assert_eq!(read.settings, vec!["reward.mode=escrow".to_owned()]);
    assert_eq!(read.seed_index, Some(1));
}

#[test]
fn a_new_child_goes_to_the_least_busy_device() {
    assert_eq!(least_busy(1, [].into_iter()), 0);
    assert_eq!(least_busy(4, [].into_iter()), 0);
    assert_eq!(least_busy(4, [0, 1].into_iter()), 2);
    assert_eq!(least_busy(2, [0, 1, 0].into_iter()), 1);
    assert_eq!(least_busy(3, [0, 1, 2].into_iter()), 0);
    // A finished child frees its device: 1 is running nothing now.
    assert_eq!(least_busy(3, [0, 2, 0, 2].into_iter()), 1);
}
