//! Deferred seed metrics (`tolaria::seed_metrics`) on the CPU: the epoch's
//! one readback equals the same quantities computed eagerly step by step
//! (read back every step, here only), for several strides, with groups
//! added and removed mid-epoch; empty epochs, non-finite gradients, buffer
//! reuse and the leyline codec round trip.

use kasmina::groups::{GroupEvent, GroupKey, ParamGroup};
use kasmina::host::SlotId;
use leyline::codec::Contract;
use leyline::proto::SeedMetricSet;
use tch::{Device, Kind, Tensor};
use tolaria::Error;
use tolaria::seed_metrics::{GroupGrads, SeedMetricsAccumulator};

const SEED_A: GroupKey = GroupKey::Seed(SlotId { row: 0, col: 1 });
const SEED_B: GroupKey = GroupKey::Seed(SlotId { row: 1, col: 0 });

fn group(key: GroupKey, shapes: &[&[i64]]) -> ParamGroup {
    ParamGroup::new(
        key,
        shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                (
                    format!("p{i}"),
                    Tensor::zeros(*shape, (Kind::Float, Device::Cpu)),
                )
            })
            .collect(),
    )
}

fn host() -> ParamGroup {
    group(GroupKey::Host, &[&[4, 3], &[3], &[2, 2, 2]])
}

fn seed_a() -> ParamGroup {
    group(SEED_A, &[&[5], &[2, 3]])
}

fn seed_b() -> ParamGroup {
    group(SEED_B, &[&[7, 2]])
}

fn random_grads(group: &ParamGroup, scale: f64) -> Vec<Tensor> {
    group
        .tensors
        .iter()
        .map(|t| Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * scale)
        .collect()
}

/// Eager reference per group: (sum of per-step group norms, sum of squared,
/// per-layer norm sums, samples), computed in f64 from read-back gradients.
#[derive(Default, Clone)]
struct Eager {
    norm_sum: f64,
    squared_sum: f64,
    layers: Vec<f64>,
    samples: u64,
}

impl Eager {
    fn add(&mut self, grads: &[Tensor]) {
        let layers: Vec<f64> = grads
            .iter()
            .map(|g| {
                let v = Vec::<f64>::try_from(g.to_kind(Kind::Double).flatten(0, -1)).unwrap();
                v.iter().map(|x| x * x).sum::<f64>().sqrt()
            })
            .collect();
        let squared: f64 = layers.iter().map(|n| n * n).sum();
        self.norm_sum += squared.sqrt();
        self.squared_sum += squared;
        if self.layers.is_empty() {
            self.layers = vec![0.0; layers.len()];
        }
        for (sum, n) in self.layers.iter_mut().zip(&layers) {
            *sum += n;
        }
        self.samples += 1;
    }

    fn mean(&self) -> f64 {
        self.norm_sum / self.samples as f64
    }
}

fn close(actual: f64, expected: f64, what: &str) {
    let tolerance = 1e-6 * expected.abs().max(1e-12);
    assert!(
        (actual - expected).abs() <= tolerance,
        "{what}: deferred {actual}, eager {expected}"
    );
}

fn kasmina_ratio(seed: f64, seed_params: i64, host: f64, host_params: i64) -> f64 {
    if host < 1e-8 || seed_params <= 0 {
        0.0
    } else {
        ((seed / host) * (host_params as f64 / seed_params as f64).sqrt()).min(10.0)
    }
}

