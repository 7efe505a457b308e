//! `torch_ext::nn::linear` against libtorch's `linear` on the GPU (part of
//! the `gpu` test binary): output and every gradient in f32, in bf16 and
//! under bf16 autocast, with and without a bias, the transformer host's
//! layers, the narrowest and widest outputs its own backward takes and
//! widths that fall back to libtorch, the gradients' dtypes, determinism,
//! an input that wants no gradient, a replay from a captured graph, and the
//! bf16 weight-and-bias gradient kernel against exact sums. The
//! tests hold the binary's device lock, since they flip the process-wide
//! fused switch.

use tch::{Kind, Tensor};
use torch_ext::{AutocastDevice, AutocastGuard, CudaGraph, CudaStream, cuda, nn};

use super::nn::{assert_matches_and_repeats, worst_of_max};
use super::{CUDA, backward_kernels, gpu_or_skip, values};

/// How a case computes: f32 throughout, bf16 throughout, or f32
/// parameters under bf16 autocast.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Precision {
    F32,
    Bf16,
    Autocast,
}

/// One linear forward and backward against a seeded upstream gradient;
/// returns (y, dx, dweight, dbias) as f32, after checking the gradients'
/// dtypes are the parameters'.
fn linear_run(x: &Tensor, out: i64, bias: bool, precision: Precision, fused: bool) -> [Tensor; 4] {
    nn::set_fused_kernels(fused);
    let inputs = *x.size().last().unwrap();
    let param_kind = if precision == Precision::Bf16 {
        Kind::BFloat16
    } else {
        Kind::Float
    };
    let x = x.detach().set_requires_grad(true);
    tch::manual_seed(out + inputs);
    let f32 = (Kind::Float, CUDA);
    let weight = (Tensor::randn([out, inputs], f32) * 0.1)
        .to_kind(param_kind)
        .set_requires_grad(true);
    let b = bias.then(|| {
        (Tensor::randn([out], f32) * 0.3)
            .to_kind(param_kind)
            .set_requires_grad(true)
    });
    let y = {
        let _autocast = (precision == Precision::Autocast)
            .then(|| AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16).unwrap());
        nn::linear(&x, &weight, b.as_ref()).unwrap()
    };
    let upstream = Tensor::randn(y.size(), f32);
    (y.to_kind(Kind::Float) * &upstream)
        .sum(Kind::Float)
        .backward();
    nn::set_fused_kernels(true);
    assert_eq!(x.grad().kind(), x.kind(), "the input gradient's dtype");
    assert_eq!(
        weight.grad().kind(),
        param_kind,
        "the weight gradient's dtype"
    );
    let dbias = match &b {
        Some(b) => {
            assert_eq!(b.grad().kind(), param_kind, "the bias gradient's dtype");
            b.grad().to_kind(Kind::Float)
        }
        None => Tensor::zeros([1], f32),
    };
    [
        y.to_kind(Kind::Float),
        x.grad().to_kind(Kind::Float),
        weight.grad().to_kind(Kind::Float),
        dbias,
    ]
}

#[test]
fn linear_matches_libtorch() {
    let Some(_device) = gpu_or_skip() else { return };
    // (input shape, outputs, bias): the LM host's qkv, projection and MLP
    // layers over its [128, 64, 128] activations, the narrowest (4) and
    // widest (1024) outputs of the own backward, rows not a multiple of a
    // block pass, no bias, and outputs that take libtorch's op (not a
    // multiple of four; wider than 1024).
    let cases: [(&[i64], i64, bool); 9] = [
        (&[128, 64, 128], 384, true),
        (&[128, 64, 128], 512, true),
        (&[128, 64, 512], 128, true),
        (&[7, 36], 4, true),
        (&[3, 5, 64], 1024, true),
        (&[1001, 64], 128, false),
        (&[33, 20], 12, true),
        (&[6, 16], 6, true),
        (&[5, 32], 1028, true),
    ];
    for precision in [Precision::F32, Precision::Bf16, Precision::Autocast] {
        for (shape, out, bias) in cases {
            tch::manual_seed(shape.iter().sum::<i64>());
            let x = Tensor::randn(shape, (Kind::Float, CUDA));
            let x = if precision == Precision::Bf16 {
                x.to_kind(Kind::BFloat16)
            } else {
                x
            };
            let fused = linear_run(&x, out, bias, precision, true);
            let reference = linear_run(&x, out, bias, precision, false);
            // f32: the two sums differ in order only. bf16 and autocast:
            // libtorch rounds each gradient to bf16, the own path writes
            // the f32 weight's gradient unrounded.
            let bound = if precision == Precision::F32 {
                2e-3
            } else {
                2e-2
            };
            let again = linear_run(&x, out, bias, precision, true);
            let case = format!("{precision:?} {shape:?} -> {out} bias {bias}");
            assert_matches_and_repeats(&case, &fused, &reference, &again, bound);
        }
    }
}

#[test]
fn linear_gives_parameter_gradients_when_the_input_wants_none() {
    let Some(_device) = gpu_or_skip() else { return };
    let f32 = (Kind::Float, CUDA);
    let x = Tensor::randn([64, 32], f32);
    let run = |fused: bool| {
        nn::set_fused_kernels(fused);
        tch::manual_seed(3);
        let weight = Tensor::randn([16, 32], f32).set_requires_grad(true);
        let bias = Tensor::randn([16], f32).set_requires_grad(true);
        let y = nn::linear(&x, &weight, Some(&bias)).unwrap();
        y.sum(Kind::Float).backward();
        nn::set_fused_kernels(true);
        (weight.grad(), bias.grad())
    };
    let (fused_w, fused_b) = run(true);
    let (w, b) = run(false);
    assert!(worst_of_max(&fused_w, &w) <= 2e-3);
    assert!(worst_of_max(&fused_b, &b) <= 2e-3);
}

