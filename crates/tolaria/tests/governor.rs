//! The governor (CPU): the reference §9 item 13 thresholds (NaN/±inf at
//! once, lobotomy at its boundary, divergence only with all three conditions
//! and at least 10 samples, exactly N consecutive anomalies, a normal loss
//! resetting the count), snapshots into reused buffers, and rollback:
//! bitwise restore, live seeds pruned with the reason, optimizer state
//! cleared, telemetry emitted and a panicking or dropping sink not stopping
//! it, a typed error without a snapshot, a fossil appearing since the
//! snapshot; an exported state imported into a fresh governor judges and
//! rolls back exactly as the original, and a bad one is refused.

use kasmina::groups::GroupKey;
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::proto::TelemetryPacket;
use leyline::telemetry::{
    TOLARIA_ROLLBACK_COMPLETED, TOLARIA_ROLLBACK_CONSECUTIVE_PANICS, TOLARIA_ROLLBACK_FAILED,
    TOLARIA_ROLLBACK_RECOVERY_MS, TOLARIA_ROLLBACK_TOTAL, TOLARIA_ROLLBACK_TRIGGERED,
};
use leyline::{Collector, Emitter, SeedStage, Telemetry};
use tch::{Device, Kind, Tensor};
use tolaria::Error;
use tolaria::governor::{Governor, GovernorConfig, PanicReason, Verdict};
use tolaria::optim::{GroupOptimizers, OptimizerConfig};

const A: SlotId = SlotId { row: 0, col: 0 };
const B: SlotId = SlotId { row: 0, col: 1 };

fn governor() -> Governor {
    Governor::new(GovernorConfig::for_classes(10).expect("config")).expect("governor")
}

fn with_history(values: &[f64]) -> Governor {
    let mut governor = governor();
    for value in values {
        assert_eq!(governor.check(*value), Verdict::Healthy, "history {value}");
    }
    governor
}

