//! torch-ext's SGD kernel on the GPU (part of the `gpu` test binary):
//! `fused::sgd_step_groups` on `f32` CUDA tensors against libtorch's
//! `_fused_sgd_` a group and `_foreach_add_` of the step counts (the fused
//! kernels turned off) over three steps, for groups with and without
//! momentum, Nesterov, dampening, weight decay, maximize, the first step, a
//! learning rate as a value and as a tensor, a grad scale, a found-inf flag
//! that skips one group, an empty tensor, and channels-last weights; that the step is one launch
//! of torch-ext's kernel; a replay from a captured graph with a new
//! learning rate.

use tch::{Kind, Tensor};
use torch_ext::fused::{self, LearningRate, SgdGroup, SgdOptions};
use torch_ext::{CudaGraph, CudaStream, cuda, memory, nn};

use super::{CUDA, gpu_or_skip, kernels_of};

/// Three groups' tensors and the step counts.
struct State {
    params: [Vec<Tensor>; 3],
    grads: [Vec<Tensor>; 3],
    buffers: [Vec<Tensor>; 3],
    counts: Vec<Tensor>,
    lr: Tensor,
    scale: Tensor,
    skip: Tensor,
}

impl State {
    fn new() -> State {
        tch::manual_seed(21);
        let on = (Kind::Float, CUDA);
        let sizes: [&[i64]; 3] = [&[300, 9, 1025], &[64, 0, 7], &[2049, 5]];
        let make =
            |scale: f64| sizes.map(|s| s.iter().map(|&n| Tensor::randn([n], on) * scale).collect());
        let mut params: [Vec<Tensor>; 3] = make(1.0);
        let mut grads = make(0.5);
        // A channels-last conv weight (not contiguous) in the groups with
        // momentum, its gradient and buffer in its layout.
        for g in 0..2 {
            let weight = |scale: f64| {
                memory::contiguous_channels_last(&(Tensor::randn([16, 8, 3, 3], on) * scale))
                    .unwrap()
            };
            params[g].push(weight(1.0));
            grads[g].push(weight(0.5));
        }
        assert!(!params[0].last().unwrap().is_contiguous());
        // Group 2 has no momentum: no buffers.
        let buffers = [
            params[0].iter().map(Tensor::zeros_like).collect(),
            params[1]
                .iter()
                .map(|p| Tensor::randn_like(p) * 0.1)
                .collect(),
            Vec::new(),
        ];
        State {
            params,
            grads,
            buffers,
            counts: (0..3).map(|_| Tensor::zeros([], on)).collect(),
            lr: Tensor::full([], 0.05, on),
            scale: Tensor::full([], 4.0, on),
            skip: Tensor::zeros([], on),
        }
    }

    fn copy(&self) -> State {
        let deep = |lists: &[Vec<Tensor>; 3]| -> [Vec<Tensor>; 3] {
            std::array::from_fn(|g| lists[g].iter().map(Tensor::copy).collect())
        };
        State {
            params: deep(&self.params),
            grads: deep(&self.grads),
            buffers: deep(&self.buffers),
            counts: self.counts.iter().map(Tensor::copy).collect(),
            lr: self.lr.copy(),
            scale: self.scale.copy(),
            skip: self.skip.copy(),
        }
    }

    fn groups(&self, first_step: bool) -> Vec<SgdGroup<'_>> {
        let options = [
            SgdOptions {
                lr: LearningRate::Tensor(&self.lr),
                momentum: 0.9,
                is_first_step: first_step,
                ..SgdOptions::default()
            },
            SgdOptions {
                lr: LearningRate::Value(0.02),
                momentum: 0.8,
                dampening: 0.1,
                nesterov: true,
                weight_decay: 1e-3,
                found_inf: Some(&self.skip),
                ..SgdOptions::default()
            },
            SgdOptions {
                lr: LearningRate::Value(0.1),
                weight_decay: 5e-4,
                maximize: true,
                grad_scale: Some(&self.scale),
                ..SgdOptions::default()
            },
        ];
        (0..3)
            .map(|g| SgdGroup {
                params: &self.params[g],
                grads: &self.grads[g],
                momentum_buffers: &self.buffers[g],
                options: options[g],
            })
            .collect()
    }

    fn step(&self, first_step: bool, fused_kernels: bool) {
        nn::set_fused_kernels(fused_kernels);
        let result = fused::sgd_step_groups(&self.groups(first_step), &self.counts);
        nn::set_fused_kernels(true);
        result.unwrap();
    }

    fn all(&self) -> Vec<(String, &Tensor)> {
        let mut out = Vec::new();
        for (name, lists) in [
            ("param", &self.params),
            ("grad", &self.grads),
            ("buffer", &self.buffers),
        ] {
            for (g, list) in lists.iter().enumerate() {
                for (i, t) in list.iter().enumerate() {
                    out.push((format!("{name} {g}.{i}"), t));
                }
            }
        }
        for (i, t) in self.counts.iter().enumerate() {
            out.push((format!("count {i}"), t));
        }
        out
    }
}

/// The largest distance between two tensors, relative to the larger of 1
/// and the reference's largest magnitude.
fn distance(got: &Tensor, expected: &Tensor) -> f64 {
    if got.numel() == 0 {
        return 0.0;
    }
    let scale = expected.abs().max().double_value(&[]).max(1.0);
    (got - expected).abs().max().double_value(&[]) / scale
}

#[test]
fn sgd_step_groups_matches_libtorchs_fused_sgd() {
    let Some(_device) = gpu_or_skip() else { return };
    let ours = State::new();
    let reference = ours.copy();
    for step in 0..3 {
        // Group 1 skipped on the second step.
        let skip = if step == 1 { 1.0 } else { 0.0 };
        for state in [&ours, &reference] {
            let _ = state.skip.shallow_clone().fill_(skip);
        }
        ours.step(step == 0, true);
        reference.step(step == 0, false);
        let mut bit_equal = true;
        for ((name, got), (_, expected)) in ours.all().into_iter().zip(reference.all()) {
            let error = distance(got, expected);
            bit_equal &= got.equal(expected);
            assert!(error <= 1e-6, "step {step} {name}: {error}");
        }
        println!("step {step}: bit-equal to libtorch: {bit_equal}");
    }
    for count in &ours.counts {
        assert_eq!(
            count.double_value(&[]),
            3.0,
            "every count advanced each step"
        );
    }
}

#[test]
fn sgd_step_groups_is_one_launch_and_replays_a_new_learning_rate() {
    let Some(_device) = gpu_or_skip() else { return };
    let state = State::new();
    let kernels = kernels_of(|| state.step(false, true));
    assert_eq!(kernels, ["esper_sgd"], "kernels: {kernels:?}");

    let ours = State::new();
    let reference = ours.copy();
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, || {
        fused::sgd_step_groups(&ours.groups(false), &ours.counts).map_err(|e| e.to_string())
    })
    .unwrap();
    for lr in [0.05, 0.3] {
        let _ = ours.lr.shallow_clone().fill_(lr);
        let _ = reference.lr.shallow_clone().fill_(lr);
        graph.replay().unwrap();
        stream.synchronize().unwrap();
        cuda::synchronize(0).unwrap();
        reference.step(false, false);
        for ((name, got), (_, expected)) in ours.all().into_iter().zip(reference.all()) {
            let error = distance(got, expected);
            assert!(error <= 1e-6, "replay at lr {lr}, {name}: {error}");
        }
    }
}
