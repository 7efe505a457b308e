//! Fashion-MNIST read straight from its four gzipped IDX files.
//!
//! The files come from Debian's `dataset-fashion-mnist` package (installed by
//! `cargo xtask provision`), which puts them in [`DEFAULT_DIR`]. The folder is
//! chosen by, in order: [`FashionMnistOptions::dir`], the environment
//! variable [`DIR_ENV`], then [`DEFAULT_DIR`]. Each file is inflated in
//! memory by the streaming IDX reader ([`super::idx`]: header checked first,
//! then exactly the promised bytes; nothing is unpacked on disk), the four
//! files in parallel, and turned into tensors with one copy and in-place
//! normalisation.

use std::path::{Path, PathBuf};

use tch::Tensor;

use super::idx::{self, IMAGES_MAGIC, IdxArray, LABELS_MAGIC};
use super::normalisation::{Normalisation, bytes_to_normalised_f32};
use super::{DataError, Dataset, FormatError, Result, torch_error};

/// Environment variable naming the folder that holds the four files.
pub const DIR_ENV: &str = "ESPER_FASHION_MNIST_DIR";
/// Where Debian's `dataset-fashion-mnist` package installs the files.
pub const DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";
/// Training images file name.
pub const TRAIN_IMAGES_FILE: &str = "train-images-idx3-ubyte.gz";
/// Training labels file name.
pub const TRAIN_LABELS_FILE: &str = "train-labels-idx1-ubyte.gz";
/// Test images file name.
pub const TEST_IMAGES_FILE: &str = "t10k-images-idx3-ubyte.gz";
/// Test labels file name.
pub const TEST_LABELS_FILE: &str = "t10k-labels-idx1-ubyte.gz";
/// Number of classes.
pub const N_CLASSES: usize = 10;
/// Image height and width, in pixels.
pub const IMAGE_SIDE: usize = 28;
/// Class names, indexed by label.
pub const CLASS_NAMES: [&str; N_CLASSES] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// How to load Fashion-MNIST.
#[derive(Debug, Clone, PartialEq)]
pub struct FashionMnistOptions {
    /// Folder holding the four `.gz` files; `None` means `$ESPER_FASHION_MNIST_DIR`
    /// if set, else [`DEFAULT_DIR`].
    pub dir: Option<PathBuf>,
    /// Applied to pixels scaled to `[0, 1]`; defaults to
    /// [`Normalisation::fashion_mnist`] (mean 0.2860, std 0.3530). Use
    /// [`Normalisation::identity`]`(1)` for plain `[0, 1]` pixels.
    pub normalisation: Normalisation,
}

impl Default for FashionMnistOptions {
    fn default() -> Self {
        Self {
            dir: None,
            normalisation: Normalisation::fashion_mnist(),
        }
    }
}

impl FashionMnistOptions {
    /// Default options reading from `dir`.
    pub fn from_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
            ..Self::default()
        }
    }
}

/// Where the folder came from, so that error hints say what to change.
#[derive(Debug, Clone, Copy)]
enum DirSource {
    Option,
    Environment,
    Default,
}

/// The folder the files are read from under `options`, and its source.
fn resolve_dir(options: &FashionMnistOptions) -> (PathBuf, DirSource) {
    if let Some(dir) = &options.dir {
        return (dir.clone(), DirSource::Option);
    }
    match std::env::var_os(DIR_ENV) {
        Some(dir) if !dir.is_empty() => (PathBuf::from(dir), DirSource::Environment),
        _ => (PathBuf::from(DEFAULT_DIR), DirSource::Default),
    }
}

/// The folder [`load`] reads from under `options`: `options.dir`, else
/// `$ESPER_FASHION_MNIST_DIR` (if set and not empty), else [`DEFAULT_DIR`].
pub fn data_dir(options: &FashionMnistOptions) -> PathBuf {
    resolve_dir(options).0
}

fn hint(source: DirSource) -> String {
    let chosen_by = match source {
        DirSource::Option => "FashionMnistOptions::dir",
        DirSource::Environment => "the environment variable ESPER_FASHION_MNIST_DIR",
        DirSource::Default => {
            "the default (neither FashionMnistOptions::dir nor ESPER_FASHION_MNIST_DIR is set)"
        }
    };
    format!(
        "This folder was chosen by {chosen_by}. Point FashionMnistOptions::dir or {DIR_ENV} at a folder \
         holding the original {TRAIN_IMAGES_FILE}, {TRAIN_LABELS_FILE}, {TEST_IMAGES_FILE} and \
         {TEST_LABELS_FILE}, or run `cargo xtask provision`, which installs Debian's \
         dataset-fashion-mnist package into {DEFAULT_DIR}."
    )
}

