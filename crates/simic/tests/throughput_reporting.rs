//! `simic::bench::run_throughput_reporting` on the CPU (a quick
//! `simic-throughput` run): the caller is handed the entries measured so far
//! after each variant, before the run ends, so that a run stopped by a time
//! limit keeps them (`esper bench` writes them as a partial record).

mod common;

use simic::bench::{SimicBenchOptions, ThroughputTask, run_throughput_reporting};
use torch_ext::DeviceChoice;

#[test]
fn the_entries_so_far_are_handed_over_after_each_variant() {
    if common::fashion_mnist_missing() {
        return;
    }
    let mut options = SimicBenchOptions::new(DeviceChoice::Cpu, true);
    options.episode_length = Some(2);
    let mut handed: Vec<Vec<String>> = Vec::new();
    let run = run_throughput_reporting(
        ThroughputTask::FashionMnist,
        &options,
        &mut |_| {},
        &mut |entries| handed.push(entries.iter().map(|e| e.mode.clone()).collect()),
    )
    .expect("runs");
    assert_eq!(
        handed,
        vec![vec!["fp32-eager".to_owned()]],
        "one variant on the CPU"
    );
    let modes: Vec<&str> = run
        .measurements
        .results
        .iter()
        .map(|entry| entry.mode.as_str())
        .collect();
    assert_eq!(modes, ["fp32-eager", "max-growth-ceiling"]);
    assert!(run.measurements.results[0].error.is_none());
}
