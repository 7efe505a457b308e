//! Tests of the run picture: bounds, clipping, names, the lanes and the
//! files written.

use super::*;
use crate::train::epoch_log::SlotRecord;

fn record(epoch: usize, stage: &str, alpha: f64) -> EpochRecord {
    EpochRecord {
        epoch,
        train_loss: Some(1.0 / (epoch as f64 + 1.0)),
        train_accuracy: 50.0 + epoch as f64,
        val_loss: if epoch == 1 { None } else { Some(0.9) },
        val_accuracy: 48.0 + epoch as f64,
        epoch_ms: 10.0,
        samples_per_s: 1000.0,
        active_seeds: 1,
        slots: vec![
            SlotRecord {
                slot: "r0c1".to_owned(),
                stage: stage.to_owned(),
                alpha,
                blueprint: Some("conv_light".to_owned()),
                seed_id: Some("seed-0".to_owned()),
            },
            SlotRecord {
                slot: "r0c2".to_owned(),
                stage: "DORMANT".to_owned(),
                alpha: 0.0,
                blueprint: None,
                seed_id: None,
            },
        ],
        decision: None,
        rollback: None,
        val_perplexity: None,
    }
}

#[test]
fn a_picture_is_drawn_for_every_stage_and_a_missing_loss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let records: Vec<EpochRecord> = LEGEND
        .iter()
        .enumerate()
        .map(|(epoch, stage)| record(epoch, stage, epoch as f64 / 8.0))
        .collect();
    let (png, svg) = draw_run(dir.path(), &records).expect("drawn");
    let png_bytes = std::fs::read(png).expect("png");
    assert!(png_bytes.starts_with(b"\x89PNG"));
    let svg_text = std::fs::read_to_string(svg).expect("svg");
    assert!(svg_text.contains("<svg") && svg_text.contains("conv_light"));
    assert!(svg_text.contains("r0c2"), "a lane per slot");
    assert!(draw_run(dir.path(), &[]).is_err(), "nothing to draw");
}

/// The names of the files in `dir`.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn a_language_models_perplexity_is_in_the_loss_caption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut records: Vec<EpochRecord> =
        (0..3).map(|epoch| record(epoch, "TRAINING", 0.0)).collect();
    for (record, perplexity) in records.iter_mut().zip([21.0, f64::NAN, 6.0]) {
        record.val_perplexity = Some(perplexity);
    }
    let (_, svg) = draw_run(dir.path(), &records).expect("drawn");
    let svg = std::fs::read_to_string(svg).expect("svg");
    assert!(
        svg.contains("validation perplexity 21.00 -&gt; 6.00")
            || svg.contains("validation perplexity 21.00 -> 6.00"),
        "caption"
    );
    let (_, svg) = draw_run(
        dir.path(),
        &records[..1]
            .iter()
            .map(|r| EpochRecord {
                val_perplexity: None,
                ..r.clone()
            })
            .collect::<Vec<_>>(),
    )
    .expect("drawn");
    let svg = std::fs::read_to_string(svg).expect("svg");
    assert!(!svg.contains("perplexity"), "an image task has none");
}

#[test]
fn absurd_epochs_and_slot_counts_are_refused_before_anything_is_drawn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut far = record(0, "TRAINING", 0.5);
    far.epoch = usize::MAX;
    let error = draw_run(dir.path(), &[record(0, "TRAINING", 0.5), far])
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains(&format!("epoch {}", usize::MAX)) && error.contains("no picture"),
        "{error}"
    );
    let mut crowded = record(0, "TRAINING", 0.5);
    crowded.slots = (0..50_000)
        .map(|index| epoch_log::SlotRecord {
            slot: format!("r{index}c0"),
            stage: "DORMANT".to_owned(),
            alpha: 0.0,
            blueprint: None,
            seed_id: None,
        })
        .collect();
    let error = draw_run(dir.path(), &[crowded])
        .expect_err("refused")
        .to_string();
    assert!(error.contains("50000 slots"), "{error}");
    assert!(files(dir.path()).is_empty(), "nothing written");
}

