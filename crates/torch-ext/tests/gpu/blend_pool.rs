//! `nn::blend_lerp_pool2x2` and `blend_lerp_clamped_pool2x2` on the GPU
//! (part of the `gpu` test binary): the one node against the two it
//! replaces (`blend_lerp` then `max_pool2x2`, whose kernels `blend.rs` and
//! `nn.rs` check against libtorch's), the output and both gradients bit for
//! bit, in f32 and bf16, channels-last with four and one channels a thread
//! and NCHW, even and odd sides, many ties, weights inside and outside
//! `[0, 1]`, one each or one for all; its two kernels; the fallbacks (a
//! weight that learns, a 1-pixel side, layouts the two do not share); a
//! captured graph replayed with new weights.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, memory, nn};

use super::{CUDA, gpu_or_skip, kernels_of, values};

/// `t` channels-last when asked, contiguous NCHW otherwise.
fn in_layout(t: Tensor, channels_last: bool) -> Tensor {
    if channels_last {
        memory::contiguous_channels_last(&t).unwrap()
    } else {
        t.contiguous()
    }
}

/// Values on a grid of halves (equal blends, so ties, are common).
fn grid(shape: [i64; 4], kind: Kind, channels_last: bool) -> Tensor {
    let t = (Tensor::randn(shape, (Kind::Float, CUDA)) * 2.0).round() / 2.0;
    in_layout(t.to_kind(kind), channels_last)
}

/// Forward and backward, as one node (`fused`) or the blend then the
/// pool; returns (y, dh, ds).
fn run(h: &Tensor, s: &Tensor, w: &Tensor, clamp: bool, fused: bool) -> [Tensor; 3] {
    let h = h.detach().set_requires_grad(true);
    let s = s.detach().set_requires_grad(true);
    let y = match (fused, clamp) {
        (true, true) => nn::blend_lerp_clamped_pool2x2(&h, &s, w).unwrap(),
        (true, false) => nn::blend_lerp_pool2x2(&h, &s, w).unwrap(),
        (false, true) => nn::max_pool2x2(&nn::blend_lerp_clamped(&h, &s, w).unwrap()).unwrap(),
        (false, false) => nn::max_pool2x2(&nn::blend_lerp(&h, &s, w).unwrap()).unwrap(),
    };
    tch::manual_seed(3);
    let upstream = Tensor::randn(y.size(), (Kind::Float, CUDA)).to_kind(h.kind());
    (&y * &upstream)
        .to_kind(Kind::Float)
        .sum(Kind::Float)
        .backward();
    [y.detach(), h.grad(), s.grad()]
}

#[test]
fn blend_lerp_pool2x2_matches_the_blend_then_the_pool_bit_for_bit() {
    let Some(_device) = gpu_or_skip() else { return };
    for kind in [Kind::Float, Kind::BFloat16] {
        for (shape, channels_last) in [
            ([64_i64, 16_i64, 14_i64, 14_i64], true),
            ([32, 32, 7, 7], true),
            ([5, 3, 6, 5], true),
            ([6, 8, 5, 3], false),
            ([4, 1, 4, 4], true),
        ] {
            tch::manual_seed(shape[1] + shape[2]);
            let h = grid(shape, kind, channels_last);
            let s = grid(shape, kind, channels_last);
            for (batch, clamp) in [(shape[0], true), (shape[0], false), (1, true)] {
                // Weights at the ends, both sides of 0.5 and outside [0, 1].
                let w = Tensor::rand([batch, 1, 1, 1], (Kind::Float, CUDA)) * 1.6 - 0.3;
                let _ = w.get(0).fill_(if batch == 1 { 0.5 } else { 1.0 });
                if batch > 2 {
                    let _ = w.get(1).fill_(0.0);
                }
                let w = w.to_kind(kind);
                let case = format!(
                    "{kind:?} {shape:?} channels-last {channels_last}, {batch} weights, clamp {clamp}"
                );
                let fused = run(&h, &s, &w, clamp, true);
                let two = run(&h, &s, &w, clamp, false);
                let pooled = [shape[0], shape[1], shape[2] / 2, shape[3] / 2];
                assert_eq!(fused[0].size(), pooled, "{case}");
                assert_eq!(
                    memory::is_channels_last(&fused[0]).unwrap(),
                    memory::is_channels_last(&two[0]).unwrap(),
                    "{case}: layout"
                );
                for (name, (got, expected)) in ["y", "dh", "ds"].iter().zip(fused.iter().zip(&two))
                {
                    assert_eq!(values(got), values(expected), "{case}: {name}");
                }
            }
        }
    }
}

