//! `torch_ext::nn::Bf16Shadows` on the GPU (part of the `gpu` test
//! binary): the one-launch cast gives libtorch's `to(bf16)` bit for bit
//! (ties, subnormals, infinities, NaN), over more tensors than one launch
//! takes; `nn::linear` reading the shadows gives the same output and
//! gradients, bit for bit, as casting itself, and reads the weights'
//! update at the next scope; a captured step refreshes the shadows at each
//! replay; and the step's layers launch one cast where they launched one
//! per weight and bias.

use tch::{Kind, Tensor};
use torch_ext::{AutocastDevice, AutocastGuard, CudaGraph, CudaStream, cuda, nn};

use super::{CUDA, gpu_or_skip, values};

/// The bf16 bits of `t` as i16, every NaN given one pattern (libtorch's
/// and the kernel's quiet NaNs may differ in their payload).
fn bits(t: &Tensor) -> Vec<i16> {
    let t = t.to_kind(Kind::BFloat16);
    let raw = Vec::<i16>::try_from(
        t.view_dtype(Kind::Int16)
            .flatten(0, -1)
            .to_device(tch::Device::Cpu),
    )
    .expect("i16 bits");
    let nan = Vec::<bool>::try_from(t.isnan().flatten(0, -1).to_device(tch::Device::Cpu))
        .expect("NaN mask");
    raw.into_iter()
        .zip(nan)
        .map(|(bits, nan)| if nan { i16::MIN } else { bits })
        .collect()
}

#[test]
fn shadows_are_libtorchs_bf16_cast_bit_for_bit() {
    let Some(_device) = gpu_or_skip() else { return };
    let f32 = (Kind::Float, CUDA);
    // Values at and around rounding ties, the subnormals, the extremes.
    let tie = 1.0_f32 + 1.0 / 256.0; // halfway between two bf16 values
    let special = Tensor::from_slice(&[
        tie,
        -tie,
        1.0 + 3.0 / 256.0,
        f32::MIN_POSITIVE,
        f32::MIN_POSITIVE / 3.0,
        -1e-40,
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.0,
        -0.0,
        3.389_531_4e38, // rounds up to infinity in bf16
    ])
    .to_device(CUDA);
    let mut weights = vec![special];
    tch::manual_seed(11);
    // 130 tensors: two launches; sizes around a block's 1,024 values.
    for i in 0..130_i64 {
        let n = [1, 3, 1023, 1024, 1025, 49_152][usize::try_from(i % 6).unwrap()] + i;
        weights.push(Tensor::randn([n], f32) * (10.0_f64).powi(i32::try_from(i % 7).unwrap() - 3));
    }
    let mut shadows = nn::Bf16Shadows::new();
    for w in &weights {
        assert!(shadows.add(w).unwrap());
    }
    let count = |fused_kernels: bool| {
        nn::set_fused_kernels(fused_kernels);
        cuda::synchronize(0).unwrap();
        let profiler = torch_ext::profile::KernelProfiler::start().unwrap();
        drop(shadows.enter().unwrap());
        cuda::synchronize(0).unwrap();
        let profile = profiler.stop().unwrap();
        nn::set_fused_kernels(true);
        profile.kernel_launches()
    };
    assert_eq!(count(true), 2, "130 tensors take two launches");
    for (w, s) in weights.iter().zip(shadows.shadows()) {
        assert_eq!(
            bits(s),
            bits(&w.to_kind(Kind::BFloat16)),
            "{} values",
            w.numel()
        );
    }
    // libtorch's copies where the kernel is off: one a tensor.
    for w in &weights {
        let _ = w.shallow_clone().f_mul_scalar_(-1.0).unwrap();
    }
    assert_eq!(count(false), u64::try_from(weights.len()).unwrap());
    for (w, s) in weights.iter().zip(shadows.shadows()) {
        assert_eq!(bits(s), bits(&w.to_kind(Kind::BFloat16)));
    }
}

/// One autocast step of two linear layers: `(y, dx, [dw1, db1, dw2, db2])`.
fn two_layers(x: &Tensor, params: &[Tensor; 4], shadows: Option<&nn::Bf16Shadows>) -> Vec<Tensor> {
    for p in params {
        let grad = p.grad();
        if grad.defined() {
            let _ = grad.shallow_clone().zero_();
        }
    }
    let x = x.detach().set_requires_grad(true);
    let y = {
        let _autocast = AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16).unwrap();
        let _scope = shadows.map(|s| s.enter().unwrap());
        let h = nn::linear(&x, &params[0], Some(&params[1]))
            .unwrap()
            .gelu("none");
        nn::linear(&h, &params[2], Some(&params[3])).unwrap()
    };
    let y = y.to_kind(Kind::Float);
    (&y * &y).sum(Kind::Float).backward();
    let mut out = vec![y.detach(), x.grad()];
    out.extend(params.iter().map(Tensor::grad));
    out
}

