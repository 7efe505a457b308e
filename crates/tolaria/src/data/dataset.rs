//! The in-memory [`Dataset`]: shuffle, split, select and batch.
//!
//! Orders come from [`super::shuffle::permutation`], computed on the host, so
//! a seed gives the same order on every device. Unshuffled batches are views
//! (`narrow`); shuffled ones are gathered with `index_select`.

use tch::{Device, Kind, Tensor};

use super::batches::Batches;
use super::limits::{MAX_CLASSES, MAX_SAMPLES, at_most, invalid_field};
use super::shuffle::permutation;
use super::{DataError, Result, torch_error};

mod checks;
mod sequences;

use checks::{check_finite, check_labels};

/// How many samples go to the first part of [`Dataset::split`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SplitSize {
    /// A fraction in `[0, 1]` of the samples, rounded to the nearest count.
    Fraction(f64),
    /// An exact number of samples, at most the data set's length.
    Count(usize),
}

/// Samples and labels held in memory, on one device.
///
/// # Shapes
/// - `images`: `[N, C, H, W]` for image data sets, `[N, F]` for tabular
///   tasks (the `tolaria-reference` task among them); `f32`, already
///   normalised. For a language model ([`Dataset::sequences`]): `[N, T]`
///   token ids, `i64`.
/// - `labels`: `[N]`, `i64`, each in `0..n_classes`; for a language model
///   `[N, T]`, the next token at every position, each in `0..vocabulary`
///   (`n_classes` is then the vocabulary's size).
#[derive(Debug)]
pub struct Dataset {
    name: String,
    images: Tensor,
    labels: Tensor,
    n_classes: usize,
}

impl Dataset {
    /// Builds a data set after checking its inputs.
    ///
    /// `n_classes` must lie in `1..=`[`MAX_CLASSES`]; `images` must have
    /// a leading sample dimension of at most [`MAX_SAMPLES`] samples;
    /// `labels` must be a 1-D `i64` tensor with one label per sample, on the
    /// same device as `images`, each in `0..n_classes`; floating-point
    /// images must be finite. This reads the labels' range and the images'
    /// finiteness back (once, here; derived data sets are not re-checked).
    ///
    /// # Errors
    /// [`DataError::InvalidField`] for `n_classes`, the images' rank or the
    /// labels' shape and kind, or a device mismatch;
    /// [`DataError::TooLarge`] above [`MAX_SAMPLES`];
    /// [`DataError::LengthMismatch`] when samples and labels differ in
    /// number; [`DataError::LabelOutOfRange`] naming the first bad sample and
    /// its label; [`DataError::NonFiniteValue`] naming the first sample that
    /// holds NaN or an infinity; [`DataError::ValueOutOfRange`] naming the
    /// first value of wider-than-f32 images (f64) beyond f32's range, which
    /// staging as f32 would turn into an infinity.
    pub fn new(
        name: impl Into<String>,
        images: Tensor,
        labels: Tensor,
        n_classes: usize,
    ) -> Result<Self> {
        const OP: &str = "Dataset::new";
        let name = name.into();
        if n_classes == 0 || n_classes > MAX_CLASSES {
            return Err(invalid_field(
                OP,
                "n_classes",
                n_classes,
                format!("1..={MAX_CLASSES}"),
            ));
        }
        if !images.defined() || !labels.defined() {
            return Err(invalid_field(
                OP,
                "images, labels",
                (images.defined(), labels.defined()),
                "defined tensors",
            ));
        }
        let image_shape = images.size();
        let Some(&n_images) = image_shape.first() else {
            return Err(invalid_field(
                OP,
                "images.shape",
                image_shape,
                "a leading sample dimension",
            ));
        };
        let label_kind = labels.f_kind().map_err(torch_error(OP))?;
        let label_shape = labels.size();
        let (&[n_labels], Kind::Int64) = (label_shape.as_slice(), label_kind) else {
            return Err(invalid_field(
                OP,
                "labels",
                (label_shape, label_kind),
                "a 1-D Int64 tensor",
            ));
        };
        if n_images != n_labels {
            return Err(DataError::LengthMismatch {
                dataset: name,
                samples: n_images,
                labels: n_labels,
            });
        }
        at_most(
            OP,
            "samples",
            usize::try_from(n_labels).unwrap_or(usize::MAX),
            MAX_SAMPLES,
        )?;
        if images.device() != labels.device() {
            return Err(invalid_field(
                OP,
                "labels.device",
                labels.device(),
                format!("the images' device {:?}", images.device()),
            ));
        }
        check_labels(&name, &labels, n_classes)?;
        check_finite(&name, &images)?;
        Ok(Self {
            name,
            images,
            labels,
            n_classes,
        })
    }

