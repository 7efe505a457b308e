//! Hostile input at every public entry point of Tolaria: non-finite and
//! absurd numbers, sizes near the integer limits, inconsistent data sets, a
//! diverging run. Every case must end in a typed error naming the field (or
//! the epoch), never a panic, an abort or a result that hides the problem.

use leyline::testing::{extreme_f32, extreme_f64, extreme_i64, extreme_u64, extreme_usize};
use proptest::prelude::*;
use tolaria::data::limits::MAX_PACKED_VALUES;
use tolaria::data::{DataError, Dataset, MicrobatchSpan, ReferenceData, pack_epoch, packed_len};
use tolaria::reference::bench::{BenchOptions, Variant};
use tolaria::reference::config::{MAX_TRAINER_CLASSES, MAX_TRAINER_FEATURES, MAX_TRAINER_SAMPLES};
use tolaria::reference::step::{LinearCeState, StepViews};
use tolaria::reference::{StepKind, Trainer, TrainerConfig};
use tolaria::{DeviceChoice, Error, ExecutionMode};

fn cpu() -> TrainerConfig {
    TrainerConfig {
        device: DeviceChoice::Cpu,
        ..TrainerConfig::reference()
    }
}

fn config_field(result: Result<(), Error>) -> Option<&'static str> {
    match result {
        Err(Error::InvalidConfig { field, .. }) => Some(field),
        _ => None,
    }
}

fn data_field(err: &DataError) -> Option<&str> {
    match err {
        DataError::InvalidField { field, .. } => Some(field),
        _ => None,
    }
}

#[test]
fn labels_out_of_range_are_refused_when_the_set_is_built() {
    // Label 7 of 4 classes used to pack an all-zero one-hot row: a fake loss.
    let err = Dataset::from_rows("t", &[0.5; 4 * 16], &[0, 1, 7, 2], 16, 4).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::LabelOutOfRange {
                index: 2,
                label: 7,
                n_classes: 4,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("label 7 of sample 2"), "{err}");
    let negative = Dataset::from_rows("t", &[0.5; 16], &[-1], 16, 4).unwrap_err();
    assert!(
        matches!(negative, DataError::LabelOutOfRange { label: -1, .. }),
        "{negative:?}"
    );
    // Through the trainer's error, the message is kept.
    let wrapped = Error::from(err);
    assert!(
        wrapped.to_string().contains("label 7 of sample 2"),
        "{wrapped}"
    );
}

#[test]
fn inputs_and_labels_of_different_lengths_are_a_typed_error() {
    for (inputs, labels) in [(3 * 16, 4), (5 * 16, 4), (4 * 16 + 1, 4), (16, 0)] {
        let err = Dataset::from_rows("t", &vec![0.5; inputs], &vec![0; labels], 16, 4).unwrap_err();
        assert_eq!(
            data_field(&err),
            Some("features"),
            "{inputs} inputs, {labels} labels: {err:?}"
        );
    }
    for (features, classes, field) in [
        (0, 4, "n_features"),
        (usize::MAX, 4, "n_features"),
        (16, 0, "n_classes"),
        (16, usize::MAX, "n_classes"),
    ] {
        let err = Dataset::from_rows("t", &[], &[], features, classes).unwrap_err();
        assert_eq!(data_field(&err), Some(field), "{err:?}");
    }
}

#[test]
fn non_finite_inputs_are_refused_naming_sample_and_feature() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut inputs = vec![0.5; 3 * 4];
        inputs[6] = bad;
        let err = Dataset::from_rows("t", &inputs, &[0, 1, 1], 4, 2).unwrap_err();
        assert!(
            matches!(err, DataError::NonFiniteValue { sample: 1, element: 2, value, .. } if value.is_nan() == bad.is_nan()),
            "{err:?}"
        );
    }
}

#[test]
fn learning_rates_that_are_not_positive_finite_f32s_are_refused() {
    for lr in [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.01,
        0.0,
        -0.0,
        1e300,
        1e-50,
    ] {
        let config = TrainerConfig {
            learning_rate: lr,
            ..cpu()
        };
        assert_eq!(
            config_field(config.validate()),
            Some("learning_rate"),
            "{lr}"
        );
        assert!(
            matches!(
                Trainer::new(config),
                Err(Error::InvalidConfig {
                    field: "learning_rate",
                    ..
                })
            ),
            "{lr}"
        );
    }
    for momentum in [f64::NAN, 1.0, -0.1, f64::INFINITY] {
        let config = TrainerConfig { momentum, ..cpu() };
        assert_eq!(
            config_field(config.validate()),
            Some("momentum"),
            "{momentum}"
        );
    }
}

