//! `torch_ext::nn::squeeze_excite` on the GPU (part of the `gpu` test
//! binary): output and every gradient against libtorch's composition (the
//! fused kernels off; in f32 on the same values for a bf16 input), f32 and bf16, the attention seed's shapes and the
//! limits; bit for bit the same on a second run; the input gradient left
//! out when the input needs none (an isolated seed's detached input); one
//! kernel forward; a replay from a captured graph with new input; wider
//! layers take libtorch's ops.

use tch::{Kind, Tensor};
use torch_ext::{AutocastDevice, AutocastGuard, CudaGraph, CudaStream, cuda, memory, nn};

use super::nn::worst_of_max;
use super::{CUDA, gpu_or_skip, kernels_of};

struct Case {
    x: Tensor,
    w1: Tensor,
    w2: Tensor,
    b2: Tensor,
    upstream: Tensor,
}

fn case(n: i64, c: i64, side: i64, hidden: i64, bf16: bool) -> Case {
    tch::manual_seed(n * 7 + c + hidden);
    let f32 = (Kind::Float, CUDA);
    let x = memory::contiguous_channels_last(&(Tensor::randn([n, c, side, side], f32) * 2.0 + 0.3))
        .unwrap();
    let x = if bf16 { x.to_kind(Kind::BFloat16) } else { x };
    Case {
        x,
        w1: Tensor::randn([hidden, c], f32) * (1.0 / (c as f64).sqrt()),
        w2: Tensor::randn([c, hidden], f32) * (1.0 / (hidden as f64).sqrt()),
        b2: Tensor::randn([c], f32) * 0.2,
        upstream: Tensor::randn([n, c, side, side], f32),
    }
}

/// `[y, dx, dw1, dw2, db2]` (dx undefined where `input_grad` is false). A
/// bf16 input runs under bf16 autocast, as a seed's does (libtorch's
/// products take no bf16 input with f32 weights otherwise).
fn run(case: &Case, fused: bool, input_grad: bool) -> [Tensor; 5] {
    let _autocast = (case.x.kind() == Kind::BFloat16)
        .then(|| AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16).unwrap());
    nn::set_fused_kernels(fused);
    let x = case.x.detach().set_requires_grad(input_grad);
    let w1 = case.w1.detach().set_requires_grad(true);
    let w2 = case.w2.detach().set_requires_grad(true);
    let b2 = case.b2.detach().set_requires_grad(true);
    let y = nn::squeeze_excite(&x, &w1, &w2, &b2).unwrap();
    nn::set_fused_kernels(true);
    assert_eq!(y.kind(), x.kind(), "the output keeps the input's dtype");
    (y.to_kind(Kind::Float) * &case.upstream)
        .sum(Kind::Float)
        .backward();
    [y, x.grad(), w1.grad(), w2.grad(), b2.grad()]
}

#[test]
fn squeeze_excite_matches_libtorch_and_repeats() {
    let Some(_device) = gpu_or_skip() else { return };
    // (batch, channels, side, hidden): the attention seed at the CNN host's
    // 32-, 16- and 8-channel slots (C / 4 hidden), odd sizes, and the
    // kernels' limits (256 channels, 64 hidden units).
    let shapes = [
        (256_i64, 32_i64, 7_i64, 8_i64),
        (64, 16, 14, 4),
        (33, 8, 28, 2),
        (5, 12, 5, 3),
        (3, 256, 3, 64),
        (2, 1, 1, 1),
    ];
    for bf16 in [false, true] {
        // bf16: against libtorch in f32 on the same (bf16) input values;
        // the fused path keeps everything but its bf16 outputs in f32.
        let bound = if bf16 { 1e-2 } else { 2e-5 };
        for (n, c, side, hidden) in shapes {
            let case = case(n, c, side, hidden, bf16);
            let fused = run(&case, true, true);
            let exact = Case {
                x: case.x.to_kind(Kind::Float),
                w1: case.w1.shallow_clone(),
                w2: case.w2.shallow_clone(),
                b2: case.b2.shallow_clone(),
                upstream: case.upstream.shallow_clone(),
            };
            let reference = run(&exact, false, true);
            let again = run(&case, true, true);
            let label = format!("bf16 {bf16} [{n}, {c}, {side}, {side}] hidden {hidden}");
            for (name, ((got, expected), repeated)) in ["y", "dx", "dw1", "dw2", "db2"]
                .iter()
                .zip(fused.iter().zip(&reference).zip(&again))
            {
                let err = worst_of_max(got, expected);
                assert!(err <= bound, "{label} {name}: error {err} > {bound}");
                assert!(repeated.equal(got), "{label} {name}: not deterministic");
            }
            // A detached input: the same parameter gradients, no input
            // gradient.
            let weights_only = run(&case, true, false);
            assert!(!weights_only[1].defined(), "{label}: an input gradient");
            for k in 2..5 {
                assert!(
                    weights_only[k].equal(&fused[k]),
                    "{label}: parameter gradient {k}"
                );
            }
        }
    }
}

#[test]
fn squeeze_excite_is_one_kernel_forward_and_replays_from_a_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    let case = case(64, 32, 7, 8, false);
    let kernels = kernels_of(|| {
        let _ = nn::squeeze_excite(&case.x, &case.w1, &case.w2, &case.b2).unwrap();
    });
    assert_eq!(
        kernels,
        ["esper_se_forward"],
        "forward kernels: {kernels:?}"
    );

    let stream = CudaStream::from_pool(0, false).unwrap();
    let input = case.x.copy();
    let mut out = None;
    let graph = CudaGraph::capture(&stream, None, 1, || {
        out = Some(
            nn::squeeze_excite(&input, &case.w1, &case.w2, &case.b2).map_err(|e| e.to_string())?,
        );
        Ok(())
    })
    .unwrap();
    let out = out.unwrap();
    let fresh =
        memory::contiguous_channels_last(&Tensor::randn([64, 32, 7, 7], (Kind::Float, CUDA)))
            .unwrap();
    input.shallow_clone().copy_(&fresh);
    graph.replay().unwrap();
    cuda::synchronize(0).unwrap();
    let expected = nn::squeeze_excite(&fresh, &case.w1, &case.w2, &case.b2).unwrap();
    assert!(
        out.equal(&expected),
        "the replay did not read the new input"
    );

    // Wider than the kernels take: libtorch's ops, the same result.
    let wide = self::case(2, 260, 3, 65, false);
    let got = nn::squeeze_excite(&wide.x, &wide.w1, &wide.w2, &wide.b2).unwrap();
    nn::set_fused_kernels(false);
    let reference = nn::squeeze_excite(&wide.x, &wide.w1, &wide.w2, &wide.b2).unwrap();
    nn::set_fused_kernels(true);
    assert!(got.equal(&reference));
}
