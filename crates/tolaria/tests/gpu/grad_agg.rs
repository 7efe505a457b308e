//! The aggregator's fused PCGrad kernels on the GPU (part of the `gpu` test
//! binary): against its libtorch path (torch-ext's fused kernels turned
//! off) for one to sixteen seeds and for more than the kernels take, in f32
//! and f64, with conflicting seeds: the aggregate, the projected seeds and
//! the epoch metrics; and that the fused path launches its kernels.

use tch::{Device, Kind, Tensor};
use tolaria::grad_agg::GradAggregator;

const CUDA: Device = Device::Cuda(0);

/// Parameters of a small host: a matrix, a vector, a scalar.
fn shapes() -> Vec<Vec<i64>> {
    vec![vec![64, 96], vec![1000], vec![]]
}

fn list(seed: i64, kind: Kind, shift: Option<&[Tensor]>) -> Vec<Tensor> {
    tch::manual_seed(seed);
    shapes()
        .iter()
        .enumerate()
        .map(|(index, shape)| {
            let t = Tensor::randn(shape.as_slice(), (kind, CUDA));
            // Half the seeds lean against the first one: conflicts.
            match shift {
                Some(first) => t * 0.5 - first[index].shallow_clone() * 0.8,
                None => t,
            }
        })
        .collect()
}

struct Run {
    out: Vec<f64>,
    projected: Vec<f64>,
    metrics: tolaria::grad_agg::GradAggMetrics,
}

fn flat(tensors: &[Tensor]) -> Vec<f64> {
    let parts: Vec<Tensor> = tensors
        .iter()
        .map(|t| {
            t.to_kind(Kind::Double)
                .to_device(Device::Cpu)
                .flatten(0, -1)
        })
        .collect();
    Vec::<f64>::try_from(Tensor::cat(&parts, 0)).unwrap()
}

fn run(fused: bool, seeds: usize, kind: Kind) -> Run {
    torch_ext::nn::set_fused_kernels(fused);
    let mut agg = GradAggregator::new(seeds.max(1), CUDA).unwrap();
    let total = list(1, kind, None);
    let first = list(2, kind, None);
    let lists: Vec<Vec<Tensor>> = (0..seeds)
        .map(|i| {
            if i == 0 {
                first.iter().map(Tensor::copy).collect()
            } else {
                list(
                    10 + i as i64,
                    kind,
                    (i % 2 == 1).then_some(first.as_slice()),
                )
            }
        })
        .collect();
    let out: Vec<Tensor> = total.iter().map(Tensor::zeros_like).collect();
    // Two steps: the metrics accumulate.
    for _ in 0..2 {
        agg.aggregate_total(&total, &lists, false, &out).unwrap();
    }
    let projected = flat(&[agg.projected_seeds().unwrap().unwrap()]);
    let metrics = agg.take_epoch_metrics().unwrap();
    torch_ext::nn::set_fused_kernels(true);
    Run {
        out: flat(&out),
        projected,
        metrics,
    }
}

fn worst(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1.0_f64, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / scale)
        .fold(0.0, f64::max)
}

#[test]
fn fused_pcgrad_matches_the_libtorch_path() {
    if !torch_ext::cuda::is_available() {
        println!("skipping fused_pcgrad_matches_the_libtorch_path: no CUDA device on this machine");
        return;
    }
    let mut failures = Vec::new();
    // f64 first: both paths take libtorch's f64 Gram matrix there, so the
    // kernels' arithmetic is compared alone and must agree to rounding. In
    // f32 the Gram matrices differ (the fixed-order f32 sums of torch-ext's
    // kernel against libtorch's product) and the projections' cancellation
    // carries that into the aggregate: a looser bound.
    for (kind, tol, share_tol) in [(Kind::Double, 1e-12, 1e-12), (Kind::Float, 1e-4, 1e-5)] {
        for seeds in [1_usize, 2, 3, 5, 16, 17] {
            let case = format!("{kind:?}, {seeds} seeds");
            let fused = run(true, seeds, kind);
            let libtorch = run(false, seeds, kind);
            let out = worst(&fused.out, &libtorch.out);
            let projected = worst(&fused.projected, &libtorch.projected);
            println!("{case}: aggregate off by {out:.3e}, projected seeds by {projected:.3e}");
            if out > tol {
                failures.push(format!("{case}: the aggregate is off by {out}"));
            }
            if projected > tol {
                failures.push(format!(
                    "{case}: the projected seeds are off by {projected}"
                ));
            }
            let (a, b) = (fused.metrics, libtorch.metrics);
            if (
                a.steps,
                a.pcgrad_steps,
                a.seed_pairs,
                a.conflicts,
                a.projections,
            ) != (
                b.steps,
                b.pcgrad_steps,
                b.seed_pairs,
                b.conflicts,
                b.projections,
            ) || (a.teacher_share - b.teacher_share).abs() > share_tol
            {
                failures.push(format!("{case}: metrics {a:?} against {b:?}"));
            }
            if seeds >= 3 && a.conflicts == 0 {
                failures.push(format!("{case}: the seeds were meant to conflict"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn fused_pcgrad_launches_its_kernels() {
    if !torch_ext::cuda::is_available() {
        println!("skipping fused_pcgrad_launches_its_kernels: no CUDA device on this machine");
        return;
    }
    let names = |fused: bool| {
        torch_ext::nn::set_fused_kernels(fused);
        let mut agg = GradAggregator::new(2, CUDA).unwrap();
        let total = list(1, Kind::Float, None);
        let seeds = vec![list(2, Kind::Float, None), list(3, Kind::Float, None)];
        let out: Vec<Tensor> = total.iter().map(Tensor::zeros_like).collect();
        agg.aggregate_total(&total, &seeds, false, &out).unwrap();
        torch_ext::cuda::synchronize(0).unwrap();
        let profiler = torch_ext::profile::KernelProfiler::start().unwrap();
        agg.aggregate_total(&total, &seeds, false, &out).unwrap();
        torch_ext::cuda::synchronize(0).unwrap();
        let profile = profiler.stop().unwrap();
        torch_ext::nn::set_fused_kernels(true);
        profile
    };
    let fused = names(true);
    let libtorch = names(false);
    let has = |profile: &torch_ext::profile::KernelProfile, name: &str| {
        profile.kernels.iter().any(|k| k.name.contains(name))
    };
    assert!(
        has(&fused, "esper_pcgrad_coefficients"),
        "{:?}",
        fused.kernels
    );
    assert!(
        has(&fused, "esper_weighted_rows_f32"),
        "{:?}",
        fused.kernels
    );
    assert!(!has(&libtorch, "esper_pcgrad_coefficients"));
    println!(
        "aggregation of two seeds: {} launches fused, {} on the libtorch path",
        fused.kernel_launches(),
        libtorch.kernel_launches()
    );
    assert!(fused.kernel_launches() < libtorch.kernel_launches());
}
