//! Programmatic dependent launch on the GPU (part of the `gpu` test binary):
//! a kernel launched while the one before it is still running reads what
//! that kernel wrote, eagerly and replayed from a captured graph, with the
//! launch attribute on and off.

use tch::{Kind, Tensor};
use torch_ext::jit::{self, Arg, JitKernel};
use torch_ext::{CudaGraph, CudaStream, cuda};

use super::{CUDA, assert_close, gpu_or_skip, values};

/// `slow_fill` spins for `spin` clock cycles before it writes, so a reader
/// that did not wait for it would see the value before.
const CHAIN_SOURCE: &str = r#"
extern "C" __global__ void slow_fill(float* x, float value, long long n, long long spin) {
    ESPER_PDL_ENTRY();
    const long long start = clock64();
    while (clock64() - start < spin) { }
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}
extern "C" __global__ void add_one(const float* x, float* y, long long n) {
    ESPER_PDL_ENTRY();
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.0f;
}
"#;

const LINKS: usize = 16;

#[test]
fn a_programmatic_launch_reads_what_the_kernel_before_wrote() {
    let Some(_device) = gpu_or_skip() else { return };
    let arch = cuda::device_capability(0).unwrap();
    let cubin = jit::compile(CHAIN_SOURCE, "slow_fill", arch).unwrap();
    assert_eq!(cubin.programmatic(), arch.0 >= 9, "sm_{}{}", arch.0, arch.1);
    let fill = JitKernel::load_named(&cubin, c"slow_fill", 0).unwrap();
    let add = JitKernel::load_named(&cubin, c"add_one", 0).unwrap();
    let n = 1_i64 << 16;
    let blocks = u32::try_from(n / 256).unwrap();
    let x = Tensor::zeros([n], (Kind::Float, CUDA));
    let outputs: Vec<Tensor> = (0..LINKS)
        .map(|_| Tensor::zeros([n], (Kind::Float, CUDA)))
        .collect();
    // LINKS (fill x with k, y_k = x + 1) pairs: each reader follows a writer
    // that spins about 20 us first.
    let chain = || -> torch_ext::Result<()> {
        for (k, y) in outputs.iter().enumerate() {
            let value = k as f32 + 10.0;
            let spin = Arg::I64(40_000);
            let fill_args = [Arg::Tensor(&x), Arg::F32(value), Arg::I64(n), spin];
            fill.launch([blocks, 1, 1], [256, 1, 1], 0, &fill_args)?;
            let add_args = [Arg::Tensor(&x), Arg::Tensor(y), Arg::I64(n)];
            add.launch([blocks, 1, 1], [256, 1, 1], 0, &add_args)?;
        }
        Ok(())
    };
    let check = |what: &str| {
        cuda::synchronize(0).unwrap();
        for (k, y) in outputs.iter().enumerate() {
            let got = values(y);
            assert!(
                got.iter().all(|v| *v == k as f32 + 11.0),
                "{what}: link {k} read a stale value ({:?}...)",
                &got[..4]
            );
        }
        for y in &outputs {
            let _ = y.shallow_clone().fill_(0.0);
        }
    };
    for enabled in [true, false] {
        jit::set_programmatic_launch(enabled);
        assert_eq!(jit::programmatic_launch_enabled(), enabled);
        chain().unwrap();
        check(&format!("eager, programmatic {enabled}"));
        let stream = CudaStream::from_pool(0, false).unwrap();
        let graph =
            CudaGraph::capture(&stream, None, 0, || chain().map_err(|e| e.to_string())).unwrap();
        for replay in 0..3 {
            let _ = x.shallow_clone().fill_(-1.0);
            graph.replay().unwrap();
            check(&format!("replay {replay}, programmatic {enabled}"));
        }
    }
    jit::set_programmatic_launch(true);
    assert_close(&values(&x.narrow(0, 0, 4)), &[LINKS as f32 + 9.0; 4], 0.0);
}
