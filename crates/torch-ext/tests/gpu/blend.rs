//! `torch_ext::nn::blend_lerp` and `blend_lerp_replicated` against
//! libtorch's `lerp` on the GPU (part of the `gpu` test binary): every
//! layout and dtype, shared and per-sample weights, replayed from a
//! captured graph with new weights, and the replicated blend against the
//! blend of copies. The tests hold the binary's device lock, since they
//! flip the process-wide fused switch.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, memory, nn};

use super::nn::worst;
use super::{CUDA, gpu_or_skip};

/// (shape, channels-last): four values a thread where a sample's size is a
/// multiple of four, one otherwise (75), and a transformer's 3-D.
const CASES: [(&[i64], bool); 5] = [
    (&[8, 16, 14, 14], false),
    (&[8, 16, 14, 14], true),
    (&[6, 3, 5, 5], false),
    (&[6, 3, 5, 5], true),
    (&[4, 10, 32], false),
];

/// `t` channels-last when asked, as it is otherwise.
fn in_layout(t: Tensor, channels_last: bool) -> Tensor {
    if channels_last {
        memory::contiguous_channels_last(&t).unwrap()
    } else {
        t
    }
}

/// One blend forward and backward against the upstream gradient `g`;
/// returns (y, dh, ds).
fn blend_run(h: &Tensor, s: &Tensor, w: &Tensor, g: &Tensor, fused: bool) -> [Tensor; 3] {
    nn::set_fused_kernels(fused);
    let h = h.detach().set_requires_grad(true);
    let s = s.detach().set_requires_grad(true);
    let y = nn::blend_lerp(&h, &s, w).unwrap();
    (&y * g).sum(Kind::Float).backward();
    nn::set_fused_kernels(true);
    [y.detach(), h.grad(), s.grad()]
}

#[test]
fn blend_lerp_matches_libtorch_in_every_layout_and_dtype() {
    let Some(_device) = gpu_or_skip() else { return };
    tch::manual_seed(11);
    for kind in [Kind::Float, Kind::BFloat16] {
        let tolerance = if kind == Kind::Float { 1e-6 } else { 1e-2 };
        for (shape, channels_last) in CASES {
            let layout = |t: Tensor| in_layout(t, channels_last);
            let h = layout(Tensor::randn(shape, (kind, CUDA)));
            let s = layout(Tensor::randn(shape, (kind, CUDA)));
            let g = layout(Tensor::randn(shape, (kind, CUDA)));
            let mut weight_shape = vec![1_i64; shape.len()];
            for batch in [shape[0], 1] {
                weight_shape[0] = batch;
                // Weights on both sides of 0.5 (libtorch's two formulas),
                // and the two ends.
                let w = Tensor::rand(weight_shape.as_slice(), (kind, CUDA));
                let _ = w.get(0).fill_(if batch == 1 { 0.75 } else { 1.0 });
                let fused = blend_run(&h, &s, &w, &g, true);
                let reference = blend_run(&h, &s, &w, &g, false);
                for (name, (a, b)) in ["y", "dh", "ds"].iter().zip(fused.iter().zip(&reference)) {
                    let error = worst(a, b);
                    assert!(
                        error <= tolerance,
                        "{name} {kind:?} {shape:?} channels-last {channels_last}, weights {batch}: {error}"
                    );
                }
                assert_eq!(
                    memory::is_channels_last(&fused[0]).unwrap(),
                    channels_last && !h.is_contiguous(),
                    "the output keeps the host's layout"
                );
            }
        }
    }
}