fn run_epoch(stride: u64, steps: u64) {
    tch::manual_seed(7 + stride as i64);
    let groups = vec![host(), seed_a(), seed_b()];
    let mut acc = SeedMetricsAccumulator::new(stride, &groups, Device::Cpu).unwrap();
    let mut eager = vec![Eager::default(); groups.len()];
    for step in 0..steps {
        // Seed B's gradients are small, to move the ratio around.
        let grads: Vec<Vec<Tensor>> = groups
            .iter()
            .zip([1.0, 0.5, 0.01])
            .map(|(g, scale)| random_grads(g, scale))
            .collect();
        let given: Vec<GroupGrads<'_>> = groups
            .iter()
            .zip(&grads)
            .map(|(g, grads)| GroupGrads { key: g.key, grads })
            .collect();
        let observed = acc.observe_step(step, &given).unwrap();
        assert_eq!(observed, step % stride == 0, "step {step}");
        if observed {
            for (e, grads) in eager.iter_mut().zip(&grads) {
                e.add(grads);
            }
        }
    }
    let metrics = acc.finish_epoch().unwrap();
    assert_eq!(metrics.stride, stride);
    let expected_samples = steps.div_ceil(stride);
    let host_metrics = metrics.host.clone().unwrap();
    assert_eq!(host_metrics.samples, expected_samples);
    assert_eq!(host_metrics.param_count, 12 + 3 + 8);
    close(
        host_metrics.gradient_norm.unwrap(),
        eager[0].mean(),
        "host norm",
    );
    close(
        host_metrics.rms_gradient_norm.unwrap(),
        (eager[0].squared_sum / eager[0].samples as f64).sqrt(),
        "host rms",
    );
    for ((name, value), sum) in host_metrics.layers.iter().zip(&eager[0].layers) {
        close(*value, sum / expected_samples as f64, name);
    }
    assert_eq!(host_metrics.layers.len(), 3);
    assert_eq!(metrics.seeds.len(), 2);
    for (seed, (e, g)) in metrics.seeds.iter().zip(eager.iter().zip(&groups).skip(1)) {
        assert_eq!(seed.group.key, g.key);
        assert_eq!(seed.group.samples, expected_samples);
        close(seed.group.gradient_norm.unwrap(), e.mean(), "seed norm");
        for ((name, value), sum) in seed.group.layers.iter().zip(&e.layers) {
            close(*value, sum / expected_samples as f64, name);
        }
        let ratio = kasmina_ratio(
            e.mean(),
            g.element_count(),
            eager[0].mean(),
            host().element_count(),
        );
        close(seed.gradient_ratio.unwrap(), ratio, "ratio");
        let (seed_norm, host_norm, host_params) = seed.record_arguments().unwrap();
        close(seed_norm, e.mean(), "record seed norm");
        close(host_norm, eager[0].mean(), "record host norm");
        assert_eq!(host_params, 23);
        let set = seed.metric_set.as_ref().unwrap();
        close(set.gradient_norm, e.mean(), "set norm");
        assert_eq!(set.param_count, g.element_count() as u64);
        assert_eq!(set.gradient_ratio, seed.gradient_ratio);
    }
    // The accumulators were reset: an epoch without steps has no samples.
    let empty = acc.finish_epoch().unwrap();
    assert_eq!(empty.host.unwrap().samples, 0);
}

#[test]
fn deferred_equals_eager_stride_1() {
    run_epoch(1, 7);
}

#[test]
fn deferred_equals_eager_stride_3() {
    run_epoch(3, 11);
}

#[test]
fn deferred_equals_eager_default_stride() {
    run_epoch(tolaria::seed_metrics::DEFAULT_GRADIENT_TELEMETRY_STRIDE, 25);
}