#[test]
fn linear_replays_from_a_captured_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    let f32 = (Kind::Float, CUDA);
    let x = Tensor::randn([256, 128], f32);
    let weight = (Tensor::randn([384, 128], f32) * 0.1).set_requires_grad(true);
    let bias = Tensor::zeros([384], f32).set_requires_grad(true);
    let step = |out: &Tensor, grads: &[Tensor; 3]| -> Result<(), String> {
        for grad in [weight.grad(), bias.grad()] {
            if grad.defined() {
                let _zeroed = grad.shallow_clone().f_zero_().map_err(|e| e.to_string())?;
            }
        }
        let input = x.detach().set_requires_grad(true);
        let y = {
            let _autocast = AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16)
                .map_err(|e| e.to_string())?;
            nn::linear(&input, &weight, Some(&bias)).map_err(|e| e.to_string())?
        };
        let y = y.to_kind(Kind::Float);
        (&y * &y).sum(Kind::Float).backward();
        // Detached: a copy that kept y's autograd graph alive would keep
        // the eager step's gradient accumulators for the capture.
        out.shallow_clone().copy_(&y.detach());
        for (slot, grad) in grads.iter().zip([input.grad(), weight.grad(), bias.grad()]) {
            slot.shallow_clone().copy_(&grad);
        }
        Ok(())
    };
    let zeros = |shape: &[i64]| Tensor::zeros(shape, f32);
    let eager_out = zeros(&[256, 384]);
    let eager = [zeros(&[256, 128]), zeros(&[384, 128]), zeros(&[384])];
    step(&eager_out, &eager).unwrap();
    let out = zeros(&[256, 384]);
    let grads = [zeros(&[256, 128]), zeros(&[384, 128]), zeros(&[384])];
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, || step(&out, &grads)).unwrap();
    graph.replay().unwrap();
    stream.synchronize().unwrap();
    cuda::synchronize(0).unwrap();
    assert_eq!(values(&out), values(&eager_out));
    for (got, expected) in grads.iter().zip(&eager) {
        assert_eq!(values(got), values(expected));
    }
}

/// Under bf16 autocast with f32 parameters, the weight and bias gradients
/// are one tensor-core kernel and one fixed-order reduction: no cuBLAS
/// split-K reduction, no column-sum kernel, and the sums of the bf16
/// products are exact up to f32 accumulation (against f64), bit-identical
/// on a rerun. Ragged tiles and row counts, and a layer without a bias.
#[test]
fn the_bf16_weight_and_bias_gradients_are_one_kernel_with_exact_sums() {
    let Some(_device) = gpu_or_skip() else { return };
    let f32 = (Kind::Float, CUDA);
    let cases: [(i64, i64, i64, bool); 5] = [
        (8192, 128, 384, true),
        (8192, 512, 128, true),
        (1000, 72, 200, true),
        (77, 64, 128, false),
        (300, 128, 1024, true),
    ];
    for (rows, inputs, out, with_bias) in cases {
        let case = format!("[{rows}, {inputs}] -> {out} bias {with_bias}");
        tch::manual_seed(rows + out);
        let x = Tensor::randn([rows, inputs], f32);
        let upstream = Tensor::randn([rows, out], f32);
        let run = || {
            let weight = (Tensor::randn([out, inputs], f32) * 0.1).set_requires_grad(true);
            let bias = with_bias.then(|| Tensor::zeros([out], f32).set_requires_grad(true));
            let y = {
                let _autocast = AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16).unwrap();
                nn::linear(&x, &weight, bias.as_ref()).unwrap()
            };
            let loss = (y.to_kind(Kind::Float) * &upstream).sum(Kind::Float);
            let names: Vec<String> = backward_kernels(&loss)
                .into_iter()
                .map(|k| k.name)
                .collect();
            let db = bias.map(|b| b.grad());
            (weight.grad(), db, names)
        };
        let (dw, db, names) = run();
        let (dw_again, db_again, _) = run();
        assert!(
            names.iter().any(|n| n.contains("esper_linear_wgrad")),
            "{case}: the own kernel ran: {names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.contains("splitKreduce") || n.contains("esper_col_sum")),
            "{case}: no split-K reduction or column sums: {names:?}"
        );
        assert_eq!(values(&dw), values(&dw_again), "{case}: dW repeats");
        // The exact sums of the bf16 values' products.
        let g = upstream.to_kind(Kind::BFloat16).to_kind(Kind::Double);
        let xs = x.to_kind(Kind::BFloat16).to_kind(Kind::Double);
        let exact_dw = g.transpose(0, 1).mm(&xs);
        let relative = |got: &Tensor, exact: &Tensor| {
            let error = (got.to_kind(Kind::Double) - exact).abs().max();
            f64::try_from(error).unwrap() / f64::try_from(exact.abs().max()).unwrap()
        };
        let error = relative(&dw, &exact_dw);
        assert!(error < 1e-5, "{case}: dW off by {error:e} of its largest");
        if let (Some(db), Some(db_again)) = (db, db_again) {
            assert_eq!(values(&db), values(&db_again), "{case}: db repeats");
            let error = relative(&db, &g.sum_dim_intlist([0].as_slice(), false, Kind::Double));
            assert!(error < 1e-5, "{case}: db off by {error:e} of its largest");
        }
    }
}
