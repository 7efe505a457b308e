//! torch-ext's AdamW kernels on the GPU (part of the `gpu` test binary):
//! `fused::adamw_step` on `f32` CUDA tensors against libtorch's
//! `_fused_adamw_` (the fused kernels turned off) over three steps, for a
//! learning rate given as a value and as a tensor, weight decay, maximize,
//! a grad scale with and without an inf, empty tensors, and more tensors
//! than one launch takes; that the step runs torch-ext's kernels and not
//! libtorch's; a replay from a captured graph with a new learning rate.

use tch::{Kind, Tensor};
use torch_ext::fused::{self, AdamWOptions, LearningRate};
use torch_ext::{CudaGraph, CudaStream, cuda, nn};

use super::{CUDA, gpu_or_skip};

/// One optimizer's tensors.
struct State {
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
    exp_avgs: Vec<Tensor>,
    exp_avg_sqs: Vec<Tensor>,
    steps: Vec<Tensor>,
}

impl State {
    fn new(sizes: &[i64], seed: i64) -> State {
        tch::manual_seed(seed);
        let on = (Kind::Float, CUDA);
        let params: Vec<Tensor> = sizes.iter().map(|&n| Tensor::randn([n], on)).collect();
        State {
            grads: sizes.iter().map(|&n| Tensor::randn([n], on)).collect(),
            exp_avgs: params.iter().map(Tensor::zeros_like).collect(),
            exp_avg_sqs: params.iter().map(Tensor::zeros_like).collect(),
            steps: params.iter().map(|_| Tensor::zeros([], on)).collect(),
            params,
        }
    }

    fn copy(&self) -> State {
        let deep = |list: &[Tensor]| list.iter().map(Tensor::copy).collect();
        State {
            params: deep(&self.params),
            grads: deep(&self.grads),
            exp_avgs: deep(&self.exp_avgs),
            exp_avg_sqs: deep(&self.exp_avg_sqs),
            steps: deep(&self.steps),
        }
    }

    fn step(&self, options: &AdamWOptions<'_>, fused_kernels: bool) {
        nn::set_fused_kernels(fused_kernels);
        let result = fused::adamw_step(
            &self.params,
            &self.grads,
            &self.exp_avgs,
            &self.exp_avg_sqs,
            &self.steps,
            options,
        );
        nn::set_fused_kernels(true);
        result.unwrap();
    }

