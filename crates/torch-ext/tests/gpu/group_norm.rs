//! `torch_ext::nn::group_norm_relu_add` on the GPU (part of the `gpu` test
//! binary): the residual added inside the fused forward kernel gives the
//! unfused sum (`residual + group_norm_relu(x)` through libtorch's add) bit
//! for bit, output and every gradient, in f32 and bf16, for the quad and
//! the per-channel kernels, eagerly and replayed from a captured graph; the
//! forward launches no add kernel; a residual of another layout or dtype takes
//! libtorch's add, and one of another shape is refused.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, Error, cuda, memory, nn};

use super::{CUDA, gpu_or_skip, kernels_of};

/// Output and the gradients of x, weight, bias and residual, for one
/// upstream gradient; `fused` picks the fused add or the add after it.
fn run(x: &Tensor, residual: &Tensor, groups: i64, fused: bool) -> [Tensor; 5] {
    let channels = x.size()[1];
    let f32 = (Kind::Float, CUDA);
    let x = x.detach().set_requires_grad(true);
    let residual = residual.detach().set_requires_grad(true);
    tch::manual_seed(11);
    let weight = (Tensor::rand([channels], f32) + 0.5).set_requires_grad(true);
    let bias = (Tensor::randn([channels], f32) * 0.3).set_requires_grad(true);
    let y = if fused {
        nn::group_norm_relu_add(&x, &residual, groups, &weight, &bias, 1e-5).unwrap()
    } else {
        let normed = nn::group_norm_relu(&x, groups, &weight, &bias, 1e-5).unwrap();
        residual.f_add(&normed).unwrap()
    };
    assert_eq!(y.kind(), x.kind(), "the output keeps the input's dtype");
    let upstream = Tensor::randn(y.size(), f32);
    (y.to_kind(Kind::Float) * &upstream)
        .sum(Kind::Float)
        .backward();
    [y, x.grad(), weight.grad(), bias.grad(), residual.grad()]
}

fn inputs(n: i64, c: i64, hw: i64, bf16: bool) -> (Tensor, Tensor) {
    tch::manual_seed(n + c);
    let make = |scale: f64| {
        let t = Tensor::randn([n, c, hw, hw], (Kind::Float, CUDA)) * scale;
        let t = memory::contiguous_channels_last(&t).unwrap();
        if bf16 { t.to_kind(Kind::BFloat16) } else { t }
    };
    (make(2.0), make(1.0))
}

#[test]
fn group_norm_relu_add_is_the_unfused_sum_bit_for_bit() {
    let Some(_device) = gpu_or_skip() else { return };
    // (batch, channels, side, groups): the conv_light seed at the 16- and
    // 32-channel slots (quad kernels) and at the 8-channel slot (groups of
    // one channel, the per-channel kernels), and odd groups.
    let cases = [
        (64_i64, 16_i64, 16_i64, 4_i64),
        (32, 32, 8, 8),
        (64, 8, 32, 8),
        (8, 12, 5, 4),
    ];
    for bf16 in [false, true] {
        for (n, c, hw, groups) in cases {
            let (x, residual) = inputs(n, c, hw, bf16);
            let fused = run(&x, &residual, groups, true);
            let unfused = run(&x, &residual, groups, false);
            for (name, (a, b)) in ["output", "dx", "dweight", "dbias", "dresidual"]
                .iter()
                .zip(fused.iter().zip(&unfused))
            {
                assert!(
                    a.equal(b),
                    "bf16 {bf16} [{n},{c},{hw},{hw}] groups {groups} {name}: not the unfused result"
                );
            }
        }
    }
}

#[test]
fn group_norm_relu_add_launches_no_add_and_replays_from_a_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    let (x, residual) = inputs(32, 16, 16, false);
    let f32 = (Kind::Float, CUDA);
    let (weight, bias) = (Tensor::ones([16], f32), Tensor::zeros([16], f32));
    let names = kernels_of(|| {
        let _profiled = nn::group_norm_relu_add(&x, &residual, 4, &weight, &bias, 1e-5).unwrap();
    });
    assert_eq!(names.len(), 1, "one kernel forward: {names:?}");
    assert!(names[0].contains("esper_gn_relu_forward"), "{names:?}");

    // Forward and backward captured on zeros, replayed on the inputs, against
    // the same pass run eagerly.
    let upstream = Tensor::randn(x.size(), f32);
    let pass = |x: &Tensor, residual: &Tensor| -> Result<[Tensor; 3], String> {
        let xs = x.detach().set_requires_grad(true);
        let rs = residual.detach().set_requires_grad(true);
        let y = nn::group_norm_relu_add(&xs, &rs, 4, &weight, &bias, 1e-5)
            .map_err(|e| e.to_string())?;
        (&y * &upstream).sum(Kind::Float).backward();
        Ok([y, xs.grad(), rs.grad()])
    };
    let eager = pass(&x, &residual).unwrap();
    let stream = CudaStream::from_pool(0, false).unwrap();
    let (x_in, res_in) = (x.zeros_like(), residual.zeros_like());
    let outs: Vec<Tensor> = eager.iter().map(Tensor::zeros_like).collect();
    let graph = CudaGraph::capture(&stream, None, 0, || {
        for (out, t) in outs.iter().zip(pass(&x_in, &res_in)?) {
            out.shallow_clone().copy_(&t);
        }
        Ok(())
    })
    .unwrap();
    x_in.shallow_clone().copy_(&x);
    res_in.shallow_clone().copy_(&residual);
    graph.replay().unwrap();
    stream.synchronize().unwrap();
    cuda::synchronize(0).unwrap();
    for (name, (got, want)) in ["output", "dx", "dresidual"]
        .iter()
        .zip(outs.iter().zip(&eager))
    {
        assert!(got.equal(want), "replayed {name} is not the eager one");
    }
}

#[test]
fn group_norm_relu_add_falls_back_or_refuses_a_residual_that_does_not_fit() {
    let Some(_device) = gpu_or_skip() else { return };
    let (x, residual) = inputs(8, 16, 8, false);
    let f32 = (Kind::Float, CUDA);
    let (weight, bias) = (Tensor::ones([16], f32), Tensor::zeros([16], f32));
    // A contiguous (NCHW) residual to a channels-last input: the fused
    // group norm, then libtorch's add.
    let nchw = residual.contiguous();
    let y = nn::group_norm_relu_add(&x, &nchw, 4, &weight, &bias, 1e-5).unwrap();
    let normed = nn::group_norm_relu(&x, 4, &weight, &bias, 1e-5).unwrap();
    assert!(y.equal(&nchw.f_add(&normed).unwrap()));
    // An f32 residual to a bf16 input under autocast: libtorch's add with its
    // promotion, so the sum is f32.
    let half = x.to_kind(Kind::BFloat16);
    let _autocast =
        torch_ext::AutocastGuard::new(torch_ext::AutocastDevice::Cuda, Kind::BFloat16).unwrap();
    let y = nn::group_norm_relu_add(&half, &residual, 4, &weight, &bias, 1e-5).unwrap();
    let normed = nn::group_norm_relu(&half, 4, &weight, &bias, 1e-5).unwrap();
    assert_eq!(y.kind(), Kind::Float);
    assert!(y.equal(&residual.f_add(&normed).unwrap()));
    // A residual of another shape is refused before libtorch broadcasts it.
    let short = residual.narrow(0, 0, 1);
    match nn::group_norm_relu_add(&x, &short, 4, &weight, &bias, 1e-5) {
        Err(Error::InvalidArgument { message, .. }) => {
            assert!(message.contains("residual"), "{message}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