    /// A tabular data set from host values: `features` row-major
    /// `[labels.len(), n_features]`, one label per sample, each in
    /// `0..n_classes`. The tensors are built on the CPU and then checked by
    /// [`Dataset::new`].
    ///
    /// # Errors
    /// [`DataError::InvalidField`] for an `n_features` of 0 or above
    /// `i64::MAX`, or `features` whose length is not `labels.len() x
    /// n_features` (checked arithmetic); [`DataError::TooLarge`] above
    /// [`MAX_SAMPLES`] samples; then [`Dataset::new`]'s errors (classes,
    /// label range, finiteness).
    pub fn from_rows(
        name: impl Into<String>,
        features: &[f32],
        labels: &[i64],
        n_features: usize,
        n_classes: usize,
    ) -> Result<Self> {
        const OP: &str = "Dataset::from_rows";
        let columns = i64::try_from(n_features)
            .ok()
            .filter(|&columns| columns > 0)
            .ok_or_else(|| invalid_field(OP, "n_features", n_features, "1..=i64::MAX"))?;
        at_most(OP, "samples", labels.len(), MAX_SAMPLES)?;
        if labels.len().checked_mul(n_features) != Some(features.len()) {
            return Err(invalid_field(
                OP,
                "features",
                features.len(),
                format!("{} labels x {n_features} features values", labels.len()),
            ));
        }
        // At most MAX_SAMPLES rows: the count fits an i64.
        let rows = i64::try_from(labels.len()).unwrap_or(i64::MAX);
        let images = Tensor::f_from_slice(features)
            .and_then(|t| t.f_reshape([rows, columns]))
            .map_err(torch_error(OP))?;
        let labels = Tensor::f_from_slice(labels).map_err(torch_error(OP))?;
        Self::new(name, images, labels, n_classes)
    }

    /// Every sample's values as `f32`, flattened row-major, copied to host
    /// memory. A readback: for staging and tests, never inside an epoch.
    pub fn features_to_vec(&self) -> Result<Vec<f32>> {
        const OP: &str = "Dataset::features_to_vec";
        self.images
            .f_to_kind(Kind::Float)
            .and_then(|t| t.f_to_device(Device::Cpu))
            .and_then(|t| t.f_flatten(0, -1))
            .and_then(|t| Vec::<f32>::try_from(&t))
            .map_err(torch_error(OP))
    }

    /// The labels copied to host memory (each in `0..n_classes`). A
    /// readback: for staging and tests, never inside an epoch.
    pub fn labels_to_vec(&self) -> Result<Vec<i64>> {
        const OP: &str = "Dataset::labels_to_vec";
        self.labels
            .f_to_device(Device::Cpu)
            .and_then(|t| Vec::<i64>::try_from(&t))
            .map_err(torch_error(OP))
    }

    /// A data set made of parts already known to be consistent (derived from
    /// a checked one by selection, slicing or a device move).
    fn derived(&self, name: String, images: Tensor, labels: Tensor) -> Self {
        Self {
            name,
            images,
            labels,
            n_classes: self.n_classes,
        }
    }

