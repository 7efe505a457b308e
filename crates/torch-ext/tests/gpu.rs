//! GPU behaviour of torch-ext: streams and guards, event timing, graph capture
//! and replay with fresh inputs, a capture without warm-up ordered after the
//! work queued before it, shared pools, clean recovery from a failed
//! capture, sync-debug mode, memory statistics, autocast and fused ops on
//! CUDA, (module `nn`) the fused layers against libtorch's, (module `group_norm`) group norm + ReLU with the residual added in its kernel, (modules `layer_norm`, `linear`, `embedding` and `attention`) the layer norm, the linear layer, the embedding and the causal attention against libtorch's, (module `gram`) the Gram matrix of a few rows against an f64 one, (module `blend`)
//! the fused alpha blends, (module `copies`) the copies inside and outside
//! captured graphs and (module `fused`) the fused SGD step and
//! cross-entropy, (module `adamw`) torch-ext's AdamW kernels against
//! libtorch's `_fused_adamw_`, (module `foreach`) its multi-tensor zero, copy
//! and add against libtorch's `_foreach_*`, (module `shadow`) the weights'
//! bf16 shadows against libtorch's casts, read by the linear layer, (module
//! `excite`) squeeze-and-excite against libtorch's composition, (module `pdl`) early-launched kernels ordered after every kind of predecessor, (module `bn_pool`) batch norm + ReLU + max-pool as one node against the two it replaces, (module `blend_pool`) the blend + max-pool likewise, (module `sgd`) the grouped SGD kernel against libtorch's `_fused_sgd_`. Every
//! test prints "skipping: no CUDA device" and returns on machines
//! without CUDA; build it here with
//! `cargo test -p torch-ext --test gpu --release --no-run` and run the binary
//! on the GPU machine.

use std::sync::{Mutex, MutexGuard};

use tch::{Device, Kind, Tensor};
use torch_ext::{
    AutocastDevice, AutocastGuard, CaptureMode, CudaEvent, CudaGraph, CudaStream, Error, GraphPool,
    cuda,
};

/// The tests share one device and flip process-wide state (sync-debug mode),
/// so they run one at a time.
static DEVICE: Mutex<()> = Mutex::new(());

fn gpu_or_skip() -> Option<MutexGuard<'static, ()>> {
    if !cuda::is_available() {
        println!("skipping: no CUDA device");
        return None;
    }
    Some(
        DEVICE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    )
}

const CUDA: Device = Device::Cuda(0);

#[path = "gpu/adamw.rs"]
mod adamw;
#[path = "gpu/attention.rs"]
mod attention;
#[path = "gpu/blend.rs"]
mod blend;
#[path = "gpu/blend_pool.rs"]
mod blend_pool;
#[path = "gpu/bn_pool.rs"]
mod bn_pool;
#[path = "gpu/conv_overlap.rs"]
mod conv_overlap;
#[path = "gpu/copies.rs"]
mod copies;
#[path = "gpu/embedding.rs"]
mod embedding;
#[path = "gpu/excite.rs"]
mod excite;
#[path = "gpu/foreach.rs"]
mod foreach;
#[path = "gpu/fused.rs"]
mod fused;
#[path = "gpu/gram.rs"]
mod gram;
#[path = "gpu/group_norm.rs"]
mod group_norm;
#[path = "gpu/layer_norm.rs"]
mod layer_norm;
#[path = "gpu/linear.rs"]
mod linear;
#[path = "gpu/nn.rs"]
mod nn;
#[path = "gpu/pdl.rs"]
mod pdl;
#[path = "gpu/pooled.rs"]
mod pooled;
#[path = "gpu/sgd.rs"]
mod sgd;
#[path = "gpu/shadow.rs"]
mod shadow;

fn values(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(
        tensor
            .to_device(Device::Cpu)
            .to_kind(Kind::Float)
            .flatten(0, -1),
    )
    .expect("float tensor")
}

