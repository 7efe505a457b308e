//! Hostile-input strategies for property tests (feature `testing`).
//!
//! Every crate's property tests feed its public entry points from these
//! strategies, so that non-finite numbers, integer extremes and odd strings
//! reach every boundary the same way. Enable with
//! `leyline = { workspace = true, features = ["testing"] }` in
//! `[dev-dependencies]`.

use proptest::prelude::*;

use crate::baseline::{BASELINE_SCHEMA, BaselineRecord, Environment, ResultEntry};

/// `f64` values a training run can produce or a hostile caller can pass:
/// NaN, both infinities, signed zeros, subnormals, the extremes, values just
/// outside `[0, 1]`, plus ordinary finite numbers.
pub fn extreme_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => Just(f64::NAN),
        2 => Just(f64::INFINITY),
        2 => Just(f64::NEG_INFINITY),
        1 => Just(-f64::NAN),
        1 => Just(0.0),
        1 => Just(-0.0),
        1 => Just(f64::MIN_POSITIVE / 2.0),
        1 => Just(f64::MAX),
        1 => Just(f64::MIN),
        1 => Just(f64::EPSILON),
        1 => Just(-f64::EPSILON),
        1 => Just(1.0 + f64::EPSILON),
        1 => Just(1e300),
        1 => Just(-1e300),
        4 => any::<f64>(),
        4 => -10.0f64..10.0,
    ]
}

/// `f32` counterpart of [`extreme_f64`].
pub fn extreme_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => Just(f32::NAN),
        2 => Just(f32::INFINITY),
        2 => Just(f32::NEG_INFINITY),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => Just(f32::MIN_POSITIVE / 2.0),
        1 => Just(f32::MAX),
        1 => Just(f32::MIN),
        4 => any::<f32>(),
        4 => -10.0f32..10.0,
    ]
}

/// Only the non-finite `f64` values (NaN of both signs, both infinities).
pub fn non_finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(-f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY)
    ]
}

/// `usize` sizes near the edges: 0, 1, powers of two around the 32-bit
/// boundary, and values near `usize::MAX` that overflow any multiplication.
pub fn extreme_usize() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => Just(0usize),
        1 => Just(1usize),
        1 => Just(usize::MAX),
        1 => Just(usize::MAX - 1),
        1 => Just(usize::MAX / 2 + 1),
        1 => Just(u32::MAX as usize),
        1 => Just(1usize << 40),
        2 => any::<usize>(),
        4 => 0usize..64,
    ]
}

/// `i64` values near the edges (negative, zero, the extremes).
pub fn extreme_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(0i64),
        1 => Just(-1i64),
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => Just(1i64 << 31),
        2 => any::<i64>(),
        4 => -8i64..64,
    ]
}

/// `u64` values near the edges.
pub fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0u64),
        1 => Just(u64::MAX),
        1 => Just(u64::MAX - 1),
        1 => Just(u64::from(u32::MAX) + 1),
        2 => any::<u64>(),
        4 => 0u64..64,
    ]
}

/// `u32` values near the edges.
pub fn extreme_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        2 => Just(0u32),
        1 => Just(u32::MAX),
        1 => Just(u32::MAX - 1),
        2 => any::<u32>(),
        4 => 0u32..64,
    ]
}

/// Strings a hostile caller might pass as a name, id or path component:
/// empty, whitespace, path separators and `..`, control characters,
/// non-ASCII, very long, and names that collide after sanitising.
pub fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_string()),
        Just("..".to_string()),
        Just("../escape".to_string()),
        Just("/abs/path".to_string()),
        Just("a/b".to_string()),
        Just("nul\0byte".to_string()),
        Just("new\nline".to_string()),
        Just("quote\"back\\slash".to_string()),
        Just("dot.name".to_string()),
        Just("dot_name".to_string()),
        Just("é-ü-漢".to_string()),
        Just("x".repeat(100_000)),
        "\\PC{0,24}",
        "[a-z_.-]{1,12}",
    ]
}

/// Baseline records that satisfy every rule of `baseline::validate`:
/// portable names, odd but valid text, extreme finite metrics, extra
/// environment keys that repeat no fixed field, distinct entries and known
/// telemetry names. Whatever is written of one must read back equal.
pub fn valid_baseline_record() -> impl Strategy<Value = BaselineRecord> {
    let name = "[a-z0-9][a-z0-9._-]{0,20}";
    let metric = (
        "[a-z0-9_]{1,12}",
        prop_oneof![
            -1e12f64..1e12,
            Just(0.0),
            Just(f64::MAX),
            Just(f64::MIN_POSITIVE)
        ],
    );
    let entry = (
        "[a-z]{1,6}",
        "[a-z-]{1,10}",
        proptest::collection::btree_map(metric.0, metric.1, 0..6),
        proptest::option::of("\\PC{0,12}"),
    )
        .prop_map(|(implementation, mode, metrics, error)| ResultEntry {
            amp: None,
            implementation,
            mode,
            metrics,
            error,
        });
    let extra_value = prop_oneof![
        any::<u64>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        (-1e9f64..1e9).prop_map(serde_json::Value::from),
        "\\PC{0,8}".prop_map(serde_json::Value::from),
        any::<bool>().prop_map(serde_json::Value::from),
    ];
    (
        (name, name, "\\PC{0,16}", any::<bool>()),
        proptest::collection::btree_map("[a-z_]{1,10}", extra_value, 0..4),
        proptest::collection::vec(entry, 0..4),
        proptest::sample::subsequence(crate::telemetry::all_names().collect::<Vec<_>>(), 0..4),
    )
        .prop_map(|((workload, label, text, tf32), extra, results, names)| {
            let mut extra = extra;
            for field in crate::baseline::ENVIRONMENT_FIELDS {
                extra.remove(field);
            }
            let mut seen = std::collections::BTreeSet::new();
            let results = results
                .into_iter()
                .filter(|entry| seen.insert((entry.implementation.clone(), entry.mode.clone())))
                .collect();
            BaselineRecord {
                schema: BASELINE_SCHEMA,
                workload,
                label,
                environment: Environment {
                    device: text.clone(),
                    torch: text.clone(),
                    cuda: text.clone(),
                    driver: text.clone(),
                    cpu: text.clone(),
                    git_rev: text.clone(),
                    tf32,
                    amp: text.clone(),
                    extra,
                },
                params: serde_json::json!({ "text": text, "list": [1, 2.5, null] }),
                results,
                telemetry_names: names.into_iter().map(str::to_owned).collect(),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn extreme_f64_reaches_every_non_finite_class() {
        let mut runner = TestRunner::deterministic();
        let strategy = extreme_f64();
        let (mut nan, mut pos, mut neg) = (false, false, false);
        for _ in 0..2_000 {
            let v = strategy.new_tree(&mut runner).expect("tree").current();
            nan |= v.is_nan();
            pos |= v == f64::INFINITY;
            neg |= v == f64::NEG_INFINITY;
        }
        assert!(nan && pos && neg, "nan={nan} +inf={pos} -inf={neg}");
    }

    #[test]
    fn extreme_usize_reaches_overflowing_sizes() {
        let mut runner = TestRunner::deterministic();
        let strategy = extreme_usize();
        let hit = (0..2_000)
            .map(|_| strategy.new_tree(&mut runner).expect("tree").current())
            .any(|v| v.checked_mul(4).is_none());
        assert!(hit);
    }
}
