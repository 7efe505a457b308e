//! Seeded synthetic tasks for fast tests: Gaussian blobs and small images.
//!
//! (The `tolaria-reference` benchmark task is not one of these: it is
//! [`super::reference`](mod@super::reference)'s teacher-labelled generator.)
//!
//! Both generators draw every value from one [`SplitMix64`] stream in a fixed
//! order, using only integer arithmetic, IEEE additions and multiplications,
//! so the same options give bitwise identical tensors on every machine, and a
//! different seed gives different data. Values are produced in `f64` and
//! rounded once to `f32`. Labels cycle through the classes (`label of sample
//! i = i % n_classes`), so the classes are balanced; shuffle with
//! [`Dataset::shuffled`] or [`Dataset::batches`] when order matters.
//!
//! No normalisation is applied: the values are already centred near zero with
//! a spread of order one.

use tch::Tensor;

#[cfg(doc)]
use super::DataError;
use super::limits::{
    MAX_CLASSES, MAX_GRID, MAX_SAMPLES, MAX_SYNTHETIC_SCALE, MAX_SYNTHETIC_VALUES, at_most,
    checked_product, invalid_field, reserve,
};
use super::{Dataset, Result, torch_error};
use leyline::rng::SplitMix64;

/// A Gaussian-blob classification task on feature vectors.
///
/// Generator, in the order values are drawn from `SplitMix64::new(seed)`:
/// 1. class centres, class by class, feature by feature:
///    `centre[c][f] = uniform(-centre_range, centre_range)`;
/// 2. samples in order, features in order:
///    `x[i][f] = centre[i % n_classes][f] + noise_std * normal()`, where
///    `normal()` is [`SplitMix64::normal`] (unit variance, Irwin-Hall).
///
/// With the [`BlobTaskOptions::small`] settings (16 features, centres in
/// `[-1, 1]`, noise 0.5) two centres are about 3.3 apart, over six noise
/// standard deviations, so the classes are almost always linearly separable
/// but not trivially so.
#[derive(Debug, Clone, PartialEq)]
pub struct BlobTaskOptions {
    /// Number of samples.
    pub n_samples: usize,
    /// Features per sample.
    pub n_features: usize,
    /// Number of classes.
    pub n_classes: usize,
    /// Centres are drawn uniformly from `[-centre_range, centre_range)` per feature.
    pub centre_range: f64,
    /// Standard deviation of the noise around each centre.
    pub noise_std: f64,
    /// Fixes every value.
    pub seed: u64,
}

impl BlobTaskOptions {
    /// A small task for tests of hosts and slots: 16 samples x 16 features,
    /// 4 classes (4 samples each), centres in `[-1, 1)`, noise 0.5.
    pub fn small(seed: u64) -> Self {
        Self {
            n_samples: 16,
            n_features: 16,
            n_classes: 4,
            centre_range: 1.0,
            noise_std: 0.5,
            seed,
        }
    }
}

impl BlobTaskOptions {
    /// Checks every field, with checked arithmetic, before anything is
    /// allocated: `n_samples` at most [`MAX_SAMPLES`], `n_features` at least
    /// 1, `n_classes` in `1..=`[`MAX_CLASSES`], `n_samples x n_features`
    /// and `n_classes x n_features` at most [`MAX_SYNTHETIC_VALUES`],
    /// `centre_range` and `noise_std` finite in `[0, `[`MAX_SYNTHETIC_SCALE`]`]`.
    ///
    /// # Errors
    /// [`DataError::InvalidField`] or [`DataError::TooLarge`] naming the field
    /// and its value.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "synthetic::blob_task";
        at_most(OP, "n_samples", self.n_samples, MAX_SAMPLES)?;
        check_positive(
            OP,
            &[
                ("n_features", self.n_features),
                ("n_classes", self.n_classes),
            ],
        )?;
        at_most(OP, "n_classes", self.n_classes, MAX_CLASSES)?;
        checked_product(
            OP,
            &[
                ("n_samples", self.n_samples),
                ("n_features", self.n_features),
            ],
            MAX_SYNTHETIC_VALUES,
        )?;
        checked_product(
            OP,
            &[
                ("n_classes", self.n_classes),
                ("n_features", self.n_features),
            ],
            MAX_SYNTHETIC_VALUES,
        )?;
        check_scale(
            OP,
            &[
                ("centre_range", self.centre_range),
                ("noise_std", self.noise_std),
            ],
        )
    }
}

