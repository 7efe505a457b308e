//! `nn::conv3x3`'s weight gradient on a side stream
//! (`nn::set_overlapped_weight_grads`, part of the `gpu` test binary): the
//! input and weight gradients of a stack of convolutions, replayed from a
//! graph captured with the side stream on, equal bit for bit those of the
//! same capture with it off and those of an eager pass, for the
//! tensor-core and the f32 weight-gradient kernels, f32 and bf16, a
//! channels-last and a contiguous weight; with a second pass accumulating
//! (which stays on the captured stream); and through `run_backward`
//! (gradients handed back, not accumulated). Eagerly the switch changes
//! nothing.

use tch::{Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, cuda, memory, nn};

use super::nn::bf16_autocast;
use super::{CUDA, gpu_or_skip, values};

/// A stack of convolutions (`channels[i] -> channels[i + 1]`) on
/// `[batch, channels[0], side, side]`, with fixed inputs and weights.
struct Stack {
    x: Tensor,
    weights: Vec<Tensor>,
}

impl Stack {
    fn new(batch: i64, channels: &[i64], side: i64, channels_last_weights: bool) -> Stack {
        tch::manual_seed(3);
        let x = memory::contiguous_channels_last(&Tensor::randn(
            [batch, channels[0], side, side],
            (Kind::Float, CUDA),
        ))
        .unwrap();
        let weights = channels
            .windows(2)
            .map(|pair| {
                let w = Tensor::randn([pair[1], pair[0], 3, 3], (Kind::Float, CUDA)) * 0.2;
                if channels_last_weights {
                    memory::contiguous_channels_last(&w).unwrap()
                } else {
                    w.contiguous()
                }
            })
            .collect();
        Stack { x, weights }
    }

    /// Fresh leaves of the input and weights.
    fn leaves(&self) -> (Tensor, Vec<Tensor>) {
        let x = self.x.detach().set_requires_grad(true);
        let weights = self
            .weights
            .iter()
            .map(|w| w.detach().set_requires_grad(true))
            .collect();
        (x, weights)
    }

    /// The scalar loss of the stack on `x` with `weights`.
    fn loss(x: &Tensor, weights: &[Tensor], bf16: bool) -> Tensor {
        let _autocast = bf16_autocast(bf16);
        let mut y = x.shallow_clone();
        for w in weights {
            y = nn::conv3x3(&y, w).unwrap().relu();
        }
        (&y * &y).to_kind(Kind::Float).sum(Kind::Float)
    }

    /// The input's and every weight's gradient after `passes` backward
    /// passes (accumulated from the second on), the side stream `overlap`.
    fn grads(&self, bf16: bool, overlap: bool, passes: usize) -> Vec<Vec<f32>> {
        nn::set_overlapped_weight_grads(overlap);
        let (x, weights) = self.leaves();
        for _ in 0..passes {
            Stack::loss(&x, &weights, bf16).backward();
        }
        nn::set_overlapped_weight_grads(false);
        std::iter::once(&x)
            .chain(&weights)
            .map(|t| values(&t.grad()))
            .collect()
    }
}

/// The input's and every weight's gradient, replayed twice from a graph
/// captured with the side stream `overlap`: `passes` backward passes
/// (accumulated from the second on), or with `handed_back` one
/// `run_backward` pass.
fn captured_grads(
    stack: &Stack,
    bf16: bool,
    overlap: bool,
    passes: usize,
    handed_back: bool,
) -> Vec<Vec<f32>> {
    nn::set_overlapped_weight_grads(overlap);
    let (x, weights) = stack.leaves();
    let leaves: Vec<Tensor> = std::iter::once(&x)
        .chain(&weights)
        .map(Tensor::shallow_clone)
        .collect();
    let outs: Vec<Tensor> = leaves.iter().map(Tensor::zeros_like).collect();
    let stream = CudaStream::from_pool(0, false).unwrap();
    let graph = CudaGraph::capture(&stream, None, 1, || {
        memory::set_grads_to_none(&leaves).map_err(|e| e.to_string())?;
        let grads = if handed_back {
            let loss = Stack::loss(&x, &weights, bf16);
            Tensor::f_run_backward(&[loss], &leaves, false, false).map_err(|e| e.to_string())?
        } else {
            for _ in 0..passes {
                Stack::loss(&x, &weights, bf16).backward();
            }
            leaves.iter().map(Tensor::grad).collect()
        };
        for (out, grad) in outs.iter().zip(&grads) {
            out.shallow_clone().copy_(grad);
        }
        Ok(())
    });
    nn::set_overlapped_weight_grads(false);
    let graph = graph.unwrap();
    let mut replays = Vec::new();
    for _ in 0..2 {
        for out in &outs {
            let _ = out.shallow_clone().zero_();
        }
        graph.replay().unwrap();
        stream.synchronize().unwrap();
        cuda::synchronize(0).unwrap();
        replays.push(outs.iter().map(values).collect::<Vec<_>>());
    }
    assert_eq!(replays[0], replays[1], "two replays differ");
    replays.swap_remove(0)
}

#[test]
fn conv3x3_weight_grads_on_a_side_stream_replay_as_on_one_stream() {
    let Some(_device) = gpu_or_skip() else { return };
    // (batch, channels, side): the CNN host's first layer (one input
    // channel: the f32 weight-gradient kernel) and its wider layers (the
    // tensor-core kernel).
    for (batch, channels, side) in [(16, vec![1, 8, 16], 28), (8, vec![16, 32, 32], 7)] {
        for channels_last in [true, false] {
            let stack = Stack::new(batch, &channels, side, channels_last);
            for bf16 in [false, true] {
                let case = format!("{channels:?} {side}x{side} cl {channels_last} bf16 {bf16}");
                for passes in [1, 2] {
                    let eager = stack.grads(bf16, false, passes);
                    assert_eq!(stack.grads(bf16, true, passes), eager, "{case}: eager");
                    let one = captured_grads(&stack, bf16, false, passes, false);
                    let side_stream = captured_grads(&stack, bf16, true, passes, false);
                    assert_eq!(side_stream, one, "{case}, {passes} pass(es)");
                    assert_eq!(side_stream, eager, "{case}, {passes} pass(es): eager");
                }
                let one = captured_grads(&stack, bf16, false, 1, true);
                let side_stream = captured_grads(&stack, bf16, true, 1, true);
                assert_eq!(side_stream, one, "{case}, run_backward");
            }
        }
    }
}
