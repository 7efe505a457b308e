//! torch-ext's multi-tensor kernel on the GPU (part of the `gpu` test
//! binary): `fused::foreach_zero_`, `foreach_copy_` and `foreach_add_`
//! against libtorch's `_foreach_*` ops (the fused kernels turned off) for
//! lists of many sizes, more tensors than one launch takes, and dtypes the
//! kernel moves as words; lists it does not take go to libtorch's ops with
//! the same result; the launches replay from a captured graph; the profile
//! shows the kernel.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, fused, nn};

use super::{CUDA, gpu_or_skip};

fn list(sizes: &[i64], kind: Kind, seed: i64) -> Vec<Tensor> {
    tch::manual_seed(seed);
    sizes
        .iter()
        .map(|&n| Tensor::randn([n], (Kind::Float, CUDA)).to_kind(kind))
        .collect()
}

fn copies(list: &[Tensor]) -> Vec<Tensor> {
    list.iter().map(Tensor::copy).collect()
}

fn same(case: &str, got: &[Tensor], want: &[Tensor], tol: f64) {
    for (index, (g, w)) in got.iter().zip(want).enumerate() {
        if g.numel() == 0 {
            continue;
        }
        let err = (g.to_kind(Kind::Double) - w.to_kind(Kind::Double))
            .abs()
            .max()
            .double_value(&[]);
        let scale = w
            .to_kind(Kind::Double)
            .abs()
            .max()
            .double_value(&[])
            .max(1.0);
        assert!(
            err <= tol * scale,
            "{case}: tensor {index} off libtorch's by {err}"
        );
    }
}

/// Runs `op` on copies of `dst` with the kernel and with libtorch's op.
fn both(dst: &[Tensor], op: impl Fn(&[Tensor])) -> (Vec<Tensor>, Vec<Tensor>) {
    let (ours, theirs) = (copies(dst), copies(dst));
    op(&ours);
    nn::set_fused_kernels(false);
    op(&theirs);
    nn::set_fused_kernels(true);
    (ours, theirs)
}

#[test]
fn foreach_kernels_match_libtorch() {
    let Some(_device) = gpu_or_skip() else { return };
    let sizes: Vec<i64> = vec![1, 3, 128, 0, 1000, 1024, 1025, 49_152, 65_543];
    let many: Vec<i64> = (0..130).map(|i| i * 29 + 2).collect();
    for (name, sizes, kind) in [
        ("f32", &sizes, Kind::Float),
        ("f32, 130 tensors", &many, Kind::Float),
        ("f64", &sizes, Kind::Double),
        // bf16 of even lengths: whole words.
        ("bf16", &many, Kind::BFloat16),
        // bf16 of odd lengths: libtorch's ops.
        ("bf16, odd lengths", &sizes, Kind::BFloat16),
    ] {
        let dst = list(sizes, kind, 1);
        let src = list(sizes, kind, 2);
        let (ours, theirs) = both(&dst, |t| fused::foreach_zero_(t).unwrap());
        same(&format!("{name}: zero"), &ours, &theirs, 0.0);
        assert!(
            ours.iter()
                .all(|t| t.numel() == 0 || t.abs().max().double_value(&[]) == 0.0)
        );
        let (ours, theirs) = both(&dst, |t| fused::foreach_copy_(t, &src, false).unwrap());
        same(&format!("{name}: copy"), &ours, &theirs, 0.0);
        same(&format!("{name}: copy is the source"), &ours, &src, 0.0);
        for alpha in [1.0, -0.5, 3.7] {
            let (ours, theirs) = both(&dst, |t| fused::foreach_add_(t, &src, alpha).unwrap());
            let tol = if kind == Kind::Float { 1e-6 } else { 0.0 };
            same(&format!("{name}: add {alpha}"), &ours, &theirs, tol);
        }
    }
}

#[test]
fn foreach_kernels_replay_from_a_captured_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    let stream = CudaStream::from_pool(0, false).unwrap();
    let sizes = [1000_i64, 7, 65_543];
    let acc = list(&sizes, Kind::Float, 3);
    let src = list(&sizes, Kind::Float, 4);
    let expected = copies(&acc);
    let graph = CudaGraph::capture(&stream, None, 1, || {
        fused::foreach_add_(&acc, &src, 2.0).map_err(|e| e.to_string())
    })
    .unwrap();
    // The warm-up ran once; two replays make three adds.
    graph.replay().unwrap();
    graph.replay().unwrap();
    cuda::synchronize(0).unwrap();
    for _ in 0..3 {
        nn::set_fused_kernels(false);
        fused::foreach_add_(&expected, &src, 2.0).unwrap();
        nn::set_fused_kernels(true);
    }
    same("three adds", &acc, &expected, 1e-6);
}

#[test]
fn foreach_ops_run_torch_exts_kernel() {
    let Some(_device) = gpu_or_skip() else { return };
    let dst = list(&[128, 49_152, 1000], Kind::Float, 5);
    let src = list(&[128, 49_152, 1000], Kind::Float, 6);
    let kernels = |fused_kernels: bool| {
        nn::set_fused_kernels(fused_kernels);
        fused::foreach_zero_(&dst).unwrap();
        cuda::synchronize(0).unwrap();
        let profiler = torch_ext::profile::KernelProfiler::start().unwrap();
        fused::foreach_zero_(&dst).unwrap();
        fused::foreach_copy_(&dst, &src, false).unwrap();
        fused::foreach_add_(&dst, &src, 1.0).unwrap();
        cuda::synchronize(0).unwrap();
        let profile = profiler.stop().unwrap();
        nn::set_fused_kernels(true);
        profile
    };
    let ours = kernels(true);
    let count: u64 = ours
        .kernels
        .iter()
        .filter(|k| k.name.contains("esper_foreach"))
        .map(|k| k.count)
        .sum();
    assert_eq!(count, 3, "{:?}", ours.kernels);
    assert_eq!(ours.kernel_launches(), 3, "{:?}", ours.kernels);
    let theirs = kernels(false);
    assert!(
        theirs
            .kernels
            .iter()
            .all(|k| !k.name.contains("esper_foreach"))
    );
}
