//! `nn::batch_norm_relu_pool2x2` on the GPU (part of the `gpu` test
//! binary): the one-node batch norm + ReLU + 2x2 max-pool against the two
//! nodes it replaces (`batch_norm_relu` then `max_pool2x2`, whose kernels
//! `nn.rs` checks against libtorch's): the output and running statistics
//! bit for bit, every gradient within rounding (its sums run in another
//! fixed order), in f32 and bf16, four and one channels a thread, even and
//! odd sizes, many ties; its kernels; evaluation and the 1-pixel side
//! falling back to the two nodes; a captured graph replaying eager's
//! values.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, memory, nn};

use super::nn::worst;
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
