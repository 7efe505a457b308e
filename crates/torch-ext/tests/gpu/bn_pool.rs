//! `nn::batch_norm_relu_pool2x2` on the GPU (part of the `gpu` test
//! binary): the one-node batch norm + ReLU + 2x2 max-pool against the two
//! nodes it replaces (`batch_norm_relu` then `max_pool2x2`, whose kernels
//! `nn.rs` checks against libtorch's): the output and running statistics
//! bit for bit, every gradient within rounding (its sums run in another
//! fixed order), in f32 and bf16, four and one channels a thread, even and
//! odd sizes, many ties; its kernels; evaluation and the 1-pixel side
//! falling back to the two nodes; a captured graph replaying eager's
//! values; and the first layer's statistics taken in the convolution
//! (`conv3x3_with_stats`) matching the statistics pass, with no pass run.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, memory, nn};

use super::nn::{worst, worst_of_max};
use super::{CUDA, gpu_or_skip, kernels_of, values};

/// Forward and backward through the block, as one node (`fused`) or the
/// two; returns (y, running mean, running var, dx, dweight, dbias).
fn block_run(x: &Tensor, train: bool, fused: bool) -> [Tensor; 6] {
    let channels = x.size()[1];
    let f32 = (Kind::Float, CUDA);
    let x = x.detach().set_requires_grad(true);
    tch::manual_seed(7);
    let weight = (Tensor::rand([channels], f32) + 0.5).set_requires_grad(true);
    let bias = (Tensor::randn([channels], f32) * 0.3).set_requires_grad(true);
    let running_mean = Tensor::zeros([channels], f32);
    let running_var = Tensor::ones([channels], f32);
    let (rm, rv) = (Some(&running_mean), Some(&running_var));
    let y = if fused {
        nn::batch_norm_relu_pool2x2(&x, &weight, &bias, rm, rv, train, 0.1, 1e-5).unwrap()
    } else {
        let z = nn::batch_norm_relu(&x, &weight, &bias, rm, rv, train, 0.1, 1e-5).unwrap();
        nn::max_pool2x2(&z).unwrap()
    };
    let upstream = Tensor::randn(y.size(), f32).to_kind(x.kind());
    (&y * &upstream)
        .to_kind(Kind::Float)
        .sum(Kind::Float)
        .backward();
    [
        y,
        running_mean,
        running_var,
        x.grad(),
        weight.grad(),
        bias.grad(),
    ]
}

fn channels_last(shape: [i64; 4], kind: Kind, seed: i64) -> Tensor {
    tch::manual_seed(seed);
    // Values on a grid of halves make equal activations (ties) common; a
    // mean far from zero checks the statistics' numerics.
    let x = ((Tensor::randn(shape, (Kind::Float, CUDA)) * 4.0).round() / 2.0 + 3.0).to_kind(kind);
    memory::contiguous_channels_last(&x).unwrap()
}

#[test]
fn batch_norm_relu_pool2x2_matches_the_two_nodes_it_replaces() {
    let Some(_device) = gpu_or_skip() else { return };
    for (kind, tolerance) in [(Kind::Float, 1e-4_f32), (Kind::BFloat16, 1e-2)] {
        for (n, c, h, w) in [
            (256_i64, 8_i64, 28_i64, 28_i64),
            (7, 16, 14, 14),
            (3, 32, 7, 7),
            (2, 24, 5, 3),
            (4, 3, 6, 5),
            (64, 256, 2, 2),
        ] {
            let x = channels_last([n, c, h, w], kind, n * c + h);
            let case = format!("{kind:?} [{n},{c},{h},{w}]");
            tch::manual_seed(11);
            let fused = block_run(&x, true, true);
            tch::manual_seed(11);
            let two = block_run(&x, true, false);
            assert_eq!(fused[0].size(), [n, c, h / 2, w / 2], "{case}");
            assert!(memory::is_channels_last(&fused[0]).unwrap(), "{case}");
            for (name, (got, expected)) in ["y", "running_mean", "running_var"]
                .iter()
                .zip(fused.iter().zip(&two))
            {
                assert_eq!(values(got), values(expected), "{case} {name}");
            }
            for (name, (got, expected)) in ["dx", "dweight", "dbias"]
                .iter()
                .zip(fused.iter().zip(&two).skip(3))
            {
                let err = worst(got, expected);
                assert!(
                    err <= tolerance,
                    "{case} {name}: relative error {err} > {tolerance}"
                );
            }
        }
    }
}