#[test]
fn blend_lerp_replays_with_new_weights_and_falls_back_for_a_learned_weight() {
    let Some(_device) = gpu_or_skip() else { return };
    tch::manual_seed(12);
    let f32 = (Kind::Float, CUDA);
    let shape = [16_i64, 8, 7, 7];
    let h = memory::contiguous_channels_last(&Tensor::randn(shape, f32)).unwrap();
    let s = memory::contiguous_channels_last(&Tensor::randn(shape, f32)).unwrap();
    let g = memory::contiguous_channels_last(&Tensor::randn(shape, f32)).unwrap();
    let w = Tensor::full([16_i64, 1, 1, 1], 0.25, f32);
    let out = Tensor::zeros(shape, f32);
    let grads = [Tensor::zeros(shape, f32), Tensor::zeros(shape, f32)];
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, || {
        let hh = h.detach().set_requires_grad(true);
        let ss = s.detach().set_requires_grad(true);
        let y = nn::blend_lerp(&hh, &ss, &w).map_err(|e| e.to_string())?;
        (&y * &g).sum(Kind::Float).backward();
        out.shallow_clone().copy_(&y);
        grads[0].shallow_clone().copy_(&hh.grad());
        grads[1].shallow_clone().copy_(&ss.grad());
        Ok(())
    })
    .unwrap();
    for value in [0.25, 0.9] {
        let _ = w.shallow_clone().fill_(value);
        graph.replay().unwrap();
        stream.synchronize().unwrap();
        cuda::synchronize(0).unwrap();
        let expected = blend_run(&h, &s, &w, &g, false);
        assert!(worst(&out, &expected[0]) <= 1e-6, "y at alpha {value}");
        assert!(
            worst(&grads[0], &expected[1]) <= 1e-6,
            "dh at alpha {value}"
        );
        assert!(
            worst(&grads[1], &expected[2]) <= 1e-6,
            "ds at alpha {value}"
        );
    }

    // A weight that learns (a gated blend's) takes libtorch's lerp and
    // gets its gradient.
    let learned = Tensor::rand([16_i64, 1, 1, 1], f32).set_requires_grad(true);
    let y = nn::blend_lerp(&h, &s, &learned).unwrap();
    (&y * &g).sum(Kind::Float).backward();
    let expected = (&s - &h) * &g;
    let expected = expected.sum_dim_intlist([1_i64, 2, 3].as_slice(), true, Kind::Float);
    assert!(worst(&learned.grad(), &expected) <= 1e-4);
}

#[test]
fn blend_lerp_replicated_equals_the_blend_of_copies() {
    let Some(_device) = gpu_or_skip() else { return };
    tch::manual_seed(13);
    for kind in [Kind::Float, Kind::BFloat16] {
        for (shape, channels_last) in CASES {
            let layout = |t: Tensor| in_layout(t, channels_last);
            let h = layout(Tensor::randn(shape, (kind, CUDA)));
            let s = layout(Tensor::randn(shape, (kind, CUDA)));
            for replicas in [1_i64, 3] {
                let mut weight_shape = vec![1_i64; shape.len()];
                for batch in [shape[0] * replicas, 1] {
                    weight_shape[0] = batch;
                    let w = Tensor::rand(weight_shape.as_slice(), (kind, CUDA));
                    let _ = w.get(0).fill_(1.0);
                    let fused =
                        tch::no_grad(|| nn::blend_lerp_replicated(&h, &s, &w, replicas)).unwrap();
                    let copies = (
                        memory::repeat_batch(&h, replicas).unwrap(),
                        memory::repeat_batch(&s, replicas).unwrap(),
                    );
                    let expected = nn::blend_lerp(&copies.0, &copies.1, &w).unwrap();
                    assert_eq!(fused.size(), expected.size());
                    assert!(
                        fused.equal(&expected),
                        "{kind:?} {shape:?} channels-last {channels_last}, {replicas} copies, weights {batch}: not the blend of the copies"
                    );
                    assert_eq!(
                        memory::is_channels_last(&fused).unwrap(),
                        channels_last && !h.is_contiguous(),
                        "the output keeps the host's layout"
                    );
                }
            }
        }
    }
    // With a gradient wanted it blends copies through the autograd path.
    let h = Tensor::randn([4_i64, 8, 6, 6], (Kind::Float, CUDA)).set_requires_grad(true);
    let s = Tensor::randn([4_i64, 8, 6, 6], (Kind::Float, CUDA));
    let w = Tensor::rand([8_i64, 1, 1, 1], (Kind::Float, CUDA));
    let y = nn::blend_lerp_replicated(&h, &s, &w, 2).unwrap();
    y.sum(Kind::Float).backward();
    let expected = (-&w + 1.0).reshape([2, 4, 1, 1, 1]).sum_dim_intlist(
        [0_i64].as_slice(),
        false,
        Kind::Float,
    );
    assert!(worst(&h.grad(), &expected.expand([4, 8, 6, 6], false)) <= 1e-5);
}

