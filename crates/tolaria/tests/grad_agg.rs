//! Gradient aggregation with PCGrad (CPU): hand-computed 2- and 3-seed
//! cases, untouched orthogonal and aligned seeds, 0/1/2/3 seeds against a
//! plain `Vec<f64>` reference, a property test of what PCGrad guarantees,
//! pooled buffers reused across steps, a layout change, the epoch metrics
//! and their telemetry, and typed errors for mismatched gradients.
//!
//! What PCGrad guarantees, and what the property test checks (seed
//! gradients `g_i`, projected `p_i`, projection in ascending order against
//! the original gradients):
//! - with 2 seeds, the projected pair never conflicts (`p_1·p_2 ≥ 0`: if
//!   `g_1·g_2 < 0`, `p_1·p_2 = |a| |g_1|² sin²θ` with `a = g_1·g_2/|g_1|²`),
//!   so `cos(p_1, p_2) ≥ cos(g_1, g_2)`;
//! - with any count, a projection never lengthens a gradient
//!   (`|p_i| ≤ |g_i|`), `p_i` does not conflict with the last gradient it was
//!   checked against (`p_i·g_last ≥ 0`), and a gradient that conflicts with
//!   no other is untouched.
//!
//! With 3 or more seeds "no pair conflicts more after projection" is false
//! for PCGrad: in the 3-seed hand case `g_1·g_3 = 0` but `p_1·p_3 = −0.125`.
//! The test asserts that counterexample instead of a property that does not
//! hold.

use leyline::telemetry as names;
use proptest::prelude::*;
use tch::{Device, Kind, Tensor};
use tolaria::Error;
use tolaria::grad_agg::{AggPath, GradAggregator, MAX_GRAD_AGG_SEEDS};

const TOL: f64 = 1e-12;

fn tensors(values: &[f64], shapes: &[Vec<i64>], kind: Kind) -> Vec<Tensor> {
    let mut offset = 0;
    shapes
        .iter()
        .map(|shape| {
            let count: i64 = shape.iter().product();
            let count = count as usize;
            let part = &values[offset..offset + count];
            offset += count;
            Tensor::from_slice(part)
                .view(shape.as_slice())
                .to_kind(kind)
        })
        .collect()
}

fn zeros(shapes: &[Vec<i64>], kind: Kind) -> Vec<Tensor> {
    shapes
        .iter()
        .map(|shape| Tensor::zeros(shape.as_slice(), (kind, Device::Cpu)))
        .collect()
}

fn read(list: &[Tensor]) -> Vec<f64> {
    list.iter()
        .flat_map(|t| Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap())
        .collect()
}

fn read_rows(t: &Tensor) -> Vec<Vec<f64>> {
    let t = t.to_kind(Kind::Double);
    (0..t.size()[0])
        .map(|row| Vec::<f64>::try_from(t.get(row)).unwrap())
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w} ({got:?} vs {want:?})"
        );
    }
}

/// Straightforward PCGrad on plain vectors: the reference the aggregator is
/// compared with.
struct Reference {
    projected: Vec<Vec<f64>>,
    out: Vec<f64>,
    conflicts: u64,
    projections: u64,
    share: f64,
}

fn reference(teacher: &[f64], seeds: &[Vec<f64>]) -> Reference {
    let mut projected = Vec::new();
    let mut projections = 0;
    for (i, seed) in seeds.iter().enumerate() {
        let mut g = seed.clone();
        for (j, other) in seeds.iter().enumerate() {
            if i == j {
                continue;
            }
            let d = dot(&g, other);
            if d < 0.0 {
                projections += 1;
                let scale = d / dot(other, other);
                for (x, y) in g.iter_mut().zip(other) {
                    *x -= scale * y;
                }
            }
        }
        projected.push(g);
    }
    let mut conflicts = 0;
    for i in 0..seeds.len() {
        for j in i + 1..seeds.len() {
            if dot(&seeds[i], &seeds[j]) < 0.0 {
                conflicts += 1;
            }
        }
    }
    let mut out = teacher.to_vec();
    for p in &projected {
        for (o, x) in out.iter_mut().zip(p) {
            *o += x;
        }
    }
    let seed_norms: f64 = projected.iter().map(|p| norm(p)).sum();
    let share = if seeds.is_empty() {
        1.0
    } else if norm(teacher) + seed_norms == 0.0 {
        0.0
    } else {
        norm(teacher) / (norm(teacher) + seed_norms)
    };
    Reference {
        projected,
        out,
        conflicts,
        projections,
        share,
    }
}

