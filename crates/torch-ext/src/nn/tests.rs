//! The kernels' source compiles in every variant (NVRTC needs no GPU); off
//! CUDA the layers are libtorch's ops; the side stream's switch is per thread.

use super::kernels::nn_source;
use super::*;

/// Every dtype and channel-width variant compiles (NVRTC needs no GPU).
#[test]
fn every_kernel_variant_compiles() {
    for bf16 in [false, true] {
        for vec4 in [false, true] {
            let source = nn_source(bf16, vec4);
            match crate::jit::compile(&source, "esper_nn", (9, 0)) {
                Ok(cubin) => {
                    assert!(!cubin.is_empty());
                    assert!(
                        !cubin.contains_symbol("esper_gn_relu"),
                        "a prefix is no symbol"
                    );
                    // Every kernel `kernels` loads is in the image.
                    for name in [
                        "esper_gn_relu_forward",
                        "esper_gn_relu_backward",
                        "esper_gn_relu_forward_narrow",
                        "esper_gn_relu_backward_narrow",
                        "esper_conv3_direct",
                        "esper_bn_relu_forward",
                        "esper_bn_relu_eval",
                        "esper_blend_lerp_forward",
                        "esper_blend_lerp_backward",
                        "esper_blend_lerp_pool_forward",
                        "esper_blend_lerp_pool_backward",
                        "esper_ln_forward",
                        "esper_ln_backward",
                        "esper_col_sum",
                        "esper_embedding_backward",
                        "esper_gram_partial",
                        "esper_se_forward",
                        "esper_se_backward",
                        "esper_pooled_linear_forward",
                        "esper_pooled_linear_backward",
                    ] {
                        assert!(
                            cubin.contains_symbol(name),
                            "bf16 {bf16} vec4 {vec4}: no {name}"
                        );
                    }
                    // The sized direct convolutions the conv3x3 launches pick from.
                    for name in super::kernels::DIRECT_FIXED_KERNELS {
                        assert!(cubin.contains_symbol(name), "bf16 {bf16}: no {name}");
                    }
                    // The linear layer's weight-and-bias gradient: bf16 only.
                    assert_eq!(cubin.contains_symbol("esper_linear_wgrad"), bf16);
                    // The bf16-output layer norm: in the f32 build only.
                    for name in ["esper_ln_forward_bf16_out", "esper_ln_backward_bf16_out"] {
                        assert_eq!(cubin.contains_symbol(name), !bf16, "bf16 {bf16}: {name}");
                    }
                }
                Err(error) if error.to_string().contains("libnvrtc") => {
                    println!("skipping: NVRTC is not installed here ({error})");
                    return;
                }
                Err(error) => panic!("bf16 {bf16} vec4 {vec4}: {error}"),
            }
        }
    }
}

/// Off CUDA, `layer_norm` is libtorch's op, with its clear error for a
/// weight that does not fit.
#[test]
fn layer_norm_on_the_cpu_is_libtorchs() {
    let cpu = (Kind::Float, Device::Cpu);
    let x = Tensor::randn([3, 5, 8], cpu);
    let (weight, bias) = (Tensor::rand([8], cpu), Tensor::randn([8], cpu));
    let y = layer_norm(&x, &weight, &bias, 1e-5).unwrap();
    let expected = x.layer_norm([8].as_slice(), Some(&weight), Some(&bias), 1e-5, true);
    assert!(y.equal(&expected));
    let wrong = Tensor::ones([5], cpu);
    assert!(layer_norm(&x, &wrong, &bias, 1e-5).is_err());
    assert!(layer_norm(&Tensor::ones([0], cpu), &weight, &bias, 1e-5).is_err());
}