    fn lists(&self) -> [(&'static str, &[Tensor]); 5] {
        [
            ("params", &self.params),
            ("grads", &self.grads),
            ("exp_avgs", &self.exp_avgs),
            ("exp_avg_sqs", &self.exp_avg_sqs),
            ("steps", &self.steps),
        ]
    }
}

/// The largest distance between two lists' values, relative to the larger
/// of 1 and the reference's largest magnitude.
fn worst(got: &[Tensor], expected: &[Tensor]) -> f64 {
    got.iter()
        .zip(expected)
        .filter(|(g, _)| g.numel() > 0)
        .map(|(g, e)| {
            let scale = e.abs().max().double_value(&[]).max(1.0);
            (g - e).abs().max().double_value(&[]) / scale
        })
        .fold(0.0, f64::max)
}

fn assert_same(case: &str, got: &State, expected: &State) {
    for ((name, g), (_, e)) in got.lists().into_iter().zip(expected.lists()) {
        let err = worst(g, e);
        assert!(err <= 1e-6, "{case}: {name} off libtorch's by {err}");
    }
}

#[test]
fn adamw_kernels_match_libtorch() {
    let Some(_device) = gpu_or_skip() else { return };
    let sizes = [1_i64, 3, 128, 0, 1000, 1024, 1025, 49_152, 65_543];
    let many: Vec<i64> = (0..45).map(|i| i * 37 + 1).collect();
    let lr = Tensor::from(3e-3_f32).to_device(CUDA);
    let scale = Tensor::from(1024.0_f32).to_device(CUDA);
    let no_inf = Tensor::from(0.0_f32).to_device(CUDA);
    let inf = Tensor::from(1.0_f32).to_device(CUDA);
    let cases: [(&str, &[i64], AdamWOptions<'_>); 5] = [
        ("lr value, weight decay", &sizes, AdamWOptions::default()),
        (
            "lr tensor, maximize, no weight decay",
            &sizes,
            AdamWOptions {
                lr: LearningRate::Tensor(&lr),
                weight_decay: 0.0,
                maximize: true,
                ..AdamWOptions::default()
            },
        ),
        (
            "grad scale, no inf",
            &sizes,
            AdamWOptions {
                grad_scale: Some(&scale),
                found_inf: Some(&no_inf),
                beta1: 0.8,
                beta2: 0.95,
                eps: 1e-6,
                ..AdamWOptions::default()
            },
        ),
        (
            "an inf found",
            &sizes,
            AdamWOptions {
                found_inf: Some(&inf),
                ..AdamWOptions::default()
            },
        ),
        ("45 tensors", &many, AdamWOptions::default()),
    ];
    for (index, (case, sizes, options)) in cases.iter().enumerate() {
        let ours = State::new(sizes, index as i64);
        let before = ours.copy();
        let theirs = ours.copy();
        for round in 0..3 {
            // New gradients each step, the same on both sides.
            tch::manual_seed(100 + round);
            for (a, b) in ours.grads.iter().zip(&theirs.grads) {
                let fresh = Tensor::randn(a.size(), (Kind::Float, CUDA)) * 1000.0;
                let (mut a, mut b) = (a.shallow_clone(), b.shallow_clone());
                a.copy_(&fresh);
                b.copy_(&fresh);
            }
            ours.step(options, true);
            theirs.step(options, false);
            assert_same(&format!("{case}, step {round}"), &ours, &theirs);
        }
        if options.found_inf == Some(&inf) {
            // Nothing moved, no step counted.
            assert_eq!(worst(&ours.params, &before.params), 0.0, "{case}");
            assert_eq!(worst(&ours.steps, &before.steps), 0.0, "{case}");
        } else {
            assert!(worst(&ours.params, &before.params) > 0.0, "{case}");
            let steps =
                Vec::<f32>::try_from(Tensor::stack(&ours.steps, 0).to_device(tch::Device::Cpu))
                    .unwrap();
            assert!(steps.iter().all(|&s| s == 3.0), "{case}: steps {steps:?}");
        }
    }
}

#[test]
fn adamw_runs_torch_exts_kernels_not_libtorchs() {
    let Some(_device) = gpu_or_skip() else { return };
    let state = State::new(&[128, 16_384, 49_152], 7);
    let names = |fused_kernels: bool| {
        state.step(&AdamWOptions::default(), fused_kernels);
        cuda::synchronize(0).unwrap();
        let profiler = torch_ext::profile::KernelProfiler::start().unwrap();
        state.step(&AdamWOptions::default(), fused_kernels);
        cuda::synchronize(0).unwrap();
        let profile = profiler.stop().unwrap();
        profile
            .kernels
            .iter()
            .filter(|stat| !stat.is_copy())
            .map(|stat| (stat.name.clone(), stat.count))
            .collect::<Vec<_>>()
    };
    let ours = names(true);
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert!(
        ours.iter()
            .any(|(name, count)| name.contains("esper_adamw") && *count == 1),
        "{ours:?}"
    );
    assert!(
        ours.iter()
            .any(|(name, count)| name.contains("esper_adamw_steps") && *count == 1),
        "{ours:?}"
    );
    let theirs = names(false);
    assert!(
        theirs.iter().all(|(name, _)| !name.contains("esper_adamw")),
        "{theirs:?}"
    );
}

#[test]
fn a_captured_adamw_step_replays_with_a_new_learning_rate() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let ours = State::new(&[1000, 3, 65_543], 11);
    let theirs = ours.copy();
    let lr = Tensor::from(1e-3_f32).to_device(CUDA);
    let options = AdamWOptions {
        lr: LearningRate::Tensor(&lr),
        ..AdamWOptions::default()
    };
    let warmup = 2;
    let graph = CudaGraph::capture(&stream, None, warmup, || {
        fused::adamw_step(
            &ours.params,
            &ours.grads,
            &ours.exp_avgs,
            &ours.exp_avg_sqs,
            &ours.steps,
            &options,
        )
        .map_err(|e| e.to_string())
    })
    .unwrap();
    // The warm-up ran the step for real: mirror it with libtorch's.
    for _ in 0..warmup {
        theirs.step(&options, false);
    }
    for rate in [1e-3_f64, 5e-3, 0.0] {
        let mut lr_static = lr.shallow_clone();
        let _filled = lr_static.f_fill_(rate).unwrap();
        graph.replay().unwrap();
        cuda::synchronize(0).unwrap();
        theirs.step(&options, false);
        assert_same(&format!("replay at lr {rate}"), &ours, &theirs);
    }
}