#[test]
fn two_seeds_hand_computed() {
    // Layout: two parameters of shape [1] and [1, 1]; flat vectors of 2.
    let shapes = vec![vec![1], vec![1, 1]];
    let teacher = tensors(&[1.0, 0.0], &shapes, Kind::Double);
    let s1 = tensors(&[1.0, 0.0], &shapes, Kind::Double);
    let s2 = tensors(&[-1.0, 1.0], &shapes, Kind::Double);
    let out = zeros(&shapes, Kind::Double);
    let mut agg = GradAggregator::new(4, Device::Cpu).unwrap();
    let path = agg.aggregate(&teacher, &[s1, s2], false, &out).unwrap();
    assert_eq!(path, AggPath::PcGrad);
    // s1·s2 = -1 < 0: a conflict. |s1|² = 1, |s2|² = 2.
    // s1' = s1 - (-1/2) s2 = [1, 0] + [-0.5, 0.5] = [0.5, 0.5]
    // s2' = s2 - (-1/1) s1 = [-1, 1] + [1, 0]   = [0, 1]
    // out = t + s1' + s2' = [1, 0] + [0.5, 0.5] + [0, 1] = [1.5, 1.5]
    let projected = read_rows(&agg.projected_seeds().unwrap().unwrap());
    assert_close(&projected[0], &[0.5, 0.5], TOL, "s1'");
    assert_close(&projected[1], &[0.0, 1.0], TOL, "s2'");
    assert_close(&read(&out), &[1.5, 1.5], TOL, "out");
    let m = agg.take_epoch_metrics().unwrap();
    assert_eq!((m.steps, m.pcgrad_steps, m.seed_pairs), (1, 1, 1));
    // One conflicting pair of one; each seed projected once.
    assert_eq!((m.conflicts, m.projections), (1, 2));
    assert_close(&[m.conflict_ratio], &[1.0], TOL, "ratio");
    // share = |t| / (|t| + |s1'| + |s2'|) = 1 / (1 + √0.5 + 1) = 0.369398...
    assert_close(
        &[m.teacher_share],
        &[1.0 / (2.0 + 0.5f64.sqrt())],
        TOL,
        "share",
    );
    assert_close(&[m.teacher_share], &[0.369_398_062_5], 1e-9, "share value");
    assert_eq!(m.flat_params, 2);
}

