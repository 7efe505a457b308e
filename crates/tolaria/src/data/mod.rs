//! Data sets, the trainer side's: every data set the workspace trains on is
//! read, generated, split, shuffled and staged here (Kasmina, the model side,
//! holds none).
//!
//! Every loader returns in-memory [`Dataset`]s: `images` as an `f32` tensor of
//! shape `[N, C, H, W]` (or `[N, F]` for tabular tasks) with the data set's
//! normalisation already applied, and `labels` as an `i64` tensor of shape
//! `[N]`. A [`Dataset`] can be shuffled, split and cut into batches with
//! seeded, device-independent permutations ([`shuffle`]).
//!
//! - [`fashion_mnist`]: the four gzipped IDX files of Debian's
//!   `dataset-fashion-mnist` package, read with flate2 (nothing is unpacked).
//! - [`cifar10`]: the CIFAR-10 binary format (`data_batch_1..5.bin`,
//!   `test_batch.bin`).
//! - [`reference`](mod@reference): the `tolaria-reference` task (Box-Muller inputs labelled
//!   by a random linear teacher, mirrored bit for bit by the Python peer) and
//!   its packed microbatch layout, the staging format of the special
//!   reference trainer (`tolaria::reference`).
//! - [`synthetic`]: seeded blob and image tasks for fast tests.
//! - [`text`]: a language model's windows of byte tokens, from Debian's
//!   `fortunes` corpus or a seeded synthetic text ([`Dataset::sequences`]).
//! - [`normalisation`]: the per-data-set mean and standard deviation.
//! - [`shuffle`]: seeded permutations and epoch seeds, drawn from
//!   leyline's SplitMix64 stream ([`leyline::rng`]).
//!
//! - [`idx`] and [`cifar10::parse_records`]: the pure-bytes readers (no
//!   file, no tch), usable from fuzz targets; they fail with a [`FormatError`].
//! - [`limits`]: the stated upper bounds every size is checked against before
//!   anything is allocated.
//!
//! Problems with files are reported as [`DataError`]s that name the file and
//! say what to do about it. Every constructor and loader validates what enters
//! (sizes with checked arithmetic against [`limits`], finiteness of floats,
//! label ranges) and returns a typed error naming the field and the value;
//! nothing in this module panics on bad input. The crate's
//! [`crate::Error::Data`] carries a [`DataError`] upwards.

// Sizes here come from callers and files: every integer operation is checked,
// saturating or explicitly justified.
#![warn(clippy::arithmetic_side_effects)]

mod batches;
pub mod cifar10;
mod dataset;
pub mod fashion_mnist;
mod format;
pub mod idx;
pub mod limits;
pub mod normalisation;
pub mod reference;
pub mod shuffle;
pub mod synthetic;
pub mod text;

use std::path::PathBuf;

pub use batches::Batches;
pub use dataset::{Dataset, SplitSize};
pub use format::FormatError;
pub use normalisation::Normalisation;
pub use reference::{
    MicrobatchSpan, PackedEpoch, REFERENCE_TASK_NAME, ReferenceData, ReferenceTask, pack_epoch,
    packed_len, tabular_features,
};

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
    /// A file's content breaks its format: see [`FormatError`] for what the
    /// pure-bytes readers check (magic number, element type, rank, empty or
    /// oversized dimensions, cut-short or trailing content, record size,
    /// labels).
    #[error("{}: {source}. {hint}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with its content.
        source: FormatError,
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
    /// A configuration value or argument is outside its allowed range.
    #[error("{op}: {field} = {value} is invalid: expected {expected}")]
    InvalidField {
        /// The operation or constructor that checked it, e.g. `Normalisation::new`.
        op: &'static str,
        /// The field, e.g. `std[0]` or `batch_size`.
        field: String,
        /// The offending value, as written by `Debug`.
        value: String,
        /// What the field accepts.
        expected: String,
    },
    /// A size (or a product of sizes) is above the data layer's stated bound
    /// (see [`limits`]); nothing was allocated.
    #[error("{op}: {what} is above the bound of {limit}")]
    TooLarge {
        /// The operation that checked it.
        op: &'static str,
        /// The size and how it was computed, e.g. `n_samples x n_features = 4 x 18446744073709551615`.
        what: String,
        /// The bound ([`limits`]).
        limit: u64,
    },
    /// A data set's images and labels hold different numbers of samples.
    #[error("data set {dataset}: {samples} samples but {labels} labels")]
    LengthMismatch {
        /// The data set's name.
        dataset: String,
        /// Samples in the images tensor.
        samples: i64,
        /// Entries in the labels tensor.
        labels: i64,
    },
    /// A label is not a class index of the data set.
    #[error("data set {dataset}: label {label} of sample {index} is outside 0..{n_classes}")]
    LabelOutOfRange {
        /// The data set's name.
        dataset: String,
        /// Index of the first offending sample.
        index: usize,
        /// Its label.
        label: i64,
        /// Number of classes of the data set.
        n_classes: usize,
    },
    /// A data set's sample values hold NaN or an infinity.
    #[error(
        "data set {dataset}: value {value} at sample {sample} (element {element}) is not finite"
    )]
    NonFiniteValue {
        /// The data set's name.
        dataset: String,
        /// Index of the first sample holding a non-finite value.
        sample: usize,
        /// Flat index of that value within the sample.
        element: usize,
        /// The value.
        value: f64,
    },
    /// A data set's sample values are finite but beyond the range of `f32`,
    /// the precision every data set is staged in: they would become
    /// infinities when staged.
    #[error(
        "data set {dataset}: value {value:e} at sample {sample} (element {element}) is beyond \
         f32's range (|x| <= {limit:e}) and would become infinite when staged as f32"
    )]
    ValueOutOfRange {
        /// The data set's name.
        dataset: String,
        /// Index of the first sample holding such a value.
        sample: usize,
        /// Flat index of that value within the sample.
        element: usize,
        /// The value.
        value: f64,
        /// The largest magnitude accepted (`f32::MAX`).
        limit: f64,
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