#[test]
fn blend_lerp_pool2x2_is_one_node_of_two_kernels() {
    let Some(_device) = gpu_or_skip() else { return };
    let shape = [32_i64, 16, 14, 14];
    let h = grid(shape, Kind::Float, true).set_requires_grad(true);
    let s = grid(shape, Kind::Float, true).set_requires_grad(true);
    let w = Tensor::full([32_i64, 1, 1, 1], 0.3, (Kind::Float, CUDA));
    let mut y = None;
    let forward = kernels_of(|| y = Some(nn::blend_lerp_clamped_pool2x2(&h, &s, &w).unwrap()));
    assert_eq!(forward, ["esper_blend_lerp_pool_forward"], "forward");
    let loss = y.unwrap().sum(Kind::Float);
    let backward = kernels_of(|| loss.backward());
    let ours: Vec<&String> = backward.iter().filter(|k| k.starts_with("esper")).collect();
    assert_eq!(
        ours,
        ["esper_blend_lerp_pool_backward"],
        "backward: {backward:?}"
    );
}

#[test]
fn blend_lerp_pool2x2_falls_back_to_the_two_nodes() {
    let Some(_device) = gpu_or_skip() else { return };
    let f32 = (Kind::Float, CUDA);
    // A 1-pixel side, and host and seed in different layouts.
    let shape = [8_i64, 16, 1, 6];
    let (h, s) = (
        grid(shape, Kind::Float, true),
        grid(shape, Kind::Float, true),
    );
    let w = Tensor::rand([8_i64, 1, 1, 1], f32);
    let fused = run(&h, &s, &w, true, true);
    let two = run(&h, &s, &w, true, false);
    for (got, expected) in fused.iter().zip(&two) {
        assert_eq!(values(got), values(expected), "1-pixel side");
    }
    let shape = [8_i64, 16, 6, 6];
    let (h, s) = (
        grid(shape, Kind::Float, true),
        grid(shape, Kind::Float, false),
    );
    let fused = run(&h, &s, &w, false, true);
    let two = run(&h, &s, &w, false, false);
    for (got, expected) in fused.iter().zip(&two) {
        assert_eq!(values(got), values(expected), "mixed layouts");
    }
    // A weight that learns (a gated blend's) gets its gradient.
    let learned = Tensor::rand([8_i64, 1, 1, 1], f32).set_requires_grad(true);
    let y = nn::blend_lerp_pool2x2(&h, &h, &learned).unwrap();
    y.sum(Kind::Float).backward();
    assert!(learned.grad().defined(), "the learned weight's gradient");
}

#[test]
fn blend_lerp_pool2x2_replays_from_a_graph_with_new_weights() {
    let Some(_device) = gpu_or_skip() else { return };
    tch::manual_seed(21);
    let shape = [16_i64, 8, 7, 7];
    let h = grid(shape, Kind::Float, true);
    let s = grid(shape, Kind::Float, true);
    let w = Tensor::full([16_i64, 1, 1, 1], 0.25, (Kind::Float, CUDA));
    let out = Tensor::zeros([16_i64, 8, 3, 3], (Kind::Float, CUDA));
    let grads = [
        Tensor::zeros(shape, (Kind::Float, CUDA)),
        Tensor::zeros(shape, (Kind::Float, CUDA)),
    ];
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, || {
        let hh = h.detach().set_requires_grad(true);
        let ss = s.detach().set_requires_grad(true);
        let y = nn::blend_lerp_clamped_pool2x2(&hh, &ss, &w).map_err(|e| e.to_string())?;
        (&y * &y).sum(Kind::Float).backward();
        out.shallow_clone().copy_(&y);
        grads[0].shallow_clone().copy_(&hh.grad());
        grads[1].shallow_clone().copy_(&ss.grad());
        Ok(())
    })
    .unwrap();
    for value in [0.25, 0.9, 1.7] {
        let _ = w.shallow_clone().fill_(value);
        graph.replay().unwrap();
        stream.synchronize().unwrap();
        cuda::synchronize(0).unwrap();
        let hh = h.detach().set_requires_grad(true);
        let ss = s.detach().set_requires_grad(true);
        let y = nn::max_pool2x2(&nn::blend_lerp_clamped(&hh, &ss, &w).unwrap()).unwrap();
        (&y * &y).sum(Kind::Float).backward();
        assert_eq!(values(&out), values(&y), "y at alpha {value}");
        assert_eq!(values(&grads[0]), values(&hh.grad()), "dh at alpha {value}");
        assert_eq!(values(&grads[1]), values(&ss.grad()), "ds at alpha {value}");
    }
}
