//! The room each blueprint leaves (`esper bench simic-learning
//! --blueprint-room`): no growth and max growth germinating one blueprint
//! in every slot it can, for each of the task's blueprints (NOOP excepted),
//! on the protocol's shared evaluation environments, with nothing trained.
//!
//! The protocol's max growth germinates the topology's scripted blueprint
//! ([`tamiyo::growth::scripted_blueprint`], `conv_light` on the CNN hosts),
//! and its gain over no growth is the room the issue measures a learned
//! policy against. A learned policy picks its blueprints, so how much each
//! blueprint gains on its own says whether a policy that falls short picked
//! a weak blueprint, and whether max growth's is the best one. Each
//! blueprint is compared with no growth and with the scripted blueprint,
//! pair for pair on the same environments (model seeds and data shards).

use kasmina::host::Topology;
use leyline::action::BlueprintAction;
use leyline::baseline::Measurements;
use serde_json::json;
use tamiyo::growth::scripted_blueprint;

use super::super::baseline::{
    Baseline, BaselineTotals, run_baseline, run_max_growth_of, run_rounds,
};
use super::super::stats::paired;
use super::super::{SLOTS, SimicBenchRun};
use super::pool::{STATISTICS, comparison_entry, controller_entry};
use super::{EVAL_ENV_SEED, LearningSetup};
use crate::Result;
use crate::vectorized::SimicConfig;

/// The blueprints the room measures for a topology: those of
/// `BlueprintAction::CNN` or `BlueprintAction::TRANSFORMER`, in that
/// list's order, NOOP (the identity seed) excepted.
pub fn room_blueprints(topology: Topology) -> Vec<BlueprintAction> {
    let all = match topology {
        Topology::Cnn => BlueprintAction::CNN,
        Topology::Transformer => BlueprintAction::TRANSFORMER,
    };
    all.iter()
        .copied()
        .filter(|blueprint| *blueprint != BlueprintAction::Noop)
        .collect()
}