#[test]
fn sizes_near_the_integer_limits_are_refused_before_allocating() {
    let cases = [
        (
            "n_classes",
            TrainerConfig {
                n_classes: usize::MAX / 2,
                ..cpu()
            },
        ),
        (
            "n_classes",
            TrainerConfig {
                n_classes: MAX_TRAINER_CLASSES + 1,
                ..cpu()
            },
        ),
        (
            "n_features",
            TrainerConfig {
                n_features: usize::MAX,
                ..cpu()
            },
        ),
        (
            "n_samples",
            TrainerConfig {
                n_samples: usize::MAX,
                ..cpu()
            },
        ),
        (
            "n_validation_samples",
            TrainerConfig {
                n_validation_samples: usize::MAX,
                ..cpu()
            },
        ),
        (
            "batch_size",
            TrainerConfig {
                batch_size: usize::MAX,
                ..cpu()
            },
        ),
        (
            "batch_size",
            TrainerConfig {
                batch_size: 0,
                ..cpu()
            },
        ),
        // Each size within its bound, the packed buffer above its own.
        (
            "n_samples",
            TrainerConfig {
                n_samples: MAX_TRAINER_SAMPLES,
                n_features: MAX_TRAINER_FEATURES,
                ..cpu()
            },
        ),
    ];
    for (field, config) in cases {
        assert_eq!(config_field(config.validate()), Some(field), "{config:?}");
        // The generator checks the task alone against the data layer's own
        // bounds: a batch size is no part of the task, and 1025 classes lie
        // within the data layer's bound, so those two refusals are the
        // trainer's alone.
        let generated = ReferenceData::generate(&config.task());
        if field == "batch_size" || config.n_classes == MAX_TRAINER_CLASSES + 1 {
            assert!(generated.is_ok(), "{config:?}");
        } else {
            assert!(
                matches!(generated, Err(Error::InvalidConfig { field: f, .. }) if f == field),
                "{config:?}"
            );
        }
        assert!(
            matches!(Trainer::new(config), Err(Error::InvalidConfig { field: f, .. }) if f == field)
        );
    }
    assert_eq!(packed_len(usize::MAX, 16, 4), None);
    assert_eq!(packed_len(4, 16, usize::MAX / 2), None);
    assert!(
        MicrobatchSpan {
            offset: 0,
            batch: usize::MAX
        }
        .len(16, 4)
        .is_err()
    );
}

#[test]
fn a_diverging_run_reports_a_non_finite_loss_instead_of_a_result() {
    // A step of 3e38 (near f32::MAX) overflows the parameters to infinities
    // and the logits to NaN in the first epoch.
    let mut trainer = Trainer::new(TrainerConfig {
        learning_rate: 3e38,
        ..cpu()
    })
    .unwrap();
    let mut outcome = None;
    for epoch in 0..20 {
        match trainer.train_epoch() {
            Ok(report) => assert!(
                report.loss.is_finite(),
                "epoch {epoch}: non-finite loss reported as a result: {report:?}"
            ),
            Err(err) => {
                outcome = Some(err);
                break;
            }
        }
    }
    let err = outcome.expect("a learning rate of 3e38 diverges within 20 epochs");
    assert!(
        matches!(err, Error::NonFiniteLoss { phase: "training", value, .. } if !value.is_finite()),
        "{err:?}"
    );
    assert!(trainer.epochs_done() > 0);
    let validation = trainer.validate();
    assert!(
        matches!(
            validation,
            Err(Error::NonFiniteLoss {
                phase: "validation",
                ..
            })
        ),
        "{validation:?}"
    );
}

#[test]
fn a_replaced_training_set_must_match_the_trainer() {
    let mut trainer = Trainer::new(cpu()).unwrap();
    let three_classes = Dataset::from_rows("t", &[0.5; 4 * 16], &[0, 1, 2, 2], 16, 3).unwrap();
    assert!(matches!(
        trainer.replace_training_set(&three_classes, 4),
        Err(Error::InvalidConfig {
            field: "n_classes",
            ..
        })
    ));
    let eight_features = Dataset::from_rows("t", &[0.5; 4 * 8], &[0, 1, 2, 3], 8, 4).unwrap();
    assert!(matches!(
        trainer.replace_training_set(&eight_features, 4),
        Err(Error::InvalidConfig {
            field: "n_features",
            ..
        })
    ));
    // Samples that are not rows cannot be packed.
    let images = tch::Tensor::zeros([4, 2, 8], (tch::Kind::Float, tch::Device::Cpu));
    let labels = tch::Tensor::from_slice(&[0i64, 1, 2, 3]);
    let not_rows = Dataset::new("images", images, labels, 4).unwrap();
    assert!(matches!(
        trainer.replace_training_set(&not_rows, 4),
        Err(Error::InvalidData {
            field: "images",
            ..
        })
    ));
    let good = Dataset::from_rows("t", &[0.5; 4 * 16], &[0, 1, 2, 3], 16, 4).unwrap();
    for batch in [0, usize::MAX] {
        assert!(matches!(
            trainer.replace_training_set(&good, batch),
            Err(Error::InvalidConfig {
                field: "batch_size",
                ..
            })
        ));
    }
    let empty = Dataset::from_rows("t", &[], &[], 16, 4).unwrap();
    assert!(trainer.replace_training_set(&empty, 4).is_err());
    trainer
        .replace_training_set(&good, MAX_TRAINER_SAMPLES)
        .unwrap();
    assert_eq!(trainer.train_epoch().unwrap().eager_steps, 1);
}