/// A blob task (see [`BlobTaskOptions`]): images `[n_samples, n_features]`
/// `f32`, labels `[n_samples]`, named `synthetic-blobs`.
///
/// # Errors
/// As [`BlobTaskOptions::validate`], checked before anything is allocated.
pub fn blob_task(options: &BlobTaskOptions) -> Result<Dataset> {
    const OP: &str = "synthetic::blob_task";
    options.validate()?;
    let BlobTaskOptions {
        n_samples,
        n_features,
        n_classes,
        centre_range,
        noise_std,
        seed,
    } = *options;
    let mut rng = SplitMix64::new(seed);
    // Both products were checked against MAX_SYNTHETIC_VALUES by validate().
    let n_centres = checked_product(
        OP,
        &[("n_classes", n_classes), ("n_features", n_features)],
        MAX_SYNTHETIC_VALUES,
    )?;
    let n_values = checked_product(
        OP,
        &[("n_samples", n_samples), ("n_features", n_features)],
        MAX_SYNTHETIC_VALUES,
    )?;
    let mut centres: Vec<f64> = reserve(OP, "centres", n_centres)?;
    centres.extend((0..n_centres).map(|_| rng.uniform(-centre_range, centre_range)));
    let mut features: Vec<f32> = reserve(OP, "features", n_values)?;
    for centre in centres.chunks_exact(n_features).cycle().take(n_samples) {
        features.extend(
            centre
                .iter()
                .map(|&mean| (mean + noise_std * rng.normal()) as f32),
        );
    }
    let images = Tensor::f_from_slice(&features)
        .and_then(|t| t.f_reshape([n_samples as i64, n_features as i64]))
        .map_err(torch_error(OP))?;
    Dataset::new(
        "synthetic-blobs",
        images,
        cyclic_labels(OP, n_samples, n_classes)?,
        n_classes,
    )
}

/// A small image classification task with one smooth pattern per class.
///
/// Generator, in the order values are drawn from `SplitMix64::new(seed)`:
/// 1. one coarse `grid x grid` template per class and channel, class by class,
///    channel by channel, row-major: `uniform(-1, 1)`;
/// 2. samples in order, then channel, row, column: `x[i][ch][y][x] =
///    template[i % n_classes][ch][y * grid / height][x * grid / width] +
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
    pub n_classes: usize,
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
            n_classes: 10,
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
            n_classes: 10,
            grid: 4,
            noise_std: 0.5,
            seed,
        }
    }
}

impl ImageTaskOptions {
    /// Checks every field, with checked arithmetic, before anything is
    /// allocated: `n_samples` at most [`MAX_SAMPLES`]; `channels`, `height`,
    /// `width`, `n_classes` and `grid` at least 1; `n_classes` at most
    /// [`MAX_CLASSES`], `grid` at most [`MAX_GRID`]; the pixel count
    /// `n_samples x channels x height x width` and the template count
    /// `n_classes x channels x grid x grid` at most
    /// [`MAX_SYNTHETIC_VALUES`]; `noise_std` finite in
    /// `[0, `[`MAX_SYNTHETIC_SCALE`]`]`.
    ///
    /// # Errors
    /// [`DataError::InvalidField`] or [`DataError::TooLarge`] naming the field
    /// and its value.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "synthetic::image_task";
        at_most(OP, "n_samples", self.n_samples, MAX_SAMPLES)?;
        check_positive(
            OP,
            &[
                ("channels", self.channels),
                ("height", self.height),
                ("width", self.width),
                ("n_classes", self.n_classes),
                ("grid", self.grid),
            ],
        )?;
        at_most(OP, "n_classes", self.n_classes, MAX_CLASSES)?;
        at_most(OP, "grid", self.grid, MAX_GRID)?;
        checked_product(
            OP,
            &[
                ("n_samples", self.n_samples),
                ("channels", self.channels),
                ("height", self.height),
                ("width", self.width),
            ],
            MAX_SYNTHETIC_VALUES,
        )?;
        checked_product(
            OP,
            &[
                ("n_classes", self.n_classes),
                ("channels", self.channels),
                ("grid", self.grid),
                ("grid", self.grid),
            ],
            MAX_SYNTHETIC_VALUES,
        )?;
        check_scale(OP, &[("noise_std", self.noise_std)])
    }
}

