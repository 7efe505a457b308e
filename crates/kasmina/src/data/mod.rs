//! Data sets: Fashion-MNIST, CIFAR-10 binary, seeded synthetic tasks.
//!
//! Every loader returns in-memory [`Dataset`]s: `images` as an `f32` tensor of
//! shape `[N, C, H, W]` (or `[N, F]` for the tabular reference task) with the
//! data set's normalisation already applied, and `labels` as an `i64` tensor of
//! shape `[N]`. A [`Dataset`] can be shuffled, split and cut into batches with
//! seeded, device-independent permutations ([`shuffle`]).
//!
//! - [`fashion_mnist`]: the four gzipped IDX files of Debian's
//!   `dataset-fashion-mnist` package, read with flate2 (nothing is unpacked).
//! - [`cifar10`]: the CIFAR-10 binary format (`data_batch_1..5.bin`,
//!   `test_batch.bin`).
//! - [`synthetic`]: seeded tasks for the `tolaria-reference` workload and for
//!   fast CNN tests.
//! - [`normalisation`]: the per-data-set mean and standard deviation.
//!
//! Problems with files are reported as [`DataError`]s that name the file and
//! say what to do about it.

pub mod cifar10;
mod dataset;
pub mod fashion_mnist;
mod idx;
pub mod normalisation;
pub mod shuffle;
pub mod synthetic;

use std::path::PathBuf;

pub use dataset::{Batches, Dataset, SplitSize};
pub use normalisation::Normalisation;

/// Result alias of the data layer.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// Why a data set could not be loaded or a [`Dataset`] operation failed.
///
/// Every variant about a file carries the file's `path` and a `hint`: a full
/// sentence telling the user how to point the loader at good files (which
/// option or environment variable, and how to install them).
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The data set's folder does not exist.
    #[error("data folder {} does not exist. {hint}", path.display())]
    MissingDirectory {
        /// The folder that was looked for.
        path: PathBuf,
        /// What to do about it.
        hint: String,
    },
    /// No folder was configured and the data set has no default location.
    #[error("no folder configured for {dataset}. {hint}")]
    NoDirectoryConfigured {
        /// Name of the data set.
        dataset: &'static str,
        /// What to do about it.
        hint: String,
    },
    /// A file the data set needs is not in its folder.
    #[error("data file {} does not exist. {hint}", path.display())]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
        /// What to do about it.
        hint: String,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}. {hint}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
        /// What to do about it.
        hint: String,
    },
    /// A gzip stream is damaged, cut short or not gzip at all.
    #[error("cannot decompress {} (damaged, cut short or not a gzip file): {source}. {hint}", path.display())]
    Decompress {
        /// The file.
        path: PathBuf,
        /// The decoder's error.
        source: std::io::Error,
        /// What to do about it.
        hint: String,
    },
    /// An IDX file starts with the wrong magic number.
    #[error(
        "wrong magic number in {}: expected {expected:#010x} ({what}), found {found:#010x}. {hint}",
        path.display()
    )]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The magic number the file should start with.
        expected: u32,
        /// The magic number it starts with.
        found: u32,
        /// What the expected magic number stands for.
        what: &'static str,
        /// What to do about it.
        hint: String,
    },
    /// A file holds fewer bytes than its header (or the format) promises.
    #[error(
        "{} is truncated: its header promises {expected_bytes} bytes of (decompressed) content, the file holds {found_bytes}. {hint}",
        path.display()
    )]
    Truncated {
        /// The file (decompressed content for gzipped files).
        path: PathBuf,
        /// Bytes the header promises, header included.
        expected_bytes: u64,
        /// Bytes present.
        found_bytes: u64,
        /// What to do about it.
        hint: String,
    },
    /// A file holds more bytes than its header promises.
    #[error(
        "{} has trailing data: its header promises {expected_bytes} bytes of (decompressed) content, the file holds {found_bytes}. {hint}",
        path.display()
    )]
    TrailingData {
        /// The file (decompressed content for gzipped files).
        path: PathBuf,
        /// Bytes the header promises, header included.
        expected_bytes: u64,
        /// Bytes present.
        found_bytes: u64,
        /// What to do about it.
        hint: String,
    },
    /// A label is not a valid class index.
    #[error(
        "label {label} of sample {sample} in {} is out of range (the data set has {num_classes} classes, labels 0..{num_classes}). {hint}",
        path.display()
    )]
    LabelOutOfRange {
        /// The file.
        path: PathBuf,
        /// Index of the sample (within the file).
        sample: usize,
        /// The label found.
        label: u8,
        /// Number of classes of the data set.
        num_classes: usize,
        /// What to do about it.
        hint: String,
    },
    /// The images in a file do not have the data set's dimensions.
    #[error("{} holds images of {found}, expected {expected}. {hint}", path.display())]
    BadDimensions {
        /// The file.
        path: PathBuf,
        /// Dimensions the data set uses, e.g. `28x28`.
        expected: String,
        /// Dimensions the file declares.
        found: String,
        /// What to do about it.
        hint: String,
    },
    /// A CIFAR-10 binary file's size is not a whole number of records.
    #[error(
        "{} holds {size} bytes, which is not a multiple of the {record_size}-byte CIFAR-10 record (1 label byte + 3072 pixel bytes). {hint}",
        path.display()
    )]
    BadRecordSize {
        /// The file.
        path: PathBuf,
        /// The file's size in bytes.
        size: u64,
        /// Size of one record.
        record_size: u64,
        /// What to do about it.
        hint: String,
    },
    /// An images file and its labels file disagree on the number of samples.
    #[error(
        "{} holds {images} images but {} holds {labels} labels. {hint}",
        images_path.display(),
        labels_path.display()
    )]
    CountMismatch {
        /// The images file.
        images_path: PathBuf,
        /// Number of images it holds.
        images: usize,
        /// The labels file.
        labels_path: PathBuf,
        /// Number of labels it holds.
        labels: usize,
        /// What to do about it.
        hint: String,
    },
    /// A caller passed an argument the operation cannot use.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The operation, e.g. `Dataset::split`.
        op: &'static str,
        /// What is wrong with the argument.
        reason: String,
    },
    /// A libtorch operation failed.
    #[error("{op}: torch: {source}")]
    Torch {
        /// The operation, e.g. `Dataset::batches`.
        op: &'static str,
        /// libtorch's error.
        source: tch::TchError,
    },
}

/// Wraps a tch error with the name of the data-layer operation that hit it.
pub(crate) fn torch_error(op: &'static str) -> impl FnOnce(tch::TchError) -> DataError {
    move |source| DataError::Torch { op, source }
}