#[test]
fn three_seeds_hand_computed() {
    // Layout: shapes [2] and [1]; flat vectors of 3.
    let shapes = vec![vec![2], vec![1]];
    let kind = Kind::Double;
    let teacher = tensors(&[0.0, 0.0, 1.0], &shapes, kind);
    let seeds = vec![
        tensors(&[1.0, 0.0, 0.0], &shapes, kind),
        tensors(&[-1.0, 1.0, 0.0], &shapes, kind),
        tensors(&[0.0, -1.0, 1.0], &shapes, kind),
    ];
    let out = zeros(&shapes, kind);
    let mut agg = GradAggregator::new(3, Device::Cpu).unwrap();
    assert_eq!(
        agg.aggregate(&teacher, &seeds, false, &out).unwrap(),
        AggPath::PcGrad
    );
    // Dots: s1·s2 = -1, s1·s3 = 0, s2·s3 = -1; |s1|² = 1, |s2|² = |s3|² = 2.
    // s1': vs s2: -1 < 0 -> [1,0,0] + 0.5 [-1,1,0] = [0.5, 0.5, 0]
    //      vs s3: [0.5,0.5,0]·[0,-1,1] = -0.5 < 0 -> + 0.25 [0,-1,1] = [0.5, 0.25, 0.25]
    // s2': vs s1: -1 < 0 -> [-1,1,0] + [1,0,0] = [0, 1, 0]
    //      vs s3: [0,1,0]·[0,-1,1] = -1 < 0 -> + 0.5 [0,-1,1] = [0, 0.5, 0.5]
    // s3': vs s1: 0, no projection; vs s2: -1 < 0 -> [0,-1,1] + 0.5 [-1,1,0] = [-0.5, -0.5, 1]
    // out = [0,0,1] + [0.5,0.25,0.25] + [0,0.5,0.5] + [-0.5,-0.5,1] = [0, 0.25, 2.75]
    let p = read_rows(&agg.projected_seeds().unwrap().unwrap());
    assert_close(&p[0], &[0.5, 0.25, 0.25], TOL, "s1'");
    assert_close(&p[1], &[0.0, 0.5, 0.5], TOL, "s2'");
    assert_close(&p[2], &[-0.5, -0.5, 1.0], TOL, "s3'");
    assert_close(&read(&out), &[0.0, 0.25, 2.75], TOL, "out");
    // The 3-seed counterexample: s1·s3 = 0, but s1'·s3' = -0.25 - 0.125 + 0.25 = -0.125.
    assert_close(&[dot(&p[0], &p[2])], &[-0.125], TOL, "s1'·s3'");
    let m = agg.take_epoch_metrics().unwrap();
    // Pairs (1,2) and (2,3) of 3 conflict; projections 2 + 2 + 1 = 5.
    assert_eq!((m.seed_pairs, m.conflicts, m.projections), (3, 2, 5));
    assert_close(&[m.conflict_ratio], &[2.0 / 3.0], TOL, "ratio");
    // share = 1 / (1 + √0.375 + √0.5 + √1.5) = 1 / 3.544224... = 0.282149...
    let want = 1.0 / (1.0 + 0.375f64.sqrt() + 0.5f64.sqrt() + 1.5f64.sqrt());
    assert_close(&[m.teacher_share], &[want], TOL, "share");
    assert_close(&[m.teacher_share], &[0.282_149_0], 1e-6, "share value");
}

#[test]
fn orthogonal_and_aligned_seeds_are_untouched() {
    let shapes = vec![vec![2]];
    let kind = Kind::Float;
    let teacher = tensors(&[0.5, -0.5], &shapes, kind);
    let out = zeros(&shapes, kind);
    let mut agg = GradAggregator::new(2, Device::Cpu).unwrap();
    for (s1, s2) in [([1.0, 0.0], [0.0, 2.0]), ([1.0, 1.0], [2.0, 2.0])] {
        let seeds = [tensors(&s1, &shapes, kind), tensors(&s2, &shapes, kind)];
        agg.aggregate(&teacher, &seeds, false, &out).unwrap();
        let p = read_rows(&agg.projected_seeds().unwrap().unwrap());
        assert_close(&p[0], &s1, 1e-6, "s1 untouched");
        assert_close(&p[1], &s2, 1e-6, "s2 untouched");
        let want = [0.5 + s1[0] + s2[0], -0.5 + s1[1] + s2[1]];
        assert_close(&read(&out), &want, 1e-6, "out = t + s1 + s2");
    }
    let m = agg.take_epoch_metrics().unwrap();
    assert_eq!(
        (m.steps, m.seed_pairs, m.conflicts, m.projections),
        (2, 2, 0, 0)
    );
    assert_eq!(m.conflict_ratio, 0.0);
}

/// Deterministic values in [-2, 2) (a small LCG).
fn values(seed: u64, count: usize) -> Vec<f64> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

