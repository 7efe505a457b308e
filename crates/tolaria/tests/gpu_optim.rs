//! The group optimizers on a CUDA device (run on the GPU machine; every test
//! prints a reason and returns when no CUDA device is present): a group's
//! step captured in a CUDA graph replays to the same numbers as eager steps,
//! a learning rate written between replays reaches the next replay without a
//! re-capture, and a rollback zeroes the state in place under a captured
//! graph.

use kasmina::groups::GroupKey;
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::SeedStage;
use tch::{Device, Kind, Tensor};
use tolaria::optim::{
    AdamWConfig, GroupOptimizer, GroupOptimizerConfig, GroupOptimizers, OptimizerConfig,
};
use torch_ext::{CudaGraph, CudaStream};

fn cuda_or_skip(test: &str) -> bool {
    if torch_ext::cuda::is_available() {
        true
    } else {
        println!("skipping {test}: no CUDA device on this machine");
        false
    }
}

/// A three-element parameter with the fixed gradient `[0.5, 1, -1]` on
/// `device`, and `config`'s state over it.
fn lone_group(config: GroupOptimizerConfig, device: Device) -> (Tensor, GroupOptimizer) {
    let parameter = Tensor::from_slice(&[1.0f32, -2.0, 0.5])
        .to_device(device)
        .set_requires_grad(true);
    let grad = Tensor::from_slice(&[0.5f32, 1.0, -1.0]).to_device(device);
    (&parameter * &grad).sum(Kind::Float).backward();
    let group = GroupOptimizer::new(
        GroupKey::Host,
        config,
        vec![parameter.shallow_clone()],
        device,
    )
    .expect("group");
    (parameter, group)
}

fn host_values(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&tensor.detach().to_device(Device::Cpu).reshape([-1])).expect("values")
}

fn assert_close(got: &[f32], expected: &[f32], tolerance: f32) {
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() <= tolerance, "{got:?} vs {expected:?}");
    }
}

/// Warm-up once, capture one step, replay `replays` times; returns the graph.
fn capture_step(group: &mut GroupOptimizer, replays: usize) -> CudaGraph {
    let stream = CudaStream::from_pool(0, false).expect("stream");
    let graph = CudaGraph::capture(&stream, None, 1, || group.step().map_err(|e| e.to_string()))
        .expect("capture");
    for _ in 0..replays {
        graph.replay().expect("replay");
    }
    torch_ext::cuda::synchronize(0).expect("sync");
    graph
}

#[test]
fn captured_group_steps_match_eager_steps_and_read_the_learning_rate_on_replay() {
    if !cuda_or_skip("captured_group_steps_match_eager_steps_and_read_the_learning_rate_on_replay")
    {
        return;
    }
    let configs = [
        GroupOptimizerConfig::sgd(0.1, 0.9),
        GroupOptimizerConfig::sgd(0.1, 0.0),
        GroupOptimizerConfig::AdamW(AdamWConfig {
            learning_rate: 0.01,
            ..AdamWConfig::default()
        }),
    ];
    for config in configs {
        // Eager on the CPU: three steps at the configured rate, then two at
        // twice that rate.
        let (cpu_parameter, mut cpu_group) = lone_group(config, Device::Cpu);
        for _ in 0..3 {
            cpu_group.step().expect("cpu step");
        }
        cpu_group
            .set_learning_rate(2.0 * config.learning_rate())
            .expect("cpu rate");
        for _ in 0..2 {
            cpu_group.step().expect("cpu step");
        }
        // CUDA: one warm-up step, then replays of one captured step.
        let (parameter, mut group) = lone_group(config, Device::Cuda(0));
        let graph = capture_step(&mut group, 2);
        assert_eq!(
            group.step_count_tensor().double_value(&[]),
            3.0,
            "{config:?}"
        );
        group
            .set_learning_rate(2.0 * config.learning_rate())
            .expect("cuda rate");
        for _ in 0..2 {
            graph.replay().expect("replay at the new rate");
        }
        torch_ext::cuda::synchronize(0).expect("sync");
        assert_eq!(
            group.step_count_tensor().double_value(&[]),
            5.0,
            "{config:?}"
        );
        assert_close(&host_values(&parameter), &host_values(&cpu_parameter), 1e-5);
        for (cuda, cpu) in group.state_tensors().iter().zip(cpu_group.state_tensors()) {
            assert_close(&host_values(cuda), &host_values(&cpu), 1e-5);
        }
    }
}

#[test]
fn a_rollback_zeroes_state_in_place_under_a_captured_step() {
    if !cuda_or_skip("a_rollback_zeroes_state_in_place_under_a_captured_step") {
        return;
    }
    tch::manual_seed(9);
    let device = Device::Cuda(0);
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 4,
            ..CnnHostConfig::fashion_mnist()
        },
        device,
    )
    .expect("host");
    let slot = SlotId::new(0, 0);
    let mut model =
        MorphogeneticModel::new(host, &[slot], SlotConfig::default(), Default::default())
            .expect("model");
    model
        .germinate(slot, "conv_light", GerminationOptions::new("seed"))
        .expect("germinate");
    assert!(
        model
            .advance_stage(slot, Some(SeedStage::Training))
            .expect("g1")
            .passed
    );
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optimizers");
    assert_eq!(optimizers.keys(), [GroupKey::Host, GroupKey::Seed(slot)]);
    let images = Tensor::randn([8, 1, 28, 28], (Kind::Float, device));
    let labels = Tensor::randint(10, [8], (Kind::Int64, device));
    model
        .forward(&images, true)
        .expect("forward")
        .cross_entropy_for_logits(&labels)
        .backward();
    let stream = CudaStream::from_pool(0, false).expect("stream");
    let graph = CudaGraph::capture(&stream, None, 1, || {
        optimizers.step().map_err(|e| e.to_string())
    })
    .expect("capture the step of every group");
    graph.replay().expect("replay");
    torch_ext::cuda::synchronize(0).expect("sync");
    optimizers.rollback().expect("rollback");
    for key in optimizers.keys() {
        let group = optimizers.group(key).expect("state");
        for tensor in group.state_tensors() {
            assert_eq!(tensor.abs().max().double_value(&[]), 0.0, "{key} zeroed");
        }
    }
    // The graph still points at the same buffers: one replay is a first
    // step again, leaving momentum = gradient.
    graph.replay().expect("replay after rollback");
    torch_ext::cuda::synchronize(0).expect("sync");
    for key in optimizers.keys() {
        let group = optimizers.group(key).expect("state");
        assert_eq!(group.step_count_tensor().double_value(&[]), 1.0);
        for (buffer, parameter) in group.state_tensors().iter().zip(group.parameters()) {
            let difference = (buffer - parameter.grad()).abs().max().double_value(&[]);
            assert!(difference < 1e-6, "{key}: momentum is the gradient again");
        }
    }
}
