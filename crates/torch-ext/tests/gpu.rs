//! GPU behaviour of torch-ext: streams and guards, event timing, graph capture
//! and replay with fresh inputs, a capture without warm-up ordered after the
//! work queued before it, shared pools, clean recovery from a failed
//! capture, sync-debug mode, memory statistics, autocast and fused ops on
//! CUDA, (module `nn`) the fused layers against libtorch's and (module `blend`)
//! the fused alpha blends. Every test prints "skipping: no CUDA device" and returns on machines
//! without CUDA; build it here with
//! `cargo test -p torch-ext --test gpu --release --no-run` and run the binary
//! on the GPU machine.

use std::sync::{Mutex, MutexGuard};

use tch::{Device, Kind, Tensor};
use torch_ext::fused::{self, LearningRate, SgdOptions};
use torch_ext::{
    AutocastDevice, AutocastGuard, CaptureMode, CudaEvent, CudaGraph, CudaStream, Error, GraphPool,
    copy_non_blocking, cuda, index_copy_many, memcpy_async, write_host_bytes,
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

#[path = "gpu/nn.rs"]
mod nn;

#[path = "gpu/blend.rs"]
mod blend;

fn values(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(
        tensor
            .to_device(Device::Cpu)
            .to_kind(Kind::Float)
            .flatten(0, -1),
    )
    .expect("float tensor")
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
fn index_copy_many_matches_index_copy_inside_a_captured_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    // Targets of three dtypes and the index along dimensions 0 and 1; one
    // source is rows of a wider tensor (a strided row dimension).
    let floats = Tensor::zeros([4, 7, 5], (Kind::Float, CUDA));
    let ints = Tensor::zeros([4, 7], (Kind::Int64, CUDA));
    let flags = Tensor::zeros([4, 7, 3], (Kind::Bool, CUDA));
    let raw = Tensor::zeros([7, 4, 5], (Kind::Float, CUDA));
    let a = Tensor::zeros([4, 5], (Kind::Float, CUDA));
    let b = Tensor::zeros([4], (Kind::Int64, CUDA));
    let wide = Tensor::zeros([4, 9], (Kind::Bool, CUDA));
    let c = wide.narrow(1, 2, 3);
    let index = Tensor::zeros([1], (Kind::Int64, CUDA));
    let writes = [
        (&floats, 1_i64, &a),
        (&ints, 1, &b),
        (&flags, 1, &c),
        (&raw, 0, &a),
    ];
    let stream = CudaStream::from_pool(0, false).unwrap();
    let current = CudaStream::current(0).unwrap();
    let graph = CudaGraph::capture(&stream, None, 1, || {
        index_copy_many(&writes, &index).map_err(|e| e.to_string())
    })
    .unwrap();
    let expected: Vec<Tensor> = writes
        .iter()
        .map(|(target, _, _)| target.to_device(Device::Cpu).zeros_like())
        .collect();
    for step in [0_i64, 6, 2, 6] {
        let _ = index.shallow_clone().fill_(step);
        a.shallow_clone()
            .copy_(&(Tensor::randn([4, 5], (Kind::Float, CUDA))));
        b.shallow_clone()
            .copy_(&Tensor::randint(100, [4], (Kind::Int64, CUDA)));
        wide.shallow_clone()
            .copy_(&Tensor::randint(2, [4, 9], (Kind::Int64, CUDA)).to_kind(Kind::Bool));
        // The inputs were written on the current stream; the replay's
        // stream waits for them.
        stream.wait_stream(&current).unwrap();
        graph.replay_on(&stream).unwrap();
        stream.synchronize().unwrap();
        let at = Tensor::from_slice(&[step]);
        for ((target, dim, source), want) in writes.iter().zip(&expected) {
            let source = source.to_device(Device::Cpu).unsqueeze(*dim);
            let _ = want.shallow_clone().index_copy_(*dim, &at, &source);
            assert!(
                target.to_device(Device::Cpu).equal(want),
                "step {step}: a {:?} target along {dim} differs",
                target.kind()
            );
        }
    }
    // An index past a target's extent writes nothing there (the caller
    // checks it on the host).
    let before = floats.copy();
    let _ = index.shallow_clone().fill_(7);
    index_copy_many(&writes[..1], &index).unwrap();
    assert!(floats.equal(&before));
}

#[test]
fn memcpy_async_uploads_and_reads_back_inside_a_captured_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    let pin = |tensor: Tensor| torch_ext::memory::pin(&tensor).unwrap();
    let host_in = pin(Tensor::zeros([8], (Kind::Float, Device::Cpu)));
    let host_out = pin(Tensor::zeros([8], (Kind::Float, Device::Cpu)));
    let on_device = Tensor::zeros([8], (Kind::Float, CUDA));
    let doubled = Tensor::zeros([8], (Kind::Float, CUDA));
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 1, || {
        memcpy_async(&on_device, &host_in).map_err(|e| e.to_string())?;
        let twice = on_device.f_mul_scalar(2.0).map_err(tch_error)?;
        doubled.shallow_clone().f_copy_(&twice).map_err(tch_error)?;
        memcpy_async(&host_out, &doubled).map_err(|e| e.to_string())?;
        Ok(())
    })
    .unwrap();
    // Each replay reads what the host buffer holds at that moment, and
    // leaves its result in the host buffer.
    for round in 0..3 {
        let input: Vec<f32> = (0..8).map(|v| (v + 10 * round) as f32).collect();
        let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_ne_bytes()).collect();
        write_host_bytes(&host_in, &bytes).unwrap();
        graph.replay_on(&stream).unwrap();
        stream.synchronize().unwrap();
        let expected: Vec<f32> = input.iter().map(|v| v * 2.0).collect();
        assert_eq!(values(&host_out), expected, "round {round}");
    }
    // Outside a graph it is a plain queued copy, device to device too.
    let other = Tensor::zeros([8], (Kind::Float, CUDA));
    memcpy_async(&other, &doubled).unwrap();
    assert_eq!(values(&other), values(&doubled));
}