#[test]
fn zero_one_two_three_seeds_match_the_reference() {
    // A scalar parameter included: shapes [2, 3], [4] and [] (11 elements).
    let shapes = vec![vec![2, 3], vec![4], vec![]];
    let n = 11;
    for (kind, tol) in [(Kind::Double, 1e-12), (Kind::Float, 1e-5)] {
        let mut agg = GradAggregator::new(3, Device::Cpu).unwrap();
        let out = zeros(&shapes, kind);
        for k in 0..=3usize {
            for confirmed in [false, true] {
                if confirmed && k != 1 {
                    continue;
                }
                let t = values(100 + k as u64, n);
                // Seeds after the first lean against it, so that they conflict.
                let mut s: Vec<Vec<f64>> = Vec::new();
                for i in 0..k {
                    let mut v = values(10 * k as u64 + i as u64, n);
                    if let Some(first) = s.first() {
                        v.iter_mut().zip(first).for_each(|(x, f)| *x -= f);
                    }
                    s.push(v);
                }
                let teacher = tensors(&t, &shapes, kind);
                let seeds: Vec<Vec<Tensor>> = s.iter().map(|v| tensors(v, &shapes, kind)).collect();
                let path = agg.aggregate(&teacher, &seeds, confirmed, &out).unwrap();
                let want_path = match (k, confirmed) {
                    (0, _) => AggPath::PassThrough,
                    (1, true) => AggPath::SingleSeed,
                    _ => AggPath::PcGrad,
                };
                assert_eq!(path, want_path, "k={k} confirmed={confirmed}");
                let r = reference(&t, &s);
                assert_close(&read(&out), &r.out, tol, &format!("out k={k} {kind:?}"));
                let m = agg.take_epoch_metrics().unwrap();
                assert_eq!(m.steps, 1);
                assert_eq!(m.conflicts, r.conflicts, "conflicts k={k}");
                assert_eq!(m.projections, r.projections, "projections k={k}");
                assert_close(&[m.teacher_share], &[r.share], tol, "share");
                if k >= 2 {
                    assert!(r.conflicts > 0, "the data exercise a projection (k={k})");
                }
            }
        }
        assert_eq!(agg.allocations(), 1, "one layout, one allocation");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pcgrad_guarantees_hold(
        (k, n, flat) in (2usize..=4, 1usize..=6)
            .prop_flat_map(|(k, n)| (Just(k), Just(n), prop::collection::vec(-3.0f64..3.0, (k + 1) * n)))
    ) {
        let t = flat[..n].to_vec();
        let seeds: Vec<Vec<f64>> = (0..k).map(|i| flat[(i + 1) * n..(i + 2) * n].to_vec()).collect();
        prop_assume!(seeds.iter().all(|s| norm(s) > 0.1));
        let shapes = vec![vec![n as i64]];
        let mut agg = GradAggregator::new(4, Device::Cpu).unwrap();
        let out = zeros(&shapes, Kind::Double);
        let seed_tensors: Vec<Vec<Tensor>> = seeds.iter().map(|s| tensors(s, &shapes, Kind::Double)).collect();
        agg.aggregate(&tensors(&t, &shapes, Kind::Double), &seed_tensors, false, &out).unwrap();
        let p = read_rows(&agg.projected_seeds().unwrap().unwrap());
        let r = reference(&t, &seeds);
        let tol = 1e-9;
        prop_assert_eq!(p.len(), k);
        for (got, want) in p.iter().zip(&r.projected) {
            assert_close(got, want, tol, "projected vs reference");
        }
        assert_close(&read(&out), &r.out, tol, "out vs reference");
        for i in 0..k {
            // A projection never lengthens a gradient.
            prop_assert!(norm(&p[i]) <= norm(&seeds[i]) * (1.0 + tol) + tol);
            // No conflict with the last gradient checked against.
            let last = if i == k - 1 { k - 2 } else { k - 1 };
            prop_assert!(dot(&p[i], &seeds[last]) >= -tol * (1.0 + norm(&seeds[i]) * norm(&seeds[last])));
            // A gradient in conflict with none is untouched.
            if (0..k).all(|j| j == i || dot(&seeds[i], &seeds[j]) >= 0.0) {
                assert_close(&p[i], &seeds[i], tol, "untouched");
            }
        }
        if k == 2 {
            // Two seeds: the projected pair never conflicts, and its cosine
            // is no lower than before.
            let scale = norm(&seeds[0]) * norm(&seeds[1]);
            prop_assert!(dot(&p[0], &p[1]) >= -tol * scale);
            let cos = |a: &[f64], b: &[f64]| {
                let d = norm(a) * norm(b);
                if d == 0.0 { 0.0 } else { dot(a, b) / d }
            };
            prop_assert!(cos(&p[0], &p[1]) >= cos(&seeds[0], &seeds[1]) - 1e-9);
        }
    }
}

#[test]
fn pooled_buffers_are_reused_across_steps_and_paths() {
    let shapes = vec![vec![3, 2], vec![2]];
    let kind = Kind::Float;
    let mut agg = GradAggregator::new(3, Device::Cpu).unwrap();
    assert!(agg.pooled_rows().is_none());
    let out = zeros(&shapes, kind);
    let teacher = tensors(&values(1, 8), &shapes, kind);
    let seeds: Vec<Vec<Tensor>> = (0..3)
        .map(|i| tensors(&values(2 + i, 8), &shapes, kind))
        .collect();
    agg.aggregate(&teacher, &seeds, false, &out).unwrap();
    let rows = agg.pooled_rows().unwrap();
    assert_eq!(rows.size(), vec![4, 8]);
    let ptr = rows.data_ptr();
    for step in 0..6 {
        let k = step % 4;
        let confirmed = k == 1 && step % 2 == 1;
        agg.aggregate(&teacher, &seeds[..k], confirmed, &out)
            .unwrap();
        assert_eq!(agg.pooled_rows().unwrap().data_ptr(), ptr, "step {step}");
    }
    // The parameters' gradients are written in place, never replaced.
    assert_eq!(agg.allocations(), 1);
    assert_eq!(agg.take_epoch_metrics().unwrap().steps, 7);
}

#[test]
fn a_layout_change_reallocates_and_aggregates_the_new_layout() {
    let kind = Kind::Double;
    let mut agg = GradAggregator::new(2, Device::Cpu).unwrap();
    let first = vec![vec![2]];
    let out = zeros(&first, kind);
    let seeds = [
        tensors(&[1.0, 0.0], &first, kind),
        tensors(&[-1.0, 1.0], &first, kind),
    ];
    agg.aggregate(&tensors(&[0.0, 0.0], &first, kind), &seeds, false, &out)
        .unwrap();
    assert_eq!(agg.allocations(), 1);
    // A seed's parameters appear: the layout grows to [2] + [3].
    let second = vec![vec![2], vec![3]];
    let (t, s1, s2) = (values(7, 5), values(8, 5), values(9, 5));
    let out = zeros(&second, kind);
    let seeds = [tensors(&s1, &second, kind), tensors(&s2, &second, kind)];
    agg.aggregate(&tensors(&t, &second, kind), &seeds, false, &out)
        .unwrap();
    assert_eq!(agg.allocations(), 2);
    assert_eq!(agg.pooled_rows().unwrap().size(), vec![3, 5]);
    let r = reference(&t, &[s1, s2]);
    assert_close(&read(&out), &r.out, TOL, "out after the change");
    let m = agg.take_epoch_metrics().unwrap();
    assert_eq!((m.steps, m.flat_params), (2, 5));
    // The same layout again: no new allocation.
    agg.aggregate(&tensors(&t, &second, kind), &seeds, false, &out)
        .unwrap();
    assert_eq!(agg.allocations(), 2);
}

#[test]
fn epoch_metrics_accumulate_over_paths_reset_and_become_telemetry() {
    let shapes = vec![vec![2]];
    let kind = Kind::Double;
    let mut agg = GradAggregator::new(2, Device::Cpu).unwrap();
    let out = zeros(&shapes, kind);
    let teacher = tensors(&[3.0, 4.0], &shapes, kind); // |t| = 5
    let one = [tensors(&[0.0, 5.0], &shapes, kind)]; // |s| = 5
    let two = [
        tensors(&[1.0, 0.0], &shapes, kind),
        tensors(&[-1.0, 1.0], &shapes, kind),
    ];
    agg.aggregate(&teacher, &[] as &[Vec<Tensor>], false, &out)
        .unwrap(); // share 1
    assert_close(&read(&out), &[3.0, 4.0], TOL, "pass-through");
    agg.aggregate(&teacher, &one, true, &out).unwrap(); // share 5 / 10
    assert_close(&read(&out), &[3.0, 9.0], TOL, "fast path");
    agg.aggregate(&teacher, &one, false, &out).unwrap(); // unconfirmed: general, share 0.5
    assert_close(&read(&out), &[3.0, 9.0], TOL, "one unconfirmed seed");
    agg.aggregate(&teacher, &two, false, &out).unwrap(); // 5 / (5 + √0.5 + 1)
    assert!(agg.projected_seeds().unwrap().is_some());
    agg.aggregate(&teacher, &one, true, &out).unwrap(); // share 0.5 again
    assert!(
        agg.projected_seeds().unwrap().is_none(),
        "stale after another path"
    );
    let m = agg.take_epoch_metrics().unwrap();
    assert_eq!(
        (
            m.steps,
            m.pass_through_steps,
            m.single_seed_steps,
            m.pcgrad_steps
        ),
        (5, 1, 2, 2)
    );
    assert_eq!((m.seed_pairs, m.conflicts, m.projections), (1, 1, 2));
    let last = 5.0 / (6.0 + 0.5f64.sqrt());
    assert_close(
        &[m.teacher_share],
        &[(1.0 + 0.5 + 0.5 + last + 0.5) / 5.0],
        TOL,
        "mean share",
    );
    let metrics = m.telemetry();
    let names: Vec<&str> = metrics.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        [
            names::TOLARIA_GRAD_AGG_CONFLICTS,
            names::TOLARIA_GRAD_AGG_PROJECTIONS,
            names::TOLARIA_GRAD_AGG_CONFLICT_RATIO,
            names::TOLARIA_GRAD_AGG_TEACHER_SHARE,
            names::TOLARIA_GRAD_AGG_FLAT_PARAMS
        ]
    );
    for x in &metrics {
        let spec = names::metric_spec(&x.name).expect("leyline knows the name");
        assert_eq!(x.unit, spec.unit);
    }
    assert_eq!(metrics[0].value, 1.0);
    assert_eq!(metrics[2].value, 1.0);
    // Taking the metrics zeroes the accumulator.
    let again = agg.take_epoch_metrics().unwrap();
    assert_eq!(
        (again.steps, again.conflicts, again.teacher_share),
        (0, 0, 0.0)
    );
    assert_eq!(again.flat_params, 2);
}

