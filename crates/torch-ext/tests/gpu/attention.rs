//! `torch_ext::nn::causal_attention`'s own kernels against libtorch's
//! fused attention: the output and the projection's gradient, against an
//! `f32` computation (no further from it than libtorch's own `bf16` path),
//! bit-identical reruns, the kernels actually launched, inference mode, a
//! captured replay, and what falls back.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, nn};

use super::{CUDA, backward_kernels, gpu_or_skip, values};

/// Output and `qkv`'s gradient (both `f32`) of one forward and backward,
/// with the kernel names the backward launched.
fn attention_run(qkv: &Tensor, heads: i64, up: &Tensor, fused: bool) -> ([Tensor; 2], Vec<String>) {
    nn::set_fused_kernels(fused);
    let qkv = qkv.detach().set_requires_grad(true);
    let out = nn::causal_attention(&qkv, heads).unwrap();
    let loss = (out.to_kind(Kind::Float) * up).sum(Kind::Float);
    let names = backward_kernels(&loss)
        .into_iter()
        .map(|k| k.name)
        .collect();
    nn::set_fused_kernels(true);
    (
        [out.to_kind(Kind::Float), qkv.grad().to_kind(Kind::Float)],
        names,
    )
}

fn max_abs(t: &Tensor) -> f32 {
    values(&t.abs().max())[0]
}

#[test]
fn causal_attention_matches_libtorch_in_one_kernel_each_way() {
    let Some(_device) = gpu_or_skip() else { return };
    // (batch, time, heads, head width): the LM host's, a ragged length,
    // one position, and narrow heads.
    let cases = [
        (16, 64, 4, 32),
        (3, 37, 2, 32),
        (5, 1, 4, 32),
        (4, 50, 3, 16),
    ];
    for (batch, time, heads, head_dim) in cases {
        let case = format!("B {batch} T {time} heads {heads} D {head_dim}");
        tch::manual_seed(batch * 1000 + time);
        let width = heads * head_dim;
        let qkv = (Tensor::randn([batch, time, 3 * width], (Kind::Float, CUDA)) * 1.5)
            .to_kind(Kind::BFloat16);
        let up = Tensor::randn([batch, time, width], (Kind::Float, CUDA));
        let (own, own_kernels) = attention_run(&qkv, heads, &up, true);
        let (again, _) = attention_run(&qkv, heads, &up, true);
        let (libtorch, libtorch_kernels) = attention_run(&qkv, heads, &up, false);
        // The f32 reference: libtorch's composition on the f32 values.
        let (exact, _) = attention_run(&qkv.to_kind(Kind::Float), heads, &up, false);
        assert!(
            own_kernels
                .iter()
                .any(|n| n.contains("esper_attention_backward")),
            "{case}: the own backward ran: {own_kernels:?}"
        );
        assert!(
            !own_kernels
                .iter()
                .any(|n| n.contains("sdpa") || n.contains("fmha") || n.contains("CatArray")),
            "{case}: no libtorch attention or concatenation in the own backward: {own_kernels:?}"
        );
        assert!(
            !libtorch_kernels
                .iter()
                .any(|n| n.contains("esper_attention")),
            "{case}: the fused kernels off means libtorch's path"
        );
        for (index, what) in ["output", "qkv gradient"].iter().enumerate() {
            assert_eq!(
                values(&own[index]),
                values(&again[index]),
                "{case}: {what} is bit-identical on a rerun"
            );
            let scale = max_abs(&exact[index]).max(1e-3);
            let own_error = max_abs(&(&own[index] - &exact[index])) / scale;
            let libtorch_error = max_abs(&(&libtorch[index] - &exact[index])) / scale;
            println!("{case} {what}: own {own_error:.2e}, libtorch bf16 {libtorch_error:.2e}");
            assert!(
                own_error <= 2.0 * libtorch_error + 4e-3,
                "{case}: {what} error {own_error} against libtorch bf16's {libtorch_error}"
            );
        }
    }
}

#[test]
fn causal_attention_runs_in_inference_mode_and_replays_from_a_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    tch::manual_seed(7);
    let (batch, time, heads, width) = (8_i64, 64_i64, 4_i64, 128_i64);
    let qkv = Tensor::randn([batch, time, 3 * width], (Kind::BFloat16, CUDA));
    let with_grad = nn::causal_attention(&qkv.detach().set_requires_grad(true), heads)
        .unwrap()
        .detach();
    let inference = tch::no_grad(|| nn::causal_attention(&qkv, heads).unwrap());
    assert_eq!(values(&inference), values(&with_grad));
    // A captured forward and backward replays on a new input copied into
    // its buffer, as eager runs it.
    let up = Tensor::randn([batch, time, width], (Kind::Float, CUDA));
    let run = |x: &Tensor| -> Result<(Tensor, Tensor), String> {
        let x = x.detach().set_requires_grad(true);
        let y = nn::causal_attention(&x, heads).map_err(|e| e.to_string())?;
        (y.to_kind(Kind::Float) * &up).sum(Kind::Float).backward();
        Ok((y, x.grad()))
    };
    let input = qkv.copy();
    let out = Tensor::zeros([batch, time, width], (Kind::BFloat16, CUDA));
    let grad = Tensor::zeros([batch, time, 3 * width], (Kind::BFloat16, CUDA));
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, || {
        let (y, dx) = run(&input)?;
        out.shallow_clone().copy_(&y);
        grad.shallow_clone().copy_(&dx);
        Ok(())
    })
    .unwrap();
    let fresh = Tensor::randn([batch, time, 3 * width], (Kind::BFloat16, CUDA));
    input.shallow_clone().copy_(&fresh);
    graph.replay().unwrap();
    stream.synchronize().unwrap();
    cuda::synchronize(0).unwrap();
    let (y, dx) = run(&fresh).unwrap();
    assert_eq!(values(&out), values(&y));
    assert_eq!(values(&grad), values(&dx));
}

#[test]
fn causal_attention_falls_back_and_refuses_bad_shapes() {
    let Some(_device) = gpu_or_skip() else { return };
    tch::manual_seed(3);
    // Longer than the kernels take, and f32: libtorch's path, same result
    // as the composition it stands for.
    for (time, kind) in [(65_i64, Kind::BFloat16), (16, Kind::Float)] {
        let qkv = Tensor::randn([2, time, 96], (kind, CUDA));
        let got = nn::causal_attention(&qkv, 2).unwrap();
        nn::set_fused_kernels(false);
        let expected = nn::causal_attention(&qkv, 2).unwrap();
        nn::set_fused_kernels(true);
        assert_eq!(got.size(), [2, time, 32]);
        assert_eq!(values(&got), values(&expected), "T {time} {kind:?}");
    }
    let qkv = Tensor::randn([2, 8, 96], (Kind::BFloat16, CUDA));
    for (tensor, heads) in [
        (qkv.shallow_clone(), 0),
        (qkv.shallow_clone(), 5),
        (qkv.view([16, 96]), 2),
    ] {
        let error = nn::causal_attention(&tensor, heads).unwrap_err();
        assert!(
            matches!(error, torch_ext::Error::InvalidArgument { .. }),
            "{error}"
        );
    }
}