/// The kernels `loss.backward()` launches, profiled after the work queued
/// before it has finished.
fn backward_kernels(loss: &Tensor) -> Vec<torch_ext::profile::KernelStat> {
    cuda::synchronize(0).unwrap();
    let profiler = torch_ext::profile::KernelProfiler::start().unwrap();
    loss.backward();
    cuda::synchronize(0).unwrap();
    profiler.stop().unwrap().kernels
}

fn assert_close(got: &[f32], expected: &[f32], tolerance: f32) {
    assert_eq!(got.len(), expected.len());
    for (index, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= tolerance,
            "element {index}: got {g}, expected {e}"
        );
    }
}

fn tch_error(error: tch::TchError) -> String {
    error.to_string()
}

#[test]
fn device_facts_are_reported() {
    let Some(_device) = gpu_or_skip() else { return };
    assert!(cuda::device_count() >= 1);
    assert!(
        tch::Cuda::is_available(),
        "tch sees CUDA once torch-ext is linked"
    );
    let name = cuda::device_name(0).unwrap();
    assert!(!name.is_empty());
    let (major, _minor) = cuda::device_capability(0).unwrap();
    assert!(major >= 7, "compute capability {major}");
    let (runtime, driver) = cuda::runtime_versions().unwrap();
    assert!(runtime.starts_with("13."), "runtime {runtime}");
    assert_ne!(driver, "none");
    println!("device 0: {name}, CUDA runtime {runtime}, driver {driver}");
    let count = cuda::device_count();
    assert!(matches!(
        cuda::synchronize(count),
        Err(Error::InvalidDevice { .. })
    ));
    cuda::synchronize(0).unwrap();
}

#[test]
fn stream_guard_makes_a_pool_stream_current_and_restores() {
    let Some(_device) = gpu_or_skip() else { return };
    let original = CudaStream::current(0).unwrap();
    let side = CudaStream::from_pool(0, false).unwrap();
    let high = CudaStream::from_pool(0, true).unwrap();
    assert_ne!(side, original);
    assert_ne!(high, side);
    assert_eq!(side.device(), 0);
    {
        let guard = side.make_current().unwrap();
        assert_eq!(guard.previous(), original);
        assert_eq!(CudaStream::current(0).unwrap(), side);
        let x = Tensor::ones([256, 256], (Kind::Float, CUDA));
        let y = x.matmul(&x);
        side.synchronize().unwrap();
        assert!(side.query().unwrap());
        assert_close(&values(&y.sum(Kind::Float)), &[256.0 * 256.0 * 256.0], 1.0);
    }
    assert_eq!(CudaStream::current(0).unwrap(), original);
    assert_eq!(CudaStream::default_stream(0).unwrap(), original);
}

#[test]
fn events_time_work_on_a_stream() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let start = CudaEvent::new(true).unwrap();
    let end = CudaEvent::new(true).unwrap();
    let _guard = stream.make_current().unwrap();
    let x = Tensor::randn([1024, 1024], (Kind::Float, CUDA));
    start.record(&stream).unwrap();
    let mut y = x.shallow_clone();
    for _ in 0..20 {
        y = y.matmul(&x).tanh();
    }
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    assert!(end.query().unwrap());
    let elapsed = start.elapsed_ms(&end).unwrap();
    assert!(elapsed > 0.0, "elapsed {elapsed} ms");
    println!("20 x (1024^2 matmul + tanh): {elapsed:.3} ms");

    // Cross-stream ordering through an event and through wait_stream.
    let other = CudaStream::from_pool(0, false).unwrap();
    other.wait_event(&end).unwrap();
    other.wait_stream(&stream).unwrap();
    other.synchronize().unwrap();
    // Timing needs timing-enabled events.
    let untimed = CudaEvent::new(false).unwrap();
    untimed.record(&stream).unwrap();
    assert!(matches!(start.elapsed_ms(&untimed), Err(Error::Cpp { .. })));
}

