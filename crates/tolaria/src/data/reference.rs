//! The `tolaria-reference` task (the only one of that name) and its packed
//! microbatch layout, the staging format of the special reference trainer
//! (`tolaria::reference`).
//!
//! Samples are drawn from a seeded [`SplitMix64`] stream (Box-Muller normals),
//! and labels come from a random linear teacher, so the task is learnable by
//! the linear host. Both sets are [`Dataset`]s like every other data set.
//! `bench/python/tolaria_reference.py` implements the same generator, so
//! Rust and Python train on the same numbers.
//!
//! Each microbatch is packed into one contiguous block of `f32`s, so staging a
//! whole epoch is a single host-to-device transfer and every tensor a step
//! reads is a contiguous view:
//!
//! ```text
//! [ grad_seed: B x C | onehot: B x C | inputs: B x (F + 1) ]
//! ```
//!
//! `grad_seed` is `-onehot / B`, the gradient of the batch-mean cross-entropy
//! with respect to the log-probabilities; `inputs` carries a constant 1 column
//! so that weight and bias are one `[C, F + 1]` matrix.

use super::Dataset;
use super::limits::{MAX_CLASSES, MAX_PACKED_VALUES, MAX_SYNTHETIC_VALUES};
use crate::error::{Error, Result};
use leyline::rng::SplitMix64;

/// Name of the task; its sets are named `tolaria-reference/train` and
/// `tolaria-reference/validation`.
pub const REFERENCE_TASK_NAME: &str = "tolaria-reference";

/// A standard normal draw by Box-Muller (cosine branch only), the form the
/// Python peer reproduces bit for bit.
fn box_muller_normal(rng: &mut SplitMix64) -> f64 {
    let u1 = 1.0 - rng.next_f64();
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// What one reference task draws: its seed and sizes (the special
/// `tolaria-reference` trainer's `TrainerConfig::task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReferenceTask {
    /// Seed of the samples and of the teacher; the initial parameters come
    /// from a stream derived from it.
    pub seed: u64,
    /// Training samples.
    pub n_samples: usize,
    /// Validation samples (0: an empty validation set).
    pub n_validation_samples: usize,
    /// Input features.
    pub n_features: usize,
    /// Output classes.
    pub n_classes: usize,
}

