//! How an epoch cuts its samples into batches: the `(start, len)` plan the
//! staged data follows, and the distinct batch sizes it yields (the step
//! shapes a trainer captures and the blueprint warm-up runs).

use crate::error::{Error, Result};

/// `(start, len)` of each batch of `batch` samples over `len` samples, as an
/// epoch takes them: the last batch shorter, or dropped with `drop_last`.
pub(crate) fn plan(len: i64, batch: i64, drop_last: bool) -> Result<Vec<(i64, i64)>> {
    if batch <= 0 {
        return Err(Error::InvalidConfig {
            field: "batch_size",
            reason: format!("{batch}; must be at least 1"),
        });
    }
    if drop_last && batch > len {
        return Err(Error::InvalidConfig {
            field: "batch_size",
            reason: format!(
                "{batch} with drop_last leaves no batch of a data set of {len} samples"
            ),
        });
    }
    let mut plan = Vec::new();
    let mut start = 0_i64;
    while start < len {
        let size = batch.min(len.saturating_sub(start));
        if size < batch && drop_last {
            break;
        }
        plan.push((start, size));
        start = start.saturating_add(size);
    }
    Ok(plan)
}

/// The distinct batch sizes an epoch over `len` samples runs with batches of
/// `batch` (the full one, and a shorter last one unless `drop_last`): the
/// step shapes a trainer captures.
///
/// # Errors
/// [`Error::InvalidConfig`] for a batch size below 1, or one that
/// `drop_last` leaves no batch of.
pub fn batch_sizes(len: i64, batch: i64, drop_last: bool) -> Result<Vec<i64>> {
    let mut sizes: Vec<i64> = Vec::new();
    for (_, size) in plan(len, batch, drop_last)? {
        if !sizes.contains(&size) {
            sizes.push(size);
        }
    }
    Ok(sizes)
}