/// Off CUDA, `group_norm_relu_add` is `residual + relu(group_norm(x))` from
/// libtorch's ops, gradients included; a residual of another shape is
/// refused (libtorch would broadcast a `[1, C, H, W]` one).
#[test]
fn group_norm_relu_add_on_the_cpu_is_libtorchs_sum() {
    let cpu = (Kind::Float, Device::Cpu);
    let x = Tensor::randn([2, 8, 3, 3], cpu).set_requires_grad(true);
    let residual = Tensor::randn([2, 8, 3, 3], cpu);
    let (weight, bias) = (Tensor::rand([8], cpu), Tensor::randn([8], cpu));
    let y = group_norm_relu_add(&x, &residual, 4, &weight, &bias, 1e-5).unwrap();
    let expected = &residual
        + x.group_norm(4, Some(&weight), Some(&bias), 1e-5, true)
            .relu();
    assert!(y.equal(&expected));
    let gx = Tensor::run_backward(&[y.sum(Kind::Float)], &[&x], false, false);
    let ge = Tensor::run_backward(&[expected.sum(Kind::Float)], &[&x], false, false);
    assert!(gx[0].equal(&ge[0]));
    let broadcastable = residual.narrow(0, 0, 1);
    match group_norm_relu_add(&x, &broadcastable, 4, &weight, &bias, 1e-5) {
        Err(Error::InvalidArgument { message, .. }) => assert!(message.contains("residual")),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// Off CUDA, `layer_norm_fork` is `(x, layer_norm(x))` from libtorch's
/// op: the stream is `x` and autograd sums the two gradients; a weight
/// that does not fit is libtorch's clear error.
#[test]
fn layer_norm_fork_on_the_cpu_is_x_and_libtorchs_layer_norm() {
    let cpu = (Kind::Float, Device::Cpu);
    let x = Tensor::randn([3, 5, 8], cpu).set_requires_grad(true);
    let (weight, bias) = (Tensor::rand([8], cpu), Tensor::randn([8], cpu));
    for bf16_out in [false, true] {
        let (stream, y) = layer_norm_fork(&x, &weight, &bias, 1e-5, bf16_out).unwrap();
        assert!(stream.equal(&x));
        let expected = x.layer_norm([8].as_slice(), Some(&weight), Some(&bias), 1e-5, true);
        let expected = if bf16_out {
            expected.to_kind(Kind::BFloat16)
        } else {
            expected
        };
        assert!(y.equal(&expected), "bf16_out {bf16_out}");
    }
    let (stream, y) = layer_norm_fork(&x, &weight, &bias, 1e-5, false).unwrap();
    let up = Tensor::randn([3, 5, 8], cpu);
    ((&stream * &up).sum(Kind::Float) + y.sum(Kind::Float)).backward();
    let lone = x.detach().set_requires_grad(true);
    lone.layer_norm([8].as_slice(), Some(&weight), Some(&bias), 1e-5, true)
        .sum(Kind::Float)
        .backward();
    let expected = lone.grad() + &up;
    assert!(x.grad().allclose(&expected, 1e-6, 1e-6, false));
    let wrong = Tensor::ones([5], cpu);
    assert!(layer_norm_fork(&x, &wrong, &bias, 1e-5, false).is_err());
}

/// Off CUDA, `linear` is libtorch's op, with its clear error for a weight
/// that does not fit the input.
#[test]
fn linear_on_the_cpu_is_libtorchs() {
    let cpu = (Kind::Float, Device::Cpu);
    let x = Tensor::randn([3, 5, 8], cpu);
    let (weight, bias) = (Tensor::randn([12, 8], cpu), Tensor::randn([12], cpu));
    let y = linear(&x, &weight, Some(&bias)).unwrap();
    assert!(y.equal(&x.linear(&weight, Some(&bias))));
    let unbiased = linear(&x, &weight, None).unwrap();
    assert!(unbiased.equal(&x.linear(&weight, None::<&Tensor>)));
    assert!(linear(&x, &Tensor::ones([12, 7], cpu), Some(&bias)).is_err());
    assert!(linear(&x, &weight, Some(&Tensor::ones([5], cpu))).is_err());
}

/// Off CUDA, `embedding` is libtorch's op, with its clear error for ids of
/// the wrong dtype.
#[test]
fn embedding_on_the_cpu_is_libtorchs() {
    let weight = Tensor::randn([10, 8], (Kind::Float, Device::Cpu));
    let ids = Tensor::from_slice(&[0i64, 3, 9, 3]).view([2, 2]);
    let y = embedding(&weight, &ids).unwrap();
    assert!(y.equal(&Tensor::embedding(&weight, &ids, -1, false, false)));
    assert_eq!(y.size(), [2, 2, 8]);
    assert!(embedding(&weight, &ids.to_kind(Kind::Float)).is_err());
}

/// Off CUDA, `gram` is libtorch's product of the rows in `f32`; a tensor
/// that is not a set of rows is a clear error.
#[test]
fn gram_on_the_cpu_is_libtorchs() {
    let cpu = (Kind::Float, Device::Cpu);
    let rows = Tensor::randn([3, 1000], cpu);
    let g = gram(&rows).unwrap();
    assert_eq!(g.size(), [3, 3]);
    assert!(g.equal(&rows.mm(&rows.tr())));
    let from_bf16 = gram(&rows.to_kind(Kind::BFloat16)).unwrap();
    assert_eq!(from_bf16.kind(), Kind::Float);
    let wide = rows.to_kind(Kind::Double);
    assert!(gram(&wide).unwrap().equal(&wide.mm(&wide.tr())));
    let empty_rows = gram(&Tensor::zeros([2, 0], cpu)).unwrap();
    assert!(empty_rows.equal(&Tensor::zeros([2, 2], cpu)));
    for bad in [
        Tensor::ones([5], cpu),
        Tensor::ones([2, 3, 4], cpu),
        Tensor::ones([0, 4], cpu),
    ] {
        let error = gram(&bad).unwrap_err().to_string();
        assert!(error.contains("row"), "{error}");
    }
}

/// Off CUDA, `squeeze_excite` is libtorch's composition bit for bit;
/// shapes that do not fit are refused before anything runs.
#[test]
fn squeeze_excite_on_the_cpu_is_libtorchs_composition() {
    let cpu = (Kind::Float, Device::Cpu);
    let x = Tensor::randn([3, 8, 5, 4], cpu);
    let (w1, w2, b2) = (
        Tensor::randn([2, 8], cpu),
        Tensor::randn([8, 2], cpu),
        Tensor::randn([8], cpu),
    );
    let y = squeeze_excite(&x, &w1, &w2, &b2).unwrap();
    let pooled = x.mean_dim([2_i64, 3].as_slice(), false, None);
    let gate = pooled
        .linear(&w1, None::<Tensor>)
        .relu()
        .linear(&w2, Some(&b2))
        .sigmoid()
        .reshape([3, 8, 1, 1]);
    assert!(y.equal(&(&x * gate)));
    let bad_shapes = [
        (
            Tensor::randn([3, 8, 5], cpu),
            w1.shallow_clone(),
            w2.shallow_clone(),
        ),
        (
            x.shallow_clone(),
            Tensor::randn([2, 7], cpu),
            w2.shallow_clone(),
        ),
        (
            x.shallow_clone(),
            w1.shallow_clone(),
            Tensor::randn([2, 8], cpu),
        ),
        (
            Tensor::randn([0, 8, 5, 4], cpu),
            w1.shallow_clone(),
            w2.shallow_clone(),
        ),
    ];
    for (x, w1, w2) in bad_shapes {
        let error = squeeze_excite(&x, &w1, &w2, &b2).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
    }
}

/// Off CUDA, `pooled_linear` is libtorch's mean and linear bit for bit,
/// with and without a bias; shapes that do not fit are refused before
/// anything runs.
#[test]
fn pooled_linear_on_the_cpu_is_libtorchs_composition() {
    let cpu = (Kind::Float, Device::Cpu);
    let x = Tensor::randn([3, 8, 5, 4], cpu);
    let (weight, bias) = (Tensor::randn([10, 8], cpu), Tensor::randn([10], cpu));
    let pooled = x.mean_dim([2_i64, 3].as_slice(), false, None);
    let y = pooled_linear(&x, &weight, Some(&bias)).unwrap();
    assert!(y.equal(&pooled.linear(&weight, Some(&bias))));
    let y = pooled_linear(&x, &weight, None).unwrap();
    assert!(y.equal(&pooled.linear(&weight, None::<Tensor>)));
    let bad_shapes = [
        (
            Tensor::randn([3, 8, 5], cpu),
            weight.shallow_clone(),
            bias.shallow_clone(),
        ),
        (
            x.shallow_clone(),
            Tensor::randn([10, 7], cpu),
            bias.shallow_clone(),
        ),
        (
            x.shallow_clone(),
            weight.shallow_clone(),
            Tensor::randn([9], cpu),
        ),
        (
            Tensor::randn([0, 8, 5, 4], cpu),
            weight.shallow_clone(),
            bias.shallow_clone(),
        ),
        (
            Tensor::randn([3, 8, 0, 4], cpu),
            weight.shallow_clone(),
            bias.shallow_clone(),
        ),
    ];
    for (x, weight, bias) in bad_shapes {
        let error = pooled_linear(&x, &weight, Some(&bias)).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
    }
}

/// The attention kernels compile (NVRTC needs no GPU) and hold every
/// kernel `attention` loads.
#[test]
fn the_attention_kernels_compile() {
    match crate::jit::compile(
        super::attention_source::ATTENTION_SOURCE,
        "esper_attention",
        (9, 0),
    ) {
        Ok(cubin) => {
            for d in FUSED_ATTENTION_HEAD_DIMS {
                for pass in ["forward", "backward"] {
                    let name = format!("esper_attention_{pass}_d{d}");
                    assert!(cubin.contains_symbol(&name), "no {name}");
                }
            }
        }
        Err(error) if error.to_string().contains("libnvrtc") => {
            println!("skipping: NVRTC is not installed here ({error})");
        }
        Err(error) => panic!("{error}"),
    }
}

/// Off CUDA, `causal_attention` is libtorch's causal SDPA on the packed
/// projection's `[B, H, T, D]` views, merged back; a projection that does
/// not split into the heads is a clear error.
#[test]
fn causal_attention_on_the_cpu_is_libtorchs_sdpa() {
    let cpu = (Kind::Float, Device::Cpu);
    let (batch, time, heads, head_dim) = (2_i64, 5_i64, 3_i64, 4_i64);
    let width = heads * head_dim;
    let qkv = Tensor::randn([batch, time, 3 * width], cpu);
    let got = causal_attention(&qkv, heads).unwrap();
    let views = |i: i64| {
        qkv.narrow(2, i * width, width)
            .reshape([batch, time, heads, head_dim])
            .transpose(1, 2)
    };
    // Causal softmax attention written out.
    let (q, k, v) = (views(0), views(1), views(2));
    let scores = q.matmul(&k.transpose(-2, -1)) / (head_dim as f64).sqrt();
    let mask = Tensor::ones([time, time], (Kind::Bool, Device::Cpu)).triu(1);
    let weights = scores
        .masked_fill(&mask, f64::NEG_INFINITY)
        .softmax(-1, Kind::Float);
    let expected = weights
        .matmul(&v)
        .transpose(1, 2)
        .reshape([batch, time, width]);
    assert_eq!(got.size(), [batch, time, width]);
    let difference = f64::try_from((&got - &expected).abs().max()).unwrap();
    assert!(difference < 1e-5, "differs by {difference}");
    for (shape, heads) in [
        (vec![2, 5, 36], 0),
        (vec![2, 5, 36], 5),
        (vec![10, 36], 3),
        (vec![2, 5, 35], 1),
    ] {
        let error = causal_attention(&Tensor::zeros(shape.as_slice(), cpu), heads).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
    }
}

#[test]
fn the_side_stream_choice_is_per_thread_and_scoped() {
    assert!(!overlapped_weight_grads(), "off by default");
    let inside = with_overlapped_weight_grads(true, || {
        let other_thread = std::thread::spawn(overlapped_weight_grads)
            .join()
            .expect("thread");
        (overlapped_weight_grads(), other_thread)
    });
    assert_eq!(inside, (true, false), "on here, not on another thread");
    assert!(!overlapped_weight_grads(), "put back after the scope");
    set_overlapped_weight_grads(true);
    let nested = with_overlapped_weight_grads(false, overlapped_weight_grads);
    assert!(!nested);
    assert!(overlapped_weight_grads(), "the earlier choice comes back");
    let unwound = std::panic::catch_unwind(|| with_overlapped_weight_grads(false, || panic!("x")));
    assert!(unwound.is_err());
    assert!(overlapped_weight_grads(), "put back after a panic too");
    set_overlapped_weight_grads(false);
}