/// An image task (see [`ImageTaskOptions`]): images
/// `[n_samples, channels, height, width]` `f32`, labels `[n_samples]`, named
/// `synthetic-images`.
///
/// # Errors
/// As [`ImageTaskOptions::validate`], checked before anything is allocated.
pub fn image_task(options: &ImageTaskOptions) -> Result<Dataset> {
    const OP: &str = "synthetic::image_task";
    options.validate()?;
    let ImageTaskOptions {
        n_samples,
        channels,
        height,
        width,
        n_classes,
        grid,
        noise_std,
        seed,
    } = *options;
    let mut rng = SplitMix64::new(seed);
    // Every product was checked against MAX_SYNTHETIC_VALUES by validate().
    let grid_cells = checked_product(OP, &[("grid", grid), ("grid", grid)], MAX_SYNTHETIC_VALUES)?;
    let template_len = checked_product(
        OP,
        &[("channels", channels), ("grid x grid", grid_cells)],
        MAX_SYNTHETIC_VALUES,
    )?;
    let n_template_values = checked_product(
        OP,
        &[("n_classes", n_classes), ("template", template_len)],
        MAX_SYNTHETIC_VALUES,
    )?;
    let n_pixels = checked_product(
        OP,
        &[
            ("n_samples", n_samples),
            ("channels", channels),
            ("height", height),
            ("width", width),
        ],
        MAX_SYNTHETIC_VALUES,
    )?;
    let mut templates: Vec<f64> = reserve(OP, "templates", n_template_values)?;
    templates.extend((0..n_template_values).map(|_| rng.uniform(-1.0, 1.0)));
    let mut pixels: Vec<f32> = reserve(OP, "pixels", n_pixels)?;
    // Pixel x of a row reads template cell x * grid / width (< grid), and row
    // y reads template row y * grid / height (< grid); the products stay
    // below MAX_SYNTHETIC_VALUES x MAX_GRID, far from usize::MAX.
    let cell =
        |position: usize, side: usize| position.saturating_mul(grid).checked_div(side).unwrap_or(0);
    let columns: Vec<usize> = (0..width).map(|x| cell(x, width)).collect();
    for template in templates.chunks_exact(template_len).cycle().take(n_samples) {
        for channel_rows in template.chunks_exact(grid_cells) {
            let rows: Vec<&[f64]> = channel_rows.chunks_exact(grid).collect();
            for y in 0..height {
                let row = rows.get(cell(y, height)).copied().unwrap_or_default();
                pixels.extend(columns.iter().map(|&column| {
                    let centre = row.get(column).copied().unwrap_or_default();
                    (centre + noise_std * rng.normal()) as f32
                }));
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
        cyclic_labels(OP, n_samples, n_classes)?,
        n_classes,
    )
}

fn cyclic_labels(op: &'static str, n_samples: usize, n_classes: usize) -> Result<Tensor> {
    let mut labels: Vec<i64> = reserve(op, "labels", n_samples)?;
    // Both bounded by validate(): the values fit an i64.
    labels.extend((0..n_samples).map(|sample| sample.checked_rem(n_classes).unwrap_or(0) as i64));
    Tensor::f_from_slice(&labels).map_err(torch_error(op))
}

fn check_positive(op: &'static str, sizes: &[(&str, usize)]) -> Result<()> {
    match sizes.iter().find(|(_, size)| *size == 0) {
        Some(&(name, size)) => Err(invalid_field(op, name, size, "at least 1")),
        None => Ok(()),
    }
}

/// Each value finite and in `[0, MAX_SYNTHETIC_SCALE]`, so generated values
/// stay finite `f32`s.
fn check_scale(op: &'static str, values: &[(&str, f64)]) -> Result<()> {
    match values
        .iter()
        .find(|(_, value)| !(0.0..=MAX_SYNTHETIC_SCALE).contains(value))
    {
        Some(&(name, value)) => Err(invalid_field(
            op,
            name,
            value,
            format!("a finite value in [0, {MAX_SYNTHETIC_SCALE}]"),
        )),
        None => Ok(()),
    }
}
