//! `torch_ext::nn::pooled_linear` on the GPU (part of the `gpu` test
//! binary): logits and every gradient against libtorch's mean and linear
//! (the fused kernels off; in f32 on the same values for a bf16 input),
//! f32 and bf16, the CNN host's head shapes and the limits; bit for bit the
//! same on a second run; the input gradient left out when the input needs
//! none and the parameter gradients when they need none; one kernel each
//! way; a replay from a captured graph with new input; wider layers and no
//! bias take libtorch's ops.

use tch::{Kind, Tensor};
use torch_ext::{AutocastDevice, AutocastGuard, CudaGraph, CudaStream, cuda, memory, nn};

use super::nn::worst_of_max;
use super::{CUDA, gpu_or_skip, kernels_of};

struct Case {
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    upstream: Tensor,
}

fn case(n: i64, c: i64, side: i64, k: i64, bf16: bool) -> Case {
    tch::manual_seed(n * 5 + c + k);
    let f32 = (Kind::Float, CUDA);
    let x =
        memory::contiguous_channels_last(&(Tensor::randn([n, c, side, side], f32) + 0.5)).unwrap();
    let x = if bf16 { x.to_kind(Kind::BFloat16) } else { x };
    Case {
        x,
        weight: Tensor::randn([k, c], f32) * (1.0 / (c as f64).sqrt()),
        bias: Tensor::randn([k], f32) * 0.2,
        upstream: Tensor::randn([n, k], f32),
    }
}

/// `[y, dx, dweight, dbias]` (a gradient undefined where it is not
/// wanted). A bf16 input runs under bf16 autocast, as the host's does.
fn run(case: &Case, fused: bool, input_grad: bool, weight_grad: bool) -> [Tensor; 4] {
    let _autocast = (case.x.kind() == Kind::BFloat16)
        .then(|| AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16).unwrap());
    nn::set_fused_kernels(fused);
    let x = case.x.detach().set_requires_grad(input_grad);
    let weight = case.weight.detach().set_requires_grad(weight_grad);
    let bias = case.bias.detach().set_requires_grad(weight_grad);
    let y = nn::pooled_linear(&x, &weight, Some(&bias)).unwrap();
    nn::set_fused_kernels(true);
    assert_eq!(y.kind(), x.kind(), "the logits keep the input's dtype");
    (y.to_kind(Kind::Float) * &case.upstream)
        .sum(Kind::Float)
        .backward();
    [y, x.grad(), weight.grad(), bias.grad()]
}

#[test]
fn pooled_linear_matches_libtorch_and_repeats() {
    let Some(_device) = gpu_or_skip() else { return };
    // (batch, channels, side, outputs): the fmnist and CIFAR hosts' heads,
    // odd sizes, a single pixel, and the kernels' limits (1024 channels,
    // 64 outputs), with more channels than a block has threads.
    let shapes = [
        (64_i64, 64_i64, 3_i64, 10_i64),
        (128, 128, 4, 10),
        (33, 7, 5, 3),
        (5, 300, 2, 64),
        (3, 1024, 1, 17),
        (1, 1, 1, 1),
    ];
    for bf16 in [false, true] {
        let bound = if bf16 { 2e-2 } else { 2e-5 };
        for (n, c, side, k) in shapes {
            let case = case(n, c, side, k, bf16);
            let fused = run(&case, true, true, true);
            let exact = Case {
                x: case.x.to_kind(Kind::Float),
                weight: case.weight.shallow_clone(),
                bias: case.bias.shallow_clone(),
                upstream: case.upstream.shallow_clone(),
            };
            let reference = run(&exact, false, true, true);
            let again = run(&case, true, true, true);
            let label = format!("bf16 {bf16} [{n}, {c}, {side}, {side}] outputs {k}");
            assert!(
                memory::is_channels_last(&fused[1]).unwrap(),
                "{label}: dx not channels-last"
            );
            for (name, ((got, expected), repeated)) in ["y", "dx", "dweight", "dbias"]
                .iter()
                .zip(fused.iter().zip(&reference).zip(&again))
            {
                let err = worst_of_max(got, expected);
                assert!(err <= bound, "{label} {name}: error {err} > {bound}");
                assert!(repeated.equal(got), "{label} {name}: not deterministic");
            }
            // A detached input: the same parameter gradients, no input
            // gradient; frozen parameters: the same input gradient only.
            let weights_only = run(&case, true, false, true);
            assert!(!weights_only[1].defined(), "{label}: an input gradient");
            assert!(weights_only[2].equal(&fused[2]) && weights_only[3].equal(&fused[3]));
            let input_only = run(&case, true, true, false);
            assert!(input_only[1].equal(&fused[1]), "{label}: dx");
            assert!(!input_only[2].defined() && !input_only[3].defined());
        }
    }
}

#[test]
fn pooled_linear_is_one_kernel_each_way_and_replays_from_a_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    let case = case(64, 64, 3, 10, false);
    let x = case.x.detach().set_requires_grad(true);
    let weight = case.weight.detach().set_requires_grad(true);
    let bias = case.bias.detach().set_requires_grad(true);
    let mut y = None;
    let forward = kernels_of(|| y = Some(nn::pooled_linear(&x, &weight, Some(&bias)).unwrap()));
    assert_eq!(
        forward,
        ["esper_pooled_linear_forward"],
        "forward: {forward:?}"
    );
    let y = y.unwrap();
    let upstream = case.upstream.shallow_clone();
    let backward = kernels_of(|| torch_ext::loss::backward_with(&y, &upstream).unwrap());
    assert_eq!(
        backward,
        ["esper_pooled_linear_backward"],
        "backward: {backward:?}"
    );

    let stream = CudaStream::from_pool(0, false).unwrap();
    let input = case.x.copy();
    let mut out = None;
    let graph = CudaGraph::capture(&stream, None, 1, || {
        out = Some(
            nn::pooled_linear(&input, &case.weight, Some(&case.bias)).map_err(|e| e.to_string())?,
        );
        Ok(())
    })
    .unwrap();
    let out = out.unwrap();
    let fresh =
        memory::contiguous_channels_last(&Tensor::randn([64, 64, 3, 3], (Kind::Float, CUDA)))
            .unwrap();
    input.shallow_clone().copy_(&fresh);
    graph.replay().unwrap();
    cuda::synchronize(0).unwrap();
    let expected = nn::pooled_linear(&fresh, &case.weight, Some(&case.bias)).unwrap();
    assert!(
        out.equal(&expected),
        "the replay did not read the new input"
    );

    // Wider than the kernels take, or no bias: libtorch's ops, the same
    // result.
    let wide = self::case(2, 1030, 2, 65, false);
    for (case, bias) in [(&wide, Some(&wide.bias)), (&case, None)] {
        let got = nn::pooled_linear(&case.x, &case.weight, bias).unwrap();
        nn::set_fused_kernels(false);
        let reference = nn::pooled_linear(&case.x, &case.weight, bias).unwrap();
        nn::set_fused_kernels(true);
        assert!(got.equal(&reference));
    }
}
