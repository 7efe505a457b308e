//! The AMP grad scaler on the CPU: finite gradients are unscaled and leave
//! found-inf at 0; an inf or NaN gradient sets it, the fused SGD step given it
//! leaves the parameters unchanged, and the update halves the scale and
//! resets the tracker; a run of clean steps (3 configured, and the default
//! 2000) doubles the scale. Also the configuration's checks, the precision
//! names, and the saved state's round trip and refusals.

use tch::{Device, Kind, Tensor};
use tolaria::Error;
use tolaria::amp::{GradScaler, GradScalerConfig, Precision, ScalerState};
use torch_ext::fused::{SgdOptions, sgd_step_with};

fn scale_of(scaler: &GradScaler) -> f64 {
    scaler.scale().double_value(&[])
}

fn tracker_of(scaler: &GradScaler) -> i64 {
    scaler.growth_tracker().int64_value(&[])
}

fn found_inf_of(scaler: &GradScaler) -> f64 {
    scaler.found_inf().double_value(&[])
}

fn values(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(tensor.flatten(0, -1)).expect("values")
}

fn small_interval(interval: u32) -> GradScalerConfig {
    GradScalerConfig {
        growth_interval: interval,
        ..GradScalerConfig::default()
    }
}

/// One clean step: a finite gradient, unscaled, then the update.
fn clean_step(scaler: &mut GradScaler) {
    let grad = Tensor::from_slice(&[1.0f32, -2.0]);
    scaler.unscale_(&[grad]).expect("unscale_");
    scaler.update().expect("update");
}

#[test]
fn defaults_match_torch_grad_scaler() {
    let scaler = GradScaler::new(GradScalerConfig::default(), Device::Cpu).expect("scaler");
    assert!(scaler.is_enabled());
    assert_eq!(scaler.scale().kind(), Kind::Float);
    assert_eq!(scaler.growth_tracker().kind(), Kind::Int);
    assert_eq!(scaler.found_inf().kind(), Kind::Float);
    assert_eq!(scaler.scale().dim(), 0);
    assert_eq!(scale_of(&scaler), 65536.0);
    assert_eq!(tracker_of(&scaler), 0);
    assert_eq!(found_inf_of(&scaler), 0.0);
    let config = scaler.config();
    assert_eq!(
        (
            config.growth_factor,
            config.backoff_factor,
            config.growth_interval
        ),
        (2.0, 0.5, 2000)
    );
}

#[test]
fn scale_loss_multiplies_by_the_scale_and_backward_sees_it() {
    let scaler = GradScaler::new(GradScalerConfig::default(), Device::Cpu).expect("scaler");
    let weight = Tensor::from_slice(&[3.0f32]).set_requires_grad(true);
    let loss = (&weight * 2.0).sum(Kind::Float);
    let scaled = scaler.scale_loss(&loss).expect("scale_loss");
    assert_eq!(scaled.double_value(&[]), 6.0 * 65536.0);
    scaled.backward();
    assert_eq!(values(&weight.grad()), vec![2.0 * 65536.0]);
}

#[test]
fn finite_gradients_are_unscaled_and_found_inf_stays_zero() {
    let mut scaler = GradScaler::new(
        GradScalerConfig {
            init_scale: 1024.0,
            ..GradScalerConfig::default()
        },
        Device::Cpu,
    )
    .expect("scaler");
    let grads = [
        Tensor::from_slice(&[1024.0f32, -2048.0, 512.0]),
        Tensor::from_slice(&[3072.0f32, 0.0]).reshape([2, 1]),
    ];
    scaler.unscale_(&grads).expect("unscale_");
    assert_eq!(values(&grads[0]), vec![1.0, -2.0, 0.5]);
    assert_eq!(values(&grads[1]), vec![3.0, 0.0]);
    assert_eq!(found_inf_of(&scaler), 0.0);
    assert_eq!(
        scaler
            .step_multiplier()
            .expect("multiplier")
            .double_value(&[]),
        1.0
    );
    scaler.update().expect("update");
    assert_eq!(scale_of(&scaler), 1024.0, "one clean step does not grow");
    assert_eq!(tracker_of(&scaler), 1);
}