/// Loads the training (60,000) and test (10,000) sets, in that order.
///
/// Images are `[N, 1, 28, 28]` `f32` normalised with `options.normalisation`;
/// labels are `[N]` `i64` in `0..10`. The data sets are named
/// `fashion-mnist/train` and `fashion-mnist/test` and live on the CPU.
///
/// # Errors
/// A [`DataError`] naming the file for a missing folder or file, a damaged
/// gzip stream, a wrong magic number, a file shorter or longer than its
/// header promises, images that are not 28x28, image and label counts that
/// differ, or a label of 10 or more.
pub fn load(options: FashionMnistOptions) -> Result<(Dataset, Dataset)> {
    if options.normalisation.channels() != 1 {
        return Err(super::limits::invalid_field(
            "fashion_mnist::load",
            "normalisation.channels",
            options.normalisation.channels(),
            "1 (Fashion-MNIST is greyscale)",
        ));
    }
    let (dir, source) = resolve_dir(&options);
    let hint = hint(source);
    if !dir.is_dir() {
        return Err(DataError::MissingDirectory { path: dir, hint });
    }
    let read_images = |name: &str| {
        let path = dir.join(name);
        idx::read_gz(
            &path,
            IMAGES_MAGIC,
            "IDX unsigned-byte images, 3 dimensions",
            &hint,
        )
        .map(|array| (path, array))
    };
    let read_labels = |name: &str| {
        let path = dir.join(name);
        idx::read_gz(
            &path,
            LABELS_MAGIC,
            "IDX unsigned-byte labels, 1 dimension",
            &hint,
        )
        .map(|array| (path, array))
    };
    // Decompression dominates; the four files decode on four threads (in
    // the calling thread when the system refuses a new one).
    let train_images_job = || read_images(TRAIN_IMAGES_FILE);
    let train_labels_job = || read_labels(TRAIN_LABELS_FILE);
    let test_images_job = || read_images(TEST_IMAGES_FILE);
    let (train_images, train_labels, test_images, test_labels) = std::thread::scope(|scope| {
        let train_images = spawn_reader(scope, &train_images_job);
        let train_labels = spawn_reader(scope, &train_labels_job);
        let test_images = spawn_reader(scope, &test_images_job);
        let test_labels = read_labels(TEST_LABELS_FILE);
        (
            join(train_images, &train_images_job),
            join(train_labels, &train_labels_job),
            join(test_images, &test_images_job),
            test_labels,
        )
    });
    let train = to_dataset(
        "fashion-mnist/train",
        train_images?,
        train_labels?,
        &options.normalisation,
        &hint,
    )?;
    let test = to_dataset(
        "fashion-mnist/test",
        test_images?,
        test_labels?,
        &options.normalisation,
        &hint,
    )?;
    Ok((train, test))
}

/// Runs `job` on a new scoped thread; `None` when the system refuses one.
fn spawn_reader<'scope, 'env, F, T>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    job: &'env F,
) -> Option<std::thread::ScopedJoinHandle<'scope, T>>
where
    F: Fn() -> T + Sync,
    T: Send + 'scope,
{
    std::thread::Builder::new()
        .name("fashion-mnist-reader".to_string())
        .spawn_scoped(scope, job)
        .ok()
}

/// Waits for a reader thread, or runs `job` here when no thread could be
/// started. A panic of the thread is passed on unchanged (the readers do not
/// panic on bad input, so one would be a bug, not a data error).
fn join<T>(handle: Option<std::thread::ScopedJoinHandle<'_, T>>, job: &dyn Fn() -> T) -> T {
    match handle {
        Some(handle) => match handle.join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        },
        None => job(),
    }
}

/// Checks a decoded images/labels pair and builds the data set.
fn to_dataset(
    name: &str,
    (images_path, images): (PathBuf, IdxArray),
    (labels_path, labels): (PathBuf, IdxArray),
    normalisation: &Normalisation,
    hint: &str,
) -> Result<Dataset> {
    // The expected magic numbers fix the ranks to 3 and 1.
    let (&[n_images, rows, cols], &[n_labels]) = (images.dims(), labels.dims()) else {
        return Err(DataError::BadDimensions {
            path: images_path,
            expected: "rank 3 images and rank 1 labels".to_string(),
            found: format!("{:?} and {:?}", images.dims(), labels.dims()),
            hint: hint.to_string(),
        });
    };
    if rows != IMAGE_SIDE || cols != IMAGE_SIDE {
        return Err(DataError::BadDimensions {
            path: images_path,
            expected: format!("{IMAGE_SIDE}x{IMAGE_SIDE} pixels"),
            found: format!("{rows}x{cols} pixels"),
            hint: hint.to_string(),
        });
    }
    if n_images != n_labels {
        return Err(DataError::CountMismatch {
            images_path,
            images: n_images,
            labels_path,
            labels: n_labels,
            hint: hint.to_string(),
        });
    }
    let label_values = checked_labels(&labels_path, labels.values(), hint)?;
    const OP: &str = "fashion_mnist::load";
    // n_images * 784 <= MAX_IDX_BYTES, so it fits an i64.
    let side = IMAGE_SIDE as i64;
    let bytes = Tensor::f_from_slice(images.values())
        .and_then(|t| t.f_reshape([n_images as i64, 1, side, side]))
        .map_err(torch_error(OP))?;
    drop(images);
    let pixels = bytes_to_normalised_f32(&bytes, normalisation)?;
    let labels = Tensor::f_from_slice(&label_values).map_err(torch_error(OP))?;
    Dataset::new(name, pixels, labels, N_CLASSES)
}

/// The labels as `i64`, after checking each is below [`N_CLASSES`].
fn checked_labels(path: &Path, values: &[u8], hint: &str) -> Result<Vec<i64>> {
    if let Some((sample, &label)) = values
        .iter()
        .enumerate()
        .find(|&(_, &label)| label as usize >= N_CLASSES)
    {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            source: FormatError::LabelOutOfRange {
                sample,
                label,
                n_classes: N_CLASSES,
            },
            hint: hint.to_string(),
        });
    }
    Ok(values.iter().map(|&label| i64::from(label)).collect())
}