#[test]
fn a_non_finite_gradient_is_caught_at_the_epoch_readback() {
    let shapes = vec![vec![2]];
    let kind = Kind::Double;
    let mut agg = GradAggregator::new(2, Device::Cpu).unwrap();
    let out = zeros(&shapes, kind);
    let seeds = [
        tensors(&[f64::NAN, 0.0], &shapes, kind),
        tensors(&[1.0, 1.0], &shapes, kind),
    ];
    agg.aggregate(&tensors(&[1.0, 0.0], &shapes, kind), &seeds, false, &out)
        .unwrap();
    match agg.take_epoch_metrics() {
        Err(Error::InvalidMetric { what, value }) => {
            assert_eq!(what, names::TOLARIA_GRAD_AGG_TEACHER_SHARE);
            assert!(value.is_nan());
        }
        other => panic!("expected InvalidMetric, got {other:?}"),
    }
}

fn dup(list: &[Tensor]) -> Vec<Tensor> {
    list.iter().map(Tensor::shallow_clone).collect()
}

fn field_of(result: tolaria::Result<impl std::fmt::Debug>) -> &'static str {
    match result {
        Err(Error::GradAgg { field, reason }) => {
            assert!(!reason.is_empty());
            field
        }
        other => panic!("expected Error::GradAgg, got {other:?}"),
    }
}