fn check_skipped_step(bad: f32) {
    let mut scaler = GradScaler::new(small_interval(3), Device::Cpu).expect("scaler");
    // Two clean steps first, so the reset of the tracker is visible.
    clean_step(&mut scaler);
    clean_step(&mut scaler);
    assert_eq!(tracker_of(&scaler), 2);

    let params = [
        Tensor::from_slice(&[1.0f32, 2.0]),
        Tensor::from_slice(&[5.0f32]),
    ];
    let before: Vec<Vec<f32>> = params.iter().map(values).collect();
    let grads = [
        Tensor::from_slice(&[65536.0f32, bad]),
        Tensor::from_slice(&[65536.0f32]),
    ];
    let momentum = [params[0].zeros_like(), params[1].zeros_like()];
    scaler.unscale_(&grads).expect("unscale_");
    assert_eq!(found_inf_of(&scaler), 1.0, "{bad} must be found");
    assert_eq!(
        scaler
            .step_multiplier()
            .expect("multiplier")
            .double_value(&[]),
        0.0
    );

    let options = SgdOptions {
        momentum: 0.9,
        is_first_step: true,
        found_inf: scaler.optimizer_found_inf(),
        ..SgdOptions::default()
    };
    sgd_step_with(&params, &grads, &momentum, &options).expect("fused sgd");
    let after: Vec<Vec<f32>> = params.iter().map(values).collect();
    assert_eq!(after, before, "the step is skipped on {bad}");

    scaler.update().expect("update");
    assert_eq!(scale_of(&scaler), 32768.0, "backoff halves the scale");
    assert_eq!(tracker_of(&scaler), 0, "backoff resets the tracker");

    // The next step is clean again: found-inf is cleared and SGD moves.
    let grads = [
        Tensor::from_slice(&[32768.0f32, 32768.0]),
        Tensor::from_slice(&[0.0f32]),
    ];
    scaler.unscale_(&grads).expect("unscale_");
    assert_eq!(
        found_inf_of(&scaler),
        0.0,
        "found-inf is cleared by unscale_"
    );
    let options = SgdOptions {
        lr: torch_ext::fused::LearningRate::Value(0.5),
        found_inf: scaler.optimizer_found_inf(),
        ..SgdOptions::default()
    };
    sgd_step_with(&params, &grads, &[], &options).expect("fused sgd");
    assert_eq!(values(&params[0]), vec![0.5, 1.5]);
    scaler.update().expect("update");
    assert_eq!(tracker_of(&scaler), 1);
}

#[test]
fn an_inf_gradient_skips_the_step_and_halves_the_scale() {
    check_skipped_step(f32::INFINITY);
}

#[test]
fn a_nan_gradient_skips_the_step_and_halves_the_scale() {
    check_skipped_step(f32::NAN);
}

#[test]
fn a_negative_inf_gradient_is_found() {
    check_skipped_step(f32::NEG_INFINITY);
}

#[test]
fn the_scale_grows_after_the_configured_interval() {
    let mut scaler = GradScaler::new(small_interval(3), Device::Cpu).expect("scaler");
    clean_step(&mut scaler);
    clean_step(&mut scaler);
    assert_eq!(scale_of(&scaler), 65536.0);
    assert_eq!(tracker_of(&scaler), 2);
    clean_step(&mut scaler);
    assert_eq!(scale_of(&scaler), 131072.0, "third clean step doubles");
    assert_eq!(tracker_of(&scaler), 0);
    for _ in 0..3 {
        clean_step(&mut scaler);
    }
    assert_eq!(scale_of(&scaler), 262144.0);
}

