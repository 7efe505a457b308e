//! CIFAR-10 in its binary format (`cifar-10-batches-bin`).
//!
//! Each file is a run of 3,073-byte records: one label byte (0..10), then
//! 3,072 pixel bytes, the 32x32 red plane, then green, then blue (CHW,
//! row-major). The training set is `data_batch_1.bin` .. `data_batch_5.bin`,
//! the test set `test_batch.bin`. The project's `make_fake_cifar.py` writes a
//! learnable fake at real size in this format.
//!
//! The folder is chosen by [`Cifar10Options::dir`], else the environment
//! variable [`DIR_ENV`]; there is no default location. A folder that holds a
//! `cifar-10-batches-bin` sub-folder instead of the files is accepted too (the
//! layout of the original archive and of `make_fake_cifar.py`).
//!
//! [`parse_records`] is the pure-bytes reader (no file, no tch) the loaders
//! and fuzz targets share.

use std::path::PathBuf;

use tch::Tensor;

use super::idx::read_file;
use super::limits::{MAX_CIFAR_BYTES, invalid_field};
use super::normalisation::{Normalisation, bytes_to_normalised_f32};
use super::{DataError, Dataset, FormatError, Result, torch_error};

/// Environment variable naming the folder that holds the `.bin` files.
pub const DIR_ENV: &str = "ESPER_CIFAR10_DIR";
/// Name of the sub-folder the original archive unpacks to.
pub const BATCHES_SUBDIR: &str = "cifar-10-batches-bin";
/// Training files, in the order their samples are concatenated.
pub const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
/// Test file.
pub const TEST_FILE: &str = "test_batch.bin";
/// Number of classes.
pub const N_CLASSES: usize = 10;
/// Channels, height and width of an image.
pub const IMAGE_SHAPE: [usize; 3] = [3, 32, 32];
/// Pixel bytes per image.
pub const PIXELS_PER_IMAGE: usize = 3 * 32 * 32;
/// Bytes per record: the label byte plus the pixels.
pub const RECORD_SIZE: usize = 1 + PIXELS_PER_IMAGE;
/// Class names, indexed by label.
pub const CLASS_NAMES: [&str; N_CLASSES] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// How to load CIFAR-10.
#[derive(Debug, Clone, PartialEq)]
pub struct Cifar10Options {
    /// Folder holding the `.bin` files (or a `cifar-10-batches-bin`
    /// sub-folder with them); `None` means `$ESPER_CIFAR10_DIR`.
    pub dir: Option<PathBuf>,
    /// Applied to pixels scaled to `[0, 1]`; defaults to
    /// [`Normalisation::cifar10`]. Use [`Normalisation::identity`]`(3)` for
    /// plain `[0, 1]` pixels.
    pub normalisation: Normalisation,
}

impl Default for Cifar10Options {
    fn default() -> Self {
        Self {
            dir: None,
            normalisation: Normalisation::cifar10(),
        }
    }
}

impl Cifar10Options {
    /// Default options reading from `dir`.
    pub fn from_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
            ..Self::default()
        }
    }
}

fn hint(chosen_by: &str) -> String {
    format!(
        "{chosen_by}Point Cifar10Options::dir or {DIR_ENV} at a folder holding the CIFAR-10 binary files \
         {} and {TEST_FILE} (or their {BATCHES_SUBDIR} sub-folder); make_fake_cifar.py in the project's \
         shared tools writes a fake CIFAR-10 at real size in this format.",
        TRAIN_FILES.join(", ")
    )
}

/// The folder [`load`] reads from under `options`, and a hint that says how
/// it was chosen.
fn resolve_dir(options: &Cifar10Options) -> Result<(PathBuf, String)> {
    let (dir, hint) = if let Some(dir) = &options.dir {
        (
            dir.clone(),
            hint("This folder was chosen by Cifar10Options::dir. "),
        )
    } else {
        match std::env::var_os(DIR_ENV) {
            Some(dir) if !dir.is_empty() => (
                PathBuf::from(dir),
                hint("This folder was chosen by the environment variable ESPER_CIFAR10_DIR. "),
            ),
            _ => {
                return Err(DataError::NoDirectoryConfigured {
                    dataset: "CIFAR-10",
                    hint: hint("CIFAR-10 has no default location. "),
                });
            }
        }
    };
    if !dir.is_dir() {
        return Err(DataError::MissingDirectory { path: dir, hint });
    }
    let nested = dir.join(BATCHES_SUBDIR);
    if !dir.join(TEST_FILE).exists() && nested.is_dir() {
        return Ok((nested, hint));
    }
    Ok((dir, hint))
}

/// Loads the training (all five `data_batch_*.bin`, in order) and test
/// (`test_batch.bin`) sets, in that order.
///
/// Images are `[N, 3, 32, 32]` `f32` normalised per channel with
/// `options.normalisation`; labels are `[N]` `i64` in `0..10`. The data sets
/// are named `cifar10/train` and `cifar10/test` and live on the CPU.
///
/// # Errors
/// A [`DataError`] naming the file for no configured folder, a missing folder
/// or file, an empty file, a file whose size is not a multiple of
/// [`RECORD_SIZE`], files above [`MAX_CIFAR_BYTES`] in total, or a label of
/// 10 or more (see [`Cifar10Records::append`]).
pub fn load(options: Cifar10Options) -> Result<(Dataset, Dataset)> {
    let (dir, hint) = resolve_dir(&options)?;
    let train_paths: Vec<PathBuf> = TRAIN_FILES.iter().map(|name| dir.join(name)).collect();
    // Check every file is there before reading 150 MB.
    for path in train_paths.iter().chain([&dir.join(TEST_FILE)]) {
        if !path.is_file() {
            return Err(DataError::MissingFile {
                path: path.clone(),
                hint,
            });
        }
    }
    let train = read_batches("cifar10/train", &train_paths, &options.normalisation, &hint)?;
    let test = read_batches(
        "cifar10/test",
        &[dir.join(TEST_FILE)],
        &options.normalisation,
        &hint,
    )?;
    Ok((train, test))
}