#[test]
fn mismatched_gradients_are_typed_errors_naming_the_argument() {
    for bad in [0, MAX_GRAD_AGG_SEEDS + 1] {
        assert_eq!(field_of(GradAggregator::new(bad, Device::Cpu)), "max_seeds");
    }
    let shapes = vec![vec![2], vec![3]];
    let kind = Kind::Float;
    let mut agg = GradAggregator::new(2, Device::Cpu).unwrap();
    let out = zeros(&shapes, kind);
    let good = tensors(&values(3, 5), &shapes, kind);
    let none: &[Vec<Tensor>] = &[];
    // Too many seeds.
    let three = [dup(&good), dup(&good), dup(&good)];
    assert_eq!(field_of(agg.aggregate(&good, &three, false, &out)), "seeds");
    // The fast-path flag with two seeds, and with none.
    let two = [dup(&good), dup(&good)];
    assert_eq!(
        field_of(agg.aggregate(&good, &two, true, &out)),
        "attribution_confirms_single_seed"
    );
    assert_eq!(
        field_of(agg.aggregate(&good, none, true, &out)),
        "attribution_confirms_single_seed"
    );
    // No parameters.
    assert_eq!(field_of(agg.aggregate(&[], none, false, &[])), "out");
    // A seed with a missing gradient, a wrong shape (same numel), a wrong dtype.
    let short = [dup(&good[..1])];
    assert_eq!(field_of(agg.aggregate(&good, &short, false, &out)), "seeds");
    let reshaped = [vec![
        good[0].shallow_clone(),
        Tensor::zeros([3, 1], (kind, Device::Cpu)),
    ]];
    assert_eq!(
        field_of(agg.aggregate(&good, &reshaped, false, &out)),
        "seeds"
    );
    let doubled = [tensors(&values(3, 5), &shapes, Kind::Double)];
    assert_eq!(
        field_of(agg.aggregate(&good, &doubled, false, &out)),
        "seeds"
    );
    // A teacher of another numel; an undefined gradient; an integer layout.
    let wrong = tensors(&values(3, 6), &[vec![3], vec![3]], kind);
    assert_eq!(
        field_of(agg.aggregate(&wrong, none, false, &out)),
        "teacher"
    );
    let undefined = [vec![good[0].shallow_clone(), Tensor::new()]];
    assert_eq!(
        field_of(agg.aggregate(&good, &undefined, false, &out)),
        "seeds"
    );
    let ints = [Tensor::zeros([2], (Kind::Int64, Device::Cpu))];
    assert_eq!(field_of(agg.aggregate(&ints, none, false, &ints)), "out");
    // Nothing was counted, and a good step still works afterwards.
    assert_eq!(agg.take_epoch_metrics().unwrap().steps, 0);
    agg.aggregate(&good, &two, false, &out).unwrap();
    assert_eq!(agg.take_epoch_metrics().unwrap().steps, 1);
}