#[test]
fn defaults_are_the_reference_constants_and_bad_values_are_named() {
    let config = GovernorConfig::for_classes(10).expect("config");
    assert_eq!(config.sensitivity, 6.0);
    assert_eq!(config.multiplier, 3.0);
    assert_eq!(config.absolute_threshold, 12.0);
    assert_eq!(config.death_penalty, 10.0);
    assert_eq!(config.history_window, 20);
    assert_eq!(config.min_samples, 10);
    assert_eq!(config.min_panics_before_rollback, 3);
    assert_eq!(config.random_guess_loss, 10f64.ln());
    assert_eq!(config.lobotomy_average_factor, 0.6);
    assert_eq!(config.lobotomy_tolerance, 0.065);
    assert_eq!(config.snapshot_interval_epochs, 5);
    let cases: [(&str, GovernorConfig); 5] = [
        (
            "history_window",
            GovernorConfig {
                history_window: 9,
                ..config
            },
        ),
        (
            "sensitivity",
            GovernorConfig {
                sensitivity: f64::NAN,
                ..config
            },
        ),
        (
            "min_panics_before_rollback",
            GovernorConfig {
                min_panics_before_rollback: 0,
                ..config
            },
        ),
        (
            "snapshot_interval_epochs",
            GovernorConfig {
                snapshot_interval_epochs: 0,
                ..config
            },
        ),
        (
            "random_guess_loss",
            GovernorConfig {
                random_guess_loss: -1.0,
                ..config
            },
        ),
    ];
    for (name, bad) in cases {
        match Governor::new(bad) {
            Err(Error::Governor { field, .. }) => assert_eq!(field, name),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(matches!(
        GovernorConfig::for_classes(1),
        Err(Error::Governor {
            field: "num_classes",
            ..
        })
    ));
    let governor = governor();
    assert!(governor.snapshot_due(0) && governor.snapshot_due(5) && !governor.snapshot_due(4));
}

#[test]
fn nan_and_infinities_panic_at_once_and_stay_out_of_the_history() {
    for loss in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut fresh = governor();
        assert_eq!(fresh.check(loss), Verdict::Panic(PanicReason::Nan));
        assert!(fresh.history().is_empty());
        let mut full = with_history(&[1.0; 12]);
        assert_eq!(full.check(loss), Verdict::Panic(PanicReason::Nan));
        assert_eq!(full.history(), vec![1.0; 12]);
    }
}

#[test]
fn losses_below_the_absolute_threshold_never_panic() {
    // mean 1, sigma 0: 11.9 beats mean + 6 sigma and 3 * mean, not 12.
    let mut governor = with_history(&[1.0; 10]);
    for _ in 0..5 {
        assert_eq!(governor.check(11.9), Verdict::Healthy);
    }
    assert_eq!(governor.consecutive_panics(), 0);
}

#[test]
fn divergence_needs_ten_samples() {
    let mut governor = with_history(&[1.0; 9]);
    assert_eq!(governor.check(1000.0), Verdict::Healthy, "9 samples only");
    assert_eq!(governor.history().len(), 10);
}

#[test]
fn divergence_needs_all_three_conditions() {
    // Not above 3 * mean: mean 5, sigma 0, loss 13 > 12 and > 5.
    let mut governor = with_history(&[5.0; 10]);
    assert_eq!(governor.check(13.0), Verdict::Healthy);
    // Not above mean + 6 sigma: mean 5, sigma 4 (1 and 9), 20 > 12, > 15, < 29.
    let mut governor = with_history(&[1.0, 9.0, 1.0, 9.0, 1.0, 9.0, 1.0, 9.0, 1.0, 9.0]);
    assert_eq!(governor.check(20.0), Verdict::Healthy);
    // All three: 30 > 12, > 29, > 15.
    let mut governor = with_history(&[1.0, 9.0, 1.0, 9.0, 1.0, 9.0, 1.0, 9.0, 1.0, 9.0]);
    assert_eq!(governor.check(30.0), Verdict::Anomaly { consecutive: 1 });
}

#[test]
fn exactly_three_consecutive_anomalies_panic_and_stay_out_of_the_history() {
    let mut governor = with_history(&[1.0; 10]);
    assert_eq!(governor.check(100.0), Verdict::Anomaly { consecutive: 1 });
    assert_eq!(governor.check(100.0), Verdict::Anomaly { consecutive: 2 });
    assert_eq!(
        governor.check(100.0),
        Verdict::Panic(PanicReason::Divergence)
    );
    assert_eq!(governor.consecutive_panics(), 3);
    assert_eq!(governor.history(), vec![1.0; 10]);
}

#[test]
fn one_normal_loss_resets_the_count() {
    let mut governor = with_history(&[1.0; 10]);
    assert_eq!(governor.check(100.0), Verdict::Anomaly { consecutive: 1 });
    assert_eq!(governor.check(100.0), Verdict::Anomaly { consecutive: 2 });
    assert_eq!(governor.check(1.0), Verdict::Healthy);
    assert_eq!(governor.consecutive_panics(), 0);
    assert_eq!(governor.check(100.0), Verdict::Anomaly { consecutive: 1 });
    assert_eq!(governor.check(100.0), Verdict::Anomaly { consecutive: 2 });
    assert_eq!(
        governor.check(100.0),
        Verdict::Panic(PanicReason::Divergence)
    );
}

#[test]
fn lobotomy_fires_inside_its_boundaries_only() {
    let guess = 10f64.ln();
    let learnt = [0.59 * guess; 10];
    // Inside the 0.065 band around the random-guess loss, after learning.
    for loss in [guess, guess + 0.064 * guess, guess - 0.064 * guess] {
        let mut governor = with_history(&learnt);
        assert_eq!(
            governor.check(loss),
            Verdict::Panic(PanicReason::Lobotomy),
            "{loss}"
        );
        assert_eq!(governor.history().len(), 10, "a panicking loss is not kept");
    }
    // Outside the band.
    for loss in [guess + 0.066 * guess, guess - 0.066 * guess] {
        let mut governor = with_history(&learnt);
        assert_eq!(governor.check(loss), Verdict::Healthy, "{loss}");
    }
    // The history mean is not below 0.6 of the guess.
    let mut governor = with_history(&[0.61 * guess; 10]);
    assert_eq!(governor.check(guess), Verdict::Healthy);
    // Fewer than 10 samples.
    let mut governor = with_history(&[0.59 * guess; 9]);
    assert_eq!(governor.check(guess), Verdict::Healthy);
}

fn model() -> MorphogeneticModel {
    tch::set_num_threads(1);
    tch::manual_seed(3);
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host");
    MorphogeneticModel::new(host, &[A, B], SlotConfig::default(), Default::default())
        .expect("model")
}

fn germinate_training(model: &mut MorphogeneticModel, slot: SlotId, id: &str) {
    model
        .germinate(slot, "conv_light", GerminationOptions::new(id))
        .expect("germinate");
    assert!(
        model
            .advance_stage(slot, Some(SeedStage::Training))
            .expect("g1")
            .passed
    );
}

fn fossilize(model: &mut MorphogeneticModel, slot: SlotId, id: &str) {
    germinate_training(model, slot, id);
    let seed = model.slot_mut(slot).expect("slot");
    for _ in 0..10 {
        seed.step_epoch().expect("tick");
    }
    seed.record_gradient_norms(1.0, 1.0, 100).expect("grads");
    assert!(seed.advance_stage(None).expect("g2").passed);
    while !seed.state().expect("state").alpha_controller().is_settled() {
        seed.step_epoch().expect("tick");
    }
    assert!(seed.advance_stage(None).expect("g3").passed);
    seed.set_counterfactual_contribution(2.0).expect("cf");
    assert!(model.fossilize(slot).expect("g5").passed);
}

/// Every variable of the host and of the seeds, sorted by name per owner.
fn variables(model: &MorphogeneticModel) -> Vec<(String, Tensor)> {
    let mut all: Vec<(String, Tensor)> = model.host().var_store().variables().into_iter().collect();
    for slot in model.slots() {
        if let Some(module) = slot.seed_module() {
            all.extend(
                module
                    .var_store()
                    .variables()
                    .into_iter()
                    .map(|(name, tensor)| (format!("{}/{name}", slot.id()), tensor)),
            );
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

fn perturb(model: &MorphogeneticModel) {
    tch::no_grad(|| {
        for (_, tensor) in variables(model) {
            let mut tensor = tensor.shallow_clone();
            if tensor.is_floating_point() {
                let noise = tensor.randn_like();
                let _ = tensor.f_add_(&noise).expect("add");
            } else {
                let _ = tensor.f_add_scalar_(1i64).expect("add");
            }
        }
    });
}

fn backward(model: &MorphogeneticModel) {
    tch::manual_seed(4);
    let images = Tensor::randn([4, 1, 28, 28], (Kind::Float, Device::Cpu));
    let labels = Tensor::from_slice(&[0i64, 3, 5, 9]);
    model
        .forward(&images, true)
        .expect("forward")
        .cross_entropy_for_logits(&labels)
        .backward();
}

#[test]
fn rollback_restores_bitwise_prunes_live_seeds_and_clears_optimizer_state() {
    let mut model = model();
    fossilize(&mut model, A, "fossil");
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optimizers");
    let mut governor = governor();
    governor.snapshot(&model, 5).expect("snapshot");
    let saved: Vec<(String, Tensor)> = variables(&model)
        .into_iter()
        .map(|(name, tensor)| (name, tensor.copy()))
        .collect();
    assert!(
        saved.iter().any(|(name, _)| name.starts_with("r0c0/")),
        "fossil kept"
    );

    germinate_training(&mut model, B, "live");
    optimizers.sync(&mut model).expect("sync");
    backward(&model);
    optimizers.step().expect("step");
    perturb(&model);
    assert!(
        variables(&model)
            .iter()
            .zip(&saved)
            .any(|((_, now), (_, then))| !now.equal(then)),
        "the perturbation changed something"
    );
    let host_state = optimizers
        .group(GroupKey::Host)
        .expect("host")
        .state_tensors();
    assert!(
        host_state
            .iter()
            .any(|t| t.abs().max().double_value(&[]) > 0.0)
    );

    let collector = Collector::new();
    let telemetry = Telemetry::new(collector.clone());
    assert_eq!(governor.check(f64::NAN), Verdict::Panic(PanicReason::Nan));
    let report = governor
        .rollback(&mut model, &mut optimizers, &telemetry, PanicReason::Nan)
        .expect("rollback");

    // Bitwise: every host and fossil variable equals its value at the snapshot.
    let now = variables(&model);
    assert_eq!(now.len(), saved.len(), "the live seed is gone");
    for ((name, now), (saved_name, then)) in now.iter().zip(&saved) {
        assert_eq!(name, saved_name);
        assert!(now.equal(then), "{name} restored bitwise");
    }
    assert_eq!(report.reason, PanicReason::Nan);
    assert_eq!(report.snapshot_epoch, 5);
    assert_eq!(report.restored_tensors, saved.len());
    assert_eq!(report.pruned, vec![B]);
    assert!(report.unrestored_fossils.is_empty());
    assert!(report.loss_at_panic.is_some_and(f64::is_nan));
    assert_eq!(report.consecutive_panics, 3);
    assert_eq!(governor.consecutive_panics(), 0);
    assert_eq!(governor.rollbacks(), 1);

    let live = model.slot(B).expect("slot");
    assert_eq!(live.stage(), Some(SeedStage::Pruned));
    let state = live.state().expect("state");
    assert_eq!(state.prune_reason(), Some("governor_nan"));
    assert_eq!(
        model.slot(A).expect("slot").stage(),
        Some(SeedStage::Fossilized)
    );

    assert_eq!(optimizers.keys(), vec![GroupKey::Host, GroupKey::Seed(A)]);
    for key in optimizers.keys() {
        let group = optimizers.group(key).expect("group");
        for tensor in group.state_tensors() {
            assert_eq!(tensor.abs().max().double_value(&[]), 0.0, "{key:?} zeroed");
        }
        assert_eq!(group.step_count_tensor().double_value(&[]), 0.0);
    }

    assert_eq!(
        collector.event_names(),
        vec![
            TOLARIA_ROLLBACK_TRIGGERED.to_owned(),
            TOLARIA_ROLLBACK_COMPLETED.to_owned()
        ]
    );
    let completed = &collector.events_named(TOLARIA_ROLLBACK_COMPLETED)[0];
    assert_eq!(
        completed.attributes.get("reason").map(String::as_str),
        Some("governor_nan")
    );
    assert_eq!(collector.metric_values(TOLARIA_ROLLBACK_TOTAL), vec![1.0]);
    assert_eq!(
        collector.metric_values(TOLARIA_ROLLBACK_CONSECUTIVE_PANICS),
        vec![3.0]
    );
    let recovery = collector.metric_values(TOLARIA_ROLLBACK_RECOVERY_MS);
    assert_eq!(recovery.len(), 1);
    assert!(recovery[0] >= 0.0 && recovery[0] == report.recovery_ms);
}

struct Panicking;

impl Emitter for Panicking {
    fn emit(&self, _packet: TelemetryPacket) {
        panic!("sink failed");
    }
}

struct Dropping;

impl Emitter for Dropping {
    fn emit(&self, _packet: TelemetryPacket) {}
}

#[test]
fn a_failing_or_dropping_sink_does_not_stop_a_rollback() {
    for (telemetry, panics) in [
        (Telemetry::new(Panicking), 3),
        (Telemetry::new(Dropping), 0),
        (Telemetry::disabled(), 0),
    ] {
        let mut model = model();
        let mut optimizers =
            GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optim");
        let mut governor = governor();
        governor.snapshot(&model, 0).expect("snapshot");
        let saved: Vec<Tensor> = variables(&model).iter().map(|(_, t)| t.copy()).collect();
        germinate_training(&mut model, A, "live");
        optimizers.sync(&mut model).expect("sync");
        perturb(&model);
        let report = governor
            .rollback(
                &mut model,
                &mut optimizers,
                &telemetry,
                PanicReason::Divergence,
            )
            .expect("rollback completes");
        assert_eq!(report.pruned, vec![A]);
        assert_eq!(
            model
                .slot(A)
                .expect("slot")
                .state()
                .expect("state")
                .prune_reason(),
            Some("governor_divergence")
        );
        for ((_, now), then) in variables(&model).iter().zip(&saved) {
            assert!(now.equal(then));
        }
        assert_eq!(telemetry.contained_panics(), panics);
    }
}

#[test]
fn rollback_without_a_snapshot_is_a_typed_error_and_changes_nothing() {
    let mut model = model();
    germinate_training(&mut model, A, "live");
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optim");
    let collector = Collector::new();
    let mut governor = governor();
    let error = governor
        .rollback(
            &mut model,
            &mut optimizers,
            &Telemetry::new(collector.clone()),
            PanicReason::Lobotomy,
        )
        .expect_err("no snapshot");
    assert!(
        matches!(
            error,
            Error::Governor {
                field: "snapshot",
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(
        model.slot(A).expect("slot").stage(),
        Some(SeedStage::Training)
    );
    assert_eq!(
        collector.event_names(),
        vec![
            TOLARIA_ROLLBACK_TRIGGERED.to_owned(),
            TOLARIA_ROLLBACK_FAILED.to_owned()
        ]
    );
    assert_eq!(governor.rollbacks(), 0);
}

#[test]
fn snapshots_reuse_their_buffers_until_the_layout_changes() {
    let mut model = model();
    let mut governor = governor();
    assert!(governor.snapshot_data_ptrs().is_empty());
    governor.snapshot(&model, 0).expect("first");
    let first = governor.snapshot_data_ptrs();
    assert!(!first.is_empty());
    perturb(&model);
    governor.snapshot(&model, 5).expect("second");
    assert_eq!(governor.snapshot_data_ptrs(), first, "same buffers");
    assert_eq!(governor.snapshot_epoch(), Some(5));
    // A live seed is not part of the snapshot: same layout, same buffers.
    germinate_training(&mut model, B, "live");
    governor.snapshot(&model, 10).expect("third");
    assert_eq!(governor.snapshot_data_ptrs(), first);

    // A fossil appearing since the snapshot: rollback keeps it and says so.
    fossilize(&mut model, A, "late-fossil");
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optim");
    let fossil_before: Vec<Tensor> = model
        .slot(A)
        .expect("slot")
        .parameters()
        .iter()
        .map(|(_, t)| t.copy())
        .collect();
    let report = governor
        .rollback(
            &mut model,
            &mut optimizers,
            &Telemetry::disabled(),
            PanicReason::Nan,
        )
        .expect("rollback");
    assert_eq!(report.unrestored_fossils, vec![A]);
    assert_eq!(report.pruned, vec![B]);
    for ((_, now), then) in model
        .slot(A)
        .expect("slot")
        .parameters()
        .iter()
        .zip(&fossil_before)
    {
        assert!(now.equal(then), "the late fossil keeps its weights");
    }
    // The next snapshot sees the new layout and allocates buffers for it.
    governor.snapshot(&model, 15).expect("fourth");
    let grown = governor.snapshot_data_ptrs();
    assert!(
        grown.len() > first.len(),
        "the fossil is in the snapshot now"
    );
}

#[test]
fn an_imported_state_judges_and_rolls_back_like_the_original() {
    let mut model = model();
    fossilize(&mut model, A, "fossil");
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optimizers");
    let mut original = with_history(&[2.0, 2.1, 1.9, 2.0, 2.2, 1.8, 2.0, 2.1, 1.9, 2.0, 2.05]);
    original.snapshot(&model, 5).expect("snapshot");
    let saved: Vec<(String, Tensor)> = variables(&model)
        .into_iter()
        .map(|(name, tensor)| (name, tensor.copy()))
        .collect();
    let state = original.export_state().expect("export");
    assert_eq!(state.history, original.history());
    let exported = state.snapshot.as_ref().expect("snapshot exported");
    assert_eq!(exported.epoch, 5);
    assert_eq!(exported.fossils.len(), 1);
    let mut restored = governor();
    restored.import_state(state, Device::Cpu).expect("import");
    assert_eq!(restored.history(), original.history());
    assert_eq!(restored.snapshot_epoch(), Some(5));
    for loss in [2.0, 50.0, 50.0] {
        assert_eq!(restored.check(loss), original.check(loss), "loss {loss}");
    }
    // The imported snapshot restores the model bitwise.
    perturb(&model);
    restored
        .rollback(
            &mut model,
            &mut optimizers,
            &Telemetry::disabled(),
            PanicReason::Divergence,
        )
        .expect("rollback");
    for ((name, now), (_, then)) in variables(&model).iter().zip(&saved) {
        assert!(now.equal(then), "{name} restored bitwise");
    }
    assert_eq!(restored.rollbacks(), 1);

    // A history longer than the window, a non-finite loss and unsorted
    // variables are refused, and the governor keeps its state.
    let mut long = governor().export_state().expect("export");
    long.history = vec![1.0; 21];
    let mut nan = governor().export_state().expect("export");
    nan.history = vec![f64::NAN];
    let mut unsorted = original.export_state().expect("export");
    if let Some(snapshot) = unsorted.snapshot.as_mut() {
        snapshot.host.reverse();
    }
    // Non-finite snapshot variables would be written into the host by the
    // rollback meant to rescue it: refused, host and fossil alike, as is a
    // non-finite last panic loss.
    let mut poisoned_host = original.export_state().expect("export");
    if let Some((_, tensor)) = poisoned_host
        .snapshot
        .as_mut()
        .and_then(|snapshot| snapshot.host.first_mut())
    {
        *tensor = tensor.full_like(f64::NAN);
    }
    let mut poisoned_fossil = original.export_state().expect("export");
    if let Some((_, tensor)) = poisoned_fossil
        .snapshot
        .as_mut()
        .and_then(|snapshot| snapshot.fossils.first_mut())
        .and_then(|fossil| fossil.variables.last_mut())
    {
        *tensor = tensor.full_like(f64::INFINITY);
    }
    let mut panic_loss = original.export_state().expect("export");
    panic_loss.last_panic_loss = Some(f64::NEG_INFINITY);
    let history_before = restored.history();
    for (bad, field) in [
        (long, "history"),
        (nan, "history"),
        (unsorted, "snapshot.host"),
        (poisoned_host, "snapshot.host"),
        (poisoned_fossil, "snapshot.fossils"),
        (panic_loss, "last_panic_loss"),
    ] {
        let error = restored
            .import_state(bad, Device::Cpu)
            .expect_err("refused");
        assert!(error.to_string().contains(field), "{error}");
        assert_eq!(restored.snapshot_epoch(), Some(5));
        assert_eq!(restored.history(), history_before);
        assert_eq!(restored.rollbacks(), 1);
    }
    // The refused imports changed nothing: the kept snapshot still restores
    // the model bitwise.
    perturb(&model);
    restored
        .rollback(
            &mut model,
            &mut optimizers,
            &Telemetry::disabled(),
            PanicReason::Divergence,
        )
        .expect("rollback after refused imports");
    for ((name, now), (_, then)) in variables(&model).iter().zip(&saved) {
        assert!(now.equal(then), "{name} still restored bitwise");
    }
}