#[test]
fn batch_norm_relu_pool2x2_is_one_node_of_four_kernels() {
    let Some(_device) = gpu_or_skip() else { return };
    let x = channels_last([32, 16, 14, 14], Kind::Float, 3).set_requires_grad(true);
    let weight = Tensor::ones([16], (Kind::Float, CUDA)).set_requires_grad(true);
    let bias = Tensor::zeros([16], (Kind::Float, CUDA)).set_requires_grad(true);
    let mut y = None;
    let forward = kernels_of(|| {
        y = Some(
            nn::batch_norm_relu_pool2x2(&x, &weight, &bias, None, None, true, 0.1, 1e-5).unwrap(),
        );
    });
    // (The profile lists kernels by name, not in launch order.)
    let mut forward = forward;
    forward.sort();
    assert_eq!(
        forward,
        ["esper_bn_relu_pool_forward", "esper_bn_stats"],
        "forward"
    );
    let y = y.unwrap();
    // The sum's backward (a fill) runs beside the node's kernels.
    let loss = y.sum(Kind::Float);
    let backward = kernels_of(|| loss.backward());
    let mut ours: Vec<&String> = backward
        .iter()
        .filter(|k| k.starts_with("esper_bn"))
        .collect();
    ours.sort();
    assert_eq!(
        ours,
        [
            "esper_bn_relu_pool_backward_apply",
            "esper_bn_relu_pool_backward_reduce"
        ],
        "backward: {backward:?}"
    );
}

#[test]
fn batch_norm_relu_pool2x2_falls_back_to_the_two_nodes() {
    let Some(_device) = gpu_or_skip() else { return };
    // Evaluation (running statistics), and a side of one pixel.
    for (shape, train) in [([8, 16, 6, 6], false), ([8, 16, 1, 6], true)] {
        let x = channels_last(shape, Kind::Float, 5);
        tch::manual_seed(2);
        let fused = block_run(&x, train, true);
        tch::manual_seed(2);
        let two = block_run(&x, train, false);
        for (got, expected) in fused.iter().zip(&two) {
            assert_eq!(values(got), values(expected), "{shape:?} train {train}");
        }
    }
}

#[test]
fn batch_norm_relu_pool2x2_replays_from_a_graph_as_eager() {
    let Some(_device) = gpu_or_skip() else { return };
    let x = channels_last([64, 8, 14, 14], Kind::Float, 9);
    let weight = Tensor::ones([8], (Kind::Float, CUDA)).set_requires_grad(true);
    let bias = Tensor::full([8], 0.1, (Kind::Float, CUDA)).set_requires_grad(true);
    let run = || {
        let input = x.detach().set_requires_grad(true);
        let y = nn::batch_norm_relu_pool2x2(&input, &weight, &bias, None, None, true, 0.1, 1e-5)?;
        (&y * &y).sum(Kind::Float).backward();
        Ok::<_, torch_ext::Error>((y, input.grad()))
    };
    // Only values outlive a run: a live autograd graph would keep the
    // parameters' gradient-accumulation nodes on the default stream into
    // the capture.
    let eager = run().map(|(y, dx)| (values(&y), values(&dx))).unwrap();
    let second = run().map(|(y, dx)| (values(&y), values(&dx))).unwrap();
    assert_eq!(eager, second, "two runs differ");
    let out = Tensor::zeros([64, 8, 7, 7], (Kind::Float, CUDA));
    let grad = Tensor::zeros([64, 8, 14, 14], (Kind::Float, CUDA));
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, || {
        let (y, dx) = run().map_err(|e| e.to_string())?;
        out.shallow_clone().copy_(&y);
        grad.shallow_clone().copy_(&dx);
        Ok(())
    })
    .unwrap();
    graph.replay().unwrap();
    stream.synchronize().unwrap();
    cuda::synchronize(0).unwrap();
    assert_eq!(values(&out), eager.0);
    assert_eq!(values(&grad), eager.1);
}

/// `conv3x3_with_stats` then `batch_norm_relu_pool2x2_with_stats` (the
/// statistics from the convolution's kernel) where `with_stats`, else
/// `conv3x3` then the node with its own statistics pass; returns (conv
/// output, y, running mean, running var, dx, dconv weight, dweight, dbias)
/// and whether statistics came with the convolution.
fn first_layer_run(x: &Tensor, conv_weight: &Tensor, with_stats: bool) -> (Vec<Tensor>, bool) {
    let channels = conv_weight.size()[0];
    let f32 = (Kind::Float, CUDA);
    let x = x.detach().set_requires_grad(true);
    let conv_weight = conv_weight.detach().set_requires_grad(true);
    tch::manual_seed(7);
    let weight = (Tensor::rand([channels], f32) + 0.5).set_requires_grad(true);
    let bias = (Tensor::randn([channels], f32) * 0.3).set_requires_grad(true);
    let running_mean = Tensor::zeros([channels], f32);
    let running_var = Tensor::ones([channels], f32);
    let (rm, rv) = (Some(&running_mean), Some(&running_var));
    let (z, stats) = if with_stats {
        nn::conv3x3_with_stats(&x, &conv_weight).unwrap()
    } else {
        (nn::conv3x3(&x, &conv_weight).unwrap(), None)
    };
    let y = nn::batch_norm_relu_pool2x2_with_stats(
        &z,
        stats.as_ref(),
        &weight,
        &bias,
        rm,
        rv,
        true,
        0.1,
        1e-5,
    )
    .unwrap();
    let upstream = Tensor::randn(y.size(), f32).to_kind(y.kind());
    (&y * &upstream)
        .to_kind(Kind::Float)
        .sum(Kind::Float)
        .backward();
    let outputs = vec![
        z.detach(),
        y.detach(),
        running_mean,
        running_var,
        x.grad(),
        conv_weight.grad(),
        weight.grad(),
        bias.grad(),
    ];
    (outputs, stats.is_some())
}

