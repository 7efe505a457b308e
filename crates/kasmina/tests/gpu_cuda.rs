//! CUDA checks, run on the GPU machine (each test prints why it skips on a
//! machine without CUDA): prefetched modules land on the GPU, a model with
//! two seeds trains, attributes and exports there, seeds blended before the
//! host's pools (one fused node each) give the blend-then-pool's values and
//! gradients, and a depthwise convolution run in NCHW matches the
//! channels-last one.

mod common;

use common::forward_by_hand;
use common::sgd::GroupSgd;
use kasmina::attribution::attribute_batch;
use kasmina::export::export_seed_states;
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use kasmina::prefetch::{PrefetchConfig, Prefetcher};
use leyline::SeedStage;
use leyline::Telemetry;
use tch::{Device, Kind, Tensor};

fn cuda_or_skip(test: &str) -> Option<Device> {
    let device = torch_ext::device::select(torch_ext::DeviceChoice::Auto).unwrap_or(Device::Cpu);
    if device == Device::Cpu {
        eprintln!("skipping {test}: no CUDA device");
        None
    } else {
        Some(device)
    }
}

#[test]
fn prefetched_modules_are_built_on_the_gpu() {
    let Some(device) = cuda_or_skip("prefetched_modules_are_built_on_the_gpu") else {
        return;
    };
    let prefetcher = Prefetcher::new(PrefetchConfig::default()).expect("prefetcher");
    let prepared = prefetcher
        .request("conv_light", 8, SlotId::new(0, 1), device)
        .expect("request")
        .wait()
        .expect("built");
    assert_eq!(prepared.module.device(), device);
    for (_, tensor) in prepared.module.var_store().variables() {
        assert_eq!(tensor.device(), device);
    }
}

#[test]
fn a_two_seed_model_trains_attributes_and_exports_on_the_gpu() {
    let Some(device) = cuda_or_skip("a_two_seed_model_trains_attributes_and_exports_on_the_gpu")
    else {
        return;
    };
    tch::manual_seed(5);
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), device).expect("host");
    let slots = [SlotId::new(0, 1), SlotId::new(0, 2)];
    let mut model =
        MorphogeneticModel::new(host, &slots, SlotConfig::default(), Telemetry::disabled())
            .expect("model");
    model
        .germinate(slots[0], "conv_light", GerminationOptions::new("light"))
        .expect("germinate");
    let prefetcher = Prefetcher::new(PrefetchConfig::default()).expect("prefetcher");
    let prepared = prefetcher
        .request("attention", 32, slots[1], device)
        .expect("request")
        .wait()
        .expect("built");
    model
        .germinate_module(
            slots[1],
            prepared.module,
            GerminationOptions::new("attention"),
        )
        .expect("germinate prefetched");
    for slot in slots {
        model
            .advance_stage(slot, Some(SeedStage::Training))
            .expect("g1");
    }
    model
        .slot_mut(slots[1])
        .expect("slot")
        .set_alpha(0.5)
        .expect("alpha");
    let images = Tensor::randn([32, 1, 28, 28], (Kind::Float, device));
    let labels = Tensor::randint(10, [32], (Kind::Int64, device));
    let logits = model.forward(&images, true).expect("forward");
    assert_eq!(logits.device(), device);
    logits.cross_entropy_for_logits(&labels).backward();
    model.measure_gradients().expect("measure");
    GroupSgd::new(0.01, 0.9).step(&mut model);
    let attribution = attribute_batch(&model, &images).expect("attribution");
    assert_eq!(attribution.influence.size(), vec![32, 2]);
    assert_eq!(attribution.influence.device(), device);
    let influence = attribution.influence.to_device(Device::Cpu);
    assert_eq!(influence.select(1, 0).abs().max().double_value(&[]), 0.0);
    assert!(influence.select(1, 1).min().double_value(&[]) > 0.0);
    let messages = export_seed_states(&model).expect("export");
    assert_eq!(messages.len(), 2);
    let masks = model.seed_masks();
    let mask = masks.to_tensor(&masks.seeds[1], device).expect("mask");
    assert_eq!(mask.device(), device);
}