#[test]
fn the_scale_grows_after_2000_clean_steps_by_default() {
    let mut scaler = GradScaler::new(GradScalerConfig::default(), Device::Cpu).expect("scaler");
    let grad = Tensor::from_slice(&[1.0f32]);
    for step in 1..2000 {
        scaler
            .unscale_(std::slice::from_ref(&grad))
            .expect("unscale_");
        scaler.update().expect("update");
        if step == 1999 {
            assert_eq!(scale_of(&scaler), 65536.0, "not yet after 1999");
            assert_eq!(tracker_of(&scaler), 1999);
        }
    }
    scaler
        .unscale_(std::slice::from_ref(&grad))
        .expect("unscale_");
    scaler.update().expect("update");
    assert_eq!(scale_of(&scaler), 131072.0);
    assert_eq!(tracker_of(&scaler), 0);
}

#[test]
fn calls_out_of_order_are_refused() {
    let mut scaler = GradScaler::new(GradScalerConfig::default(), Device::Cpu).expect("scaler");
    let err = scaler.update().expect_err("update before unscale_");
    assert!(
        matches!(
            err,
            Error::GradScaler {
                field: "update",
                ..
            }
        ),
        "{err}"
    );
    let grad = Tensor::from_slice(&[65536.0f32]);
    scaler
        .unscale_(std::slice::from_ref(&grad))
        .expect("unscale_");
    let err = scaler
        .unscale_(std::slice::from_ref(&grad))
        .expect_err("twice");
    assert!(
        matches!(
            err,
            Error::GradScaler {
                field: "unscale_",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        values(&grad),
        vec![1.0],
        "the refused call did not unscale again"
    );
}

#[test]
fn bad_gradients_are_refused_before_anything_changes() {
    let mut scaler = GradScaler::new(GradScalerConfig::default(), Device::Cpu).expect("scaler");
    let good = Tensor::from_slice(&[65536.0f32]);
    let ints = Tensor::from_slice(&[1i64]);
    let err = scaler
        .unscale_(&[good.shallow_clone(), ints])
        .expect_err("ints");
    assert!(
        matches!(err, Error::GradScaler { field: "grads", .. }),
        "{err}"
    );
    assert_eq!(values(&good), vec![65536.0], "nothing unscaled");
    let undefined = Tensor::from_slice(&[1.0f32]).grad();
    let err = scaler.unscale_(&[undefined]).expect_err("undefined");
    assert!(
        matches!(err, Error::GradScaler { field: "grads", .. }),
        "{err}"
    );
    let err = scaler
        .scale_loss(&Tensor::from_slice(&[1i64]))
        .expect_err("int loss");
    assert!(
        matches!(err, Error::GradScaler { field: "loss", .. }),
        "{err}"
    );
    // Still usable: the refused calls left it ready.
    scaler
        .unscale_(std::slice::from_ref(&good))
        .expect("unscale_");
    assert_eq!(values(&good), vec![1.0]);
}

#[test]
fn a_disabled_scaler_takes_the_same_calls_and_changes_nothing() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        let mut scaler =
            GradScaler::for_precision(precision, GradScalerConfig::default(), Device::Cpu)
                .expect("scaler");
        assert!(!scaler.is_enabled());
        assert!(scaler.optimizer_found_inf().is_none());
        let loss = Tensor::from_slice(&[2.5f32]).sum(Kind::Float);
        assert_eq!(
            scaler.scale_loss(&loss).expect("scale").double_value(&[]),
            2.5
        );
        let grads = [Tensor::from_slice(&[f32::INFINITY, 4.0])];
        scaler.unscale_(&grads).expect("unscale_");
        scaler.unscale_(&grads).expect("unscale_ again is harmless");
        assert_eq!(values(&grads[0]), vec![f32::INFINITY, 4.0]);
        assert_eq!(found_inf_of(&scaler), 0.0);
        assert_eq!(
            scaler
                .step_multiplier()
                .expect("multiplier")
                .double_value(&[]),
            1.0
        );
        scaler.update().expect("update");
        assert_eq!(scale_of(&scaler), 1.0);
        let state = scaler.state().expect("state");
        assert_eq!(
            state,
            ScalerState {
                enabled: false,
                scale: 1.0,
                growth_tracker: 0
            }
        );
    }
    let fp16 = GradScaler::for_precision(Precision::Fp16, GradScalerConfig::default(), Device::Cpu)
        .expect("scaler");
    assert!(fp16.is_enabled());
    assert!(fp16.optimizer_found_inf().is_some());
}

