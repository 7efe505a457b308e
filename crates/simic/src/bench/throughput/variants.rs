//! A simic workload's variants by name: a base name (precision and
//! execution mode, [`super::super::variant`]) with optional suffixes, read
//! the same way by the single-process bench and by every data-parallel rank
//! (`super::super::scaling`).

use tolaria::amp::Precision;

use super::super::{ThroughputTask, simic_config, variant};
use crate::Result;
use crate::vectorized::SimicConfig;

/// The settings of the variant `name`: a base name ([`variant`]) with
/// optional suffixes that turn Simic's environment defaults (one warm-up
/// step before a capture, no cuDNN algorithm timing) back to Tolaria's:
/// `-bench` times cuDNN algorithms at every new shape, `-w<N>` warms up N
/// steps (`-w3`: Tolaria's default; `-w0`: none, the capture's replay runs
/// a shape's first step); `-fp32-policy` keeps the policy in fp32 whatever the
/// environments' precision; and `-no-prewarm` (last) skips running every
/// blueprint once before the first round
/// ([`SimicConfig::prewarm_blueprints`], on by default).
pub(in crate::bench) fn variant_config(
    task: ThroughputTask,
    name: &str,
    episode_length: u32,
    quick: bool,
) -> Result<(Precision, SimicConfig)> {
    let (base, suffixes) = split_variant(name);
    let VariantSuffixes {
        prewarm,
        benchmark,
        warmup,
        fp32_policy,
    } = suffixes;
    let (precision, mode) = variant(base)?;
    let mut config = simic_config(task.task(), precision, mode, episode_length, quick);
    if let Some(warmup) = warmup {
        config.trainer.graph_warmup_steps = warmup;
    }
    if benchmark {
        config.trainer.cudnn_benchmark = true;
    }
    if fp32_policy {
        config.policy_precision = Some(tamiyo::policy::PolicyPrecision::Fp32);
    }
    config.prewarm_blueprints = prewarm;
    Ok((precision, config))
}

/// `name` without a trailing `-w<N>` (N decimal digits, at most 3), and N:
/// the eager warm-up steps before a capture. `-w0` captures a shape's
/// first step (the capture's replay runs it).
fn split_warmup(name: &str) -> (&str, Option<usize>) {
    let Some((base, digits)) = name.rsplit_once("-w") else {
        return (name, None);
    };
    let parsed = (1..=3)
        .contains(&digits.len())
        .then(|| digits.parse::<usize>().ok())
        .flatten()
        .filter(|_| digits.bytes().all(|byte| byte.is_ascii_digit()));
    match parsed {
        Some(steps) => (base, Some(steps)),
        None => (name, None),
    }
}

/// What a variant's suffixes ask for (see [`variant_config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::bench) struct VariantSuffixes {
    pub(in crate::bench) prewarm: bool,
    pub(in crate::bench) benchmark: bool,
    pub(in crate::bench) warmup: Option<usize>,
    pub(in crate::bench) fp32_policy: bool,
}

/// A variant's base name and its suffixes, in the order
/// [`variant_config`] takes them (`-fp32-policy`, `-w<N>`, `-bench`,
/// `-no-prewarm`).
pub(in crate::bench) fn split_variant(name: &str) -> (&str, VariantSuffixes) {
    let (name, prewarm) = match name.strip_suffix("-no-prewarm") {
        Some(base) => (base, false),
        None => (name, true),
    };
    let (base, benchmark) = match name.strip_suffix("-bench") {
        Some(base) => (base, true),
        None => (name, false),
    };
    let (base, warmup) = split_warmup(base);
    let (base, fp32_policy) = match base.strip_suffix("-fp32-policy") {
        Some(base) => (base, true),
        None => (base, false),
    };
    (
        base,
        VariantSuffixes {
            prewarm,
            benchmark,
            warmup,
            fp32_policy,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_suffix_takes_any_small_count_and_leaves_other_names_alone() {
        assert_eq!(
            split_warmup("fp32-graph-step-w0"),
            ("fp32-graph-step", Some(0))
        );
        assert_eq!(
            split_warmup("fp32-graph-step-w3"),
            ("fp32-graph-step", Some(3))
        );
        assert_eq!(
            split_warmup("bf16-graph-step-fp32-policy-w12"),
            ("bf16-graph-step-fp32-policy", Some(12))
        );
        for name in [
            "fp32-graph-step",
            "fp32-graph-step-w",
            "fp32-graph-step-w+1",
            "fp32-graph-step-w1000",
            "fp32-graph-step-wx",
        ] {
            assert_eq!(split_warmup(name), (name, None), "{name}");
        }
        let (base, suffixes) = split_variant("bf16-graph-step-fp32-policy-w0-bench-no-prewarm");
        assert_eq!(base, "bf16-graph-step");
        assert_eq!(
            suffixes,
            VariantSuffixes {
                prewarm: false,
                benchmark: true,
                warmup: Some(0),
                fp32_policy: true,
            }
        );
    }
}
