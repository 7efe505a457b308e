//! Seeded synthetic tasks: the `tolaria-reference` blobs and small images.
//!
//! Both generators draw every value from one [`SplitMix64`] stream in a fixed
//! order, using only integer arithmetic, IEEE additions and multiplications,
//! so the same options give bitwise identical tensors on every machine, and a
//! different seed gives different data. Values are produced in `f64` and
//! rounded once to `f32`. Labels cycle through the classes (`label of sample
//! i = i % num_classes`), so the classes are balanced; shuffle with
//! [`Dataset::shuffled`] or [`Dataset::batches`] when order matters.
//!
//! No normalisation is applied: the values are already centred near zero with
//! a spread of order one.

use tch::Tensor;

use super::shuffle::SplitMix64;
use super::{DataError, Dataset, Result, torch_error};

/// Name of the data set [`reference_task`] returns.
pub const REFERENCE_TASK_NAME: &str = "tolaria-reference";

/// A Gaussian-blob classification task on feature vectors.
///
/// Generator, in the order values are drawn from `SplitMix64::new(seed)`:
/// 1. class centres, class by class, feature by feature:
///    `centre[c][f] = uniform(-centre_range, centre_range)`;
/// 2. samples in order, features in order:
///    `x[i][f] = centre[i % num_classes][f] + noise_std * normal()`, where
///    `normal()` is [`SplitMix64::normal`] (unit variance, Irwin-Hall).
///
/// With the reference settings (16 features, centres in `[-1, 1]`, noise 0.5)
/// two centres are about 3.3 apart, over six noise standard deviations, so the
/// classes are almost always linearly separable but not trivially so.
#[derive(Debug, Clone, PartialEq)]
pub struct BlobTaskOptions {
    /// Number of samples.
    pub n_samples: usize,
    /// Features per sample.
    pub n_features: usize,
    /// Number of classes.
    pub num_classes: usize,
    /// Centres are drawn uniformly from `[-centre_range, centre_range)` per feature.
    pub centre_range: f64,
    /// Standard deviation of the noise around each centre.
    pub noise_std: f64,
    /// Fixes every value.
    pub seed: u64,
}

impl BlobTaskOptions {
    /// The `tolaria-reference` workload: 16 samples x 16 features, 4 classes
    /// (4 samples each), centres in `[-1, 1)`, noise 0.5.
    pub fn reference(seed: u64) -> Self {
        Self {
            n_samples: 16,
            n_features: 16,
            num_classes: 4,
            centre_range: 1.0,
            noise_std: 0.5,
            seed,
        }
    }
}

/// A task of the `tolaria-reference` shape as a [`Dataset`]:
/// [`BlobTaskOptions::reference`], images `[16, 16]` `f32`, labels `[16]` in
/// `0..4`, named `tolaria-reference`, for tests of hosts and slots.
///
/// The benchmark itself trains on `tolaria::data`'s generator (Box-Muller
/// inputs labelled by a random linear teacher), which its Python peer
/// reproduces bit for bit; the two share the [`super::shuffle::SplitMix64`]
/// stream but not the sampling, so their values differ.
pub fn reference_task(seed: u64) -> Result<Dataset> {
    Ok(blob_task(&BlobTaskOptions::reference(seed))?.with_name(REFERENCE_TASK_NAME))
}

/// A blob task (see [`BlobTaskOptions`]): images `[n_samples, n_features]`
/// `f32`, labels `[n_samples]`, named `synthetic-blobs`.
pub fn blob_task(options: &BlobTaskOptions) -> Result<Dataset> {
    const OP: &str = "synthetic::blob_task";
    check_positive(
        OP,
        &[
            ("n_features", options.n_features),
            ("num_classes", options.num_classes),
        ],
    )?;
    check_finite(
        OP,
        &[
            ("centre_range", options.centre_range),
            ("noise_std", options.noise_std),
        ],
    )?;
    let mut rng = SplitMix64::new(options.seed);
    let centres: Vec<f64> = (0..options.num_classes * options.n_features)
        .map(|_| rng.uniform(-options.centre_range, options.centre_range))
        .collect();
    let mut features = allocate(OP, &[options.n_samples, options.n_features])?;
    for sample in 0..options.n_samples {
        let centre =
            &centres[(sample % options.num_classes) * options.n_features..][..options.n_features];
        features.extend(
            centre
                .iter()
                .map(|&mean| (mean + options.noise_std * rng.normal()) as f32),
        );
    }
    let images = Tensor::f_from_slice(&features)
        .and_then(|t| t.f_reshape([options.n_samples as i64, options.n_features as i64]))
        .map_err(torch_error(OP))?;
    Dataset::new(
        "synthetic-blobs",
        images,
        cyclic_labels(OP, options.n_samples, options.num_classes)?,
        options.num_classes,
    )
}

