//! `torch_ext::nn::layer_norm` against libtorch's `layer_norm` on the GPU
//! (part of the `gpu` test binary): output and every gradient in f32 and
//! bf16, the transformer host's rows, narrow and the widest rows, a mean far
//! from zero, the widths that fall back to libtorch, determinism, autocast,
//! a replay from a captured graph, `layer_norm_bf16` as the cast of
//! `layer_norm` bit for bit, and `layer_norm_fork` adding the stream's
//! gradient in its own kernel. The tests hold the binary's device
//! lock, since they flip the process-wide fused switch.

use tch::{Kind, Tensor};
use torch_ext::{AutocastDevice, AutocastGuard, CudaGraph, CudaStream, cuda, nn};

use super::nn::{assert_matches_and_repeats, worst_of_max};
use super::{CUDA, backward_kernels, gpu_or_skip, values};

/// One layer-norm forward and backward against a seeded upstream gradient;
/// returns (y, dx, dweight, dbias) as f32.
fn ln_run(x: &Tensor, seed: i64, fused: bool) -> [Tensor; 4] {
    nn::set_fused_kernels(fused);
    let width = *x.size().last().unwrap();
    let f32 = (Kind::Float, CUDA);
    let x = x.detach().set_requires_grad(true);
    tch::manual_seed(seed);
    let weight = (Tensor::rand([width], f32) + 0.5).set_requires_grad(true);
    let bias = (Tensor::randn([width], f32) * 0.3).set_requires_grad(true);
    let y = nn::layer_norm(&x, &weight, &bias, 1e-5).unwrap();
    assert_eq!(y.kind(), x.kind(), "the output keeps the input's dtype");
    assert_eq!(y.size(), x.size());
    let upstream = Tensor::randn(y.size(), f32);
    (y.to_kind(Kind::Float) * &upstream)
        .sum(Kind::Float)
        .backward();
    nn::set_fused_kernels(true);
    [
        y.to_kind(Kind::Float),
        x.grad().to_kind(Kind::Float),
        weight.grad(),
        bias.grad(),
    ]
}

#[test]
fn layer_norm_matches_libtorch() {
    let Some(_device) = gpu_or_skip() else { return };
    // (shape, offset): the LM host's rows ([128, 64, 128]), a width a warp
    // covers in part (36), the widest fused rows (512), rows not a
    // multiple of the block's warps, a mean far from zero, and widths that
    // take libtorch's op (not a multiple of four; wider than 512), which in
    // bf16 refuses an f32 weight as libtorch does.
    let cases: [(&[i64], f64); 8] = [
        (&[128, 64, 128], 0.0),
        (&[7, 36], 0.0),
        (&[3, 5, 512], 0.0),
        (&[1001, 64], 0.0),
        (&[33, 128], 50.0),
        (&[4, 4], 0.0),
        (&[6, 130], 0.0),
        (&[5, 768], 0.0),
    ];
    for bf16 in [false, true] {
        for (shape, offset) in cases {
            tch::manual_seed(shape.iter().sum::<i64>());
            let x = Tensor::randn(shape, (Kind::Float, CUDA)) * 2.0 + offset;
            let x = if bf16 { x.to_kind(Kind::BFloat16) } else { x };
            let width = *shape.last().unwrap();
            if bf16 && (width % 4 != 0 || width > nn::MAX_FUSED_LAYER_NORM_WIDTH) {
                // libtorch's op, which wants the weight in the input's
                // dtype outside autocast: its clear error, not a crash.
                let f32 = (Kind::Float, CUDA);
                let (weight, bias) = (Tensor::ones([width], f32), Tensor::zeros([width], f32));
                assert!(
                    nn::layer_norm(&x, &weight, &bias, 1e-5).is_err(),
                    "{shape:?}"
                );
                continue;
            }
            let fused = ln_run(&x, 5, true);
            // The reference runs in f32 on the same (bf16-rounded) values.
            let reference = ln_run(&x.to_kind(Kind::Float), 5, false);
            let bound = if bf16 { 3e-2 } else { 2e-3 };
            let again = ln_run(&x, 5, true);
            let case = format!("bf16 {bf16} {shape:?} offset {offset}");
            assert_matches_and_repeats(&case, &fused, &reference, &again, bound);
        }
    }
}