#[test]
fn aggregating_from_the_total_equals_aggregating_its_teacher_with_undefined_parts_as_zeros() {
    // The model step's form: the total host gradient, and per seed a list
    // where the parameters above its slot are undefined (no gradient).
    let shapes = vec![vec![2, 3], vec![4], vec![]];
    let n = 11;
    for (kind, tol) in [(Kind::Double, 1e-12), (Kind::Float, 1e-5)] {
        let mut by_teacher = GradAggregator::new(3, Device::Cpu).unwrap();
        let mut by_total = GradAggregator::new(3, Device::Cpu).unwrap();
        let want = zeros(&shapes, kind);
        let got = zeros(&shapes, kind);
        for k in 0..=3usize {
            for confirmed in [false, true] {
                if confirmed && k != 1 {
                    continue;
                }
                let total = values(200 + k as u64, n);
                let mut parts: Vec<Vec<f64>> = Vec::new();
                let mut lists: Vec<Vec<Tensor>> = Vec::new();
                for i in 0..k {
                    let mut v = values(30 * k as u64 + i as u64, n);
                    if let Some(first) = parts.first() {
                        v.iter_mut().zip(first).for_each(|(x, f)| *x -= f);
                    }
                    // Seed i sends nothing to the last `i` parameters.
                    let mut list = tensors(&v, &shapes, kind);
                    let mut offset = 0;
                    for (index, shape) in shapes.iter().enumerate() {
                        let count = shape.iter().product::<i64>() as usize;
                        if index + i >= shapes.len() {
                            list[index] = Tensor::new();
                            v[offset..offset + count].iter_mut().for_each(|x| *x = 0.0);
                        }
                        offset += count;
                    }
                    parts.push(v);
                    lists.push(list);
                }
                let mut teacher = total.clone();
                for part in &parts {
                    teacher.iter_mut().zip(part).for_each(|(t, p)| *t -= p);
                }
                let dense: Vec<Vec<Tensor>> =
                    parts.iter().map(|v| tensors(v, &shapes, kind)).collect();
                let want_path = by_teacher
                    .aggregate(&tensors(&teacher, &shapes, kind), &dense, confirmed, &want)
                    .unwrap();
                let got_path = by_total
                    .aggregate_total(&tensors(&total, &shapes, kind), &lists, confirmed, &got)
                    .unwrap();
                assert_eq!(got_path, want_path, "k={k} confirmed={confirmed}");
                assert_close(&read(&got), &read(&want), tol, &format!("k={k} {kind:?}"));
                let (a, b) = (
                    by_teacher.take_epoch_metrics().unwrap(),
                    by_total.take_epoch_metrics().unwrap(),
                );
                assert_eq!((a.conflicts, a.projections), (b.conflicts, b.projections));
                assert_close(&[b.teacher_share], &[a.teacher_share], tol, "share");
            }
        }
        // The teacher's list may not hold an undefined gradient.
        let mut total = tensors(&values(1, n), &shapes, kind);
        total[0] = Tensor::new();
        let seeds = vec![tensors(&values(2, n), &shapes, kind)];
        assert!(
            by_total
                .aggregate_total(&total, &seeds, false, &got)
                .is_err()
        );
    }
}

