//! `torch_ext::nn`'s fused layers against libtorch's ops on the GPU (part
//! of the `gpu` test binary): batch norm + ReLU (output, running statistics,
//! every gradient), the 2x2 max-pool (values, ties, NaN, odd sizes, both
//! layouts), the 3x3 convolution and group norm + ReLU, in f32 and bf16,
//! eagerly and replayed from a captured graph (the alpha blend: `blend.rs`).
//! The tests hold the binary's device lock, since they flip the
//! process-wide fused switch.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, memory, nn};

use super::{CUDA, gpu_or_skip, kernels_of, values};

/// Largest |got - expected| relative to max(1, |expected|).
pub(super) fn worst(got: &Tensor, expected: &Tensor) -> f32 {
    let (g, e) = (values(got), values(expected));
    assert_eq!(g.len(), e.len());
    g.iter()
        .zip(&e)
        .map(|(g, e)| {
            assert_eq!(g.is_nan(), e.is_nan(), "NaN in one result only");
            if e.is_nan() {
                0.0
            } else {
                (g - e).abs() / e.abs().max(1.0)
            }
        })
        .fold(0.0, f32::max)
}

/// As [`worst`], leaving out the elements where `skip` is true.
fn worst_where(got: &Tensor, expected: &Tensor, skip: &[bool]) -> f32 {
    let (g, e) = (values(got), values(expected));
    assert_eq!(g.len(), skip.len());
    g.iter()
        .zip(&e)
        .zip(skip)
        .filter(|(_, skip)| !**skip)
        .map(|((g, e), _)| (g - e).abs() / e.abs().max(1.0))
        .fold(0.0, f32::max)
}

/// One batch-norm + ReLU forward and backward; returns (y, running mean,
/// running var, dx, dweight, dbias).
fn bn_relu_run(x: &Tensor, seed: i64, fused: bool) -> [Tensor; 6] {
    nn::set_fused_kernels(fused);
    let channels = x.size()[1];
    let f32 = (Kind::Float, CUDA);
    let x = x.detach().set_requires_grad(true);
    tch::manual_seed(seed);
    let weight = (Tensor::rand([channels], f32) + 0.5).set_requires_grad(true);
    let bias = (Tensor::randn([channels], f32) * 0.3).set_requires_grad(true);
    let running_mean = Tensor::zeros([channels], f32);
    let running_var = Tensor::ones([channels], f32);
    let y = nn::batch_norm_relu(
        &x,
        &weight,
        &bias,
        Some(&running_mean),
        Some(&running_var),
        true,
        0.1,
        1e-5,
    )
    .unwrap();
    assert_eq!(y.size(), x.size());
    assert_eq!(y.kind(), x.kind());
    let upstream = Tensor::randn(x.size(), f32).to_kind(x.kind());
    (&y * &upstream)
        .to_kind(Kind::Float)
        .sum(Kind::Float)
        .backward();
    nn::set_fused_kernels(true);
    [
        y,
        running_mean,
        running_var,
        x.grad(),
        weight.grad(),
        bias.grad(),
    ]
}

