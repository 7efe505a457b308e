//! Separating what the group costs from what sharing the host costs: a
//! scaling run also starts N single-process benches of a variant at once,
//! one per GPU and no group between them, and records them as one entry
//! ([`concurrent_entry`]). Against the single process alone it gives
//! `host_sharing_ratio`, what N processes on one host cost each other (the
//! host's cores, memory and clocks); on the `dpN` entry [`group_ratios`]
//! give `group_ratio`, the group's eps over the N independent processes',
//! which is what the group itself costs (its collectives, the wait for the
//! slowest rank, one policy learned from every rank's rollouts). With the
//! one-GPU entry's `single_process_ratio` the three multiply to the
//! scaling efficiency:
//! `scaling_efficiency = group_ratio · host_sharing_ratio / single_process_ratio`.

use std::collections::BTreeMap;

use leyline::baseline::ResultEntry;

use super::OneGpu;
use crate::bench::throughput::split_variant;
use crate::bench::{amp_name, mean, variant};
use crate::{Error, Result};

/// The record entry `concurrent{n}-{variant}` of `processes`, the
/// single-process bench's entries of `variant_name` from `n` processes that
/// ran at once (one per GPU, no group): their eps summed (`eps`, and
/// `eps_steady` where every process has one), the mean per GPU, the slowest
/// and fastest process, and their live seeds and accuracy averaged. Given
/// the single process alone from the same run, `host_sharing_ratio` (and
/// `_steady`) is the eps per GPU over it: 1.0 where the processes do not
/// slow each other.
///
/// # Errors
/// [`Error::InvalidInput`] without processes or where one has no positive
/// `eps` (a failed run); [`Error::InvalidConfig`] for an unknown variant.
pub fn concurrent_entry(
    variant_name: &str,
    processes: &[ResultEntry],
    alone: Option<OneGpu>,
) -> Result<ResultEntry> {
    let (precision, _) = variant(split_variant(variant_name).0)?;
    let figures: Vec<OneGpu> = processes
        .iter()
        .map(OneGpu::of)
        .collect::<Option<_>>()
        .filter(|figures: &Vec<OneGpu>| !figures.is_empty())
        .ok_or_else(|| Error::InvalidInput {
            field: "concurrent processes",
            reason: "every process must have measured a positive eps".to_owned(),
        })?;
    let n = figures.len() as f64;
    let eps: f64 = figures.iter().map(|f| f.eps).sum();
    let mut metrics = BTreeMap::from([
        ("processes".to_owned(), n),
        ("eps".to_owned(), eps),
        ("eps_per_gpu".to_owned(), eps / n),
        (
            "eps_slowest_process".to_owned(),
            figures.iter().map(|f| f.eps).fold(f64::INFINITY, f64::min),
        ),
        (
            "eps_fastest_process".to_owned(),
            figures.iter().map(|f| f.eps).fold(0.0, f64::max),
        ),
    ]);
    let steady: Option<f64> = figures.iter().map(|f| f.eps_steady).sum();
    if let Some(steady) = steady {
        metrics.insert("eps_steady".to_owned(), steady);
    }
    for name in ["active_seeds_per_env", "final_accuracy_pct", "env_epochs"] {
        let values: Vec<f64> = processes
            .iter()
            .filter_map(|p| p.metrics.get(name).copied())
            .collect();
        if values.len() == processes.len() {
            let value = if name == "env_epochs" {
                values.iter().sum()
            } else {
                mean(values.into_iter())
            };
            metrics.insert(name.to_owned(), value);
        }
    }
    if let Some(alone) = alone {
        let per_gpu = OneGpu {
            eps: eps / n,
            eps_steady: steady.map(|steady| steady / n),
        };
        metrics.extend(super::ratios("host_sharing_ratio", per_gpu, alone));
    }
    Ok(ResultEntry {
        implementation: "rust".to_owned(),
        mode: format!("concurrent{}-{variant_name}", figures.len()),
        metrics,
        error: None,
        amp: Some(amp_name(precision).to_owned()),
    })
}