#[test]
fn the_first_layers_statistics_from_the_convolution_match_the_statistics_pass() {
    let Some(_device) = gpu_or_skip() else { return };
    for (kind, tolerance) in [(Kind::Float, 1e-4_f32), (Kind::BFloat16, 2e-2)] {
        for (n, ci, co, side) in [
            (256_i64, 1_i64, 8_i64, 28_i64),
            (64, 3, 8, 32),
            (16, 1, 16, 14),
            (3, 2, 8, 5),
            (8, 1, 4, 8),
            (8, 3, 32, 8),
        ] {
            let case = format!("{kind:?} [{n},{ci},{side},{side}] -> {co}");
            tch::manual_seed(n + co);
            // Mean far from zero: the shift keeps the variance exact.
            let x = memory::contiguous_channels_last(
                &(Tensor::randn([n, ci, side, side], (Kind::Float, CUDA)) + 2.0).to_kind(kind),
            )
            .unwrap();
            let conv_weight =
                (Tensor::randn([co, ci, 3, 3], (Kind::Float, CUDA)) * 0.5).to_kind(kind);
            tch::manual_seed(3);
            let (fused, took) = first_layer_run(&x, &conv_weight, true);
            tch::manual_seed(3);
            let (plain, _) = first_layer_run(&x, &conv_weight, false);
            assert_eq!(took, co == 8 || co == 16, "{case}: statistics taken");
            assert_eq!(values(&fused[0]), values(&plain[0]), "{case}: conv output");
            // The statistics are the same sums in another order: the
            // output and running statistics within rounding. A rounding
            // difference may move a pool's argmax between near-equal
            // values, so the gradients are compared as sums (relative to
            // their largest value), and the input gradient not at all.
            for (name, index) in [("y", 1), ("running_mean", 2), ("running_var", 3)] {
                let err = worst(&fused[index], &plain[index]);
                assert!(
                    err <= tolerance,
                    "{case} {name}: relative error {err} > {tolerance}"
                );
            }
            let sums_tolerance = if kind == Kind::Float { 1e-3 } else { 2e-2 };
            for (name, index) in [("dconv", 5), ("dweight", 6), ("dbias", 7)] {
                let err = worst_of_max(&fused[index], &plain[index]);
                assert!(
                    err <= sums_tolerance,
                    "{case} {name}: error {err} of the largest > {sums_tolerance}"
                );
            }
        }
    }
}

#[test]
fn the_first_layer_with_statistics_runs_no_statistics_pass() {
    let Some(_device) = gpu_or_skip() else { return };
    let x = memory::contiguous_channels_last(&Tensor::randn([32, 1, 28, 28], (Kind::Float, CUDA)))
        .unwrap();
    let conv_weight = Tensor::randn([8, 1, 3, 3], (Kind::Float, CUDA));
    let weight = Tensor::ones([8], (Kind::Float, CUDA));
    let bias = Tensor::zeros([8], (Kind::Float, CUDA));
    let mut names = kernels_of(|| {
        let (z, stats) = nn::conv3x3_with_stats(&x, &conv_weight).unwrap();
        assert!(stats.is_some());
        let _y = nn::batch_norm_relu_pool2x2_with_stats(
            &z,
            stats.as_ref(),
            &weight,
            &bias,
            None,
            None,
            true,
            0.1,
            1e-5,
        )
        .unwrap();
    });
    names.sort();
    assert_eq!(
        names,
        [
            "esper_bn_relu_pool_forward",
            "esper_conv3_forward_small_stats8"
        ]
    );
    // Statistics of another tensor are refused.
    let (_, stats) = nn::conv3x3_with_stats(&x, &conv_weight).unwrap();
    let other = nn::conv3x3(&x, &conv_weight).unwrap();
    let refused = nn::batch_norm_relu_pool2x2_with_stats(
        &other,
        stats.as_ref(),
        &weight,
        &bias,
        None,
        None,
        true,
        0.1,
        1e-5,
    );
    assert!(matches!(
        refused,
        Err(torch_ext::Error::InvalidArgument { .. })
    ));
}