/// A small image classification task with one smooth pattern per class.
///
/// Generator, in the order values are drawn from `SplitMix64::new(seed)`:
/// 1. one coarse `grid x grid` template per class and channel, class by class,
///    channel by channel, row-major: `uniform(-1, 1)`;
/// 2. samples in order, then channel, row, column: `x[i][ch][y][x] =
///    template[i % num_classes][ch][y * grid / height][x * grid / width] +
///    noise_std * normal()`, i.e. the template upsampled by nearest neighbour
///    plus noise.
///
/// The class is visible in every region of the image, so a small CNN learns
/// it within a few epochs at the default noise.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageTaskOptions {
    /// Number of samples.
    pub n_samples: usize,
    /// Channels per image.
    pub channels: usize,
    /// Image height, in pixels.
    pub height: usize,
    /// Image width, in pixels.
    pub width: usize,
    /// Number of classes.
    pub num_classes: usize,
    /// Side of the coarse template grid (`grid x grid` cells per channel).
    pub grid: usize,
    /// Standard deviation of the per-pixel noise.
    pub noise_std: f64,
    /// Fixes every value.
    pub seed: u64,
}

impl ImageTaskOptions {
    /// Fashion-MNIST-shaped: `[n_samples, 1, 28, 28]`, 10 classes, 4x4
    /// templates, noise 0.5.
    pub fn fashion_like(n_samples: usize, seed: u64) -> Self {
        Self {
            n_samples,
            channels: 1,
            height: 28,
            width: 28,
            num_classes: 10,
            grid: 4,
            noise_std: 0.5,
            seed,
        }
    }

    /// CIFAR-10-shaped: `[n_samples, 3, 32, 32]`, 10 classes, 4x4 templates,
    /// noise 0.5.
    pub fn cifar_like(n_samples: usize, seed: u64) -> Self {
        Self {
            n_samples,
            channels: 3,
            height: 32,
            width: 32,
            num_classes: 10,
            grid: 4,
            noise_std: 0.5,
            seed,
        }
    }
}

/// An image task (see [`ImageTaskOptions`]): images
/// `[n_samples, channels, height, width]` `f32`, labels `[n_samples]`, named
/// `synthetic-images`.
pub fn image_task(options: &ImageTaskOptions) -> Result<Dataset> {
    const OP: &str = "synthetic::image_task";
    let ImageTaskOptions {
        n_samples,
        channels,
        height,
        width,
        num_classes,
        grid,
        noise_std,
        seed,
    } = *options;
    check_positive(
        OP,
        &[
            ("channels", channels),
            ("height", height),
            ("width", width),
            ("num_classes", num_classes),
            ("grid", grid),
        ],
    )?;
    check_finite(OP, &[("noise_std", noise_std)])?;
    let mut rng = SplitMix64::new(seed);
    let template_len = channels * grid * grid;
    let templates: Vec<f64> = (0..num_classes * template_len)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    let mut pixels = allocate(OP, &[n_samples, channels, height, width])?;
    for sample in 0..n_samples {
        let template = &templates[(sample % num_classes) * template_len..][..template_len];
        for channel in 0..channels {
            for y in 0..height {
                let row = &template[(channel * grid + y * grid / height) * grid..][..grid];
                pixels.extend(
                    (0..width).map(|x| (row[x * grid / width] + noise_std * rng.normal()) as f32),
                );
            }
        }
    }
    let images = Tensor::f_from_slice(&pixels)
        .and_then(|t| {
            t.f_reshape([
                n_samples as i64,
                channels as i64,
                height as i64,
                width as i64,
            ])
        })
        .map_err(torch_error(OP))?;
    Dataset::new(
        "synthetic-images",
        images,
        cyclic_labels(OP, n_samples, num_classes)?,
        num_classes,
    )
}

fn cyclic_labels(op: &'static str, n_samples: usize, num_classes: usize) -> Result<Tensor> {
    let labels: Vec<i64> = (0..n_samples)
        .map(|sample| (sample % num_classes) as i64)
        .collect();
    Tensor::f_from_slice(&labels).map_err(torch_error(op))
}

fn check_positive(op: &'static str, sizes: &[(&str, usize)]) -> Result<()> {
    match sizes.iter().find(|(_, size)| *size == 0) {
        Some((name, _)) => Err(DataError::InvalidArgument {
            op,
            reason: format!("{name} must be at least 1"),
        }),
        None => Ok(()),
    }
}

fn check_finite(op: &'static str, values: &[(&str, f64)]) -> Result<()> {
    match values
        .iter()
        .find(|(_, value)| !value.is_finite() || *value < 0.0)
    {
        Some((name, value)) => Err(DataError::InvalidArgument {
            op,
            reason: format!("{name} must be finite and not negative, got {value}"),
        }),
        None => Ok(()),
    }
}

/// An empty vector with room for the product of `sizes` values, or an error
/// (rather than an abort) when that does not fit in memory.
fn allocate(op: &'static str, sizes: &[usize]) -> Result<Vec<f32>> {
    let too_big = || DataError::InvalidArgument {
        op,
        reason: format!("{sizes:?} values do not fit in memory"),
    };
    let len = sizes
        .iter()
        .try_fold(1usize, |len, &size| len.checked_mul(size))
        .ok_or_else(too_big)?;
    let mut values = Vec::new();
    values.try_reserve_exact(len).map_err(|_| too_big())?;
    Ok(values)
}