#[test]
fn step_state_and_views_check_their_sizes() {
    let parameters = vec![0.1f32; 4 * 17];
    let new_state = |parameters: &[f32], lr: f64, momentum: f64| {
        LinearCeState::new(
            StepKind::Fused,
            parameters,
            16,
            4,
            lr,
            momentum,
            tch::Device::Cpu,
        )
    };
    assert!(matches!(
        new_state(&parameters, f64::NAN, 0.9),
        Err(Error::InvalidConfig {
            field: "learning_rate",
            ..
        })
    ));
    assert!(matches!(
        new_state(&parameters, 0.01, f64::NAN),
        Err(Error::InvalidConfig {
            field: "momentum",
            ..
        })
    ));
    assert!(matches!(
        new_state(&parameters[1..], 0.01, 0.9),
        Err(Error::InvalidData {
            field: "initial_parameters",
            ..
        })
    ));
    let mut poisoned = parameters.clone();
    poisoned[5] = f32::NAN;
    assert!(matches!(
        new_state(&poisoned, 0.01, 0.9),
        Err(Error::InvalidData {
            field: "initial_parameters",
            ..
        })
    ));
    let state = new_state(&parameters, 0.01, 0.9).unwrap();
    assert!(matches!(
        state.interpret_metrics(&[0.0; 3], 1, 4),
        Err(Error::Readback {
            expected: 17,
            got: 3,
            ..
        })
    ));
    let mut values = vec![0.0f32; 17];
    values[1] = f32::NAN;
    assert!(matches!(
        state.interpret_metrics(&values, 1, 4),
        Err(Error::InvalidMetric {
            what: "correct",
            ..
        })
    ));
    values[1] = 5.0;
    assert!(matches!(
        state.interpret_metrics(&values, 1, 4),
        Err(Error::InvalidMetric {
            what: "correct",
            ..
        })
    ));
    values[1] = 3.0;
    let metrics = state.interpret_metrics(&values, 1, 4).unwrap();
    assert_eq!(metrics.correct, 3);

    let buffer = tch::Tensor::zeros([64], (tch::Kind::Float, tch::Device::Cpu));
    for span in [
        MicrobatchSpan {
            offset: usize::MAX,
            batch: 1,
        },
        MicrobatchSpan {
            offset: 0,
            batch: usize::MAX,
        },
        MicrobatchSpan {
            offset: i64::MAX as usize,
            batch: 1,
        },
    ] {
        assert!(
            StepViews::new(&buffer, span, 16, 4).is_err(),
            "{span:?} gave views"
        );
    }
}

