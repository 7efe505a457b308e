//! The synthetic `tolaria-reference` data set and its microbatch layout.
//!
//! Samples are drawn from a seeded SplitMix64 stream (Box-Muller normals), and
//! labels come from a random linear teacher, so the task is learnable by the
//! linear host. `bench/python/tolaria_reference.py` implements the same
//! generator, so Rust and Python train on the same numbers.
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

use kasmina::data::shuffle::SplitMix64;

use crate::config::{MAX_CLASSES, MAX_FEATURES, MAX_PACKED_VALUES, MAX_SAMPLES, TrainerConfig};
use crate::error::{Result, TolariaError};

/// A standard normal draw by Box-Muller (cosine branch only), the form the
/// Python peer reproduces bit for bit.
fn box_muller_normal(rng: &mut SplitMix64) -> f64 {
    let u1 = 1.0 - rng.next_f64();
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Labelled samples of the reference task.
///
/// Built only through [`LabelledSet::new`], which checks that the inputs
/// hold exactly `n_features` finite values per label and every label is a
/// class index, so a packed epoch never holds a fake one-hot row (a label out
/// of range would train towards nothing and read as a loss of 0).
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledSet {
    inputs: Vec<f32>,
    labels: Vec<usize>,
    n_features: usize,
    n_classes: usize,
}

impl LabelledSet {
    /// A set of `labels.len()` samples: row-major `[n, n_features]` inputs
    /// and one class index in `0..n_classes` per sample.
    ///
    /// # Errors
    /// [`TolariaError::InvalidData`] when `n_features` lies outside
    /// `1..=`[`MAX_FEATURES`], `n_classes` outside `2..=`[`MAX_CLASSES`],
    /// there are more than [`MAX_SAMPLES`] samples, or `inputs.len()` is not
    /// `labels.len() x n_features` (checked arithmetic);
    /// [`TolariaError::LabelOutOfRange`] for the first label of `n_classes`
    /// or more; [`TolariaError::NonFiniteInput`] for the first NaN or
    /// infinite input.
    pub fn new(
        inputs: Vec<f32>,
        labels: Vec<usize>,
        n_features: usize,
        n_classes: usize,
    ) -> Result<LabelledSet> {
        let invalid =
            |field: &'static str, reason: String| TolariaError::InvalidData { field, reason };
        if !(1..=MAX_FEATURES).contains(&n_features) {
            return Err(invalid(
                "n_features",
                format!("{n_features} is outside 1..={MAX_FEATURES}"),
            ));
        }
        if !(2..=MAX_CLASSES).contains(&n_classes) {
            return Err(invalid(
                "n_classes",
                format!("{n_classes} is outside 2..={MAX_CLASSES}"),
            ));
        }
        if labels.len() > MAX_SAMPLES {
            return Err(invalid(
                "labels",
                format!("{} samples, above the bound of {MAX_SAMPLES}", labels.len()),
            ));
        }
        if labels.len().checked_mul(n_features) != Some(inputs.len()) {
            return Err(invalid(
                "inputs",
                format!(
                    "{} values for {} labels of {n_features} features",
                    inputs.len(),
                    labels.len()
                ),
            ));
        }
        if let Some((index, &label)) = labels
            .iter()
            .enumerate()
            .find(|&(_, &label)| label >= n_classes)
        {
            return Err(TolariaError::LabelOutOfRange {
                index,
                label,
                n_classes,
            });
        }
        if let Some((position, &value)) = inputs
            .iter()
            .enumerate()
            .find(|&(_, value)| !value.is_finite())
        {
            return Err(TolariaError::NonFiniteInput {
                sample: position.checked_div(n_features).unwrap_or(position),
                feature: position.checked_rem(n_features).unwrap_or(0),
                value,
            });
        }
        Ok(LabelledSet {
            inputs,
            labels,
            n_features,
            n_classes,
        })
    }

    /// Row-major `[n, n_features]` inputs.
    pub fn inputs(&self) -> &[f32] {
        &self.inputs
    }

    /// Class index per sample.
    pub fn labels(&self) -> &[usize] {
        &self.labels
    }

    /// Features per sample.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// Number of classes (labels lie in `0..n_classes`).
    pub fn n_classes(&self) -> usize {
        self.n_classes
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the set holds no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Training and validation sets of the reference task, plus the initial
/// parameters (drawn from their own stream so they do not depend on the data
/// size).
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceData {
    /// Training samples.
    pub train: LabelledSet,
    /// Validation samples.
    pub validation: LabelledSet,
    /// Initial `[C, F + 1]` parameters (weight columns then the bias column),
    /// uniform in `±1/sqrt(F)` like `torch.nn.Linear`'s default.
    pub initial_parameters: Vec<f32>,
}

/// Seed offset of the parameter stream.
const INIT_STREAM: u64 = 0xA5A5_A5A5_5A5A_5A5A;

impl ReferenceData {
    /// Generates the data set and initial parameters described by `config`.
    ///
    /// # Errors
    /// [`TrainerConfig::validate`]'s errors, checked before anything is
    /// allocated, so every size below is bounded.
    pub fn generate(config: &TrainerConfig) -> Result<ReferenceData> {
        config.validate()?;
        let (n_features, n_classes) = (config.n_features, config.n_classes);
        let mut rng = SplitMix64::new(config.seed);
        // Bounded by validate(): F <= 2^16, C <= 2^10, n x F <= the packed
        // buffer's bound; checked again here so no product can wrap.
        let product = |a: usize, b: usize| {
            a.checked_mul(b).ok_or_else(|| TolariaError::InvalidConfig {
                field: "n_features",
                reason: format!("{a} x {b} overflows usize"),
            })
        };
        let teacher: Vec<f64> = (0..product(n_features, n_classes)?)
            .map(|_| box_muller_normal(&mut rng))
            .collect();
        let mut draw = |n: usize| {
            let inputs: Vec<f64> = (0..product(n, n_features)?)
                .map(|_| box_muller_normal(&mut rng))
                .collect();
            let labels = inputs
                .chunks_exact(n_features)
                .map(|row| teacher_label(row, &teacher, n_classes))
                .collect();
            LabelledSet::new(
                inputs.iter().map(|&value| value as f32).collect(),
                labels,
                n_features,
                n_classes,
            )
        };
        let train = draw(config.n_samples)?;
        let validation = draw(config.n_validation_samples)?;
        let mut init_rng = SplitMix64::new(config.seed ^ INIT_STREAM);
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
fn teacher_label(row: &[f64], teacher: &[f64], n_classes: usize) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for class in 0..n_classes {
        let score: f64 = row
            .iter()
            .zip(teacher.iter().skip(class).step_by(n_classes))
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
    /// [`TolariaError::InvalidData`] when the length overflows `usize`.
    pub fn len(&self, n_features: usize, n_classes: usize) -> Result<usize> {
        packed_len(self.batch, n_features, n_classes).ok_or_else(|| TolariaError::InvalidData {
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

/// Packs `set` into microbatches of `batch_size` (the last may be smaller).
///
/// # Errors
/// [`TolariaError::InvalidData`] for a `batch_size` of 0, or a packed buffer
/// above [`MAX_PACKED_VALUES`] `f32`s (checked before allocating).
pub fn pack_epoch(set: &LabelledSet, batch_size: usize) -> Result<PackedEpoch> {
    let (n_features, n_classes) = (set.n_features, set.n_classes);
    if batch_size == 0 {
        return Err(TolariaError::InvalidData {
            field: "batch_size",
            reason: "0: a microbatch holds at least 1 sample".to_owned(),
        });
    }
    let total = packed_len(set.len(), n_features, n_classes)
        .filter(|&total| total <= MAX_PACKED_VALUES)
        .ok_or_else(|| TolariaError::InvalidData {
            field: "inputs",
            reason: format!(
                "{} samples of {n_features} features and {n_classes} classes pack into more \
                 than {MAX_PACKED_VALUES} f32s",
                set.len()
            ),
        })?;
    let mut values = Vec::with_capacity(total);
    let mut spans = Vec::with_capacity(set.len().div_ceil(batch_size));
    // Both chunkings yield the same number of chunks: inputs.len() == len x F.
    let input_rows = batch_size.saturating_mul(n_features);
    for (labels, inputs) in set
        .labels
        .chunks(batch_size)
        .zip(set.inputs.chunks(input_rows))
    {
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
        let set = LabelledSet::new(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], vec![1, 0, 1], 2, 2)
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
        let config = TrainerConfig::reference();
        let first = ReferenceData::generate(&config).expect("reference data");
        assert_eq!(
            first,
            ReferenceData::generate(&config).expect("reference data")
        );
        let other = ReferenceData::generate(&TrainerConfig {
            seed: config.seed + 1,
            ..config.clone()
        })
        .expect("reference data");
        assert_ne!(first.train.inputs(), other.train.inputs());
        let mut seen = [false; 4];
        for &label in first.train.labels().iter().chain(first.validation.labels()) {
            seen[label] = true;
        }
        assert_eq!(seen, [true; 4], "labels {:?}", first.train.labels);
    }
}