/// How a `dpN` entry compares with `concurrent`, N independent processes of
/// the same variant from the same run: `group_ratio` is the group's eps over
/// theirs (1.0: the group costs nothing beyond sharing the host), and
/// `group_ratio_steady` the same over the rounds after the first, where both
/// have them.
pub fn group_ratios(group: OneGpu, concurrent: OneGpu) -> BTreeMap<String, f64> {
    super::ratios("group_ratio", group, concurrent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(eps: f64, eps_steady: Option<f64>, seeds: f64) -> ResultEntry {
        let mut metrics = BTreeMap::from([
            ("eps".to_owned(), eps),
            ("active_seeds_per_env".to_owned(), seeds),
            ("env_epochs".to_owned(), 600.0),
        ]);
        if let Some(steady) = eps_steady {
            metrics.insert("eps_steady".to_owned(), steady);
        }
        ResultEntry {
            implementation: "rust".to_owned(),
            mode: "fp32-graph-step".to_owned(),
            metrics,
            error: None,
            amp: None,
        }
    }

    #[test]
    fn concurrent_processes_are_summed_and_compared_with_one_alone() {
        let processes = [
            process(90.0, Some(95.0), 0.4),
            process(100.0, Some(105.0), 0.6),
        ];
        let alone = OneGpu {
            eps: 100.0,
            eps_steady: Some(110.0),
        };
        let entry = concurrent_entry("fp32-graph-step", &processes, Some(alone)).unwrap();
        assert_eq!(entry.mode, "concurrent2-fp32-graph-step");
        let metric = |name: &str| entry.metrics[name];
        assert_eq!(metric("processes"), 2.0);
        assert!((metric("eps") - 190.0).abs() < 1e-12);
        assert!((metric("eps_per_gpu") - 95.0).abs() < 1e-12);
        assert_eq!(metric("eps_slowest_process"), 90.0);
        assert_eq!(metric("eps_fastest_process"), 100.0);
        assert!((metric("eps_steady") - 200.0).abs() < 1e-12);
        assert!((metric("active_seeds_per_env") - 0.5).abs() < 1e-12);
        assert_eq!(metric("env_epochs"), 1200.0);
        assert!((metric("host_sharing_ratio") - 0.95).abs() < 1e-12);
        assert!((metric("host_sharing_ratio_steady") - 100.0 / 110.0).abs() < 1e-12);
        // Without the process alone, no ratio; without a steady figure on
        // every process, no steady sum.
        let partial = [process(90.0, None, 0.4), process(100.0, Some(105.0), 0.6)];
        let entry = concurrent_entry("fp32-graph-step", &partial, None).unwrap();
        assert!(!entry.metrics.contains_key("eps_steady"));
        assert!(!entry.metrics.contains_key("host_sharing_ratio"));
        // A failed process, no process, or an unknown variant: an error.
        let failed = [process(0.0, None, 0.0), process(100.0, None, 0.6)];
        assert!(concurrent_entry("fp32-graph-step", &failed, None).is_err());
        assert!(concurrent_entry("fp32-graph-step", &[], None).is_err());
        assert!(concurrent_entry("fp64-eager", &processes, None).is_err());
    }

    #[test]
    fn the_group_is_compared_with_independent_processes_whole_and_steady() {
        let group = OneGpu {
            eps: 180.0,
            eps_steady: Some(190.0),
        };
        let concurrent = OneGpu {
            eps: 200.0,
            eps_steady: Some(200.0),
        };
        let ratios = group_ratios(group, concurrent);
        assert!((ratios["group_ratio"] - 0.9).abs() < 1e-12);
        assert!((ratios["group_ratio_steady"] - 0.95).abs() < 1e-12);
        let cold = OneGpu {
            eps_steady: None,
            ..concurrent
        };
        assert!(!group_ratios(group, cold).contains_key("group_ratio_steady"));
        // The decomposition the module documents: a process alone at 100
        // eps, two at once at 95 each, the group at 0.9 of those, the group
        // of one at 99.
        let alone = OneGpu {
            eps: 100.0,
            eps_steady: None,
        };
        let pair = [process(95.0, None, 0.5), process(95.0, None, 0.5)];
        let concurrent = concurrent_entry("fp32-graph-step", &pair, Some(alone)).unwrap();
        let group = OneGpu {
            eps: 171.0,
            eps_steady: None,
        };
        let group_ratio = group_ratios(group, OneGpu::of(&concurrent).unwrap())["group_ratio"];
        let one_gpu = OneGpu {
            eps: 99.0,
            eps_steady: None,
        };
        let single = super::super::single_process_ratios(one_gpu, alone)["single_process_ratio"];
        let efficiency = group.eps / (2.0 * one_gpu.eps);
        let product = group_ratio * concurrent.metrics["host_sharing_ratio"] / single;
        assert!(
            (efficiency - product).abs() < 1e-12,
            "{efficiency} {product}"
        );
    }
}