/// Channels-last gradients (a convolution weight on the GPU): the pooled
/// rows hold each parameter in its gradient's memory order (so the copies
/// in and out are plain memory moves), the result is the reference's, and
/// the same shapes in another memory layout are a new layout.
#[test]
fn channels_last_gradients_keep_their_memory_order_in_the_rows() {
    let shapes = vec![vec![4, 3, 2, 2], vec![4]];
    let n = 52;
    let kind = Kind::Double;
    let last = |list: Vec<Tensor>| -> Vec<Tensor> {
        list.into_iter()
            .map(|t| {
                if t.dim() == 4 {
                    torch_ext::memory::contiguous_channels_last(&t).unwrap()
                } else {
                    t
                }
            })
            .collect()
    };
    let t = values(41, n);
    let s: Vec<Vec<f64>> = (0..2)
        .map(|i| {
            let mut v = values(42 + i, n);
            if i == 1 {
                // Lean against the first seed, so that they conflict.
                v.iter_mut().zip(values(42, n)).for_each(|(x, f)| *x -= f);
            }
            v
        })
        .collect();
    let teacher = last(tensors(&t, &shapes, kind));
    let seeds: Vec<Vec<Tensor>> = s.iter().map(|v| last(tensors(v, &shapes, kind))).collect();
    let out = last(zeros(&shapes, kind));
    assert!(
        !out[0].is_contiguous(),
        "the weight's gradient is channels-last"
    );
    let mut agg = GradAggregator::new(2, Device::Cpu).unwrap();
    assert_eq!(
        agg.aggregate(&teacher, &seeds, false, &out).unwrap(),
        AggPath::PcGrad
    );
    let r = reference(&t, &s);
    assert!(r.conflicts > 0, "the data exercise a projection");
    assert_close(&read(&out), &r.out, TOL, "channels-last out");
    // Row 0 is the teacher in memory order: NHWC for the weight.
    let memory_order: Vec<f64> =
        Vec::<f64>::try_from(teacher[0].permute([0, 2, 3, 1]).contiguous().flatten(0, -1)).unwrap();
    let row0 = read_rows(agg.pooled_rows().unwrap()).remove(0);
    assert_close(&row0[..48], &memory_order, 0.0, "row 0 in memory order");
    assert_eq!(agg.allocations(), 1);
    // The same shapes, contiguous: a new layout, the same result.
    let out_contiguous = zeros(&shapes, kind);
    agg.aggregate(
        &tensors(&t, &shapes, kind),
        &s.iter()
            .map(|v| tensors(v, &shapes, kind))
            .collect::<Vec<_>>(),
        false,
        &out_contiguous,
    )
    .unwrap();
    assert_eq!(agg.allocations(), 2);
    assert_close(&read(&out_contiguous), &r.out, TOL, "contiguous out");
}
