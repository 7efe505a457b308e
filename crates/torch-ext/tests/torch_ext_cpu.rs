//! CPU behaviour of torch-ext: CUDA-only calls fail with `CudaUnavailable`,
//! precision switches round-trip, inference mode and autocast guards apply and
//! restore, non-blocking copies and the fused / foreach ops compute the right
//! values.

use std::sync::Mutex;

use tch::{Device, Kind, Tensor};
use torch_ext::fused::{self, AdamWOptions, LearningRate, SgdOptions};
use torch_ext::precision::{self, MatmulPrecision};
use torch_ext::{
    AutocastDevice, AutocastGuard, CudaEvent, CudaGraph, CudaStream, Error, GraphPool,
    InferenceModeGuard, autocast_state, copy_non_blocking, cuda, index_copy_many, is_inference,
    is_inference_mode_enabled, memcpy_async, write_host_bytes,
};

/// Serialises the tests that flip process-wide libtorch flags.
static GLOBAL_FLAGS: Mutex<()> = Mutex::new(());

fn values(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(tensor.flatten(0, -1).to_kind(Kind::Float)).expect("float tensor")
}

fn assert_close(got: &[f32], expected: &[f64], tolerance: f64) {
    assert_eq!(
        got.len(),
        expected.len(),
        "lengths differ: {got:?} vs {expected:?}"
    );
    for (index, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (f64::from(*g) - e).abs() <= tolerance,
            "element {index}: got {g}, expected {e} (all: {got:?} vs {expected:?})"
        );
    }
}

fn is_unavailable<T: std::fmt::Debug>(result: torch_ext::Result<T>) -> bool {
    matches!(result, Err(Error::CudaUnavailable))
}

#[test]
fn cuda_only_calls_report_cuda_unavailable_without_a_gpu() {
    if cuda::is_available() {
        println!("skipping: a CUDA device is present, this test is for CPU-only machines");
        return;
    }
    assert_eq!(cuda::device_count(), 0);
    assert!(
        !tch::Cuda::is_available(),
        "tch and torch-ext disagree about CUDA"
    );
    assert!(is_unavailable(cuda::synchronize(0)));
    assert!(is_unavailable(cuda::set_sync_debug_mode(
        cuda::SyncDebugMode::Error
    )));
    assert!(is_unavailable(cuda::sync_debug_mode()));
    assert!(is_unavailable(cuda::max_memory_allocated(0)));
    assert!(is_unavailable(cuda::memory_allocated(0)));
    assert!(is_unavailable(cuda::memory_reserved(0)));
    assert!(is_unavailable(cuda::memory_stats(0)));
    assert!(is_unavailable(cuda::reset_peak_memory_stats(0)));
    assert!(is_unavailable(cuda::empty_cache()));
    assert!(is_unavailable(cuda::device_name(0)));
    assert!(is_unavailable(cuda::device_capability(0)));
    assert!(is_unavailable(CudaStream::from_pool(0, false)));
    assert!(is_unavailable(CudaStream::from_pool(0, true)));
    assert!(is_unavailable(CudaStream::current(0)));
    assert!(is_unavailable(CudaStream::default_stream(0)));
    assert!(is_unavailable(CudaEvent::new(true)));
    assert!(is_unavailable(GraphPool::new()));
    assert!(is_unavailable(AutocastGuard::new(
        AutocastDevice::Cuda,
        Kind::BFloat16
    )));
    assert_eq!(Error::CudaUnavailable.to_string(), "CUDA not available");
}

#[test]
fn graph_capture_without_a_gpu_fails_before_running_the_body() {
    if cuda::is_available() {
        println!("skipping: a CUDA device is present, this test is for CPU-only machines");
        return;
    }
    // A stream cannot be obtained without CUDA, so no capture can even be
    // attempted; the body is never run.
    let mut calls = 0;
    let stream = CudaStream::from_pool(0, false);
    assert!(is_unavailable(stream));
    let result = CudaStream::current(0).and_then(|stream| {
        CudaGraph::capture(&stream, None, 3, || {
            calls += 1;
            Ok(())
        })
    });
    assert!(is_unavailable(result));
    assert_eq!(calls, 0);
}