/// Loads the records of `paths`, concatenated in order, as one data set named
/// `name` (for example a single `data_batch_1.bin`).
///
/// # Errors
/// As [`load`], for the files given.
pub fn load_files(name: &str, paths: &[PathBuf], normalisation: &Normalisation) -> Result<Dataset> {
    read_batches(
        name,
        paths,
        normalisation,
        &hint("These files were passed to cifar10::load_files. "),
    )
}

/// The records of one or more CIFAR-10 binary files, split into labels and
/// pixels.
///
/// Produced only by [`parse_records`] and [`Cifar10Records::append`], so
/// `pixels().len() == labels().len() * PIXELS_PER_IMAGE` and every label is
/// below [`N_CLASSES`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cifar10Records {
    labels: Vec<u8>,
    pixels: Vec<u8>,
}

impl Cifar10Records {
    /// No records yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// One label per record, each in `0..10`.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// The pixels of every record, `[N, 3, 32, 32]` row-major (CHW per image).
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no record.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Checks `bytes` (one file's content) and appends its records; returns
    /// how many it held. On error nothing is appended.
    ///
    /// # Errors
    /// [`FormatError::Empty`] for no bytes, [`FormatError::BadRecordSize`]
    /// when the size is not a multiple of [`RECORD_SIZE`],
    /// [`FormatError::TooLarge`] when the records held so far plus these
    /// exceed [`MAX_CIFAR_BYTES`], [`FormatError::LabelOutOfRange`] (sample
    /// index within `bytes`) for a label byte of 10 or more.
    pub fn append(&mut self, bytes: &[u8]) -> Result<usize, FormatError> {
        if bytes.is_empty() {
            return Err(FormatError::Empty);
        }
        if !bytes.len().is_multiple_of(RECORD_SIZE) {
            return Err(FormatError::BadRecordSize {
                size: bytes.len() as u64,
                record_size: RECORD_SIZE as u64,
            });
        }
        let held = self.labels.len().saturating_mul(RECORD_SIZE);
        let total = held.saturating_add(bytes.len());
        if total as u64 > MAX_CIFAR_BYTES {
            return Err(FormatError::TooLarge {
                what: "CIFAR-10 records",
                bytes: total as u128,
                limit: MAX_CIFAR_BYTES,
            });
        }
        let records = bytes.chunks_exact(RECORD_SIZE);
        if let Some((sample, &label)) = records
            .clone()
            .filter_map(|record| record.first())
            .enumerate()
            .find(|&(_, &label)| usize::from(label) >= N_CLASSES)
        {
            return Err(FormatError::LabelOutOfRange {
                sample,
                label,
                n_classes: N_CLASSES,
            });
        }
        let n_records = bytes.len().checked_div(RECORD_SIZE).unwrap_or(0);
        let too_large = || FormatError::TooLarge {
            what: "CIFAR-10 records (allocation refused)",
            bytes: total as u128,
            limit: MAX_CIFAR_BYTES,
        };
        self.labels
            .try_reserve_exact(n_records)
            .map_err(|_| too_large())?;
        self.pixels
            .try_reserve_exact(n_records.saturating_mul(PIXELS_PER_IMAGE))
            .map_err(|_| too_large())?;
        for record in records {
            if let Some((&label, pixels)) = record.split_first() {
                self.labels.push(label);
                self.pixels.extend_from_slice(pixels);
            }
        }
        Ok(n_records)
    }
}

/// Reads the records of one CIFAR-10 binary file's content (pure: no file,
/// no tch; the entry point for fuzz targets).
///
/// # Errors
/// As [`Cifar10Records::append`].
pub fn parse_records(bytes: &[u8]) -> Result<Cifar10Records, FormatError> {
    let mut records = Cifar10Records::new();
    records.append(bytes)?;
    Ok(records)
}

fn read_batches(
    name: &str,
    paths: &[PathBuf],
    normalisation: &Normalisation,
    hint: &str,
) -> Result<Dataset> {
    const OP: &str = "cifar10::load";
    let [image_channels, ..] = IMAGE_SHAPE;
    if normalisation.channels() != image_channels {
        return Err(invalid_field(
            OP,
            "normalisation.channels",
            normalisation.channels(),
            "3 (CIFAR-10 is RGB)",
        ));
    }
    let mut records = Cifar10Records::new();
    for path in paths {
        let held = records.len().saturating_mul(RECORD_SIZE) as u64;
        let file = read_file(path, MAX_CIFAR_BYTES.saturating_sub(held), hint)?;
        records.append(&file).map_err(|source| DataError::Format {
            path: path.clone(),
            source,
            hint: hint.to_string(),
        })?;
    }
    // n_samples * RECORD_SIZE <= MAX_CIFAR_BYTES, so it fits an i64.
    let n_samples = records.len() as i64;
    let labels: Vec<i64> = records
        .labels()
        .iter()
        .map(|&label| i64::from(label))
        .collect();
    let [channels, height, width] = IMAGE_SHAPE.map(|size| size as i64);
    let bytes = Tensor::f_from_slice(records.pixels())
        .and_then(|t| t.f_view([n_samples, channels, height, width]))
        .map_err(torch_error(OP))?;
    drop(records);
    let images = bytes_to_normalised_f32(&bytes, normalisation)?;
    let labels = Tensor::f_from_slice(&labels).map_err(torch_error(OP))?;
    Dataset::new(name, images, labels, N_CLASSES)
}