impl LearningSetup {
    /// `--blueprint-room` (see the module docs): the record's entries are
    /// `no-growth-eval`, `max-growth-<blueprint>-eval` (accuracy, active
    /// seeds, germinations in all and `germinated_<blueprint>`,
    /// fossilizations),
    /// `compare-max-growth-<blueprint>-vs-no-growth` and, for every
    /// blueprint but the scripted one,
    /// `compare-max-growth-<blueprint>-vs-max-growth-<scripted>`.
    pub fn blueprint_room(&self, progress: &mut dyn FnMut(&str)) -> Result<SimicBenchRun> {
        let topology = self.spec.host.topology();
        let blueprints = room_blueprints(topology);
        let scripted = scripted_blueprint(topology);
        let config = SimicConfig {
            seed: EVAL_ENV_SEED,
            ..self.config.clone()
        };
        progress(&format!(
            "the room of each blueprint: no growth and max growth with each of {} blueprints \
             on the {} shared evaluation environments ({} epochs each)",
            blueprints.len(),
            self.eval_environments(),
            self.episode_length
        ));
        let mut measure = |name: &str, blueprint: Option<BlueprintAction>| {
            run_rounds(name, self.eval_rounds, progress, |round| match blueprint {
                Some(blueprint) => {
                    run_max_growth_of(&self.spec, &config, self.device, round, blueprint)
                }
                None => run_baseline(&self.spec, &config, self.device, round, Baseline::NoGrowth),
            })
        };
        let none = measure("no-growth", None)?;
        let mut grown = Vec::with_capacity(blueprints.len());
        for blueprint in &blueprints {
            let name = format!("max-growth-{}", blueprint.blueprint_id());
            grown.push((*blueprint, measure(&name, Some(*blueprint))?));
        }

        let precision = self.precision;
        let entry = |mode: String, figures: &BaselineTotals| {
            let mut entry = controller_entry(
                mode,
                &figures.accuracies,
                &figures.active,
                (figures.germinations, figures.fossilizations),
                precision,
            );
            for (blueprint, count) in &figures.germinated {
                entry
                    .metrics
                    .insert(format!("germinated_{blueprint}"), *count as f64);
            }
            entry
        };
        let mut results = vec![entry("no-growth-eval".to_owned(), &none)];
        let scripted_accuracies = grown
            .iter()
            .find(|(blueprint, _)| *blueprint == scripted)
            .map(|(_, figures)| figures.accuracies.clone());
        for (blueprint, figures) in &grown {
            let id = blueprint.blueprint_id();
            results.push(entry(format!("max-growth-{id}-eval"), figures));
            let gain = paired(&figures.accuracies, &none.accuracies);
            progress(&format!("  max growth with {id} - no growth = {gain}"));
            results.push(comparison_entry(
                format!("compare-max-growth-{id}-vs-no-growth"),
                &gain,
                precision,
            ));
            if *blueprint != scripted
                && let Some(reference) = &scripted_accuracies
            {
                results.push(comparison_entry(
                    format!(
                        "compare-max-growth-{id}-vs-max-growth-{}",
                        scripted.blueprint_id()
                    ),
                    &paired(&figures.accuracies, reference),
                    precision,
                ));
            }
        }
        let task = self.task;
        Ok(SimicBenchRun {
            device: self.device,
            measurements: Measurements {
                params: json!({
                    "task": task.name(),
                    "host_base_channels": task.host_config().ok().map(|host| host.base_channels),
                    "n_envs": 4,
                    "slots": SLOTS,
                    "episode_length": self.episode_length,
                    "blueprint_room": blueprints.iter().map(|b| b.blueprint_id()).collect::<Vec<_>>(),
                    "scripted_blueprint": scripted.blueprint_id(),
                    "eval_env_seed": EVAL_ENV_SEED,
                    "eval_environments": self.eval_environments(),
                    "settings": self.settings,
                    "quick": self.quick,
                    "statistics": STATISTICS,
                }),
                results,
                telemetry_names: Vec::new(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::SimicBenchOptions;

    fn quick_setup(episode: u32) -> LearningSetup {
        let mut options = SimicBenchOptions::new(torch_ext::DeviceChoice::Cpu, true);
        options.seeds = 1;
        options.episode_length = Some(episode);
        LearningSetup::new(&options, 1).expect("the quick protocol's setup")
    }

    #[test]
    fn the_room_measures_every_blueprint_of_the_topology_but_noop() {
        let cnn = room_blueprints(Topology::Cnn);
        assert_eq!(cnn.len(), BlueprintAction::CNN.len() - 1);
        assert!(!cnn.contains(&BlueprintAction::Noop));
        assert!(cnn.contains(&scripted_blueprint(Topology::Cnn)));
        let transformer = room_blueprints(Topology::Transformer);
        assert!(transformer.contains(&scripted_blueprint(Topology::Transformer)));
        assert!(!transformer.contains(&BlueprintAction::Noop));
    }

    #[test]
    fn max_growth_of_a_blueprint_germinates_that_blueprint_only() {
        let _rng = crate::global_rng_lock();
        let setup = quick_setup(5);
        for blueprint in [BlueprintAction::ConvHeavy, BlueprintAction::Norm] {
            let run = run_max_growth_of(&setup.spec, &setup.config, setup.device, 0, blueprint)
                .expect("one round of max growth");
            assert!(run.germinations > 0, "{blueprint:?} germinated nothing");
            let expected: std::collections::BTreeMap<&str, u64> =
                [(blueprint.blueprint_id(), run.germinations)].into();
            assert_eq!(run.germinated, expected);
        }
    }

    #[test]
    fn the_room_record_pairs_each_blueprint_with_no_growth_and_the_scripted_one() {
        let _rng = crate::global_rng_lock();
        let setup = quick_setup(2);
        let mut lines = Vec::new();
        let run = setup
            .blueprint_room(&mut |line: &str| lines.push(line.to_owned()))
            .expect("the room");
        let modes: Vec<&str> = run
            .measurements
            .results
            .iter()
            .map(|entry| entry.mode.as_str())
            .collect();
        assert_eq!(modes.first(), Some(&"no-growth-eval"));
        let scripted = scripted_blueprint(Topology::Cnn).blueprint_id();
        for blueprint in room_blueprints(Topology::Cnn) {
            let id = blueprint.blueprint_id();
            let eval = run
                .measurements
                .results
                .iter()
                .find(|entry| entry.mode == format!("max-growth-{id}-eval"))
                .unwrap_or_else(|| panic!("no entry for {id}: {modes:?}"));
            assert_eq!(
                eval.metrics.get(&format!("germinated_{id}")),
                eval.metrics.get("germinations"),
                "{id}"
            );
            let pairs = |mode: String| {
                run.measurements
                    .results
                    .iter()
                    .find(|entry| entry.mode == mode)
                    .and_then(|entry| entry.metrics.get("pairs").copied())
            };
            let environments = setup.eval_environments() as f64;
            assert_eq!(
                pairs(format!("compare-max-growth-{id}-vs-no-growth")),
                Some(environments)
            );
            let against_scripted =
                pairs(format!("compare-max-growth-{id}-vs-max-growth-{scripted}"));
            if id == scripted {
                assert_eq!(against_scripted, None);
            } else {
                assert_eq!(against_scripted, Some(environments), "{id}");
            }
        }
        let no_growth = &run.measurements.results[0];
        assert_eq!(no_growth.metrics.get("germinations"), Some(&0.0));
        assert_eq!(
            run.measurements.params["scripted_blueprint"],
            serde_json::json!(scripted)
        );
        assert!(
            lines
                .iter()
                .any(|line| line.contains("max growth with conv_heavy"))
        );
    }
}
