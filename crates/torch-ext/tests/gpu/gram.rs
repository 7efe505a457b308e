//! `torch_ext::nn::gram` on the GPU (part of the `gpu` test binary): every
//! row count the kernel takes, lengths that fill no block and that fill the
//! most blocks, f32 and bf16 rows, against the Gram matrix taken in f64;
//! bit for bit the same on a second call; libtorch's product for more rows
//! than the kernel takes; a replay from a captured graph with new rows.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, nn};

use super::nn::worst_of_max;
use super::{CUDA, gpu_or_skip, values};

/// The Gram matrix of `rows` (as the kernel reads them) in f64, as f32.
fn exact(rows: &Tensor) -> Tensor {
    let wide = rows.to_kind(Kind::Double);
    wide.mm(&wide.tr()).to_kind(Kind::Float)
}

#[test]
fn gram_matches_the_f64_product() {
    let Some(_device) = gpu_or_skip() else { return };
    for bf16 in [false, true] {
        for rows in 1..=nn::MAX_FUSED_GRAM_ROWS {
            for n in [1_i64, 37, 256, 1025, 636_032, 3_000_001] {
                tch::manual_seed(rows * 1000 + n);
                // Rows of unlike scale, and one that opposes the first, so
                // the matrix holds large, small and negative values.
                let x = Tensor::randn([rows, n], (Kind::Float, CUDA))
                    * Tensor::arange_start(1, rows + 1, (Kind::Float, CUDA)).unsqueeze(1);
                if rows > 1 {
                    let first = x.get(0);
                    x.get(rows - 1)
                        .copy_(&(first * -0.5 + x.get(rows - 1) * 0.1));
                }
                let x = if bf16 { x.to_kind(Kind::BFloat16) } else { x };
                let case = format!("bf16 {bf16} rows {rows} n {n}");
                let got = nn::gram(&x).unwrap();
                assert_eq!(got.size(), [rows, rows], "{case}");
                assert_eq!(got.kind(), Kind::Float, "{case}");
                let err = worst_of_max(&got, &exact(&x));
                assert!(err <= 1e-5, "{case}: off the f64 product by {err}");
                assert!(got.equal(&got.tr()), "{case}: not symmetric");
                let again = nn::gram(&x).unwrap();
                assert!(again.equal(&got), "{case}: not deterministic");
            }
        }
    }
    // More rows than the kernel takes: libtorch's product, still f32.
    let many = Tensor::randn([nn::MAX_FUSED_GRAM_ROWS + 1, 500], (Kind::Float, CUDA));
    let got = nn::gram(&many).unwrap();
    assert!(worst_of_max(&got, &exact(&many)) <= 1e-2);
}

#[test]
fn gram_replays_from_a_captured_graph() {
    let Some(_device) = gpu_or_skip() else { return };
    let rows = Tensor::randn([3, 100_000], (Kind::Float, CUDA));
    let out = Tensor::zeros([3, 3], (Kind::Float, CUDA));
    let step = || -> Result<(), String> {
        let g = nn::gram(&rows).map_err(|error| error.to_string())?;
        out.shallow_clone().copy_(&g);
        Ok(())
    };
    step().unwrap();
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 0, step).unwrap();
    // New rows in the same memory: the replay reads them.
    rows.shallow_clone()
        .copy_(&Tensor::randn([3, 100_000], (Kind::Float, CUDA)));
    graph.replay().unwrap();
    stream.synchronize().unwrap();
    cuda::synchronize(0).unwrap();
    assert_eq!(values(&out), values(&nn::gram(&rows).unwrap()));
}