#[test]
fn config_validation_names_the_field() {
    let cases: [(GradScalerConfig, &str); 11] = [
        (
            GradScalerConfig {
                init_scale: 0.0,
                ..Default::default()
            },
            "amp.init_scale",
        ),
        (
            GradScalerConfig {
                init_scale: -1.0,
                ..Default::default()
            },
            "amp.init_scale",
        ),
        (
            GradScalerConfig {
                init_scale: f64::NAN,
                ..Default::default()
            },
            "amp.init_scale",
        ),
        (
            GradScalerConfig {
                init_scale: 1e300,
                ..Default::default()
            },
            "amp.init_scale",
        ),
        (
            GradScalerConfig {
                growth_factor: 1.0,
                ..Default::default()
            },
            "amp.growth_factor",
        ),
        (
            GradScalerConfig {
                growth_factor: f64::INFINITY,
                ..Default::default()
            },
            "amp.growth_factor",
        ),
        (
            GradScalerConfig {
                backoff_factor: 1.0,
                ..Default::default()
            },
            "amp.backoff_factor",
        ),
        (
            GradScalerConfig {
                backoff_factor: 0.0,
                ..Default::default()
            },
            "amp.backoff_factor",
        ),
        (
            GradScalerConfig {
                backoff_factor: f64::NAN,
                ..Default::default()
            },
            "amp.backoff_factor",
        ),
        (
            GradScalerConfig {
                growth_interval: 0,
                ..Default::default()
            },
            "amp.growth_interval",
        ),
        (
            GradScalerConfig {
                growth_interval: u32::MAX,
                ..Default::default()
            },
            "amp.growth_interval",
        ),
    ];
    for (config, field) in cases {
        let err = GradScaler::new(config, Device::Cpu).expect_err(field);
        match &err {
            Error::InvalidConfig { field: got, .. } => assert_eq!(*got, field, "{config:?}"),
            other => panic!("{config:?}: unexpected {other}"),
        }
        // Refused whatever the precision.
        assert!(GradScaler::for_precision(Precision::Fp32, config, Device::Cpu).is_err());
    }
    GradScalerConfig {
        init_scale: 1.0,
        growth_factor: 1.5,
        backoff_factor: 0.25,
        growth_interval: 1,
    }
    .validate()
    .expect("edge values are valid");
}