#[test]
fn captured_matmul_replays_with_new_inputs() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let x = Tensor::randn([4, 16], (Kind::Float, CUDA));
    let w = Tensor::randn([16, 4], (Kind::Float, CUDA));
    let mut out = Tensor::zeros([4, 4], (Kind::Float, CUDA));
    let mut body_calls = 0;
    let graph = CudaGraph::capture(&stream, None, 3, || {
        body_calls += 1;
        let y = x.f_matmul(&w).map_err(tch_error)?;
        out.f_copy_(&y).map_err(tch_error)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(body_calls, 4, "three warm-up calls and one captured call");
    assert!(!stream.is_capturing().unwrap());

    for _ in 0..3 {
        let fresh = Tensor::randn([4, 16], (Kind::Float, CUDA));
        let mut x_static = x.shallow_clone();
        x_static.copy_(&fresh);
        graph.replay().unwrap();
        let expected = values(&fresh.matmul(&w));
        assert_close(&values(&out), &expected, 1e-4);
    }
    // Replay on another stream after filling the input there.
    let fresh = Tensor::randn([4, 16], (Kind::Float, CUDA));
    // `fresh` was written on the current stream: the side stream waits for
    // it (without the wait the copy raced the randn on a busy GPU).
    stream
        .wait_stream(&CudaStream::current(0).unwrap())
        .unwrap();
    {
        let _guard = stream.make_current().unwrap();
        let mut x_static = x.shallow_clone();
        x_static.copy_(&fresh);
        graph.replay_on(&stream).unwrap();
        stream.synchronize().unwrap();
    }
    assert_close(&values(&out), &values(&fresh.matmul(&w)), 1e-4);
    assert_eq!(graph.capture_stream(), stream);
}

#[test]
fn graphs_sharing_a_pool_replay_in_order() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let pool = GraphPool::new().unwrap();
    let x = Tensor::randn([64], (Kind::Float, CUDA));
    let mut doubled = Tensor::zeros([64], (Kind::Float, CUDA));
    let mut shifted = Tensor::zeros([64], (Kind::Float, CUDA));
    let first = CudaGraph::capture(&stream, Some(&pool), 3, || {
        let y = (&x * 2.0).f_relu().map_err(tch_error)?;
        doubled.f_copy_(&y).map_err(tch_error)?;
        Ok(())
    })
    .unwrap();
    let doubled_view = doubled.shallow_clone();
    let second = CudaGraph::capture(&stream, Some(&first.pool()), 3, || {
        let y = &doubled_view + 1.0;
        shifted.f_copy_(&y).map_err(tch_error)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(first.pool(), pool);
    assert_eq!(second.pool(), pool);

    let fresh = Tensor::randn([64], (Kind::Float, CUDA));
    let mut x_static = x.shallow_clone();
    x_static.copy_(&fresh);
    first.replay().unwrap();
    second.replay().unwrap();
    let expected = values(&((&fresh * 2.0).relu() + 1.0));
    assert_close(&values(&shifted), &expected, 1e-5);
}

#[test]
fn panic_inside_capture_is_caught_and_eager_work_continues() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let before = CudaStream::current(0).unwrap();
    let x = Tensor::randn([8, 8], (Kind::Float, CUDA));
    let mut out = Tensor::zeros([8, 8], (Kind::Float, CUDA));
    let mut calls = 0;
    let result = CudaGraph::capture(&stream, None, 2, || {
        calls += 1;
        let y = x.f_matmul(&x).map_err(tch_error)?;
        out.f_copy_(&y).map_err(tch_error)?;
        if calls == 3 {
            panic!("deliberate panic during capture");
        }
        Ok(())
    });
    match result {
        Err(Error::Panic { message }) => assert!(message.contains("deliberate"), "{message}"),
        other => panic!("expected Error::Panic, got {other:?}"),
    }
    assert!(!stream.is_capturing().unwrap(), "the capture was ended");
    assert_eq!(
        CudaStream::current(0).unwrap(),
        before,
        "current stream restored"
    );
    assert_eq!(cuda::sync_debug_mode().unwrap(), cuda::SyncDebugMode::Off);

    // Eager execution still works, random numbers included ...
    let a = Tensor::randn([8, 8], (Kind::Float, CUDA));
    let b = Tensor::randn([8, 8], (Kind::Float, CUDA));
    assert_ne!(
        values(&a),
        values(&b),
        "the CUDA RNG advances after the aborted capture"
    );
    let eager = a.matmul(&b);
    assert_close(
        &values(&eager),
        &values(&a.to_device(Device::Cpu).matmul(&b.to_device(Device::Cpu))),
        1e-3,
    );
    // ... and so does a new capture on the same stream.
    let graph = CudaGraph::capture(&stream, None, 1, || {
        let y = x.f_matmul(&x).map_err(tch_error)?;
        out.f_copy_(&y).map_err(tch_error)?;
        Ok(())
    })
    .unwrap();
    graph.replay().unwrap();
    assert_close(&values(&out), &values(&x.matmul(&x)), 1e-4);
}

#[test]
fn body_error_and_hidden_sync_abort_the_capture_cleanly() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let x = Tensor::randn([16], (Kind::Float, CUDA));

    let mut calls = 0;
    let result = CudaGraph::capture(&stream, None, 1, || {
        calls += 1;
        if calls == 2 {
            Err("step failed".to_owned())
        } else {
            Ok(())
        }
    });
    match result {
        Err(Error::Body { phase, message }) => {
            assert_eq!(phase, "capture");
            assert_eq!(message, "step failed");
        }
        other => panic!("expected Error::Body, got {other:?}"),
    }

    // A read-back inside the body is illegal during capture: libtorch reports
    // it, the capture is invalidated, and the abort path must still leave the
    // process usable.
    let mut calls = 0;
    let result = CudaGraph::capture_with_mode(&stream, None, 1, CaptureMode::Global, || {
        calls += 1;
        let total = x.f_sum(Kind::Float).map_err(tch_error)?;
        let value = f64::try_from(&total).map_err(tch_error)?;
        if calls == 2 {
            return Err(format!("read back {value} during capture without an error"));
        }
        Ok(())
    });
    match &result {
        Err(Error::Body { phase, message }) => {
            assert_eq!(*phase, "capture");
            assert!(!message.contains("without an error"), "{message}");
        }
        other => panic!("expected Error::Body from the illegal sync, got {other:?}"),
    }
    assert!(!stream.is_capturing().unwrap());
    let total = f64::try_from(&x.sum(Kind::Float)).unwrap();
    let expected: f32 = values(&x).iter().sum();
    assert!((total as f32 - expected).abs() < 1e-3);
}

