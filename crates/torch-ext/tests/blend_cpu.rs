//! `memory::repeat_batch` and `nn::blend_lerp_replicated` on the CPU: the
//! copies keep a channels-last layout, the replicated blend equals the
//! blend of the copies (and passes gradients through them), the pooled
//! blend is the blend then the pool, and bad arguments are typed errors.

use tch::{Device, Kind, Tensor};
use torch_ext::{Error, memory, nn};

const CPU: (Kind, Device) = (Kind::Float, Device::Cpu);

#[test]
fn copies_keep_the_layout_and_bad_counts_are_refused() {
    tch::manual_seed(3);
    let nchw = Tensor::randn([3, 4, 5, 6], CPU);
    let nhwc = memory::contiguous_channels_last(&nchw).unwrap();
    for replicas in [1, 3] {
        let want = nchw.repeat([replicas, 1, 1, 1]);
        let plain = memory::repeat_batch(&nchw, replicas).unwrap();
        let kept = memory::repeat_batch(&nhwc, replicas).unwrap();
        assert!(plain.equal(&want) && kept.equal(&want), "{replicas} copies");
        assert!(plain.is_contiguous());
        assert!(
            memory::is_channels_last(&kept).unwrap(),
            "{replicas} copies stay NHWC"
        );
    }
    let tokens = Tensor::randn([2, 3, 4], CPU);
    assert!(
        memory::repeat_batch(&tokens, 2)
            .unwrap()
            .equal(&tokens.repeat([2, 1, 1]))
    );
    for (tensor, replicas) in [(&tokens, 0), (&tokens, -2), (&Tensor::from(1.0f32), 2)] {
        assert!(matches!(
            memory::repeat_batch(tensor, replicas),
            Err(Error::InvalidArgument { .. })
        ));
    }
}

#[test]
fn the_replicated_blend_is_the_blend_of_copies() {
    tch::manual_seed(4);
    let h = memory::contiguous_channels_last(&Tensor::randn([4, 8, 3, 3], CPU)).unwrap();
    let s = memory::contiguous_channels_last(&Tensor::randn([4, 8, 3, 3], CPU)).unwrap();
    for weight in [
        Tensor::rand([12, 1, 1, 1], CPU),
        Tensor::full([1, 1, 1, 1], 0.3, CPU),
    ] {
        let got = nn::blend_lerp_replicated(&h, &s, &weight, 3).unwrap();
        let want = h
            .repeat([3, 1, 1, 1])
            .lerp_tensor(&s.repeat([3, 1, 1, 1]), &weight);
        assert_eq!(got.size(), [12, 8, 3, 3]);
        assert!(got.allclose(&want, 1e-6, 1e-6, false));
    }
    // Gradients flow to the host through every copy.
    let leaf = Tensor::randn([2, 5], CPU).set_requires_grad(true);
    let seed = Tensor::randn([2, 5], CPU);
    let weight = Tensor::from_slice(&[0.25f32, 0.5, 1.0, 0.0]).reshape([4, 1]);
    nn::blend_lerp_replicated(&leaf, &seed, &weight, 2)
        .unwrap()
        .sum(Kind::Float)
        .backward();
    let expected = Tensor::from_slice(&[0.75f32 + 0.0, 0.5 + 1.0])
        .reshape([2, 1])
        .expand([2, 5], false);
    assert!(leaf.grad().allclose(&expected, 1e-6, 1e-6, false));
    // A replica count below one is refused; a weight of the wrong batch is
    // libtorch's error, not a crash.
    assert!(matches!(
        nn::blend_lerp_replicated(&h, &s, &Tensor::rand([4, 1, 1, 1], CPU), 0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(nn::blend_lerp_replicated(&h, &s, &Tensor::rand([5, 1, 1, 1], CPU), 3).is_err());
}

#[test]
fn the_pooled_blend_is_the_blend_then_the_pool_on_the_cpu() {
    tch::manual_seed(5);
    let h = Tensor::randn([3, 4, 7, 6], CPU);
    let s = Tensor::randn([3, 4, 7, 6], CPU);
    let w = Tensor::from_slice(&[0.25f32, 1.5, -0.5]).reshape([3, 1, 1, 1]);
    let pooled = nn::blend_lerp_pool2x2(&h, &s, &w).unwrap();
    assert_eq!(pooled.size(), [3, 4, 3, 3]);
    let want = h
        .lerp_tensor(&s, &w)
        .max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false);
    assert!(pooled.equal(&want));
    let clamped = nn::blend_lerp_clamped_pool2x2(&h, &s, &w).unwrap();
    let want =
        h.lerp_tensor(&s, &w.clamp(0.0, 1.0))
            .max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false);
    assert!(clamped.equal(&want));
    // A shape that does not fit together is libtorch's error, not a panic.
    let other = Tensor::randn([3, 4, 6, 6], CPU);
    assert!(nn::blend_lerp_pool2x2(&h, &other, &w).is_err());
}