fn params() -> [Tensor; 4] {
    tch::manual_seed(5);
    let f32 = (Kind::Float, CUDA);
    [
        (Tensor::randn([512, 128], f32) * 0.1).set_requires_grad(true),
        (Tensor::randn([512], f32) * 0.1).set_requires_grad(true),
        (Tensor::randn([128, 512], f32) * 0.05).set_requires_grad(true),
        (Tensor::randn([128], f32) * 0.1).set_requires_grad(true),
    ]
}

#[test]
fn linear_reads_the_shadows_with_the_same_results() {
    let Some(_device) = gpu_or_skip() else { return };
    let x = Tensor::randn([256, 128], (Kind::Float, CUDA));
    let p = params();
    let mut shadows = nn::Bf16Shadows::new();
    // The first step misses all four and casts them itself.
    let first = two_layers(&x, &p, Some(&shadows));
    assert_eq!(shadows.adopt_misses().unwrap(), 4);
    let plain = two_layers(&x, &p, None);
    for (a, b) in first.iter().zip(&plain) {
        assert_eq!(values(a), values(b));
    }
    for round in 0..2 {
        let shadowed = two_layers(&x, &p, Some(&shadows));
        assert_eq!(shadows.adopt_misses().unwrap(), 0, "nothing missed");
        let plain = two_layers(&x, &p, None);
        for (index, (a, b)) in shadowed.iter().zip(&plain).enumerate() {
            assert_eq!(values(a), values(b), "round {round}, tensor {index}");
        }
        // An update in place, as the optimizer's: the next scope sees it.
        tch::no_grad(|| {
            for t in &p {
                let _ = t.shallow_clone().f_add_scalar_(0.01).unwrap();
            }
        });
    }
    // The layers cast nothing themselves: one launch casts all four.
    let casts = |shadows: Option<&nn::Bf16Shadows>| {
        let _ = two_layers(&x, &p, shadows);
        cuda::synchronize(0).unwrap();
        let profiler = torch_ext::profile::KernelProfiler::start().unwrap();
        let _ = two_layers(&x, &p, shadows);
        cuda::synchronize(0).unwrap();
        let profile = profiler.stop().unwrap();
        let named = |name: &str| -> u64 {
            profile
                .kernels
                .iter()
                .filter(|k| k.name.contains(name))
                .map(|k| k.count)
                .sum()
        };
        (named("bfloat16_copy"), named("esper_foreach"))
    };
    let (own, _) = casts(None);
    let (left, multi) = casts(Some(&shadows));
    assert_eq!(multi, 1, "one multi-tensor cast");
    assert_eq!(
        own.checked_sub(left),
        Some(4),
        "four casts fewer: {own} against {left}"
    );
}

#[test]
fn a_captured_step_refreshes_the_shadows_at_each_replay() {
    let Some(_device) = gpu_or_skip() else { return };
    let x = Tensor::randn([256, 128], (Kind::Float, CUDA));
    let p = params();
    let mut shadows = nn::Bf16Shadows::new();
    let _ = two_layers(&x, &p, Some(&shadows));
    assert_eq!(shadows.adopt_misses().unwrap(), 4);
    let out = Tensor::zeros([256, 128], (Kind::Float, CUDA));
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, || {
        let y = two_layers(&x, &p, Some(&shadows));
        out.shallow_clone().copy_(&y[0]);
        Ok::<(), String>(())
    })
    .unwrap();
    assert_eq!(shadows.adopt_misses().unwrap(), 0);
    for _ in 0..2 {
        tch::no_grad(|| {
            for t in &p {
                let _ = t.shallow_clone().f_mul_scalar_(1.5).unwrap();
            }
        });
        cuda::synchronize(0).unwrap();
        graph.replay().unwrap();
        stream.synchronize().unwrap();
        cuda::synchronize(0).unwrap();
        let eager = two_layers(&x, &p, None);
        assert_eq!(
            values(&out),
            values(&eager[0]),
            "the replay used the new weights"
        );
    }
}