#[test]
fn failed_captures_release_their_memory_pools() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let x = Tensor::randn([16], (Kind::Float, CUDA));
    cuda::synchronize(0).unwrap();
    cuda::empty_cache().unwrap();
    let baseline = cuda::memory_reserved(0).unwrap();
    println!("baseline reserved {baseline} bytes");
    let block_elements: i64 = 4 << 20; // 16 MiB of f32 per capture
    for attempt in 0..6 {
        let mut calls = 0;
        // Alternate a returned error, a panic, and an invalidated capture.
        let result = CudaGraph::capture(&stream, None, 1, || {
            calls += 1;
            let scratch =
                Tensor::f_ones([block_elements], (Kind::Float, CUDA)).map_err(tch_error)?;
            let total = scratch.f_sum(Kind::Float).map_err(tch_error)?;
            if calls == 2 {
                match attempt % 3 {
                    0 => return Err("failing on purpose".to_owned()),
                    1 => panic!("failing on purpose"),
                    _ => {
                        // A device synchronisation is illegal during capture:
                        // CUDA invalidates the capture, which takes the abort
                        // path where capture_end itself fails.
                        cuda::synchronize(0).map_err(|e| e.to_string())?;
                        return Err(format!("synchronised after {total:?} without an error"));
                    }
                }
            }
            Ok(())
        });
        assert!(result.is_err(), "attempt {attempt}");
        if attempt % 3 == 2 {
            let message = result
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            assert!(!message.contains("without an error"), "{message}");
        }
        assert!(!stream.is_capturing().unwrap());
        cuda::empty_cache().unwrap();
        println!(
            "attempt {attempt}: {:?}; reserved {} bytes",
            result.err(),
            cuda::memory_reserved(0).unwrap()
        );
    }
    cuda::synchronize(0).unwrap();
    cuda::empty_cache().unwrap();
    let after = cuda::memory_reserved(0).unwrap();
    // Each unreleased private pool would keep its 16 MiB block reserved.
    assert!(
        after <= baseline + (8 << 20),
        "reserved grew from {baseline} to {after} bytes: failed captures leaked their pools"
    );
    // Eager work is fine afterwards.
    assert!((f64::try_from(&(&x - &x).sum(Kind::Float)).unwrap()).abs() < 1e-6);
}

