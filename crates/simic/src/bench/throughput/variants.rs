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
/// `-bench` times cuDNN algorithms at every new shape, `-w3` warms up three
/// steps; `-fp32-policy` keeps the policy in fp32 whatever the
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

/// What a variant's suffixes ask for (see [`variant_config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::bench) struct VariantSuffixes {
    pub(in crate::bench) prewarm: bool,
    pub(in crate::bench) benchmark: bool,
    pub(in crate::bench) warmup: Option<usize>,
    pub(in crate::bench) fp32_policy: bool,
}

/// A variant's base name and its suffixes, in the order
/// [`variant_config`] takes them (`-fp32-policy`, `-w3`, `-bench`,
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
    let (base, warmup) = match base.strip_suffix("-w3") {
        Some(base) => (base, Some(3)),
        None => (base, None),
    };
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