impl ReferenceTask {
    /// Checks the sizes against the data layer's bounds, with checked
    /// arithmetic, before anything is allocated: `n_features >= 1`,
    /// `n_classes` in `2..=`[`MAX_CLASSES`], the teacher's and the initial
    /// parameters' `n_features x n_classes` values at most
    /// [`MAX_SYNTHETIC_VALUES`], and each set's packed buffer at most
    /// [`MAX_PACKED_VALUES`] `f32`s (which bounds its `samples x
    /// n_features` values too). A trainer checks its own, tighter bounds
    /// first.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field and its value.
    pub fn validate(&self) -> Result<()> {
        let invalid =
            |field: &'static str, reason: String| Err(Error::InvalidConfig { field, reason });
        if self.n_features == 0 {
            return invalid(
                "n_features",
                "0: a sample has at least 1 feature".to_owned(),
            );
        }
        if !(2..=MAX_CLASSES).contains(&self.n_classes) {
            return invalid(
                "n_classes",
                format!("{} is outside 2..={MAX_CLASSES}", self.n_classes),
            );
        }
        let parameters = self
            .n_features
            .checked_add(1)
            .and_then(|columns| columns.checked_mul(self.n_classes));
        if parameters.is_none_or(|len| len > MAX_SYNTHETIC_VALUES) {
            return invalid(
                "n_features",
                format!(
                    "{} features x {} classes are more than {MAX_SYNTHETIC_VALUES} parameters",
                    self.n_features, self.n_classes
                ),
            );
        }
        for (field, samples) in [
            ("n_samples", self.n_samples),
            ("n_validation_samples", self.n_validation_samples),
        ] {
            match packed_len(samples, self.n_features, self.n_classes) {
                Some(len) if len <= MAX_PACKED_VALUES => {}
                len => {
                    return invalid(
                        field,
                        format!(
                            "{samples} samples of {} features and {} classes pack into {} f32s, \
                             above the bound of {MAX_PACKED_VALUES}",
                            self.n_features,
                            self.n_classes,
                            len.map_or_else(
                                || "more than usize::MAX".to_owned(),
                                |len| len.to_string()
                            )
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

/// Training and validation sets of the reference task, plus the initial
/// parameters (drawn from their own stream so they do not depend on the data
/// size).
#[derive(Debug)]
pub struct ReferenceData {
    /// Training samples, `[n_samples, n_features]` on the CPU.
    pub train: Dataset,
    /// Validation samples, `[n_validation_samples, n_features]` on the CPU.
    pub validation: Dataset,
    /// Initial `[C, F + 1]` parameters (weight columns then the bias column),
    /// uniform in `±1/sqrt(F)` like `torch.nn.Linear`'s default.
    pub initial_parameters: Vec<f32>,
}

/// Seed offset of the parameter stream.
const INIT_STREAM: u64 = 0xA5A5_A5A5_5A5A_5A5A;

impl ReferenceData {
    /// Generates the data set and initial parameters described by `task`.
    ///
    /// # Errors
    /// [`ReferenceTask::validate`]'s errors, checked before anything is
    /// allocated, so every size below is bounded; [`Error::Data`] if
    /// libtorch cannot hold the sets.
    pub fn generate(task: &ReferenceTask) -> Result<ReferenceData> {
        task.validate()?;
        let (n_features, n_classes) = (task.n_features, task.n_classes);
        let mut rng = SplitMix64::new(task.seed);
        // Bounded by validate(): C <= MAX_CLASSES, F x C and n x F within
        // their bounds; checked again here so no product can wrap.
        let product = |a: usize, b: usize| {
            a.checked_mul(b).ok_or_else(|| Error::InvalidConfig {
                field: "n_features",
                reason: format!("{a} x {b} overflows usize"),
            })
        };
        let teacher: Vec<f64> = (0..product(n_features, n_classes)?)
            .map(|_| box_muller_normal(&mut rng))
            .collect();
        let mut draw = |n: usize, part: &str| -> Result<Dataset> {
            let inputs: Vec<f64> = (0..product(n, n_features)?)
                .map(|_| box_muller_normal(&mut rng))
                .collect();
            let labels: Vec<i64> = inputs
                .chunks_exact(n_features)
                .map(|row| teacher_label(row, &teacher, n_classes))
                .collect();
            let features: Vec<f32> = inputs.iter().map(|&value| value as f32).collect();
            Ok(Dataset::from_rows(
                format!("{REFERENCE_TASK_NAME}/{part}"),
                &features,
                &labels,
                n_features,
                n_classes,
            )?)
        };
        let train = draw(task.n_samples, "train")?;
        let validation = draw(task.n_validation_samples, "validation")?;
        let mut init_rng = SplitMix64::new(task.seed ^ INIT_STREAM);
        let bound = 1.0 / (n_features as f64).sqrt();
        let initial_parameters = (0..product(n_classes, n_features.saturating_add(1))?)
            .map(|_| ((2.0 * init_rng.next_f64() - 1.0) * bound) as f32)
            .collect();
        Ok(ReferenceData {
            train,
            validation,
            initial_parameters,
        })
    }
}

/// Arg-max of `row · teacher[:, c]` (teacher is row-major `[F, C]`).
fn teacher_label(row: &[f64], teacher: &[f64], n_classes: usize) -> i64 {
    let mut best = (0, f64::NEG_INFINITY);
    // n_classes <= MAX_CLASSES (validated): every class fits an i64.
    for class in 0..n_classes as i64 {
        let score: f64 = row
            .iter()
            .zip(teacher.iter().skip(class as usize).step_by(n_classes))
            .map(|(value, weight)| value * weight)
            .sum();
        if score > best.1 {
            best = (class, score);
        }
    }
    best.0
}

/// Where one microbatch sits inside a packed buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MicrobatchSpan {
    /// Offset of the block in `f32`s.
    pub offset: usize,
    /// Samples in the microbatch.
    pub batch: usize,
}

impl MicrobatchSpan {
    /// Length of the packed block in `f32`s.
    ///
    /// # Errors
    /// [`Error::InvalidData`] when the length overflows `usize`.
    pub fn len(&self, n_features: usize, n_classes: usize) -> Result<usize> {
        packed_len(self.batch, n_features, n_classes).ok_or_else(|| Error::InvalidData {
            field: "span",
            reason: format!(
                "a microbatch of {} samples, {n_features} features and {n_classes} classes \
                 overflows usize",
                self.batch
            ),
        })
    }
}

/// `f32`s in a packed microbatch of `batch` samples:
/// `batch x (2 x n_classes + n_features + 1)`, or `None` on overflow.
pub fn packed_len(batch: usize, n_features: usize, n_classes: usize) -> Option<usize> {
    n_classes
        .checked_mul(2)?
        .checked_add(n_features)?
        .checked_add(1)?
        .checked_mul(batch)
}

/// A labelled set packed microbatch after microbatch, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedEpoch {
    /// All microbatches back to back.
    pub values: Vec<f32>,
    /// One span per microbatch.
    pub spans: Vec<MicrobatchSpan>,
}

/// Features per sample of a tabular set (its samples are `[F]`, `F >= 1`).
///
/// # Errors
/// [`Error::InvalidData`] naming `images` for any other sample shape.
pub fn tabular_features(set: &Dataset) -> Result<usize> {
    match set.sample_shape().as_slice() {
        &[features] if features > 0 => Ok(usize::try_from(features).unwrap_or(usize::MAX)),
        shape => Err(Error::InvalidData {
            field: "images",
            reason: format!(
                "{} has samples of shape {shape:?}; the packed layout needs [n_features] rows",
                set.name()
            ),
        }),
    }
}

/// Packs `set` into microbatches of `batch_size` (the last may be smaller).
///
/// Reads the set back to host memory once (staging happens before the
/// epochs, never inside one).
///
/// # Errors
/// [`Error::InvalidData`] for a `batch_size` of 0, samples that are
/// not `[n_features]` rows ([`tabular_features`]), or a packed buffer above
/// [`MAX_PACKED_VALUES`] `f32`s (checked before allocating);
/// [`Error::Data`] when the readback fails.
pub fn pack_epoch(set: &Dataset, batch_size: usize) -> Result<PackedEpoch> {
    let (n_features, n_classes) = (tabular_features(set)?, set.n_classes());
    if batch_size == 0 {
        return Err(Error::InvalidData {
            field: "batch_size",
            reason: "0: a microbatch holds at least 1 sample".to_owned(),
        });
    }
    let total = packed_len(set.len(), n_features, n_classes)
        .filter(|&total| total <= MAX_PACKED_VALUES)
        .ok_or_else(|| Error::InvalidData {
            field: "inputs",
            reason: format!(
                "{} samples of {n_features} features and {n_classes} classes pack into more \
                 than {MAX_PACKED_VALUES} f32s",
                set.len()
            ),
        })?;
    let inputs = set.features_to_vec()?;
    // Labels were checked to lie in 0..n_classes when the set was built.
    let labels: Vec<usize> = set
        .labels_to_vec()?
        .into_iter()
        .map(|label| usize::try_from(label).unwrap_or(usize::MAX))
        .collect();
    let mut values = Vec::with_capacity(total);
    let mut spans = Vec::with_capacity(set.len().div_ceil(batch_size));
    // Both chunkings yield the same number of chunks: inputs.len() == len x F.
    let input_rows = batch_size.saturating_mul(n_features);
    for (labels, inputs) in labels.chunks(batch_size).zip(inputs.chunks(input_rows)) {
        let batch = labels.len();
        spans.push(MicrobatchSpan {
            offset: values.len(),
            batch,
        });
        let scale = -1.0 / batch as f32;
        for &label in labels {
            values.extend((0..n_classes).map(|class| if class == label { scale } else { 0.0 }));
        }
        for &label in labels {
            values.extend((0..n_classes).map(|class| f32::from(u8::from(class == label))));
        }
        for row in inputs.chunks_exact(n_features) {
            values.extend_from_slice(row);
            values.push(1.0);
        }
    }
    Ok(PackedEpoch { values, spans })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_lays_out_seed_onehot_and_inputs() {
        let set = Dataset::from_rows("t", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[1, 0, 1], 2, 2)
            .expect("a valid set");
        let packed = pack_epoch(&set, 2).expect("packs");
        assert_eq!(
            packed.spans,
            vec![
                MicrobatchSpan {
                    offset: 0,
                    batch: 2
                },
                MicrobatchSpan {
                    offset: 14,
                    batch: 1
                }
            ]
        );
        assert_eq!(
            &packed.values[..14],
            &[
                0.0, -0.5, -0.5, 0.0, // grad seed
                0.0, 1.0, 1.0, 0.0, // onehot
                1.0, 2.0, 1.0, 3.0, 4.0, 1.0 // inputs with the bias column
            ]
        );
        assert_eq!(&packed.values[14..], &[0.0, -1.0, 0.0, 1.0, 5.0, 6.0, 1.0]);
    }

    #[test]
    fn reference_data_is_seeded_and_uses_every_class() {
        // The `tolaria-reference` workload's task.
        let task = ReferenceTask {
            seed: 20_251_001,
            n_samples: 16,
            n_validation_samples: 16,
            n_features: 16,
            n_classes: 4,
        };
        let host = |data: &ReferenceData| {
            (
                data.train.features_to_vec().expect("train features"),
                data.train.labels_to_vec().expect("train labels"),
                data.validation
                    .features_to_vec()
                    .expect("validation features"),
                data.validation.labels_to_vec().expect("validation labels"),
                data.initial_parameters.clone(),
            )
        };
        let first = ReferenceData::generate(&task).expect("reference data");
        assert_eq!(
            host(&first),
            host(&ReferenceData::generate(&task).expect("reference data"))
        );
        assert_eq!(first.train.name(), "tolaria-reference/train");
        assert_eq!(first.train.sample_shape(), vec![16]);
        let other = ReferenceData::generate(&ReferenceTask {
            seed: task.seed + 1,
            ..task
        })
        .expect("reference data");
        assert_ne!(host(&first).0, host(&other).0);
        let (_, train_labels, _, validation_labels, _) = host(&first);
        let mut seen = [false; 4];
        for &label in train_labels.iter().chain(&validation_labels) {
            seen[label as usize] = true;
        }
        assert_eq!(seen, [true; 4], "labels {train_labels:?}");
    }
}