#[test]
fn sync_debug_mode_error_rejects_an_implicit_sync() {
    let Some(_device) = gpu_or_skip() else { return };
    let x = Tensor::ones([4], (Kind::Float, CUDA));
    cuda::set_sync_debug_mode(cuda::SyncDebugMode::Error).unwrap();
    assert_eq!(cuda::sync_debug_mode().unwrap(), cuda::SyncDebugMode::Error);
    let read = f64::try_from(&x.sum(Kind::Float));
    // Explicit synchronisation stays allowed.
    let explicit = cuda::synchronize(0);
    cuda::set_sync_debug_mode(cuda::SyncDebugMode::Off).unwrap();
    assert!(read.is_err(), "an .item() read must fail in Error mode");
    explicit.unwrap();
    assert_eq!(f64::try_from(&x.sum(Kind::Float)).unwrap(), 4.0);
}

#[test]
fn memory_statistics_follow_allocations() {
    let Some(_device) = gpu_or_skip() else { return };
    cuda::synchronize(0).unwrap();
    cuda::reset_peak_memory_stats(0).unwrap();
    let base = cuda::memory_allocated(0).unwrap();
    let bytes: u64 = 64 << 20;
    let big = Tensor::zeros([(bytes / 4) as i64], (Kind::Float, CUDA));
    let during = cuda::memory_allocated(0).unwrap();
    assert!(during >= base + bytes, "{during} < {base} + {bytes}");
    drop(big);
    let after = cuda::memory_allocated(0).unwrap();
    assert!(after < during);
    assert!(cuda::max_memory_allocated(0).unwrap() >= base + bytes);
    let stats = cuda::memory_stats(0).unwrap();
    assert!(stats.reserved_bytes >= stats.allocated_bytes);
    cuda::empty_cache().unwrap();
}

#[test]
fn autocast_on_cuda_runs_matmul_in_bfloat16() {
    let Some(_device) = gpu_or_skip() else { return };
    let a = Tensor::randn([32, 32], (Kind::Float, CUDA));
    {
        let _guard = AutocastGuard::new(AutocastDevice::Cuda, Kind::BFloat16).unwrap();
        assert_eq!(a.matmul(&a).kind(), Kind::BFloat16);
    }
    {
        let _guard = AutocastGuard::new(AutocastDevice::Cuda, Kind::Half).unwrap();
        assert_eq!(a.matmul(&a).kind(), Kind::Half);
    }
    assert_eq!(a.matmul(&a).kind(), Kind::Float);
}

const SCALE_SOURCE: &str = r#"
extern "C" __global__ void scale_add(float* x, const float* y, float by, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * by + y[i];
}
"#;