    /// The data set's name, e.g. `fashion-mnist/train`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same data under another name (tensors shared, not copied).
    pub fn with_name(self, name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..self
        }
    }

    /// The samples, `[N, ...]` `f32`.
    pub fn images(&self) -> &Tensor {
        &self.images
    }

    /// The labels, `[N]` `i64`.
    pub fn labels(&self) -> &Tensor {
        &self.labels
    }

    /// Number of classes (labels lie in `0..n_classes`).
    pub fn n_classes(&self) -> usize {
        self.n_classes
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        // Checked at construction: a 1-D tensor of at most MAX_SAMPLES.
        self.labels
            .size()
            .first()
            .map_or(0, |&n| usize::try_from(n).unwrap_or(0))
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shape of one sample, e.g. `[1, 28, 28]`.
    pub fn sample_shape(&self) -> Vec<i64> {
        self.images.size().get(1..).unwrap_or_default().to_vec()
    }

    /// The device holding the tensors.
    pub fn device(&self) -> Device {
        self.images.device()
    }

    /// Another handle on the same tensors (no copy).
    pub fn shallow_clone(&self) -> Self {
        self.derived(
            self.name.clone(),
            self.images.shallow_clone(),
            self.labels.shallow_clone(),
        )
    }

    /// The samples at `indices`, in that order (copied with `index_select`).
    /// Every index must lie in `0..len()`; repeats are allowed.
    pub fn select(&self, indices: &[i64]) -> Result<Self> {
        const OP: &str = "Dataset::select";
        let n = self.len() as i64;
        if let Some(bad) = indices.iter().find(|&&i| i < 0 || i >= n) {
            return Err(DataError::InvalidArgument {
                op: OP,
                reason: format!("index {bad} is outside 0..{n} of {}", self.name),
            });
        }
        let index = Tensor::f_from_slice(indices)
            .and_then(|t| t.f_to_device(self.device()))
            .map_err(torch_error(OP))?;
        self.gather(OP, self.name.clone(), &index)
    }

    fn gather(&self, op: &'static str, name: String, index: &Tensor) -> Result<Self> {
        let images = self
            .images
            .f_index_select(0, index)
            .map_err(torch_error(op))?;
        let labels = self
            .labels
            .f_index_select(0, index)
            .map_err(torch_error(op))?;
        Ok(self.derived(name, images, labels))
    }

    /// Samples `start..start + len` as views on the same storage (no copy).
    pub fn slice(&self, start: usize, len: usize) -> Result<Self> {
        const OP: &str = "Dataset::slice";
        if start.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(DataError::InvalidArgument {
                op: OP,
                reason: format!(
                    "{start}..{start}+{len} is outside 0..{} of {}",
                    self.len(),
                    self.name
                ),
            });
        }
        let images = self
            .images
            .f_narrow(0, start as i64, len as i64)
            .map_err(torch_error(OP))?;
        let labels = self
            .labels
            .f_narrow(0, start as i64, len as i64)
            .map_err(torch_error(OP))?;
        Ok(self.derived(self.name.clone(), images, labels))
    }

    /// All samples in the order of [`permutation`]`(len, seed)`.
    pub fn shuffled(&self, seed: u64) -> Result<Self> {
        self.select(&permutation(self.len(), seed)?)
    }

    /// Splits into two disjoint parts that together hold every sample once.
    ///
    /// The first part gets `size` samples. With `seed = Some(s)` the samples
    /// are dealt in the order of [`permutation`]`(len, s)` (so each part is a
    /// random subset, itself in random order); with `None` the first part is
    /// the leading samples and the second the rest, both views (no copy).
    /// The parts are named `<name>/first` and `<name>/second`.
    pub fn split(&self, size: SplitSize, seed: Option<u64>) -> Result<(Self, Self)> {
        const OP: &str = "Dataset::split";
        let n = self.len();
        let first_len = match size {
            SplitSize::Fraction(fraction) if (0.0..=1.0).contains(&fraction) => {
                // In [0, n]: the product of a fraction in [0, 1] and n.
                ((fraction * n as f64).round() as usize).min(n)
            }
            SplitSize::Count(count) if count <= n => count,
            _ => {
                return Err(invalid_field(
                    OP,
                    "size",
                    size,
                    format!(
                        "a fraction in [0, 1] or a count up to the {n} samples of {}",
                        self.name
                    ),
                ));
            }
        };
        let (first_name, second_name) = (
            format!("{}/first", self.name),
            format!("{}/second", self.name),
        );
        match seed {
            None => {
                let first = self.slice(0, first_len)?.with_name(first_name);
                let second = self
                    .slice(first_len, n.saturating_sub(first_len))?
                    .with_name(second_name);
                Ok((first, second))
            }
            Some(seed) => {
                let order = permutation(n, seed)?;
                let (head, tail) = order.split_at_checked(first_len).unwrap_or((&order, &[]));
                let first = self.select(head)?.with_name(first_name);
                let second = self.select(tail)?.with_name(second_name);
                Ok((first, second))
            }
        }
    }

    /// One epoch of `(images, labels)` batches of `batch_size` samples.
    ///
    /// With `shuffle_seed = Some(s)` the epoch visits the samples in the order
    /// of [`permutation`]`(len, s)` (pass a new seed each epoch, e.g. from
    /// [`super::shuffle::epoch_seed`]); with `None` it visits them in stored
    /// order and the batches are views. Every sample appears exactly once per
    /// epoch, except that with `drop_last` a final batch smaller than
    /// `batch_size` is skipped. The permutation is uploaded to the data set's
    /// device once per epoch, not once per batch.
    pub fn batches(
        &self,
        batch_size: usize,
        shuffle_seed: Option<u64>,
        drop_last: bool,
    ) -> Result<Batches> {
        const OP: &str = "Dataset::batches";
        if batch_size == 0 {
            return Err(invalid_field(OP, "batch_size", batch_size, "at least 1"));
        }
        let n = self.len();
        let order = match shuffle_seed {
            None => None,
            Some(seed) => Some(
                Tensor::f_from_slice(&permutation(n, seed)?)
                    .and_then(|t| t.f_to_device(self.device()))
                    .map_err(torch_error(OP))?,
            ),
        };
        Ok(Batches::new(
            self.images.shallow_clone(),
            self.labels.shallow_clone(),
            order,
            batch_size,
            drop_last,
        ))
    }

    /// The data set on `device` (a copy unless it is already there).
    pub fn to_device(&self, device: Device) -> Result<Self> {
        const OP: &str = "Dataset::to_device";
        let images = self.images.f_to_device(device).map_err(torch_error(OP))?;
        let labels = self.labels.f_to_device(device).map_err(torch_error(OP))?;
        Ok(self.derived(self.name.clone(), images, labels))
    }

    /// The data set in page-locked host memory, so copies to a CUDA device can
    /// be asynchronous.
    ///
    /// Pinning only means something with CUDA: when no CUDA device is
    /// available, or the data already lives on a CUDA device, this returns
    /// the data set unchanged (a shallow clone) rather than failing, so the
    /// same code runs on CPU-only machines. "Available" is
    /// [`torch_ext::cuda::is_available`], which also loads libtorch's CUDA
    /// backend.
    ///
    /// The memory belongs to the current CUDA device
    /// ([`torch_ext::memory::pin`]), so a process working on another GPU
    /// than GPU 0 never touches GPU 0.
    pub fn pin_memory(&self) -> Result<Self> {
        const OP: &str = "Dataset::pin_memory";
        if !torch_ext::cuda::is_available() || self.device() != Device::Cpu {
            return Ok(self.shallow_clone());
        }
        let pin_error = |error: torch_ext::Error| DataError::Torch {
            op: OP,
            source: tch::TchError::Torch(error.to_string()),
        };
        let images = torch_ext::memory::pin(&self.images).map_err(pin_error)?;
        let labels = torch_ext::memory::pin(&self.labels).map_err(pin_error)?;
        Ok(self.derived(self.name.clone(), images, labels))
    }

    /// Whether the tensors are in page-locked host memory (always `false`
    /// without CUDA).
    pub fn is_pinned(&self) -> bool {
        torch_ext::cuda::is_available()
            && self.device() == Device::Cpu
            && torch_ext::memory::is_pinned(&self.images)
    }

    /// Number of samples of each class, indexed by class (for sequences:
    /// of each token among the targets).
    pub fn class_counts(&self) -> Result<Vec<usize>> {
        const OP: &str = "Dataset::class_counts";
        let counts = self
            .labels
            .f_reshape([-1])
            .and_then(|flat| flat.f_bincount::<Tensor>(None, self.n_classes as i64))
            .and_then(|t| t.f_to_device(Device::Cpu))
            .and_then(|t| Vec::<i64>::try_from(&t))
            .map_err(torch_error(OP))?;
        // bincount counts are non-negative.
        Ok(counts
            .into_iter()
            .map(|count| usize::try_from(count).unwrap_or(0))
            .collect())
    }
}