#[test]
fn bench_options_with_absurd_counts_are_refused() {
    for field in [
        "warmup_epochs",
        "measured_epochs",
        "bare_replay_samples",
        "timed_replays",
    ] {
        let mut options = BenchOptions::new(DeviceChoice::Cpu, true);
        options.variants = vec![Variant {
            mode: ExecutionMode::Eager,
            step: StepKind::Fused,
        }];
        match field {
            "warmup_epochs" => options.warmup_epochs = usize::MAX,
            "measured_epochs" => options.measured_epochs = usize::MAX,
            "bare_replay_samples" => options.bare_replay_samples = usize::MAX,
            _ => options.timed_replays = usize::MAX,
        }
        let result = tolaria::reference::bench::run(&options, &mut |_| {});
        assert!(
            matches!(result, Err(Error::InvalidConfig { field: f, .. }) if f == field),
            "{field}: {result:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn trainer_configs_never_panic(
        n_samples in extreme_usize(), n_validation_samples in extreme_usize(),
        n_features in extreme_usize(), n_classes in extreme_usize(),
        batch_size in extreme_usize(), learning_rate in extreme_f64(),
        momentum in extreme_f64(), seed in extreme_u64(),
    ) {
        let config = TrainerConfig {
            n_samples, n_validation_samples, n_features, n_classes, batch_size,
            learning_rate, momentum, seed, ..cpu()
        };
        match config.validate() {
            Err(err) => prop_assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}"),
            Ok(()) => {
                prop_assert!(learning_rate.is_finite() && learning_rate > 0.0);
                prop_assert!((0.0..1.0).contains(&momentum));
                let packed = packed_len(n_samples.max(n_validation_samples), n_features, n_classes);
                prop_assert!(packed.is_some_and(|len| len <= MAX_PACKED_VALUES));
                // Small ones train for an epoch.
                if packed.is_some_and(|len| len <= 1 << 14) {
                    let mut trainer = Trainer::new(config).unwrap();
                    match trainer.train_epoch() {
                        Ok(report) => prop_assert!(report.loss.is_finite()),
                        Err(err) => prop_assert!(matches!(err, Error::NonFiniteLoss { .. }), "{err:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn tabular_sets_and_packing_never_panic(
        inputs in proptest::collection::vec(extreme_f32(), 0..40),
        labels in proptest::collection::vec(extreme_i64(), 0..10),
        n_features in extreme_usize(), n_classes in extreme_usize(), batch_size in extreme_usize(),
    ) {
        match Dataset::from_rows("p", &inputs, &labels, n_features, n_classes) {
            Ok(set) => {
                prop_assert!(set.features_to_vec().unwrap().iter().all(|value| value.is_finite()));
                prop_assert!(set.labels_to_vec().unwrap().iter().all(|&label| (label as u64) < n_classes as u64));
                match pack_epoch(&set, batch_size) {
                    Ok(packed) => {
                        prop_assert_eq!(packed.spans.len(), set.len().div_ceil(batch_size));
                        prop_assert_eq!(Some(packed.values.len()), packed_len(set.len(), n_features, n_classes));
                    }
                    Err(err) => prop_assert!(batch_size == 0, "{err:?}"),
                }
            }
            Err(err) => prop_assert!(matches!(
                err,
                DataError::InvalidField { .. } | DataError::TooLarge { .. } | DataError::LabelOutOfRange { .. } | DataError::NonFiniteValue { .. }
            ), "{err:?}"),
        }
    }

    #[test]
    fn step_views_never_panic(offset in extreme_usize(), batch in extreme_usize(), n_features in extreme_usize(), n_classes in extreme_usize()) {
        let buffer = tch::Tensor::zeros([256], (tch::Kind::Float, tch::Device::Cpu));
        let span = MicrobatchSpan { offset, batch };
        if let Ok(views) = StepViews::new(&buffer, span, n_features, n_classes) {
            prop_assert_eq!(views.batch, batch);
            prop_assert!(span.len(n_features, n_classes).is_ok_and(|len| offset + len <= 256));
        }
    }

    #[test]
    fn step_state_and_metrics_never_panic(
        n_features in extreme_usize(), n_classes in extreme_usize(),
        learning_rate in extreme_f64(), momentum in extreme_f64(),
        values in proptest::collection::vec(extreme_f32(), 0..20), samples in extreme_usize(),
    ) {
        let parameters = vec![0.1f32; 4 * 17];
        match LinearCeState::new(StepKind::Fused, &parameters, n_features, n_classes, learning_rate, momentum, tch::Device::Cpu) {
            Ok(state) => {
                // Any shape whose [C, F + 1] matrix holds the 68 values is
                // accepted: (16, 4), but also (1, 34), (3, 17) and others.
                prop_assert_eq!(n_classes * (n_features + 1), parameters.len());
                if let Ok(metrics) = state.interpret_metrics(&values, 4, samples) {
                    // The loss sum, then the [C, C] confusion matrix.
                    prop_assert_eq!(values.len(), n_classes * n_classes + 1);
                    prop_assert!(metrics.correct <= samples);
                }
            }
            Err(err) => prop_assert!(matches!(err, Error::InvalidConfig { .. } | Error::InvalidData { .. }), "{err:?}"),
        }
    }

    #[test]
    fn bench_options_never_panic(
        warmup_epochs in extreme_usize(), measured_epochs in extreme_usize(),
        bare_replay_samples in extreme_usize(), timed_replays in extreme_usize(),
    ) {
        let options = BenchOptions {
            warmup_epochs, measured_epochs, bare_replay_samples, timed_replays,
            ..BenchOptions::new(DeviceChoice::Cpu, true)
        };
        let within = warmup_epochs.max(measured_epochs) <= tolaria::reference::bench::MAX_BENCH_EPOCHS
            && bare_replay_samples.max(timed_replays) <= tolaria::reference::bench::MAX_BENCH_REPLAYS;
        prop_assert_eq!(options.validate().is_ok(), within);
    }
}