#[test]
fn stride_zero_is_refused() {
    let err = SeedMetricsAccumulator::new(0, &[host()], Device::Cpu).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "gradient_telemetry_stride",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn no_observed_step_reports_none_not_nan() {
    let groups = vec![host(), seed_a()];
    let mut acc = SeedMetricsAccumulator::new(100, &groups, Device::Cpu).unwrap();
    for step in 1..50 {
        acc.observe_params(step, &groups).unwrap();
    }
    let metrics = acc.finish_epoch().unwrap();
    let host = metrics.host.unwrap();
    assert_eq!(host.samples, 0);
    assert_eq!(host.gradient_norm, None);
    assert_eq!(host.rms_gradient_norm, None);
    assert!(host.layers.is_empty());
    let seed = &metrics.seeds[0];
    assert_eq!(seed.group.gradient_norm, None);
    assert_eq!(seed.gradient_ratio, None);
    assert_eq!(seed.metric_set, None);
    assert_eq!(seed.record_arguments(), None);
}

#[test]
fn observe_params_reads_grads_and_missing_grad_counts_zero() {
    let w = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let frozen = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let h = Tensor::ones([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let loss = (&w * 2.0).sum(Kind::Float) + (&h * 3.0).sum(Kind::Float);
    loss.backward();
    let groups = vec![
        ParamGroup::new(GroupKey::Host, vec![("h".to_owned(), h)]),
        ParamGroup::new(
            SEED_A,
            vec![("frozen".to_owned(), frozen), ("w".to_owned(), w)],
        ),
    ];
    let mut acc = SeedMetricsAccumulator::new(1, &groups, Device::Cpu).unwrap();
    assert!(acc.observe_params(0, &groups).unwrap());
    let metrics = acc.finish_epoch().unwrap();
    close(
        metrics.host.clone().unwrap().gradient_norm.unwrap(),
        6.0,
        "host",
    ); // sqrt(4*9)
    let seed = metrics.seed(SEED_A).unwrap();
    close(seed.group.gradient_norm.unwrap(), 12f64.sqrt(), "seed"); // sqrt(3*4)
    assert_eq!(seed.group.layers[0], ("frozen".to_owned(), 0.0));
    close(seed.group.layers[1].1, 12f64.sqrt(), "w");
}

#[test]
fn groups_added_and_removed_mid_epoch() {
    tch::manual_seed(11);
    let (h, a, b) = (host(), seed_a(), seed_b());
    let mut acc = SeedMetricsAccumulator::new(2, &[host(), seed_a()], Device::Cpu).unwrap();
    let (mut eh, mut ea, mut eb) = (Eager::default(), Eager::default(), Eager::default());
    for step in 0..12u64 {
        if step == 5 {
            acc.on_group_event(GroupEvent::Added(SEED_B), Some(&b))
                .unwrap();
        }
        if step == 7 {
            acc.on_group_event(GroupEvent::Removed(SEED_A), None)
                .unwrap();
        }
        let mut held = vec![&h];
        if step < 7 {
            held.push(&a);
        }
        if step >= 5 {
            held.push(&b);
        }
        let grads: Vec<Vec<Tensor>> = held.iter().map(|g| random_grads(g, 1.0)).collect();
        let given: Vec<GroupGrads<'_>> = held
            .iter()
            .zip(&grads)
            .map(|(g, grads)| GroupGrads { key: g.key, grads })
            .collect();
        if acc.observe_step(step, &given).unwrap() {
            for (g, grads) in held.iter().zip(&grads) {
                match g.key {
                    GroupKey::Host => eh.add(grads),
                    k if k == SEED_A => ea.add(grads),
                    _ => eb.add(grads),
                }
            }
        }
    }
    assert_eq!(ea.samples, 4);
    assert_eq!(acc.keys(), vec![GroupKey::Host, SEED_B]);
    let metrics = acc.finish_epoch().unwrap();
    assert!(
        metrics.seed(SEED_A).is_none(),
        "a removed seed reports nothing"
    );
    let host_m = metrics.host.clone().unwrap();
    assert_eq!(host_m.samples, 6);
    close(host_m.gradient_norm.unwrap(), eh.mean(), "host");
    let seed_b = metrics.seed(SEED_B).unwrap();
    assert_eq!(seed_b.group.samples, 3); // steps 6, 8, 10
    assert_eq!(eb.samples, 3);
    close(seed_b.group.gradient_norm.unwrap(), eb.mean(), "seed b");
}

#[test]
fn added_event_needs_its_group_and_keeps_same_layout() {
    let mut acc = SeedMetricsAccumulator::new(1, &[host()], Device::Cpu).unwrap();
    let err = acc
        .on_group_event(GroupEvent::Added(SEED_A), None)
        .unwrap_err();
    assert!(
        matches!(err, Error::SeedMetrics { field: "group", .. }),
        "{err}"
    );
    let err = acc
        .on_group_event(GroupEvent::Added(SEED_A), Some(&seed_b()))
        .unwrap_err();
    assert!(
        matches!(err, Error::SeedMetrics { field: "group", .. }),
        "{err}"
    );
    // Added(Host) for the held host (as drained after construction) keeps it.
    let before = acc.accumulator(GroupKey::Host).unwrap().data_ptr();
    acc.on_group_event(GroupEvent::Added(GroupKey::Host), Some(&host()))
        .unwrap();
    assert_eq!(acc.accumulator(GroupKey::Host).unwrap().data_ptr(), before);
    // Removing an absent group is a no-op.
    acc.on_group_event(GroupEvent::Removed(SEED_B), None)
        .unwrap();
    assert_eq!(acc.keys(), vec![GroupKey::Host]);
}

#[test]
fn mismatched_gradients_are_refused_before_any_change() {
    let groups = vec![host(), seed_a()];
    let mut acc = SeedMetricsAccumulator::new(1, &groups, Device::Cpu).unwrap();
    let good_h = random_grads(&groups[0], 1.0);
    let good_a = random_grads(&groups[1], 1.0);
    let bad_a = vec![
        Tensor::ones([4], (Kind::Float, Device::Cpu)),
        good_a[1].shallow_clone(),
    ];
    let cases: Vec<Vec<GroupGrads<'_>>> = vec![
        vec![GroupGrads {
            key: GroupKey::Host,
            grads: &good_h,
        }],
        vec![
            GroupGrads {
                key: GroupKey::Host,
                grads: &good_h,
            },
            GroupGrads {
                key: SEED_A,
                grads: &bad_a,
            },
        ],
        vec![
            GroupGrads {
                key: GroupKey::Host,
                grads: &good_h,
            },
            GroupGrads {
                key: SEED_B,
                grads: &good_a,
            },
        ],
        vec![
            GroupGrads {
                key: GroupKey::Host,
                grads: &good_h,
            },
            GroupGrads {
                key: GroupKey::Host,
                grads: &good_h,
            },
        ],
        vec![
            GroupGrads {
                key: GroupKey::Host,
                grads: &good_h[..2],
            },
            GroupGrads {
                key: SEED_A,
                grads: &good_a,
            },
        ],
    ];
    for given in &cases {
        let err = acc.observe_step(0, given).unwrap_err();
        assert!(
            matches!(err, Error::SeedMetrics { field: "grads", .. }),
            "{err}"
        );
    }
    let metrics = acc.finish_epoch().unwrap();
    assert_eq!(
        metrics.host.unwrap().samples,
        0,
        "refused calls changed nothing"
    );
    // Order of the groups does not matter.
    let reversed = [
        GroupGrads {
            key: SEED_A,
            grads: &good_a,
        },
        GroupGrads {
            key: GroupKey::Host,
            grads: &good_h,
        },
    ];
    assert!(acc.observe_step(0, &reversed).unwrap());
    assert_eq!(acc.finish_epoch().unwrap().seeds[0].group.samples, 1);
}

#[test]
fn non_finite_gradient_is_a_typed_error_at_finish() {
    let groups = vec![host(), seed_a()];
    let mut acc = SeedMetricsAccumulator::new(1, &groups, Device::Cpu).unwrap();
    let h = random_grads(&groups[0], 1.0);
    let mut a = random_grads(&groups[1], 1.0);
    a[1] = Tensor::full([2, 3], f64::NAN, (Kind::Float, Device::Cpu));
    let given = [
        GroupGrads {
            key: GroupKey::Host,
            grads: &h,
        },
        GroupGrads {
            key: SEED_A,
            grads: &a,
        },
    ];
    acc.observe_step(0, &given).unwrap();
    let err = acc.finish_epoch().unwrap_err();
    assert!(
        matches!(&err, Error::SeedMetrics { field: "gradient_norm", reason } if reason.contains("seed")),
        "{err}"
    );
    // Infinite host gradient too; and the accumulators were reset after it.
    let clean = acc.finish_epoch().unwrap();
    assert_eq!(clean.host.unwrap().samples, 0);
    let inf = vec![
        Tensor::full([4, 3], f64::INFINITY, (Kind::Float, Device::Cpu)),
        h[1].shallow_clone(),
        h[2].shallow_clone(),
    ];
    let a = random_grads(&groups[1], 1.0);
    let given = [
        GroupGrads {
            key: GroupKey::Host,
            grads: &inf,
        },
        GroupGrads {
            key: SEED_A,
            grads: &a,
        },
    ];
    acc.observe_step(0, &given).unwrap();
    let err = acc.finish_epoch().unwrap_err();
    assert!(
        matches!(
            err,
            Error::SeedMetrics {
                field: "gradient_norm",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn buffers_are_reused_across_steps_and_epochs() {
    let groups = vec![host(), seed_a()];
    let mut acc = SeedMetricsAccumulator::new(1, &groups, Device::Cpu).unwrap();
    let ptrs = |acc: &SeedMetricsAccumulator| {
        [GroupKey::Host, SEED_A].map(|k| acc.accumulator(k).unwrap().data_ptr() as usize)
    };
    let before = ptrs(&acc);
    for epoch in 0..2 {
        for step in 0..4 {
            let h = random_grads(&groups[0], 1.0);
            let a = random_grads(&groups[1], 1.0);
            acc.observe_step(
                step,
                &[
                    GroupGrads {
                        key: GroupKey::Host,
                        grads: &h,
                    },
                    GroupGrads {
                        key: SEED_A,
                        grads: &a,
                    },
                ],
            )
            .unwrap();
            assert_eq!(ptrs(&acc), before, "epoch {epoch} step {step}");
        }
        acc.finish_epoch().unwrap();
        assert_eq!(ptrs(&acc), before);
        let zeroed = Vec::<f64>::try_from(acc.accumulator(SEED_A).unwrap()).unwrap();
        assert!(zeroed.iter().all(|v| *v == 0.0), "{zeroed:?}");
    }
}

#[test]
fn metric_set_round_trips_through_leyline_codec() {
    tch::manual_seed(3);
    let groups = vec![host(), seed_a()];
    let mut acc = SeedMetricsAccumulator::new(1, &groups, Device::Cpu).unwrap();
    for step in 0..3 {
        acc.observe_params(step, &groups)
            .unwrap_or_else(|e| panic!("{e}"));
        let h = random_grads(&groups[0], 1.0);
        let a = random_grads(&groups[1], 1e-9);
        acc.observe_step(
            step,
            &[
                GroupGrads {
                    key: GroupKey::Host,
                    grads: &h,
                },
                GroupGrads {
                    key: SEED_A,
                    grads: &a,
                },
            ],
        )
        .unwrap();
    }
    let metrics = acc.finish_epoch().unwrap();
    let set = metrics.seeds[0].metric_set.unwrap();
    assert_eq!(set.schema_version, leyline::SCHEMA_VERSION);
    // Params have no .grad (observe_params counted 0 on 3 steps), tiny
    // gradients on the other 3: the mean is far below 1e-7.
    assert!(set.gradients_vanishing);
    assert!(!set.gradients_exploding);
    let bytes = set.encode_protobuf().unwrap();
    assert_eq!(SeedMetricSet::decode_protobuf(&bytes).unwrap(), set);
    let json = set.to_json().unwrap();
    assert_eq!(SeedMetricSet::from_json(&json).unwrap(), set);
}