/// `blend_lerp_clamped` against libtorch's clamp and lerp, weights below,
/// inside and above `[0, 1]` (per sample and shared), in both dtypes; a
/// NaN weight stays NaN; the clamp adds no kernel and a captured step
/// replays new out-of-range weights clamped.
#[test]
fn blend_lerp_clamped_clamps_the_weights_as_it_reads_them() {
    let Some(_device) = gpu_or_skip() else { return };
    tch::manual_seed(14);
    let values = [-0.5_f32, 1.7, 0.3, 0.0, 1.0, 2.5, -3.0, 0.6];
    for kind in [Kind::Float, Kind::BFloat16] {
        let tolerance = if kind == Kind::Float { 1e-6 } else { 1e-2 };
        for (shape, channels_last) in CASES {
            let layout = |t: Tensor| in_layout(t, channels_last);
            let batch = shape[0];
            let h = layout(Tensor::randn(shape, (kind, CUDA)));
            let s = layout(Tensor::randn(shape, (kind, CUDA)));
            let g = layout(Tensor::randn(shape, (kind, CUDA)));
            let mut weight_shape = vec![1_i64; shape.len()];
            weight_shape[0] = batch;
            let per_sample = Tensor::from_slice(&values[..batch as usize])
                .to_kind(kind)
                .to(CUDA)
                .reshape(weight_shape.as_slice());
            weight_shape[0] = 1;
            let shared = Tensor::full(weight_shape.as_slice(), 1.5, (kind, CUDA));
            for w in [per_sample, shared] {
                let run = |fused: bool| {
                    nn::set_fused_kernels(fused);
                    let hh = h.detach().set_requires_grad(true);
                    let ss = s.detach().set_requires_grad(true);
                    let y = nn::blend_lerp_clamped(&hh, &ss, &w).unwrap();
                    (&y * &g).sum(Kind::Float).backward();
                    nn::set_fused_kernels(true);
                    [y.detach(), hh.grad(), ss.grad()]
                };
                let fused = run(true);
                let reference = run(false);
                let explicit = blend_run(&h, &s, &w.clamp(0.0, 1.0), &g, false);
                for (name, ((a, b), c)) in ["y", "dh", "ds"]
                    .iter()
                    .zip(fused.iter().zip(&reference).zip(&explicit))
                {
                    let error = worst(a, b).max(worst(a, c));
                    assert!(
                        error <= tolerance,
                        "{name} {kind:?} {shape:?} channels-last {channels_last}, weights {:?}: {error}",
                        w.size()
                    );
                }
            }
        }
    }

    let f32 = (Kind::Float, CUDA);
    let shape = [4_i64, 8, 5, 5];
    let h = memory::contiguous_channels_last(&Tensor::randn(shape, f32)).unwrap();
    let s = memory::contiguous_channels_last(&Tensor::randn(shape, f32)).unwrap();
    let w = Tensor::from_slice(&[f32::NAN, 0.5, 1.5, -1.0])
        .to(CUDA)
        .reshape([4, 1, 1, 1]);
    let kernels = super::kernels_of(|| {
        let _ = nn::blend_lerp_clamped(&h, &s, &w).unwrap();
    });
    assert_eq!(
        kernels,
        ["esper_blend_lerp_forward"],
        "kernels: {kernels:?}"
    );
    let y = nn::blend_lerp_clamped(&h, &s, &w).unwrap();
    assert!(
        bool::try_from(y.get(0).isnan().all()).unwrap(),
        "a NaN weight gives NaN"
    );
    let finite = w.narrow(0, 1, 3).clamp(0.0, 1.0);
    let expected = h.narrow(0, 1, 3).lerp_tensor(&s.narrow(0, 1, 3), &finite);
    assert!(worst(&y.narrow(0, 1, 3), &expected) <= 1e-6);

    // Captured, then replayed with new weights beyond both ends.
    let weight = Tensor::full([4_i64, 1, 1, 1], 0.25, f32);
    let out = Tensor::zeros(shape, f32);
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, || {
        let y = nn::blend_lerp_clamped(&h, &s, &weight).map_err(|e| e.to_string())?;
        out.shallow_clone().copy_(&y);
        Ok(())
    })
    .unwrap();
    let fresh = Tensor::from_slice(&[-2.0_f32, 3.0, 0.4, 1.0]).to(CUDA);
    weight.shallow_clone().copy_(&fresh.reshape([4, 1, 1, 1]));
    graph.replay().unwrap();
    stream.synchronize().unwrap();
    let expected = h.lerp_tensor(&s, &weight.clamp(0.0, 1.0));
    assert!(worst(&out, &expected) <= 1e-6, "the replay did not clamp");
}