#[test]
fn runtime_versions_report_the_cuda_13_runtime_of_the_wheel() {
    let (runtime, driver) =
        cuda::runtime_versions().expect("cudaRuntimeGetVersion works without a GPU");
    assert!(runtime.starts_with("13."), "runtime {runtime}");
    if !cuda::is_available() {
        // No driver on CPU-only machines; a driver without a device is possible too.
        assert!(driver == "none" || driver.contains('.'), "driver {driver}");
    }
}

#[test]
fn precision_switches_round_trip() {
    let _lock = GLOBAL_FLAGS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let saved_tf32 = precision::try_allow_tf32().expect("consistent TF32 settings");
    let saved_precision = precision::float32_matmul_precision();
    let saved_cudnn = precision::cudnn_flags();

    precision::set_allow_tf32(true, false);
    assert_eq!(precision::try_allow_tf32().unwrap(), (true, false));
    // The matmul TF32 switch and the matmul precision are one setting.
    assert_eq!(precision::float32_matmul_precision(), MatmulPrecision::High);

    precision::set_allow_tf32(false, true);
    assert_eq!(precision::allow_tf32(), (false, true));
    assert_eq!(
        precision::float32_matmul_precision(),
        MatmulPrecision::Highest
    );

    precision::set_float32_matmul_precision(MatmulPrecision::High);
    assert_eq!(precision::float32_matmul_precision(), MatmulPrecision::High);
    assert!(precision::try_allow_tf32().unwrap().0);
    precision::set_float32_matmul_precision(MatmulPrecision::Highest);
    assert_eq!(
        precision::float32_matmul_precision(),
        MatmulPrecision::Highest
    );
    assert!(!precision::try_allow_tf32().unwrap().0);

    precision::set_cudnn_benchmark(true);
    precision::set_cudnn_deterministic(false);
    assert_eq!(precision::cudnn_flags(), (true, false));
    precision::set_cudnn_benchmark(false);
    precision::set_cudnn_deterministic(true);
    assert_eq!(precision::cudnn_flags(), (false, true));

    precision::set_float32_matmul_precision(saved_precision);
    precision::set_allow_tf32(saved_tf32.0, saved_tf32.1);
    precision::set_float32_matmul_precision(saved_precision);
    precision::set_cudnn_benchmark(saved_cudnn.0);
    precision::set_cudnn_deterministic(saved_cudnn.1);
    assert_eq!(precision::float32_matmul_precision(), saved_precision);
}

#[test]
fn medium_matmul_precision_is_stored() {
    let _lock = GLOBAL_FLAGS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let saved = precision::float32_matmul_precision();
    precision::set_float32_matmul_precision(MatmulPrecision::Medium);
    assert_eq!(
        precision::float32_matmul_precision(),
        MatmulPrecision::Medium
    );
    precision::set_float32_matmul_precision(saved);
    assert_eq!(precision::float32_matmul_precision(), saved);
}

#[test]
fn inference_mode_guard_applies_and_restores() {
    let weight = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    assert!(!is_inference_mode_enabled());
    let before = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    assert!(!is_inference(&before).unwrap());
    {
        let _guard = InferenceModeGuard::new().unwrap();
        assert!(is_inference_mode_enabled());
        let inside = &weight * 2.0;
        assert!(is_inference(&inside).unwrap());
        assert!(
            !inside.requires_grad(),
            "no autograd graph inside inference mode"
        );
        {
            let _nested = InferenceModeGuard::new().unwrap();
            assert!(is_inference_mode_enabled());
        }
        assert!(
            is_inference_mode_enabled(),
            "inner guard restored the outer state"
        );
    }
    assert!(!is_inference_mode_enabled());
    let after = &weight * 2.0;
    assert!(!is_inference(&after).unwrap());
    assert!(
        after.requires_grad(),
        "autograd records again after the guard"
    );
}