#[test]
fn config_reads_from_serde_with_defaults() {
    let config: GradScalerConfig =
        serde_json::from_str(r#"{"growth_interval": 3}"#).expect("partial config");
    assert_eq!(config, small_interval(3));
    assert!(serde_json::from_str::<GradScalerConfig>(r#"{"growth": 3}"#).is_err());
}

#[test]
fn precision_names_round_trip() {
    for (precision, name) in [
        (Precision::Fp32, "fp32"),
        (Precision::Bf16, "bf16"),
        (Precision::Fp16, "fp16"),
    ] {
        assert_eq!(precision.name(), name);
        assert_eq!(precision.to_string(), name);
        assert_eq!(name.parse::<Precision>().expect("parse"), precision);
        let json = serde_json::to_string(&precision).expect("serialize");
        assert_eq!(json, format!("\"{name}\""));
        assert_eq!(
            serde_json::from_str::<Precision>(&json).expect("deserialize"),
            precision
        );
    }
    for bad in ["FP32", "float16", "bfloat16", "", "auto"] {
        assert!(bad.parse::<Precision>().is_err(), "{bad}");
        assert!(
            serde_json::from_str::<Precision>(&format!("\"{bad}\"")).is_err(),
            "{bad}"
        );
    }
    let err = "fp8".parse::<Precision>().expect_err("fp8");
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "precision",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(Precision::Fp32.autocast_kind(), None);
    assert_eq!(Precision::Bf16.autocast_kind(), Some(Kind::BFloat16));
    assert_eq!(Precision::Fp16.autocast_kind(), Some(Kind::Half));
    assert!(Precision::Fp16.needs_grad_scaling());
    assert!(!Precision::Bf16.needs_grad_scaling());
}

#[test]
fn auto_precision_is_fp32_on_the_cpu() {
    assert_eq!(Precision::auto(Device::Cpu).expect("cpu"), Precision::Fp32);
    if !torch_ext::cuda::is_available() {
        assert!(
            Precision::auto(Device::Cuda(0)).is_err(),
            "no CUDA: the query fails"
        );
    }
}

#[test]
fn state_round_trips_and_bad_state_is_refused() {
    let mut scaler = GradScaler::new(small_interval(3), Device::Cpu).expect("scaler");
    clean_step(&mut scaler);
    let bad = Tensor::from_slice(&[f32::NAN]);
    scaler.unscale_(&[bad]).expect("unscale_");
    scaler.update().expect("update");
    clean_step(&mut scaler);
    let saved = scaler.state().expect("state");
    assert_eq!(
        saved,
        ScalerState {
            enabled: true,
            scale: 32768.0,
            growth_tracker: 1
        }
    );
    let json = serde_json::to_string(&saved).expect("json");
    let restored: ScalerState = serde_json::from_str(&json).expect("json back");

    let mut fresh = GradScaler::new(small_interval(3), Device::Cpu).expect("fresh");
    fresh.load_state(&restored).expect("load");
    assert_eq!(fresh.state().expect("state"), saved);
    // It resumes: two more clean steps reach the interval of 3.
    clean_step(&mut fresh);
    clean_step(&mut fresh);
    assert_eq!(scale_of(&fresh), 65536.0);
    // The loaded scale is the one unscale_ divides by.
    let grad = Tensor::from_slice(&[65536.0f32]);
    fresh
        .unscale_(std::slice::from_ref(&grad))
        .expect("unscale_");
    assert_eq!(values(&grad), vec![1.0]);

    let refusals = [
        (
            ScalerState {
                scale: 0.0,
                ..saved
            },
            "scale",
        ),
        (
            ScalerState {
                scale: -2.0,
                ..saved
            },
            "scale",
        ),
        (
            ScalerState {
                scale: f32::INFINITY,
                ..saved
            },
            "scale",
        ),
        (
            ScalerState {
                scale: f32::NAN,
                ..saved
            },
            "scale",
        ),
        (
            ScalerState {
                growth_tracker: -1,
                ..saved
            },
            "growth_tracker",
        ),
        (
            ScalerState {
                enabled: false,
                ..saved
            },
            "enabled",
        ),
    ];
    let mut target = GradScaler::new(small_interval(3), Device::Cpu).expect("target");
    for (state, field) in refusals {
        let err = target.load_state(&state).expect_err(field);
        assert!(
            matches!(&err, Error::GradScaler { field: got, .. } if *got == field),
            "{state:?}: {err}"
        );
        assert_eq!(scale_of(&target), 65536.0, "nothing written on error");
        assert_eq!(tracker_of(&target), 0);
    }
    // A disabled scaler checks the state, then keeps scale 1.
    let mut disabled = GradScaler::disabled(Device::Cpu).expect("disabled");
    assert!(
        disabled
            .load_state(&ScalerState {
                scale: f32::NAN,
                ..saved
            })
            .is_err()
    );
    disabled.load_state(&saved).expect("ignored");
    assert_eq!(scale_of(&disabled), 1.0);
}