#[test]
fn non_blocking_copy_from_pinned_memory_arrives() {
    let Some(_device) = gpu_or_skip() else { return };
    let host = Tensor::arange(1024, (Kind::Float, Device::Cpu)).pin_memory(CUDA);
    let mut device = Tensor::zeros([1024], (Kind::Float, CUDA));
    let stream = CudaStream::from_pool(0, false).unwrap();
    // The zeros were written on the current stream: without this wait they
    // could land after the copy on a busy GPU.
    stream
        .wait_stream(&CudaStream::current(0).unwrap())
        .unwrap();
    {
        let _guard = stream.make_current().unwrap();
        copy_non_blocking(&mut device, &host).unwrap();
    }
    stream.synchronize().unwrap();
    let expected: Vec<f32> = (0..1024).map(|v| v as f32).collect();
    assert_eq!(values(&device), expected);
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

#[test]
fn captured_fused_sgd_step_matches_eager_steps() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let make = |device| {
        let params = vec![
            Tensor::from_slice(&[1.0_f32, -2.0, 0.5]).to_device(device),
            Tensor::from_slice(&[3.0_f32, 0.25]).to_device(device),
        ];
        let buffers: Vec<Tensor> = params.iter().map(Tensor::zeros_like).collect();
        let grads = vec![
            Tensor::from_slice(&[0.5_f32, 0.25, -1.0]).to_device(device),
            Tensor::from_slice(&[1.5_f32, -0.5]).to_device(device),
        ];
        (params, buffers, grads)
    };
    let (params, buffers, grads) = make(CUDA);
    let (cpu_params, cpu_buffers, cpu_grads) = make(Device::Cpu);
    let lr = Tensor::from(0.1_f64).to_kind(Kind::Float).to_device(CUDA);

    // First step eagerly (initialises the momentum buffers), on both devices.
    fused::sgd_step(&params, &grads, &buffers, 0.1, 0.9, 0.01, 0.0, false, true).unwrap();
    fused::sgd_step(
        &cpu_params,
        &cpu_grads,
        &cpu_buffers,
        0.1,
        0.9,
        0.01,
        0.0,
        false,
        true,
    )
    .unwrap();
    // Steady-state step captured with a device learning rate; the warm-up
    // iterations run it for real, so mirror them on the CPU.
    let warmup = 3;
    let graph = CudaGraph::capture(&stream, None, warmup, || {
        let options = SgdOptions {
            lr: LearningRate::Tensor(&lr),
            momentum: 0.9,
            weight_decay: 0.01,
            ..SgdOptions::default()
        };
        fused::sgd_step_with(&params, &grads, &buffers, &options).map_err(|e| e.to_string())
    })
    .unwrap();
    for _ in 0..warmup {
        fused::sgd_step(
            &cpu_params,
            &cpu_grads,
            &cpu_buffers,
            0.1,
            0.9,
            0.01,
            0.0,
            false,
            false,
        )
        .unwrap();
    }
    for _ in 0..5 {
        graph.replay().unwrap();
        fused::sgd_step(
            &cpu_params,
            &cpu_grads,
            &cpu_buffers,
            0.1,
            0.9,
            0.01,
            0.0,
            false,
            false,
        )
        .unwrap();
    }
    for (gpu, cpu) in params.iter().zip(&cpu_params) {
        assert_close(&values(gpu), &values(cpu), 1e-4);
    }
    // A new learning rate reaches the captured step without re-capture.
    let mut lr_static = lr.shallow_clone();
    let _filled = lr_static.f_fill_(0.0).unwrap();
    let frozen = values(&params[0]);
    graph.replay().unwrap();
    // lr 0: parameters unchanged.
    assert_close(&values(&params[0]), &frozen, 0.0);
}

