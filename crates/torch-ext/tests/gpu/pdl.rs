//! Programmatic dependent launch on the GPU (part of the `gpu` test
//! binary): kernels that begin with `ESPER_PDL_ENTRY()` are launched early on
//! sm_90 and newer, and still see everything their predecessor wrote, when
//! that predecessor is a slow kernel of their own kind, a libtorch kernel, a
//! device-to-device copy or work joined from another stream; eagerly and in
//! a captured graph replayed with new input.

use tch::{Kind, Tensor};
use torch_ext::jit::{Arg, JitKernel};
use torch_ext::{CudaEvent, CudaGraph, CudaStream, cuda, pdl};

use super::{CUDA, gpu_or_skip, values};

/// `slow_double`: every thread spins about `spin` clock cycles, then writes
/// twice its input (a predecessor that finishes long after it started);
/// `add_one`: the next step, which reads what the previous kernel wrote.
fn source() -> String {
    format!(
        r#"
extern "C" __global__ void slow_double(const float* x, float* y, long long n, long long spin) {{
    {entry}
    const long long start = clock64();
    while (clock64() - start < spin) {{ }}
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}}
extern "C" __global__ void add_one(const float* x, float* y, long long n) {{
    {entry}
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.0f;
}}
"#,
        entry = pdl::ENTRY
    )
}

const N: i64 = 1 << 16;
const THREADS: u32 = 256;
const SPIN: i64 = 200_000;

struct Kernels {
    slow: JitKernel,
    add: JitKernel,
}

/// One thread a value of `N`.
fn launch(kernel: &JitKernel, args: &[Arg<'_>]) -> Result<(), String> {
    let blocks = u32::try_from(N).unwrap() / THREADS;
    kernel
        .launch([blocks, 1, 1], [THREADS, 1, 1], 0, args)
        .map_err(|e| e.to_string())
}

impl Kernels {
    fn slow(&self, x: &Tensor, y: &Tensor) -> Result<(), String> {
        launch(
            &self.slow,
            &[Arg::Tensor(x), Arg::Tensor(y), Arg::I64(N), Arg::I64(SPIN)],
        )
    }

    fn add(&self, x: &Tensor, y: &Tensor) -> Result<(), String> {
        launch(&self.add, &[Arg::Tensor(x), Arg::Tensor(y), Arg::I64(N)])
    }
}

/// Buffers of the chain, allocated once (a graph replays on the same ones).
struct Chain {
    src: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    d: Tensor,
    e: Tensor,
    f: Tensor,
    g: Tensor,
}

impl Chain {
    fn new() -> Chain {
        let zeros = || Tensor::zeros([N], (Kind::Float, CUDA));
        Chain {
            src: zeros(),
            a: zeros(),
            b: zeros(),
            c: zeros(),
            d: zeros(),
            e: zeros(),
            f: zeros(),
            g: zeros(),
        }
    }

    /// copy -> slow (early) -> add (early) -> libtorch mul -> add (early)
    /// -> slow on a side stream -> add (early) after the join.
    fn run(&mut self, kernels: &Kernels, side: &CudaStream) -> Result<(), String> {
        let main = CudaStream::current(0).map_err(|e| e.to_string())?;
        self.a.copy_(&self.src);
        kernels.slow(&self.a, &self.b)?;
        kernels.add(&self.b, &self.c)?;
        self.d.copy_(&(&self.c * 3.0));
        kernels.add(&self.d, &self.e)?;
        let forked = CudaEvent::new(false).map_err(|e| e.to_string())?;
        forked.record(&main).map_err(|e| e.to_string())?;
        side.wait_event(&forked).map_err(|e| e.to_string())?;
        {
            let _guard = side.make_current().map_err(|e| e.to_string())?;
            kernels.slow(&self.e, &self.f)?;
        }
        let joined = CudaEvent::new(false).map_err(|e| e.to_string())?;
        joined.record(side).map_err(|e| e.to_string())?;
        main.wait_event(&joined).map_err(|e| e.to_string())?;
        kernels.add(&self.f, &self.g)
    }

    fn check(&self, seed: f32) {
        cuda::synchronize(0).unwrap();
        let got = values(&self.g);
        let src = values(&self.src);
        for (index, (g, s)) in got.iter().zip(&src).enumerate() {
            let expected = ((s * 2.0 + 1.0) * 3.0 + 1.0) * 2.0 + 1.0;
            assert_eq!(*g, expected, "element {index} (input seed {seed})");
        }
    }
}

#[test]
fn early_kernels_see_what_their_predecessors_wrote() {
    let Some(_device) = gpu_or_skip() else { return };
    let source = source();
    let kernels = Kernels {
        slow: JitKernel::build(&source, "slow_double", 0).unwrap(),
        add: JitKernel::build(&source, "add_one", 0).unwrap(),
    };
    let (major, _) = cuda::device_capability(0).unwrap();
    let allowed = pdl::enabled().unwrap();
    assert_eq!(kernels.slow.launches_early(), major >= 9 && allowed);
    assert_eq!(kernels.add.launches_early(), major >= 9 && allowed);
    println!(
        "sm_{major}x, {}={:?}: early launch {}",
        pdl::ENV_PDL,
        std::env::var(pdl::ENV_PDL).ok(),
        kernels.add.launches_early()
    );
    let side = CudaStream::from_pool(0, false).unwrap();
    let mut chain = Chain::new();
    let fill = |chain: &mut Chain, seed: f32| {
        chain
            .src
            .copy_(&(Tensor::arange(N, (Kind::Float, CUDA)).remainder(97.0) + f64::from(seed)));
    };
    fill(&mut chain, 1.0);
    chain.run(&kernels, &side).unwrap();
    chain.check(1.0);

    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = {
        let _guard = stream.make_current().unwrap();
        CudaGraph::capture(&stream, None, 1, || chain.run(&kernels, &side)).unwrap()
    };
    for seed in [2.0, 5.0, -3.0] {
        fill(&mut chain, seed);
        cuda::synchronize(0).unwrap();
        graph.replay().unwrap();
        chain.check(seed);
    }
}