#[test]
fn batch_norm_relu_matches_libtorch_in_f32_and_bf16() {
    let Some(_device) = gpu_or_skip() else { return };
    for (kind, tolerance) in [(Kind::Float, 2e-4_f32), (Kind::BFloat16, 2e-2)] {
        for (n, c, h, w) in [
            (256_i64, 8_i64, 28_i64, 28_i64),
            (7, 16, 14, 14),
            (3, 32, 7, 7),
            (2, 24, 5, 3),
            (64, 256, 2, 2),
        ] {
            tch::manual_seed(n + c);
            // A mean far from zero checks the statistics' numerics.
            let x = (Tensor::randn([n, c, h, w], (Kind::Float, CUDA)) * 2.0 + 3.0).to_kind(kind);
            let x = memory::contiguous_channels_last(&x).unwrap();
            let fused = bn_relu_run(&x, n, true);
            let reference = bn_relu_run(&x, n, false);
            // Where a pre-activation is within rounding of zero the two may
            // disagree on the ReLU mask; such elements are left out of the
            // input-gradient comparison (and must be rare).
            let mask = |y: &Tensor| values(y).iter().map(|v| *v > 0.0).collect::<Vec<_>>();
            let (mask_fused, mask_ref) = (mask(&fused[0]), mask(&reference[0]));
            let flips: Vec<bool> = mask_fused
                .iter()
                .zip(&mask_ref)
                .map(|(a, b)| a != b)
                .collect();
            let flipped = flips.iter().filter(|f| **f).count();
            assert!(
                flipped <= 1 + flips.len() / 100_000,
                "{kind:?} [{n},{c},{h},{w}]: {flipped} ReLU masks differ"
            );
            for (name, (got, expected)) in
                ["y", "running_mean", "running_var", "dx", "dweight", "dbias"]
                    .iter()
                    .zip(fused.iter().zip(&reference))
            {
                // Parameter gradients sum over N*H*W products: scale the bound.
                let bound = if name.starts_with("dw") || name.starts_with("db") {
                    tolerance * 10.0
                } else {
                    tolerance
                };
                let err = if *name == "dx" {
                    worst_where(got, expected, &flips)
                } else {
                    worst(got, expected)
                };
                assert!(
                    err <= bound,
                    "{kind:?} [{n},{c},{h},{w}] {name}: relative error {err} > {bound}"
                );
            }
            assert!(memory::is_channels_last(&fused[0]).unwrap());
        }
    }
}

#[test]
fn batch_norm_relu_in_evaluation_is_one_kernel_and_matches_libtorch() {
    let Some(_device) = gpu_or_skip() else { return };
    let f32 = (Kind::Float, CUDA);
    for (kind, channels, bound) in [
        (Kind::Float, 16_i64, 1e-5),
        (Kind::BFloat16, 16, 1e-2),
        (Kind::Float, 6, 1e-5),
    ] {
        tch::manual_seed(channels);
        let x = memory::contiguous_channels_last(
            &Tensor::randn([8, channels, 9, 9], f32).to_kind(kind),
        )
        .unwrap();
        // A NaN stays NaN, as relu leaves it.
        let _ = x.get(0).get(1).get(2).get(3).fill_(f64::NAN);
        let weight = (Tensor::rand([channels], f32) + 0.5).set_requires_grad(true);
        let bias = (Tensor::randn([channels], f32) * 0.3).set_requires_grad(true);
        let mean = Tensor::randn([channels], f32) * 0.2;
        let var = Tensor::rand([channels], f32) + 0.5;
        let (mean_before, var_before) = (mean.copy(), var.copy());
        let run = |fused: bool| {
            nn::set_fused_kernels(fused);
            let y = tch::no_grad(|| {
                nn::batch_norm_relu(
                    &x,
                    &weight,
                    &bias,
                    Some(&mean),
                    Some(&var),
                    false,
                    0.1,
                    1e-5,
                )
                .unwrap()
            });
            nn::set_fused_kernels(true);
            y
        };
        let mut fused = None;
        let names = kernels_of(|| fused = Some(run(true)));
        let fused = fused.unwrap();
        assert_eq!(
            names,
            ["esper_bn_relu_eval"],
            "{kind:?} C {channels}: {names:?}"
        );
        let reference = run(false);
        assert_eq!(fused.kind(), kind);
        assert!(
            memory::is_channels_last(&fused).unwrap(),
            "channels-last output"
        );
        let err = worst(&fused, &reference);
        assert!(err <= bound, "{kind:?} C {channels}: error {err}");
        // The running statistics are read, not updated.
        assert!(mean.equal(&mean_before) && var.equal(&var_before));
    }
    // A gradient wanted: libtorch's ops, and the gradient reaches the input.
    let x = memory::contiguous_channels_last(&Tensor::randn([4, 8, 5, 5], f32))
        .unwrap()
        .set_requires_grad(true);
    let ones = Tensor::ones([8], f32);
    let zeros = Tensor::zeros([8], f32);
    let y = nn::batch_norm_relu(
        &x,
        &ones,
        &zeros,
        Some(&zeros),
        Some(&ones),
        false,
        0.1,
        0.0,
    )
    .unwrap();
    y.sum(Kind::Float).backward();
    let expected = x.detach().gt(0.0).to_kind(Kind::Float);
    assert!(worst(&x.grad(), &expected) <= 1e-6);
}