#[test]
fn pinning_keeps_values_and_is_idempotent() {
    let Some(_device) = gpu_or_skip() else { return };
    let host = Tensor::arange(12, (Kind::Float, Device::Cpu));
    assert!(!torch_ext::memory::is_pinned(&host));
    let pinned = torch_ext::memory::pin(&host).unwrap();
    assert!(torch_ext::memory::is_pinned(&pinned));
    assert_eq!(values(&pinned), values(&host));
    let again = torch_ext::memory::pin(&pinned).unwrap();
    assert_eq!(
        again.data_ptr(),
        pinned.data_ptr(),
        "a pinned tensor is returned as is"
    );
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

#[test]
fn the_fused_cross_entropy_matches_libtorch() {
    use torch_ext::loss::{CrossEntropyWeights, FusedCrossEntropy, backward_with};
    let Some(_device) = gpu_or_skip() else { return };
    let fused = FusedCrossEntropy::new(0).unwrap();
    for (rows, classes) in [(4_i64, 4_i64), (256, 10), (1000, 37), (3, 1000)] {
        tch::manual_seed(rows + classes);
        let logits =
            (Tensor::randn([rows, classes], (Kind::Float, CUDA)) * 3.0).set_requires_grad(true);
        let labels = Tensor::randint(classes, [rows], (Kind::Int64, CUDA));
        // One ignored row (libtorch's ignore_index) where there are several.
        if rows > 1 {
            let _ = labels.narrow(0, 1, 1).fill_(-100);
        }
        let weight = 0.75;
        let scale = Tensor::from_slice(&[8.0_f32]).to_device(CUDA);
        let accumulator = Tensor::zeros([2], (Kind::Float, CUDA));
        let grad = fused
            .run(
                &logits.detach(),
                &labels,
                Some(&scale),
                &accumulator,
                CrossEntropyWeights {
                    weight,
                    loss_weight: 2.0,
                    hits_weight: 0.5,
                },
            )
            .unwrap();
        // libtorch: loss, gradient of weight * scale * loss, hits.
        let loss =
            logits.cross_entropy_loss::<Tensor>(&labels, None, tch::Reduction::Mean, -100, 0.0);
        let scaled = &loss * (weight * 8.0);
        let expected = Tensor::run_backward(&[&scaled], &[&logits], false, false)
            .pop()
            .unwrap();
        assert_close(&values(&grad), &values(&expected), 1e-5);
        let valid = labels.ge(0);
        let hits = logits
            .argmax(-1, false)
            .eq_tensor(&labels)
            .logical_and(&valid)
            .sum(Kind::Float);
        let got = values(&accumulator);
        let want_loss = values(&loss)[0] * 2.0;
        assert!(
            (got[0] - want_loss).abs() <= 1e-4 * want_loss.abs().max(1.0),
            "{rows}x{classes} loss {got:?} vs {want_loss}"
        );
        assert_eq!(got[1], values(&hits)[0] * 0.5, "{rows}x{classes} hits");
        // Deterministic: the same inputs give the same bits.
        let again = Tensor::zeros([2], (Kind::Float, CUDA));
        let grad2 = fused
            .run(
                &logits.detach(),
                &labels,
                Some(&scale),
                &again,
                CrossEntropyWeights {
                    weight,
                    loss_weight: 2.0,
                    hits_weight: 0.5,
                },
            )
            .unwrap();
        assert!(grad.equal(&grad2) && accumulator.equal(&again));
        // The gradient goes on through autograd.
        let w = Tensor::ones([classes], (Kind::Float, CUDA)).set_requires_grad(true);
        let out = logits.detach() * &w;
        backward_with(&out, &grad).unwrap();
        let expected_w = (&grad * logits.detach()).sum_dim_intlist(0, false, Kind::Float);
        assert_close(&values(&w.grad()), &values(&expected_w), 1e-4);
    }
    // Shapes are checked before anything is launched.
    let bad = Tensor::zeros([4, 3], (Kind::Float, CUDA));
    let labels = Tensor::zeros([5], (Kind::Int64, CUDA));
    let acc = Tensor::zeros([2], (Kind::Float, CUDA));
    let weights = CrossEntropyWeights {
        weight: 1.0,
        loss_weight: 1.0,
        hits_weight: 1.0,
    };
    assert!(matches!(
        fused.run(&bad, &labels, None, &acc, weights),
        Err(Error::InvalidArgument { .. })
    ));
    let wrong_kind = Tensor::zeros([4, 3], (Kind::Double, CUDA));
    let labels = Tensor::zeros([4], (Kind::Int64, CUDA));
    assert!(matches!(
        fused.run(&wrong_kind, &labels, None, &acc, weights),
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