#[test]
fn a_jit_kernel_runs_eagerly_and_inside_a_captured_graph() {
    use torch_ext::jit::{Arg, JitKernel};
    let Some(_device) = gpu_or_skip() else { return };
    let kernel = JitKernel::build(SCALE_SOURCE, "scale_add", 0).unwrap();
    assert_eq!(kernel.name(), "scale_add");
    let n = 1000_i64;
    let x = Tensor::ones([n], (Kind::Float, CUDA));
    let y = Tensor::arange(n, (Kind::Float, CUDA));
    let launch = |x: &Tensor| {
        kernel.launch(
            [4, 1, 1],
            [256, 1, 1],
            0,
            &[Arg::Tensor(x), Arg::Tensor(&y), Arg::F32(2.0), Arg::I64(n)],
        )
    };
    launch(&x).unwrap();
    let expected: Vec<f32> = (0..n).map(|i| 2.0 + i as f32).collect();
    assert_close(&values(&x), &expected, 0.0);

    // Captured: every replay applies the kernel once more.
    let stream = CudaStream::from_pool(0, false).unwrap();
    let target = Tensor::zeros([n], (Kind::Float, CUDA));
    let graph = CudaGraph::capture(&stream, None, 0, || {
        launch(&target).map_err(|e| e.to_string())
    })
    .unwrap();
    let _ = target.shallow_clone().fill_(1.0);
    graph.replay().unwrap();
    graph.replay().unwrap();
    let twice: Vec<f32> = (0..n).map(|i| (2.0 + i as f32) * 2.0 + i as f32).collect();
    assert_close(&values(&target), &twice, 1e-3);

    // Wrong devices and layouts are refused before anything is launched.
    let on_cpu = Tensor::ones([n], (Kind::Float, Device::Cpu));
    assert!(matches!(
        launch(&on_cpu),
        Err(Error::InvalidArgument { .. })
    ));
    let strided = Tensor::ones([n, 2], (Kind::Float, CUDA)).select(1, 0);
    assert!(matches!(
        launch(&strided),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        kernel.launch([0, 1, 1], [256, 1, 1], 0, &[]),
        Err(Error::InvalidArgument { .. })
    ));
}

/// A capture with no warm-up iterations does not wait for the work already
/// queued on its stream, and its replays stay ordered after that work: a
/// replay reads what the queued work wrote, also when more is queued
/// before the next replay.
#[test]
fn a_capture_without_warm_up_stays_ordered_after_queued_work() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let n = 1_i64 << 22;
    let x = Tensor::zeros([n], (Kind::Float, CUDA));
    let out = Tensor::zeros([n], (Kind::Float, CUDA));
    let queue_adds = |count: usize| {
        let _on_stream = stream.make_current().unwrap();
        for _ in 0..count {
            let _ = x.shallow_clone().f_add_scalar_(1.0).unwrap();
        }
    };
    // Work still running on the stream when the capture starts.
    queue_adds(200);
    let graph = CudaGraph::capture(&stream, None, 0, || {
        out.shallow_clone()
            .f_copy_(&x.f_mul_scalar(2.0).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())
    })
    .unwrap();
    graph.replay_on(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_close(&values(&out.narrow(0, 0, 8)), &[400.0; 8], 0.0);
    assert_close(&values(&out.narrow(0, n - 8, 8)), &[400.0; 8], 0.0);
    queue_adds(50);
    graph.replay_on(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_close(&values(&out.narrow(0, n - 8, 8)), &[500.0; 8], 0.0);
}

/// The kernels' names in a profile of `run`.
fn kernels_of(run: impl FnOnce()) -> Vec<String> {
    let profiler = torch_ext::profile::KernelProfiler::start().unwrap();
    run();
    cuda::synchronize(0).unwrap();
    let profile = profiler.stop().unwrap();
    profile
        .kernels
        .iter()
        .filter(|stat| !stat.is_copy())
        .map(|stat| stat.name.clone())
        .collect()
}