#[test]
fn values_beyond_the_axes_are_clipped_and_long_names_shortened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut wild = record(1, "BLENDING", 7.0);
    wild.train_loss = Some(f64::MAX);
    wild.val_loss = Some(-1e300);
    wild.train_accuracy = 1e300;
    wild.val_accuracy = f64::NAN;
    wild.slots[0].blueprint = Some("b".repeat(10_000));
    wild.slots[1].alpha = f64::NEG_INFINITY;
    let clipped_record = clipped(&wild);
    assert_eq!(clipped_record.train_loss, Some(LOSS_AXIS_LIMIT));
    assert_eq!(clipped_record.val_loss, Some(0.0));
    assert_eq!(clipped_record.train_accuracy, 100.0);
    assert!(clipped_record.val_accuracy.is_nan(), "left out");
    assert_eq!(clipped_record.slots[0].alpha, 1.0);
    assert_eq!(clipped_record.slots[1].alpha, 0.0);
    assert_eq!(
        clipped_record.slots[0]
            .blueprint
            .as_deref()
            .map(|name| name.chars().count()),
        Some(NAME_CHARS)
    );
    let (_, svg) = draw_run(dir.path(), &[record(0, "TRAINING", 0.2), wild]).expect("drawn");
    let svg = std::fs::read_to_string(svg).expect("svg");
    assert!(svg.contains("clipped at 1e6"), "the loss axis says so");
}

fn hostile_record() -> impl proptest::strategy::Strategy<Value = EpochRecord> {
    use leyline::testing::{extreme_f64, extreme_usize};
    use proptest::prelude::*;
    let slot = (
        "\\PC{0,8}",
        proptest::sample::select(LEGEND.to_vec()),
        extreme_f64(),
        proptest::option::of("\\PC{0,40}"),
    )
        .prop_map(|(slot, stage, alpha, blueprint)| epoch_log::SlotRecord {
            slot,
            stage: stage.to_owned(),
            alpha,
            seed_id: blueprint.as_ref().map(|_| "seed-0".to_owned()),
            blueprint,
        });
    (
        prop_oneof![4 => 0usize..64, 1 => extreme_usize()],
        proptest::option::of(extreme_f64()),
        extreme_f64(),
        proptest::option::of(extreme_f64()),
        extreme_f64(),
        proptest::collection::vec(slot, 0..4),
    )
        .prop_map(
            |(epoch, train_loss, train_accuracy, val_loss, val_accuracy, slots)| EpochRecord {
                epoch,
                train_loss,
                train_accuracy,
                val_loss,
                val_accuracy,
                epoch_ms: 1.0,
                samples_per_s: 1.0,
                active_seeds: 0,
                slots,
                decision: None,
                rollback: None,
                val_perplexity: None,
            },
        )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Whatever a record holds, the bounds check and the clipping give
    /// values inside the picture's axes or a refusal, never a panic.
    #[test]
    fn hostile_records_are_refused_or_clipped_into_the_axes(
        records in proptest::collection::vec(hostile_record(), 1..6),
    ) {
        if check_bounds(&records).is_ok() {
            for record in records.iter().map(clipped) {
                proptest::prop_assert!(record.epoch < MAX_EPOCHS);
                for accuracy in [record.train_accuracy, record.val_accuracy] {
                    proptest::prop_assert!(
                        accuracy.is_nan() || (0.0..=100.0).contains(&accuracy)
                    );
                }
                for loss in [record.train_loss, record.val_loss].into_iter().flatten() {
                    proptest::prop_assert!((0.0..=LOSS_AXIS_LIMIT).contains(&loss));
                }
                for slot in &record.slots {
                    proptest::prop_assert!((0.0..=1.0).contains(&slot.alpha));
                    proptest::prop_assert!(slot.slot.chars().count() <= NAME_CHARS);
                }
            }
        }
    }
}

proptest::proptest! {
    // Each case draws a PNG and an SVG (a fraction of a second each).
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

    /// Drawing hostile records gives the picture or an error that leaves
    /// no file behind, never a panic.
    #[test]
    fn hostile_records_draw_or_are_refused_leaving_nothing(
        records in proptest::collection::vec(hostile_record(), 0..4),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        match draw_run(dir.path(), &records) {
            Ok(_) => proptest::prop_assert_eq!(files(dir.path()), [PNG_NAME, SVG_NAME]),
            Err(error) => {
                let message = error.to_string();
                proptest::prop_assert!(!message.is_empty());
                proptest::prop_assert!(files(dir.path()).is_empty());
            }
        }
    }
}