#[test]
fn seeds_blended_before_the_pools_match_the_blend_then_the_pool_on_the_gpu() {
    let Some(device) =
        cuda_or_skip("seeds_blended_before_the_pools_match_the_blend_then_the_pool_on_the_gpu")
    else {
        return;
    };
    tch::manual_seed(9);
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), device).expect("host");
    // r0c1 and r0c2 sit before the pools of blocks 1 and 2 (7x7: an odd side).
    let slots = [SlotId::new(0, 1), SlotId::new(0, 2)];
    let mut model =
        MorphogeneticModel::new(host, &slots, SlotConfig::default(), Telemetry::disabled())
            .expect("model");
    for slot in slots {
        model
            .germinate(slot, "conv_light", GerminationOptions::new("light"))
            .expect("germinate");
        model
            .advance_stage(slot, Some(SeedStage::Training))
            .expect("g1");
    }
    let batch = 16;
    let f32 = (Kind::Float, device);
    let per_sample = Tensor::rand([batch, 1, 1, 1], f32);
    let shared = Tensor::full([1, 1, 1, 1], 0.75, f32);
    let overrides = [Some(&per_sample), Some(&shared)];
    for channels_last in [false, true] {
        let images = Tensor::randn([batch, 1, 28, 28], f32);
        let images = if channels_last {
            torch_ext::memory::contiguous_channels_last(&images).expect("layout")
        } else {
            images
        };
        let run = |by_hand: bool| {
            let input = images.detach().set_requires_grad(true);
            let logits = if by_hand {
                forward_by_hand(&model, &input, &overrides, true)
            } else {
                model
                    .forward_with_alpha(&input, &overrides, true)
                    .expect("walk")
            };
            (&logits * &logits).sum(Kind::Float).backward();
            let grads: Vec<Tensor> = model
                .parameters()
                .iter()
                .map(|parameter| {
                    let grad = parameter.tensor.grad();
                    assert!(grad.defined(), "{} has no gradient", parameter.name);
                    let copy = grad.detach().copy();
                    let _ = grad.shallow_clone().zero_();
                    copy
                })
                .collect();
            (logits.detach(), input.grad(), grads)
        };
        let (walked, walked_dx, walked_grads) = run(false);
        let (by_hand, by_hand_dx, by_hand_grads) = run(true);
        let close = |a: &Tensor, b: &Tensor| {
            let scale = b.abs().max().double_value(&[]).max(1e-6);
            (a - b).abs().max().double_value(&[]) <= 1e-5 * scale
        };
        let case = format!("channels-last {channels_last}");
        assert!(close(&walked, &by_hand), "logits, {case}");
        assert!(close(&walked_dx, &by_hand_dx), "input gradient, {case}");
        assert_eq!(walked_grads.len(), by_hand_grads.len());
        for (index, (a, b)) in walked_grads.iter().zip(&by_hand_grads).enumerate() {
            assert!(close(a, b), "parameter {index} gradient, {case}");
        }
    }
}

#[test]
fn a_transformer_with_seeds_runs_on_the_gpu() {
    let Some(device) = cuda_or_skip("a_transformer_with_seeds_runs_on_the_gpu") else {
        return;
    };
    tch::manual_seed(8);
    let config = kasmina::host::TransformerHostConfig::tiny();
    let host = kasmina::host::TransformerHost::new(config.clone(), device).expect("host");
    let slot = SlotId::new(0, 1);
    let mut model =
        MorphogeneticModel::new(host, &[slot], SlotConfig::default(), Telemetry::disabled())
            .expect("model");
    model
        .germinate(slot, "attention", GerminationOptions::new("attention"))
        .expect("germinate");
    model
        .advance_stage(slot, Some(SeedStage::Training))
        .expect("g1");
    let tokens = Tensor::randint(config.vocab_size, [4, 12], (Kind::Int64, device));
    let logits = model.forward(&tokens, true).expect("forward");
    assert_eq!(logits.size(), vec![4, 12, config.vocab_size]);
    logits
        .reshape([-1, config.vocab_size])
        .cross_entropy_for_logits(&tokens.reshape([-1]))
        .backward();
    GroupSgd::new(0.01, 0.9).step(&mut model);
    model
        .slot_mut(slot)
        .expect("slot")
        .set_alpha(0.5)
        .expect("alpha");
    let attribution = attribute_batch(&model, &tokens).expect("attribution");
    assert_eq!(attribution.influence.size(), vec![4, 1]);
    assert!(
        attribution
            .influence
            .to_device(Device::Cpu)
            .min()
            .double_value(&[])
            > 0.0
    );
}

/// A depthwise convolution of a channels-last CUDA input runs in NCHW
/// (libtorch's own depthwise kernel, not cuDNN's): the values and the
/// weight's gradient match the channels-last convolution's, in fp32 and
/// under bf16 autocast.
#[test]
fn a_depthwise_convolution_in_nchw_matches_the_channels_last_one() {
    let Some(device) =
        cuda_or_skip("a_depthwise_convolution_in_nchw_matches_the_channels_last_one")
    else {
        return;
    };
    tch::manual_seed(3);
    let vs = tch::nn::VarStore::new(device);
    let conv = kasmina::layers::Conv2d::new(&vs.root(), 16, 16, 3, 16, false).expect("conv");
    assert!(torch_ext::memory::set_channels_last_(&conv.weight).expect("channels last"));
    let x = torch_ext::memory::contiguous_channels_last(&Tensor::randn(
        [8, 16, 14, 14],
        (Kind::Float, device),
    ))
    .expect("input");
    for bf16 in [false, true] {
        let run = |nchw: bool| -> (Tensor, Tensor) {
            let _autocast = bf16.then(|| {
                torch_ext::AutocastGuard::new(torch_ext::AutocastDevice::Cuda, Kind::BFloat16)
                    .expect("autocast")
            });
            let y = if nchw {
                conv.forward(&x).expect("forward")
            } else {
                x.conv2d(&conv.weight, None::<Tensor>, [1, 1], [1, 1], [1, 1], 16)
            };
            let grad = Tensor::run_backward(
                &[y.to_kind(Kind::Float).sum(Kind::Float)],
                &[&conv.weight],
                false,
                false,
            );
            (y.to_kind(Kind::Float), grad[0].shallow_clone())
        };
        let (y, grad) = run(true);
        let (expected_y, expected_grad) = run(false);
        let tolerance = if bf16 { 2e-2 } else { 1e-5 };
        assert!(
            y.allclose(&expected_y, tolerance, tolerance, false),
            "bf16 {bf16}: outputs differ"
        );
        assert!(
            grad.allclose(&expected_grad, tolerance, tolerance * 10.0, false),
            "bf16 {bf16}: weight gradients differ"
        );
    }
}