#[test]
fn autocast_guard_on_cpu_runs_matmul_in_bfloat16_and_restores() {
    let a = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
    let b = Tensor::randn([8, 3], (Kind::Float, Device::Cpu));
    let before = autocast_state(AutocastDevice::Cpu).unwrap();
    assert!(!before.enabled);
    assert_eq!(a.matmul(&b).kind(), Kind::Float);
    {
        let guard = AutocastGuard::new(AutocastDevice::Cpu, Kind::BFloat16).unwrap();
        assert_eq!(guard.device(), AutocastDevice::Cpu);
        let state = autocast_state(AutocastDevice::Cpu).unwrap();
        assert!(state.enabled);
        assert_eq!(state.dtype, Kind::BFloat16);
        let product = a.matmul(&b);
        assert_eq!(product.kind(), Kind::BFloat16);
        // bf16 result approximates the float32 product.
        let exact = values(&a.matmul(&b.to_kind(Kind::Float)).to_kind(Kind::Float));
        let approx = values(&product);
        for (x, y) in exact.iter().zip(&approx) {
            assert!((x - y).abs() <= 0.05 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
    let after = autocast_state(AutocastDevice::Cpu).unwrap();
    assert_eq!(after, before);
    assert_eq!(a.matmul(&b).kind(), Kind::Float);
}

#[test]
fn autocast_guard_without_cache_restores_the_cache_flag() {
    let before = autocast_state(AutocastDevice::Cpu).unwrap();
    {
        let _guard = AutocastGuard::with_cache(AutocastDevice::Cpu, Kind::BFloat16, false).unwrap();
        assert!(!autocast_state(AutocastDevice::Cpu).unwrap().cache_enabled);
    }
    assert_eq!(autocast_state(AutocastDevice::Cpu).unwrap(), before);
}

#[test]
fn autocast_guard_rejects_a_full_precision_dtype() {
    let before = autocast_state(AutocastDevice::Cpu).unwrap();
    let result = AutocastGuard::new(AutocastDevice::Cpu, Kind::Float);
    assert!(
        matches!(result, Err(Error::InvalidArgument { .. })),
        "{result:?}"
    );
    assert_eq!(autocast_state(AutocastDevice::Cpu).unwrap(), before);
}

#[test]
fn copy_non_blocking_copies_cpu_tensors_and_converts_dtype() {
    let source = Tensor::arange(6, (Kind::Double, Device::Cpu)).reshape([2, 3]);
    let mut destination = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    copy_non_blocking(&mut destination, &source).unwrap();
    assert_eq!(destination.kind(), Kind::Float);
    assert_eq!(values(&destination), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);

    // Broadcasting works like copy_.
    let row = Tensor::from_slice(&[7.0_f32, 8.0, 9.0]);
    copy_non_blocking(&mut destination, &row).unwrap();
    assert_eq!(values(&destination), vec![7.0, 8.0, 9.0, 7.0, 8.0, 9.0]);
}

#[test]
fn copy_non_blocking_reports_a_shape_mismatch_as_a_cpp_error() {
    let source = Tensor::ones([4], (Kind::Float, Device::Cpu));
    let mut destination = Tensor::zeros([3], (Kind::Float, Device::Cpu));
    match copy_non_blocking(&mut destination, &source) {
        Err(Error::Cpp { op, message }) => {
            assert_eq!(op, "copy_non_blocking");
            assert!(!message.is_empty());
        }
        other => panic!("expected a C++ error, got {other:?}"),
    }
    assert_eq!(
        values(&destination),
        vec![0.0, 0.0, 0.0],
        "destination untouched"
    );
}

#[test]
fn write_host_bytes_writes_into_a_view_and_refuses_what_does_not_fit() {
    let buffer = Tensor::zeros([16], (Kind::Uint8, Device::Cpu));
    // Into a view: the bytes land from the view's first element on.
    let view = buffer.narrow(0, 4, 8);
    write_host_bytes(&view, &[1, 2, 3]).unwrap();
    let bytes = Vec::<u8>::try_from(&buffer).unwrap();
    assert_eq!(&bytes[..8], &[0, 0, 0, 0, 1, 2, 3, 0]);
    // Typed targets take their size in bytes: two f32 are eight bytes.
    let floats = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    let raw: Vec<u8> = [1.5_f32, -2.0]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    write_host_bytes(&floats, &raw).unwrap();
    assert_eq!(Vec::<f32>::try_from(&floats).unwrap(), vec![1.5, -2.0]);

    let refused = |target: &Tensor, bytes: &[u8]| match write_host_bytes(target, bytes) {
        Err(Error::InvalidArgument { op, message }) => {
            assert_eq!(op, "write_host_bytes");
            message
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    let message = refused(&view, &[9; 9]);
    assert!(message.contains("9 bytes"), "{message}");
    let strided = Tensor::zeros([4, 4], (Kind::Uint8, Device::Cpu)).transpose(0, 1);
    assert!(refused(&strided, &[1]).contains("contiguous"));
    // Nothing was written by a refused call.
    assert_eq!(Vec::<u8>::try_from(&buffer).unwrap()[8..], [0; 8]);
}

#[test]
fn memcpy_async_refuses_what_it_cannot_copy_raw() {
    let refused = |dst: &Tensor, src: &Tensor| match memcpy_async(dst, src) {
        Err(Error::InvalidArgument { op, message }) => {
            assert_eq!(op, "memcpy_async");
            message
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    let host = Tensor::zeros([4], (Kind::Float, Device::Cpu));
    // Pageable host memory cannot take part (and on the CPU nothing is
    // pinned), whichever side it is.
    assert!(refused(&host, &host.copy()).contains("pageable"));
    let strided = Tensor::zeros([2, 2], (Kind::Float, Device::Cpu)).transpose(0, 1);
    assert!(refused(&host.view([2, 2]), &strided).contains("contiguous"));
    if cuda::is_available() {
        let pinned = torch_ext::memory::pin(&host).unwrap();
        let on_device = Tensor::zeros([5], (Kind::Float, Device::Cuda(0)));
        assert!(refused(&on_device, &pinned).contains("bytes"));
        assert!(refused(&pinned, &pinned.copy().pin_memory(Device::Cuda(0))).contains("neither"));
    }
}

#[test]
fn index_copy_many_writes_every_target_at_the_index_or_nothing() {
    let cpu = Device::Cpu;
    let floats = Tensor::zeros([2, 5, 3], (Kind::Float, cpu));
    let ints = Tensor::zeros([2, 5], (Kind::Int64, cpu));
    let flags = Tensor::zeros([5, 2], (Kind::Bool, cpu));
    let a = Tensor::arange(6, (Kind::Float, cpu)).view([2, 3]);
    let b = Tensor::from_slice(&[7_i64, 8]);
    let c = Tensor::from_slice(&[true, false]);
    let index = Tensor::from_slice(&[3_i64]);
    index_copy_many(&[(&floats, 1, &a), (&ints, 1, &b), (&flags, 0, &c)], &index).unwrap();
    let expect = |target: &Tensor, dim: i64, source: &Tensor| {
        let want = target.zeros_like();
        let _ = want
            .shallow_clone()
            .index_copy_(dim, &index, &source.unsqueeze(dim));
        assert!(target.equal(&want));
    };
    expect(&floats, 1, &a);
    expect(&ints, 1, &b);
    expect(&flags, 0, &c);

    // Refused before any write: a wrong shape, dtype, dimension or index.
    let before = floats.copy();
    for (writes, index) in [
        (vec![(&floats, 1_i64, &b)], index.shallow_clone()),
        (vec![(&floats, 3, &a)], index.shallow_clone()),
        (vec![(&floats, 1, &a)], Tensor::from_slice(&[1_i64, 2])),
        (vec![(&floats, 1, &a)], Tensor::from_slice(&[1.0_f32])),
    ] {
        let mut all = writes.clone();
        all.insert(0, (&ints, 1, &b));
        match index_copy_many(&all, &index) {
            Err(Error::InvalidArgument { op, .. }) => assert_eq!(op, "index_copy_many"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert!(floats.equal(&before));
}

/// Reference SGD (torch.optim.SGD semantics) on plain numbers.
struct ReferenceSgd {
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    dampening: f64,
    nesterov: bool,
}

impl ReferenceSgd {
    fn step(&self, param: &mut [f64], grad: &[f64], buffer: &mut [f64], first: bool) {
        for i in 0..param.len() {
            let d_p = grad[i] + self.weight_decay * param[i];
            let update = if self.momentum != 0.0 {
                if first {
                    buffer[i] = d_p;
                } else {
                    buffer[i] = self.momentum * buffer[i] + (1.0 - self.dampening) * d_p;
                }
                if self.nesterov {
                    d_p + self.momentum * buffer[i]
                } else {
                    buffer[i]
                }
            } else {
                d_p
            };
            param[i] -= self.lr * update;
        }
    }
}

fn run_sgd_against_reference(nesterov: bool) {
    let reference = ReferenceSgd {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.01,
        dampening: 0.0,
        nesterov,
    };
    let p0 = [1.0, -2.0, 0.5, 3.0];
    let p1 = [0.25, -0.75];
    let grads_step1 = ([0.5, 0.25, -1.0, 2.0], [1.5, -0.5]);
    let grads_step2 = ([-0.5, 1.0, 0.0, 0.25], [0.125, 2.0]);

    let params = vec![
        Tensor::from_slice(&p0.map(|v| v as f32)).set_requires_grad(true),
        Tensor::from_slice(&p1.map(|v| v as f32))
            .reshape([1, 2])
            .set_requires_grad(true),
    ];
    let buffers: Vec<Tensor> = params.iter().map(Tensor::zeros_like).collect();
    let mut expected = (p0.to_vec(), p1.to_vec());
    let mut expected_buffers = (vec![0.0; 4], vec![0.0; 2]);

    for (step, (g0, g1)) in [grads_step1, grads_step2].into_iter().enumerate() {
        let grads = vec![
            Tensor::from_slice(&g0.map(|v| v as f32)),
            Tensor::from_slice(&g1.map(|v| v as f32)).reshape([1, 2]),
        ];
        let first = step == 0;
        fused::sgd_step(
            &params, &grads, &buffers, 0.1, 0.9, 0.01, 0.0, nesterov, first,
        )
        .unwrap();
        reference.step(&mut expected.0, &g0, &mut expected_buffers.0, first);
        reference.step(&mut expected.1, &g1, &mut expected_buffers.1, first);
        assert_close(&values(&params[0]), &expected.0, 1e-5);
        assert_close(&values(&params[1]), &expected.1, 1e-5);
        assert_close(&values(&buffers[0]), &expected_buffers.0, 1e-5);
    }
    assert!(
        params[0].requires_grad(),
        "parameters stay trainable leaves"
    );
}

#[test]
fn fused_sgd_step_matches_reference_sgd_with_momentum() {
    run_sgd_against_reference(false);
}

#[test]
fn fused_sgd_step_matches_reference_sgd_with_nesterov() {
    run_sgd_against_reference(true);
}

#[test]
fn fused_sgd_without_momentum_takes_no_buffers_and_reads_a_tensor_lr() {
    let params = vec![Tensor::from_slice(&[1.0_f32, 2.0])];
    let grads = vec![Tensor::from_slice(&[0.5_f32, -1.0])];
    let lr = Tensor::from(0.5_f64).to_kind(Kind::Float);
    let options = SgdOptions {
        lr: LearningRate::Tensor(&lr),
        ..SgdOptions::default()
    };
    fused::sgd_step_with(&params, &grads, &[], &options).unwrap();
    assert_close(&values(&params[0]), &[0.75, 2.5], 1e-6);
}

#[test]
fn fused_sgd_rejects_mismatched_lists() {
    let params = vec![
        Tensor::from_slice(&[1.0_f32]),
        Tensor::from_slice(&[2.0_f32]),
    ];
    let grads = vec![Tensor::from_slice(&[0.5_f32])];
    let result = fused::sgd_step(&params, &grads, &[], 0.1, 0.0, 0.0, 0.0, false, false);
    assert!(
        matches!(result, Err(Error::InvalidArgument { .. })),
        "{result:?}"
    );
    let buffers = vec![Tensor::from_slice(&[0.0_f32])];
    let result = fused::sgd_step(
        &params,
        &[params[0].zeros_like(), params[1].zeros_like()],
        &buffers,
        0.1,
        0.9,
        0.0,
        0.0,
        false,
        true,
    );
    assert!(
        matches!(result, Err(Error::InvalidArgument { .. })),
        "{result:?}"
    );
    assert_eq!(values(&params[0]), vec![1.0], "nothing was updated");
}

#[test]
fn fused_adamw_first_step_matches_the_reference() {
    let (lr, beta1, beta2, weight_decay, eps) = (0.01, 0.9, 0.999, 0.1, 1e-8);
    let p = [1.0, -2.0, 0.5];
    let g = [0.5, 0.25, -4.0];
    let params = vec![Tensor::from_slice(&p.map(|v| v as f32)).set_requires_grad(true)];
    let grads = vec![Tensor::from_slice(&g.map(|v| v as f32))];
    let exp_avgs = vec![params[0].zeros_like()];
    let exp_avg_sqs = vec![params[0].zeros_like()];
    let steps = vec![Tensor::zeros([], (Kind::Float, Device::Cpu))];
    let options = AdamWOptions {
        lr: LearningRate::Value(lr),
        beta1,
        beta2,
        weight_decay,
        eps,
        ..AdamWOptions::default()
    };
    fused::adamw_step(&params, &grads, &exp_avgs, &exp_avg_sqs, &steps, &options).unwrap();

    let expected: Vec<f64> = p
        .iter()
        .zip(&g)
        .map(|(p, g)| {
            let decayed = p * (1.0 - lr * weight_decay);
            let m_hat = (1.0 - beta1) * g / (1.0 - beta1);
            let v_hat = (1.0 - beta2) * g * g / (1.0 - beta2);
            decayed - lr * m_hat / (v_hat.sqrt() + eps)
        })
        .collect();
    assert_close(&values(&params[0]), &expected, 1e-6);
    assert_eq!(
        values(&steps[0]),
        vec![1.0],
        "the step count lives in a tensor"
    );
    assert_close(&values(&exp_avgs[0]), &g.map(|g| 0.1 * g), 1e-6);
}

#[test]
fn foreach_ops_update_every_tensor() {
    let tensors = vec![
        Tensor::from_slice(&[1.0_f32, 2.0]),
        Tensor::from_slice(&[3.0_f32]),
    ];
    let others = vec![
        Tensor::from_slice(&[10.0_f32, 20.0]),
        Tensor::from_slice(&[30.0_f32]),
    ];

    fused::foreach_add_(&tensors, &others, 0.5).unwrap();
    assert_eq!(values(&tensors[0]), vec![6.0, 12.0]);
    assert_eq!(values(&tensors[1]), vec![18.0]);

    fused::foreach_add_scalar_(&tensors, 1.0).unwrap();
    assert_eq!(values(&tensors[1]), vec![19.0]);

    fused::foreach_mul_scalar_(&tensors, 2.0).unwrap();
    assert_eq!(values(&tensors[0]), vec![14.0, 26.0]);

    let half = Tensor::from(0.5_f64).to_kind(Kind::Float);
    fused::foreach_mul_tensor_(&tensors, &half).unwrap();
    assert_eq!(values(&tensors[0]), vec![7.0, 13.0]);
    assert_eq!(values(&tensors[1]), vec![19.0]);

    fused::foreach_copy_(&tensors, &others, false).unwrap();
    assert_eq!(values(&tensors[0]), vec![10.0, 20.0]);

    fused::foreach_zero_(&tensors).unwrap();
    assert_eq!(values(&tensors[0]), vec![0.0, 0.0]);
    assert_eq!(values(&tensors[1]), vec![0.0]);
    assert_eq!(values(&others[0]), vec![10.0, 20.0], "sources untouched");

    fused::foreach_zero_(&[]).unwrap();
    let mismatch = fused::foreach_add_(&tensors, &others[..1], 1.0);
    assert!(
        matches!(mismatch, Err(Error::InvalidArgument { .. })),
        "{mismatch:?}"
    );
}

#[test]
fn foreach_norm_and_clip_grad_norm_compute_the_joint_norm() {
    let tensors = vec![
        Tensor::from_slice(&[3.0_f32, 4.0]),
        Tensor::from_slice(&[12.0_f32]),
    ];
    let norms = fused::foreach_norm(&tensors, 2.0).unwrap();
    assert_eq!(norms.len(), 2);
    assert_close(&values(&norms[0]), &[5.0], 1e-6);
    assert_close(&values(&norms[1]), &[12.0], 1e-6);

    // Joint norm sqrt(9 + 16 + 144) = 13; clip to 6.5 halves every gradient.
    let total = fused::clip_grad_norm_(&tensors, 6.5, 2.0).unwrap();
    assert_close(&values(&total), &[13.0], 1e-5);
    let scale = 6.5 / (13.0 + 1e-6);
    assert_close(&values(&tensors[0]), &[3.0 * scale, 4.0 * scale], 1e-5);
    assert_close(&values(&tensors[1]), &[12.0 * scale], 1e-5);

    // Below the limit nothing changes.
    let small = vec![Tensor::from_slice(&[0.3_f32, 0.4])];
    let total = fused::clip_grad_norm_(&small, 1.0, 2.0).unwrap();
    assert_close(&values(&total), &[0.5], 1e-6);
    assert_close(&values(&small[0]), &[0.3, 0.4], 1e-6);

    assert!(matches!(
        fused::clip_grad_norm_(&[], 1.0, 2.0),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn amp_unscale_divides_gradients_and_flags_non_finite_values() {
    let inv_scale = Tensor::from(0.25_f64).to_kind(Kind::Float);
    let mut found_inf = Tensor::zeros([1], (Kind::Float, Device::Cpu));
    let grads = vec![
        Tensor::from_slice(&[4.0_f32, 8.0]),
        Tensor::from_slice(&[16.0_f32]),
    ];
    fused::amp_unscale_(&grads, &mut found_inf, &inv_scale).unwrap();
    assert_eq!(values(&grads[0]), vec![1.0, 2.0]);
    assert_eq!(values(&grads[1]), vec![4.0]);
    assert_eq!(values(&found_inf), vec![0.0]);

    let with_inf = vec![Tensor::from_slice(&[f32::INFINITY, 1.0])];
    fused::amp_unscale_(&with_inf, &mut found_inf, &inv_scale).unwrap();
    assert_eq!(values(&found_inf), vec![1.0]);
}

#[test]
fn fused_steps_skip_the_update_when_found_inf_is_set() {
    let found_inf = Tensor::ones([1], (Kind::Float, Device::Cpu));
    let grads = vec![Tensor::from_slice(&[0.5_f32, -1.0])];

    let params = vec![Tensor::from_slice(&[1.0_f32, 2.0])];
    let options = SgdOptions {
        lr: LearningRate::Value(0.5),
        found_inf: Some(&found_inf),
        ..SgdOptions::default()
    };
    fused::sgd_step_with(&params, &grads, &[], &options).unwrap();
    assert_eq!(values(&params[0]), vec![1.0, 2.0], "SGD step skipped");

    let exp_avgs = vec![params[0].zeros_like()];
    let exp_avg_sqs = vec![params[0].zeros_like()];
    let steps = vec![Tensor::zeros([], (Kind::Float, Device::Cpu))];
    let options = AdamWOptions {
        found_inf: Some(&found_inf),
        ..AdamWOptions::default()
    };
    fused::adamw_step(&params, &grads, &exp_avgs, &exp_avg_sqs, &steps, &options).unwrap();
    assert_eq!(values(&params[0]), vec![1.0, 2.0], "AdamW step skipped");
    assert_eq!(
        values(&steps[0]),
        vec![0.0],
        "a skipped step is not counted"
    );

    // With found_inf clear the same call updates.
    let clear = Tensor::zeros([1], (Kind::Float, Device::Cpu));
    let options = AdamWOptions {
        found_inf: Some(&clear),
        ..AdamWOptions::default()
    };
    fused::adamw_step(&params, &grads, &exp_avgs, &exp_avg_sqs, &steps, &options).unwrap();
    assert_eq!(values(&steps[0]), vec![1.0]);
    assert_ne!(values(&params[0]), vec![1.0, 2.0]);
}

#[test]
fn pinning_needs_cuda_and_nothing_is_pinned_without_it() {
    if torch_ext::cuda::is_available() {
        println!("skipping: this check is for machines without CUDA");
        return;
    }
    let host = tch::Tensor::zeros([4], (tch::Kind::Float, tch::Device::Cpu));
    assert!(!torch_ext::memory::is_pinned(&host));
    assert!(matches!(
        torch_ext::memory::pin(&host),
        Err(torch_ext::Error::CudaUnavailable)
    ));
}

/// On the CPU the fused layers are libtorch's ops: same values, and a
/// gradient through both.
#[test]
fn nn_layers_on_the_cpu_are_libtorchs_ops() {
    use torch_ext::nn;
    tch::manual_seed(3);
    let x = Tensor::randn([4, 3, 5, 5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let weight = Tensor::rand([3], (Kind::Float, Device::Cpu));
    let bias = Tensor::randn([3], (Kind::Float, Device::Cpu));
    let (rm, rv) = (
        Tensor::zeros([3], (Kind::Float, Device::Cpu)),
        Tensor::ones([3], (Kind::Float, Device::Cpu)),
    );
    let (rm2, rv2) = (rm.copy(), rv.copy());
    let y = nn::batch_norm_relu(&x, &weight, &bias, Some(&rm), Some(&rv), true, 0.1, 1e-5).unwrap();
    let expected = x
        .batch_norm(
            Some(&weight),
            Some(&bias),
            Some(&rm2),
            Some(&rv2),
            true,
            0.1,
            1e-5,
            true,
        )
        .relu();
    assert!(y.equal(&expected));
    assert!(rm.equal(&rm2) && rv.equal(&rv2));
    assert!(
        !rm.equal(&Tensor::zeros([3], (Kind::Float, Device::Cpu))),
        "running mean updated"
    );
    let pooled = nn::max_pool2x2(&y).unwrap();
    assert_eq!(pooled.size(), [4, 3, 2, 2]);
    assert!(pooled.equal(&y.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false)));
    pooled.sum(Kind::Float).backward();
    assert_eq!(x.grad().size(), [4, 3, 5, 5]);
    let weight3 = Tensor::randn([4, 3, 3, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let conv = nn::conv3x3(&x, &weight3).unwrap();
    assert!(conv.equal(&x.conv2d(&weight3, None::<&Tensor>, [1, 1], [1, 1], [1, 1], 1)));
    assert!(nn::conv3x3(&x, &Tensor::ones([4, 2, 3, 3], (Kind::Float, Device::Cpu))).is_err());
    let gx = Tensor::randn([2, 8, 4, 4], (Kind::Float, Device::Cpu));
    let (gw, gb) = (
        Tensor::rand([8], (Kind::Float, Device::Cpu)),
        Tensor::randn([8], (Kind::Float, Device::Cpu)),
    );
    let gn = nn::group_norm_relu(&gx, 2, &gw, &gb, 1e-5).unwrap();
    assert!(gn.equal(&gx.group_norm(2, Some(&gw), Some(&gb), 1e-5, true).relu()));
    // 8 channels do not form 3 groups: libtorch's error.
    assert!(nn::group_norm_relu(&gx, 3, &gw, &gb, 1e-5).is_err());
    // Wrong shapes are libtorch's clear error, not a crash.
    let bad = Tensor::ones([5], (Kind::Float, Device::Cpu));
    assert!(nn::batch_norm_relu(&x, &bad, &bias, None, None, true, 0.1, 1e-5).is_err());
    assert!(nn::max_pool2x2(&Tensor::ones([3], (Kind::Float, Device::Cpu))).is_err());
}

/// One kernel profiler at a time; with no CUDA work it sees no kernels.
#[test]
fn one_kernel_profiler_runs_at_a_time() {
    use torch_ext::profile::KernelProfiler;
    let profiler = match KernelProfiler::start() {
        Ok(profiler) => profiler,
        Err(error) => {
            println!("skipping: the profiler cannot start here ({error})");
            return;
        }
    };
    assert!(matches!(
        KernelProfiler::start(),
        Err(Error::InvalidArgument { .. })
    ));
    let _ = Tensor::ones([4], (Kind::Float, Device::Cpu)).sum(Kind::Float);
    let profile = profiler.stop().unwrap();
    assert_eq!(profile.kernel_launches(), 0);
    // Stopped, it can start again.
    drop(KernelProfiler::start().unwrap());
}

/// On the CPU `nn::blend_lerp` is libtorch's `lerp`: the same values and
/// gradients, a weight that learns included.
#[test]
fn blend_lerp_on_the_cpu_is_libtorchs_lerp() {
    tch::manual_seed(3);
    let h = Tensor::randn([4, 3, 5, 5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let s = Tensor::randn([4, 3, 5, 5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let w = Tensor::from_slice(&[0.0_f32, 0.3, 0.7, 1.0])
        .reshape([4, 1, 1, 1])
        .set_requires_grad(true);
    let y = torch_ext::nn::blend_lerp(&h, &s, &w).expect("blend");
    y.sum(Kind::Float).backward();
    let expected: Vec<f64> = values(&(&h + (&s - &h) * &w))
        .into_iter()
        .map(f64::from)
        .collect();
    assert_close(&values(&y), &expected, 1e-6);
    let per_sample = [1.0, 0.7, 0.3, 0.0];
    let dh: Vec<f64> = (0..4).flat_map(|n| [per_sample[n]; 75]).collect();
    assert_close(&values(&h.grad()), &dh, 1e-6);
    let ds: Vec<f64> = (0..4).flat_map(|n| [1.0 - per_sample[n]; 75]).collect();
    assert_close(&values(&s.grad()), &ds, 1e-6);
    let dw: Vec<f64> =
        values(&(&s - &h).sum_dim_intlist([1_i64, 2, 3].as_slice(), false, Kind::Float))
            .into_iter()
            .map(f64::from)
            .collect();
    assert_close(&values(&w.grad()), &dw, 1e-4);
}