#[test]
fn batch_norm_relu_is_deterministic_and_capturable() {
    let Some(_device) = gpu_or_skip() else { return };
    let x = memory::contiguous_channels_last(&Tensor::randn([64, 16, 14, 14], (Kind::Float, CUDA)))
        .unwrap();
    let first = bn_relu_run(&x, 5, true);
    let second = bn_relu_run(&x, 5, true);
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(values(a), values(b), "two runs differ");
    }

    // Captured forward + backward replays to the same values as eager.
    let stream = CudaStream::from_pool(0, false).unwrap();
    let weight = Tensor::ones([16], (Kind::Float, CUDA)).set_requires_grad(true);
    let bias = Tensor::zeros([16], (Kind::Float, CUDA)).set_requires_grad(true);
    let input = x.detach().set_requires_grad(true);
    let eager = {
        let y = nn::batch_norm_relu(&input, &weight, &bias, None, None, true, 0.1, 1e-5).unwrap();
        y.sum(Kind::Float).backward();
        (values(&y), values(&input.grad()))
    };
    let out = Tensor::zeros([64, 16, 14, 14], (Kind::Float, CUDA));
    let grad = Tensor::zeros([64, 16, 14, 14], (Kind::Float, CUDA));
    let graph = CudaGraph::capture(&stream, None, 0, || {
        let input = x.detach().set_requires_grad(true);
        let y = nn::batch_norm_relu(&input, &weight, &bias, None, None, true, 0.1, 1e-5)
            .map_err(|e| e.to_string())?;
        y.sum(Kind::Float).backward();
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

fn pool_run(x: &Tensor, fused: bool) -> (Tensor, Tensor) {
    nn::set_fused_kernels(fused);
    let x = x.detach().set_requires_grad(true);
    let y = nn::max_pool2x2(&x).unwrap();
    let upstream = Tensor::randn(y.size(), (Kind::Float, CUDA)).to_kind(x.kind());
    (&y * &upstream)
        .to_kind(Kind::Float)
        .sum(Kind::Float)
        .backward();
    nn::set_fused_kernels(true);
    (y, x.grad())
}

#[test]
fn max_pool2x2_matches_libtorch_with_ties_nan_and_odd_sizes() {
    let Some(_device) = gpu_or_skip() else { return };
    for kind in [Kind::Float, Kind::BFloat16] {
        for (n, c, h, w) in [
            (256_i64, 8_i64, 28_i64, 28_i64),
            (5, 16, 7, 7),
            (2, 3, 5, 6),
            (4, 1, 9, 9),
        ] {
            for channels_last in [true, false] {
                tch::manual_seed(h * w + c);
                // Rounded values make ties common; one NaN per tensor.
                let x = (Tensor::randn([n, c, h, w], (Kind::Float, CUDA)) * 2.0)
                    .round()
                    .to_kind(kind);
                let _ = x.flatten(0, -1).narrow(0, 5, 1).fill_(f64::NAN);
                let x = if channels_last {
                    memory::contiguous_channels_last(&x).unwrap()
                } else {
                    x.contiguous()
                };
                tch::manual_seed(1);
                let (y, dx) = pool_run(&x, true);
                tch::manual_seed(1);
                let (y_ref, dx_ref) = pool_run(&x, false);
                assert_eq!(y.size(), [n, c, h / 2, w / 2]);
                let case = format!("{kind:?} [{n},{c},{h},{w}] channels_last {channels_last}");
                assert_eq!(worst(&y, &y_ref), 0.0, "{case}: forward");
                assert_eq!(worst(&dx, &dx_ref), 0.0, "{case}: backward");
            }
        }
    }
}

/// bf16 autocast on CUDA while the guard lives, when `on`.
pub(super) fn bf16_autocast(on: bool) -> Option<torch_ext::AutocastGuard> {
    on.then(|| {
        torch_ext::AutocastGuard::with_cache(torch_ext::AutocastDevice::Cuda, Kind::BFloat16, false)
            .unwrap()
    })
}

/// One 3x3 convolution forward and backward; returns (y, dx, dw).
fn conv_run(x: &Tensor, weight: &Tensor, bf16: bool, fused: bool) -> [Tensor; 3] {
    nn::set_fused_kernels(fused);
    let x = x.detach().set_requires_grad(true);
    let weight = weight.detach().set_requires_grad(true);
    let y = {
        let _autocast = bf16_autocast(bf16);
        nn::conv3x3(&x, &weight).unwrap()
    };
    tch::manual_seed(11);
    let upstream = Tensor::randn(y.size(), (Kind::Float, CUDA)).to_kind(y.kind());
    (&y * &upstream)
        .to_kind(Kind::Float)
        .sum(Kind::Float)
        .backward();
    nn::set_fused_kernels(true);
    [y, x.grad(), weight.grad()]
}

/// Largest |got - expected| relative to the largest |expected|.
pub(super) fn worst_of_max(got: &Tensor, expected: &Tensor) -> f32 {
    let (g, e) = (values(got), values(expected));
    let scale = e.iter().fold(1e-6_f32, |m, v| m.max(v.abs()));
    g.iter()
        .zip(&e)
        .map(|(g, e)| (g - e).abs() / scale)
        .fold(0.0, f32::max)
}

/// Asserts that a fused layer's output and gradients `[y, dx, dweight,
/// dbias]` are within `bound` of the reference's (relative to the
/// reference's largest value, [`worst_of_max`]) and that a second fused run
/// gave them bit for bit (`case` names the case in the messages).
pub(super) fn assert_matches_and_repeats(
    case: &str,
    fused: &[Tensor; 4],
    reference: &[Tensor; 4],
    again: &[Tensor; 4],
    bound: f32,
) {
    for (name, ((got, expected), repeated)) in ["y", "dx", "dweight", "dbias"]
        .iter()
        .zip(fused.iter().zip(reference).zip(again))
    {
        let err = worst_of_max(got, expected);
        assert!(err <= bound, "{case} {name}: error {err} > {bound}");
        assert!(repeated.equal(got), "{case} {name}: not deterministic");
    }
}

#[test]
fn conv3x3_matches_libtorch() {
    let Some(_device) = gpu_or_skip() else { return };
    // (batch, in, out, height, width): the CNN host's and seed's shapes, odd
    // sizes, and ones too large for a whole image a block (bands of rows).
    // The one- and three-channel inputs take the small forward kernel; the
    // host's and seed's other layers the direct kernel forward and for the
    // input gradient (the sized kernels for 8, 16, 32 channels, four warps
    // a block where the grid is large: the 401-image cases, whose weight
    // gradient takes two images a block and the last alone); [4, 12 -> 8]
    // is cuDNN's both ways (12 is not a multiple of 8); [5, 24 -> 8] the
    // general direct kernel both ways; [2, 8 -> 16, 40 x 40] in bands of
    // rows; the last two are too wide for the direct kernel (cuDNN) and
    // take the weight gradient's units in passes.
    let cases = [
        (256_i64, 1_i64, 8_i64, 28_i64, 28_i64),
        (32, 8, 16, 14, 14),
        (16, 16, 32, 7, 7),
        (8, 16, 16, 14, 14),
        (401, 16, 32, 8, 8),
        (401, 8, 8, 16, 16),
        (4, 32, 32, 8, 8),
        (4, 12, 8, 5, 9),
        (5, 24, 8, 11, 6),
        (4, 3, 8, 9, 7),
        (2, 8, 16, 40, 40),
        (2, 32, 64, 32, 32),
        (2, 32, 96, 8, 8),
    ];
    for bf16 in [false, true] {
        for (n, c_in, c_out, h, w) in cases {
            tch::manual_seed(n + c_in);
            let x = memory::contiguous_channels_last(&Tensor::randn(
                [n, c_in, h, w],
                (Kind::Float, CUDA),
            ))
            .unwrap();
            let weight = Tensor::randn([c_out, c_in, 3, 3], (Kind::Float, CUDA)) * 0.3;
            memory::set_channels_last_(&weight).unwrap();
            let fused = conv_run(&x, &weight, bf16, true);
            let reference = conv_run(&x, &weight, bf16, false);
            let bound = if bf16 { 2e-2 } else { 5e-3 };
            for (name, (got, expected)) in
                ["y", "dx", "dw"].iter().zip(fused.iter().zip(&reference))
            {
                assert_eq!(got.size(), expected.size(), "{name}");
                assert_eq!(got.kind(), expected.kind(), "{name}");
                let err = worst_of_max(got, expected);
                assert!(
                    err <= bound,
                    "bf16 {bf16} [{n},{c_in}->{c_out},{h},{w}] {name}: error {err} > {bound}"
                );
            }
            assert_eq!(fused[2].stride(), reference[2].stride(), "dw layout");
            // Every sum is taken in a fixed order: a second run is bit-equal.
            let again = conv_run(&x, &weight, bf16, true);
            for (name, (a, b)) in ["y", "dx", "dw"].iter().zip(again.iter().zip(&fused)) {
                assert!(
                    a.equal(b),
                    "bf16 {bf16} [{n},{c_in}->{c_out},{h},{w}] {name}: not deterministic"
                );
            }
        }
    }
}

#[test]
fn conv3x3_without_gradients_takes_the_fused_kernels() {
    let Some(_device) = gpu_or_skip() else { return };
    // A frozen seed's layer in an inference-mode validation pass: neither
    // the input nor the weight requires a gradient.
    for (n, c_in, c_out, bf16) in [
        (64_i64, 16_i64, 32_i64, false),
        (64, 16, 32, true),
        (9, 3, 8, false),
    ] {
        tch::manual_seed(n + c_out);
        let x = memory::contiguous_channels_last(&Tensor::randn(
            [n, c_in, 12, 12],
            (Kind::Float, CUDA),
        ))
        .unwrap();
        let weight = Tensor::randn([c_out, c_in, 3, 3], (Kind::Float, CUDA)) * 0.3;
        memory::set_channels_last_(&weight).unwrap();
        let run = |fused: bool| {
            nn::set_fused_kernels(fused);
            let _autocast = bf16_autocast(bf16);
            let y = tch::no_grad(|| nn::conv3x3(&x, &weight).unwrap());
            nn::set_fused_kernels(true);
            y
        };
        let mut fused = None;
        let names = kernels_of(|| fused = Some(run(true)));
        let fused = fused.unwrap();
        assert!(
            names.iter().any(|name| name.starts_with("esper_conv3")),
            "[{n},{c_in}->{c_out}] bf16 {bf16}: no fused kernel in {names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|name| name.contains("cudnn") || name.contains("convolve")),
            "[{n},{c_in}->{c_out}] bf16 {bf16}: cuDNN ran: {names:?}"
        );
        let sized = names.iter().any(|name| name == "esper_conv3_direct_c2_n4");
        assert_eq!(
            sized,
            c_in == 16,
            "[{n},{c_in}->{c_out}] sized kernel: {names:?}"
        );
        let reference = run(false);
        assert_eq!(fused.size(), reference.size());
        let bound = if bf16 { 2e-2 } else { 5e-3 };
        let err = worst_of_max(&fused, &reference);
        assert!(
            err <= bound,
            "[{n},{c_in}->{c_out}] bf16 {bf16}: error {err}"
        );
        assert!(
            memory::is_channels_last(&fused).unwrap(),
            "channels-last output"
        );
    }
}

#[test]
fn conv3x3_in_f32_stays_exact_with_tf32_off() {
    let Some(_device) = gpu_or_skip() else { return };
    let (matmul, cudnn) = torch_ext::precision::allow_tf32();
    tch::manual_seed(17);
    let x = memory::contiguous_channels_last(&Tensor::randn([8, 16, 14, 14], (Kind::Float, CUDA)))
        .unwrap();
    let weight = Tensor::randn([16, 16, 3, 3], (Kind::Float, CUDA)) * 0.3;
    memory::set_channels_last_(&weight).unwrap();
    // TF32 off: every kernel the layer uses must be exact f32, so it agrees
    // with libtorch's exact convolution far inside TF32's rounding (about
    // 1e-3 relative here).
    torch_ext::precision::set_allow_tf32(matmul, false);
    let exact = conv_run(&x, &weight, false, true);
    let reference = conv_run(&x, &weight, false, false);
    // TF32 on: the tensor-core kernels run, and they round.
    torch_ext::precision::set_allow_tf32(matmul, true);
    let rounded = conv_run(&x, &weight, false, true);
    torch_ext::precision::set_allow_tf32(matmul, cudnn);
    for (name, ((e, r), t)) in ["y", "dx", "dw"]
        .iter()
        .zip(exact.iter().zip(&reference).zip(&rounded))
    {
        let err = worst_of_max(e, r);
        assert!(err <= 2e-5, "{name} with TF32 off: error {err}");
        let tf32 = worst_of_max(t, r);
        assert!(tf32 <= 5e-3, "{name} with TF32 on: error {tf32}");
    }
    // The forward is where TF32 shows: not bit-equal to the exact run.
    assert!(
        !exact[0].equal(&rounded[0]),
        "TF32 on took the same path as TF32 off"
    );
}

/// One group norm + ReLU forward and backward; returns (y, dx, dweight,
/// dbias), y and dx as f32.
fn gn_run(x: &Tensor, groups: i64, seed: i64, fused: bool) -> [Tensor; 4] {
    nn::set_fused_kernels(fused);
    let channels = x.size()[1];
    let f32 = (Kind::Float, CUDA);
    let x = x.detach().set_requires_grad(true);
    tch::manual_seed(seed);
    let weight = (Tensor::rand([channels], f32) + 0.5).set_requires_grad(true);
    let bias = (Tensor::randn([channels], f32) * 0.3).set_requires_grad(true);
    let y = nn::group_norm_relu(&x, groups, &weight, &bias, 1e-5).unwrap();
    assert_eq!(y.kind(), x.kind(), "the output keeps the input's dtype");
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
fn group_norm_relu_matches_libtorch() {
    let Some(_device) = gpu_or_skip() else { return };
    // (batch, channels, height, width, groups): the conv_light seed's shape
    // (16 channels, one group), several groups, four-channel groups, odd
    // sizes, wide layers, and a mean far from zero.
    let cases = [
        (256_i64, 16_i64, 14_i64, 14_i64, 1_i64, 0.0),
        (8, 32, 7, 7, 2, 0.0),
        (4, 12, 9, 5, 3, 0.0),
        (3, 64, 5, 3, 16, 0.0),
        (2, 256, 4, 4, 8, 0.0),
        (2, 1024, 2, 3, 32, 0.0),
        (4, 16, 6, 6, 4, 50.0),
        // Groups narrower than four channels (the per-channel kernels): a
        // seed's GroupNorm at 4- and 8-channel slots, and three-channel
        // groups.
        (64, 8, 16, 16, 8, 0.0),
        (16, 8, 8, 8, 4, 0.0),
        (8, 4, 14, 14, 4, 0.0),
        (4, 12, 6, 6, 4, 0.0),
        (4, 8, 5, 7, 8, 50.0),
    ];
    for bf16 in [false, true] {
        for (n, c, h, w, groups, offset) in cases {
            tch::manual_seed(n + c);
            let x = Tensor::randn([n, c, h, w], (Kind::Float, CUDA)) * 2.0 + offset;
            let x = memory::contiguous_channels_last(&x).unwrap();
            let x = if bf16 { x.to_kind(Kind::BFloat16) } else { x };
            let fused = gn_run(&x, groups, 5, true);
            // libtorch's group_norm wants the weight in the input's dtype:
            // the reference runs in f32 on the same (bf16-rounded) values.
            let reference = gn_run(&x.to_kind(Kind::Float), groups, 5, false);
            let bound = if bf16 { 3e-2 } else { 2e-3 };
            let again = gn_run(&x, groups, 5, true);
            let case = format!("bf16 {bf16} [{n},{c},{h},{w}] groups {groups}");
            assert_matches_and_repeats(&case, &fused, &reference, &again, bound);
        }
    }
}