#[test]
fn layer_norm_under_autocast_returns_f32_as_libtorch_does() {
    let Some(_device) = gpu_or_skip() else { return };
    let f32 = (Kind::Float, CUDA);
    let weight = Tensor::ones([128], f32);
    let bias = Tensor::zeros([128], f32);
    let _guard = AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16).unwrap();
    for kind in [Kind::Float, Kind::BFloat16] {
        let x = Tensor::randn([16, 128], f32).to_kind(kind);
        let y = nn::layer_norm(&x, &weight, &bias, 1e-5).unwrap();
        let expected = x
            .layer_norm([128].as_slice(), Some(&weight), Some(&bias), 1e-5, true)
            .to_kind(Kind::Float);
        assert_eq!(y.kind(), Kind::Float, "{kind:?} input under autocast");
        assert!(worst_of_max(&y, &expected) <= 2e-3, "{kind:?} input");
    }
}

#[test]
fn layer_norm_replays_from_a_captured_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    let f32 = (Kind::Float, CUDA);
    let x = Tensor::randn([256, 128], f32);
    let weight = (Tensor::rand([128], f32) + 0.5).set_requires_grad(true);
    let bias = Tensor::zeros([128], f32).set_requires_grad(true);
    let eager = {
        let input = x.detach().set_requires_grad(true);
        let y = nn::layer_norm(&input, &weight, &bias, 1e-5).unwrap();
        (&y * &y).sum(Kind::Float).backward();
        (values(&y), values(&input.grad()))
    };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let out = Tensor::zeros([256, 128], f32);
    let grad = Tensor::zeros([256, 128], f32);
    let graph = CudaGraph::capture(&stream, None, 0, || {
        let input = x.detach().set_requires_grad(true);
        let y = nn::layer_norm(&input, &weight, &bias, 1e-5).map_err(|e| e.to_string())?;
        (&y * &y).sum(Kind::Float).backward();
        out.shallow_clone().copy_(&y);
        grad.shallow_clone().copy_(&input.grad());
        Ok(())
    })
    .unwrap();
    graph.replay().unwrap();
    stream.synchronize().unwrap();
    cuda::synchronize(0).unwrap();
    assert_eq!(values(&out), eager.0);
    assert_eq!(values(&grad), eager.1);
}

/// `layer_norm_bf16` against `layer_norm` and a cast: (y, dx, dweight,
/// dbias) as f32, from a bf16 upstream gradient.
fn ln_bf16_run(x: &Tensor, own: bool) -> [Tensor; 4] {
    let width = *x.size().last().unwrap();
    let f32 = (Kind::Float, CUDA);
    let x = x.detach().set_requires_grad(true);
    tch::manual_seed(width);
    let weight = (Tensor::rand([width], f32) + 0.5).set_requires_grad(true);
    let bias = (Tensor::randn([width], f32) * 0.3).set_requires_grad(true);
    let y = if own {
        nn::layer_norm_bf16(&x, &weight, &bias, 1e-5).unwrap()
    } else {
        nn::layer_norm(&x, &weight, &bias, 1e-5)
            .unwrap()
            .to_kind(Kind::BFloat16)
    };
    assert_eq!(y.kind(), Kind::BFloat16);
    let upstream = Tensor::randn(y.size(), (Kind::BFloat16, CUDA));
    torch_ext::loss::backward_with(&y, &upstream).unwrap();
    [y.to_kind(Kind::Float), x.grad(), weight.grad(), bias.grad()]
}

#[test]
fn the_bf16_output_layer_norm_is_the_cast_of_layer_norm_bit_for_bit() {
    let Some(_device) = gpu_or_skip() else { return };
    // The LM host's rows, under autocast and outside; a mean far from
    // zero; a width that takes libtorch's op and a cast.
    for (shape, offset) in [
        (&[128_i64, 64, 128][..], 0.0),
        (&[33, 128], 50.0),
        (&[1001, 64], 0.0),
        (&[6, 130], 0.0),
    ] {
        for autocast in [false, true] {
            tch::manual_seed(shape.iter().sum::<i64>());
            let x = Tensor::randn(shape, (Kind::Float, CUDA)) + offset;
            let _autocast =
                autocast.then(|| AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16).unwrap());
            let own = ln_bf16_run(&x, true);
            let reference = ln_bf16_run(&x, false);
            for (index, (a, b)) in own.iter().zip(&reference).enumerate() {
                assert_eq!(
                    values(a),
                    values(b),
                    "{shape:?} autocast {autocast}: tensor {index}"
                );
            }
        }
    }
    // A bf16 input stays on the bf16 kernels with a bf16 output.
    let x = Tensor::randn([64, 128], (Kind::BFloat16, CUDA));
    let w = Tensor::ones([128], (Kind::Float, CUDA));
    let b = Tensor::zeros([128], (Kind::Float, CUDA));
    let y = nn::layer_norm_bf16(&x, &w, &b, 1e-5).unwrap();
    assert!(y.equal(&nn::layer_norm(&x, &w, &b, 1e-5).unwrap()));
}

