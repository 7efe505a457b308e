//! Copies on the GPU (part of the `gpu` test binary): `index_copy_many`
//! and `memcpy_async` inside a captured graph, a non-blocking copy from
//! pinned memory on a side stream, and pinning. Where a side stream reads
//! what the current stream wrote, it waits for it first: on a busy GPU
//! the copy would otherwise race the write.

use tch::{Device, Kind, Tensor};
use torch_ext::{
    CudaGraph, CudaStream, copy_non_blocking, index_copy_many, memcpy_async, write_host_bytes,
};

use super::{CUDA, gpu_or_skip, tch_error, values};

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
