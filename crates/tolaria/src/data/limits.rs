//! The data layer's stated upper bounds, and the checked size arithmetic
//! that enforces them before anything is allocated.
//!
//! Every size that comes from a caller or a file (sample counts, features,
//! classes, image sides, IDX dimensions, file sizes) is multiplied with
//! checked arithmetic and compared with one of these bounds first, so absurd
//! values give [`DataError::TooLarge`] (or [`super::FormatError::TooLarge`])
//! in debug and release builds alike, instead of wrapping, panicking or
//! aborting the process on a failed allocation.

use super::{DataError, Result};

// The size arithmetic below (e.g. a pixel row times a grid side) relies on
// 64-bit `usize`, the only width libtorch ships for.
const _: () = assert!(usize::BITS >= 64, "the data layer assumes a 64-bit usize");

/// Largest IDX payload (values after the header) read, in bytes: 1 GiB
/// (Fashion-MNIST's training images are 47 MB).
pub const MAX_IDX_BYTES: u64 = 1 << 30;
/// Largest IDX rank read (the MNIST family uses 1 and 3).
pub const MAX_IDX_RANK: u8 = 4;
/// Largest gzipped IDX file read: [`MAX_IDX_BYTES`] plus 1 MiB for deflate's
/// worst-case overhead on incompressible data.
pub const MAX_GZ_FILE_BYTES: u64 = MAX_IDX_BYTES + (1 << 20);
/// Trailing bytes read past an IDX payload to report [`super::FormatError::TrailingData`];
/// a stream going on beyond that is not inflated further.
pub const TRAILING_PROBE_BYTES: u64 = 4096;
/// The part of a promised IDX payload reserved up front (64 MiB); beyond it
/// the buffer grows with what the stream actually delivers, so a header that
/// lies costs at most this much.
pub const IDX_RESERVE_BYTES: u64 = 64 << 20;
/// Largest total size of the CIFAR-10 files of one data set: 1 GiB (the
/// training set is 154 MB).
pub const MAX_CIFAR_BYTES: u64 = 1 << 30;
/// Largest number of samples of a data set, a permutation or a synthetic task.
pub const MAX_SAMPLES: usize = 1 << 30;
/// Largest number of classes.
pub const MAX_CLASSES: usize = 1 << 20;
/// Largest number of channels of a [`super::Normalisation`].
pub const MAX_CHANNELS: usize = 1024;
/// Largest number of `f32` values a synthetic generator produces (1 GiB).
pub const MAX_SYNTHETIC_VALUES: usize = 1 << 28;
/// Largest packed buffer of the reference task's layout (one training or
/// validation set, [`super::pack_epoch`]), in `f32`s: 1 GiB.
pub const MAX_PACKED_VALUES: usize = 1 << 28;
/// Largest centre range and noise standard deviation of a synthetic task,
/// so every generated value is a finite `f32`.
pub const MAX_SYNTHETIC_SCALE: f64 = 1e6;
/// Largest template grid side of [`super::synthetic::ImageTaskOptions`].
pub const MAX_GRID: usize = 256;

/// The product of `sizes` (named, for the message), or
/// [`DataError::TooLarge`] when it overflows or exceeds `limit`.
pub(crate) fn checked_product(
    op: &'static str,
    sizes: &[(&str, usize)],
    limit: usize,
) -> Result<usize> {
    // A zero factor must not hide a huge one (0 samples of width 2^60 still
    // sizes per-row buffers by the width): the bound applies to the product
    // of the factors with zeros counted as one.
    let bounded = sizes.iter().try_fold(1usize, |product, &(_, size)| {
        product.checked_mul(size.max(1))
    });
    let product = sizes
        .iter()
        .try_fold(1usize, |product, &(_, size)| product.checked_mul(size));
    match (bounded, product) {
        (Some(bounded), Some(product)) if bounded <= limit => Ok(product),
        (bounded, _) => {
            let names: Vec<&str> = sizes.iter().map(|&(name, _)| name).collect();
            let values: Vec<String> = sizes.iter().map(|&(_, size)| size.to_string()).collect();
            let value = bounded.map_or_else(
                || "more than usize::MAX".to_owned(),
                |p| format!("{p} (zeros counted as 1)"),
            );
            Err(DataError::TooLarge {
                op,
                what: format!("{} = {} = {value}", names.join(" x "), values.join(" x ")),
                limit: limit as u64,
            })
        }
    }
}

/// `size`, or [`DataError::TooLarge`] naming `field` when it exceeds `limit`.
pub(crate) fn at_most(op: &'static str, field: &str, size: usize, limit: usize) -> Result<usize> {
    if size <= limit {
        Ok(size)
    } else {
        Err(DataError::TooLarge {
            op,
            what: format!("{field} = {size}"),
            limit: limit as u64,
        })
    }
}

/// An empty vector with room for exactly `len` values (`len` already
/// checked against a bound), or [`DataError::TooLarge`] when the allocator
/// refuses.
pub(crate) fn reserve<T>(op: &'static str, what: &str, len: usize) -> Result<Vec<T>> {
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|_| DataError::TooLarge {
            op,
            what: format!("{what}: {len} values (allocation refused)"),
            limit: len as u64,
        })?;
    Ok(values)
}

/// [`DataError::InvalidField`] for `field = value` under `op`.
pub(crate) fn invalid_field(
    op: &'static str,
    field: impl Into<String>,
    value: impl std::fmt::Debug,
    expected: impl Into<String>,
) -> DataError {
    DataError::InvalidField {
        op,
        field: field.into(),
        value: format!("{value:?}"),
        expected: expected.into(),
    }
}