/// One forked layer norm, `(pass, y) = layer_norm_fork(x)`, with a seeded
/// upstream gradient on both outputs; returns (y, dx, dweight, dbias) as
/// f32 and the `CUDAFunctor_add` launches of the backward.
fn fork_run(x: &Tensor, bf16_out: bool, fused: bool) -> ([Tensor; 4], u64) {
    nn::set_fused_kernels(fused);
    let width = *x.size().last().unwrap();
    let f32 = (Kind::Float, CUDA);
    let x = x.detach().set_requires_grad(true);
    tch::manual_seed(width);
    let weight = (Tensor::rand([width], f32) + 0.5).set_requires_grad(true);
    let bias = (Tensor::randn([width], f32) * 0.3).set_requires_grad(true);
    let (pass, y) = nn::layer_norm_fork(&x, &weight, &bias, 1e-5, bf16_out).unwrap();
    assert_eq!(pass.size(), x.size());
    assert_eq!(y.kind(), if bf16_out { Kind::BFloat16 } else { x.kind() });
    assert_eq!(values(&pass), values(&x), "the pass-through is x");
    let up_pass = Tensor::randn(x.size(), f32);
    let up_y = Tensor::randn(y.size(), f32);
    let loss =
        (&pass * &up_pass).sum(Kind::Float) + (y.to_kind(Kind::Float) * &up_y).sum(Kind::Float);
    let kernels = backward_kernels(&loss);
    nn::set_fused_kernels(true);
    let adds = kernels
        .iter()
        .filter(|k| k.name.contains("CUDAFunctor_add"))
        .map(|k| k.count)
        .sum();
    (
        [
            y.to_kind(Kind::Float),
            x.grad().to_kind(Kind::Float),
            weight.grad(),
            bias.grad(),
        ],
        adds,
    )
}

#[test]
fn the_forked_layer_norm_adds_the_streams_gradient_in_its_own_kernel() {
    let Some(_device) = gpu_or_skip() else { return };
    // The LM host's rows, a partial warp's width and the widest rows.
    let shapes: [&[i64]; 3] = [&[128, 64, 128], &[7, 36], &[3, 5, 512]];
    for bf16_out in [false, true] {
        for shape in shapes {
            tch::manual_seed(shape.iter().sum::<i64>());
            let x = Tensor::randn(shape, (Kind::Float, CUDA)) * 2.0;
            let (fused, fused_adds) = fork_run(&x, bf16_out, true);
            let (reference, reference_adds) = fork_run(&x, bf16_out, false);
            let (again, _) = fork_run(&x, bf16_out, true);
            let case = format!("fork {shape:?} bf16_out {bf16_out}");
            assert_eq!(
                fused_adds, 0,
                "{case}: no separate sum of the two gradients"
            );
            assert!(
                reference_adds >= 1,
                "{case}: libtorch's path sums them apart"
            );
            let bound = if bf16_out { 2e-2 } else { 2e-3 };
            assert_matches_and_repeats(&case, &fused, &reference, &again, bound);
        }
    }
    // Without a gradient for the layer norm's output, the input's gradient
    // is the stream's alone.
    let x = Tensor::randn([64, 128], (Kind::Float, CUDA)).set_requires_grad(true);
    let f32 = (Kind::Float, CUDA);
    let (weight, bias) = (Tensor::ones([128], f32), Tensor::zeros([128], f32));
    let (pass, _y) = nn::layer_norm_fork(&x, &weight, &bias, 1e-5, false).unwrap();
    let up = Tensor::randn([64, 128], f32);
    (&pass * &up).sum(Kind::Float).backward();
    assert_eq!(values(&x.grad()), values(&up));
}
