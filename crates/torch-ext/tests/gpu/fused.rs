//! Fused ops on the GPU (part of the `gpu` test binary): the fused SGD step
//! eagerly and inside a captured graph, and the fused cross-entropy against
//! libtorch's.

use tch::{Device, Kind, Tensor};
use torch_ext::fused::{self, LearningRate, SgdOptions};
use torch_ext::{CudaGraph, CudaStream, Error};

use super::{CUDA, assert_close, gpu_or_skip, values};

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
fn the_fused_cross_entropy_matches_libtorch() {
    use torch_ext::loss::{CrossEntropyWeights, FusedCrossEntropy, backward_with};
    let Some(_device) = gpu_or_skip() else { return };
    let fused = FusedCrossEntropy::new(0).unwrap();
    for (rows, classes) in [(4_i64, 4_i64), (256, 10), (512, 16), (1000, 37), (3, 1000)] {
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
