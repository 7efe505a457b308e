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

use crate::config::TrainerConfig;

/// A standard normal draw by Box-Muller (cosine branch only), the form the
/// Python peer reproduces bit for bit.
fn box_muller_normal(rng: &mut SplitMix64) -> f64 {
    let u1 = 1.0 - rng.next_f64();
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Labelled samples of the reference task.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledSet {
    /// Row-major `[n, n_features]` inputs.
    pub inputs: Vec<f32>,
    /// Class index per sample.
    pub labels: Vec<usize>,
    /// Features per sample.
    pub n_features: usize,
}

impl LabelledSet {
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
    pub fn generate(config: &TrainerConfig) -> ReferenceData {
        let (n_features, n_classes) = (config.n_features, config.n_classes);
        let mut rng = SplitMix64::new(config.seed);
        let teacher: Vec<f64> = (0..n_features * n_classes)
            .map(|_| box_muller_normal(&mut rng))
            .collect();
        let mut draw = |n: usize| {
            let inputs: Vec<f64> = (0..n * n_features)
                .map(|_| box_muller_normal(&mut rng))
                .collect();
            let labels = inputs
                .chunks(n_features)
                .map(|row| teacher_label(row, &teacher, n_classes))
                .collect();
            LabelledSet {
                inputs: inputs.iter().map(|&value| value as f32).collect(),
                labels,
                n_features,
            }
        };
        let train = draw(config.n_samples);
        let validation = draw(config.n_validation_samples);
        let mut init_rng = SplitMix64::new(config.seed ^ INIT_STREAM);
        let bound = 1.0 / (n_features as f64).sqrt();
        let initial_parameters = (0..n_classes * (n_features + 1))
            .map(|_| ((2.0 * init_rng.next_f64() - 1.0) * bound) as f32)
            .collect();
        ReferenceData {
            train,
            validation,
            initial_parameters,
        }
    }
}

/// Arg-max of `row · teacher[:, c]` (teacher is row-major `[F, C]`).
fn teacher_label(row: &[f64], teacher: &[f64], n_classes: usize) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for class in 0..n_classes {
        let score: f64 = row
            .iter()
            .enumerate()
            .map(|(feature, value)| value * teacher[feature * n_classes + class])
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
    pub fn len(&self, n_features: usize, n_classes: usize) -> usize {
        packed_len(self.batch, n_features, n_classes)
    }
}

/// `f32`s in a packed microbatch of `batch` samples.
pub fn packed_len(batch: usize, n_features: usize, n_classes: usize) -> usize {
    batch * (2 * n_classes + n_features + 1)
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
pub fn pack_epoch(set: &LabelledSet, n_classes: usize, batch_size: usize) -> PackedEpoch {
    let n_features = set.n_features;
    let mut values = Vec::with_capacity(packed_len(set.len(), n_features, n_classes));
    let mut spans = Vec::new();
    let mut start = 0;
    while start < set.len() {
        let batch = batch_size.min(set.len() - start);
        spans.push(MicrobatchSpan {
            offset: values.len(),
            batch,
        });
        let labels = &set.labels[start..start + batch];
        let scale = -1.0 / batch as f32;
        for &label in labels {
            values.extend((0..n_classes).map(|class| if class == label { scale } else { 0.0 }));
        }
        for &label in labels {
            values.extend((0..n_classes).map(|class| f32::from(u8::from(class == label))));
        }
        for sample in start..start + batch {
            values.extend_from_slice(&set.inputs[sample * n_features..(sample + 1) * n_features]);
            values.push(1.0);
        }
        start += batch;
    }
    PackedEpoch { values, spans }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_lays_out_seed_onehot_and_inputs() {
        let set = LabelledSet {
            inputs: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            labels: vec![1, 0, 1],
            n_features: 2,
        };
        let packed = pack_epoch(&set, 2, 2);
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
        let first = ReferenceData::generate(&config);
        assert_eq!(first, ReferenceData::generate(&config));
        let other = ReferenceData::generate(&TrainerConfig {
            seed: config.seed + 1,
            ..config.clone()
        });
        assert_ne!(first.train.inputs, other.train.inputs);
        let mut seen = [false; 4];
        for &label in first.train.labels.iter().chain(&first.validation.labels) {
            seen[label] = true;
        }
        assert_eq!(seen, [true; 4], "labels {:?}", first.train.labels);
    }
}
