//! [`Batches`]: one epoch of a [`Dataset`]'s samples, batch by batch, as
//! views (stored order) or gathered through the epoch's permutation.

use tch::Tensor;

#[cfg(doc)]
use super::Dataset;
use super::{Result, torch_error};

/// One epoch of batches from [`Dataset::batches`]: each item is
/// `(images [B, ...], labels [B])` with `B = batch_size`, except possibly the
/// last one.
#[derive(Debug)]
pub struct Batches {
    images: Tensor,
    labels: Tensor,
    /// The epoch's order on the data set's device; `None` for stored order.
    order: Option<Tensor>,
    n_samples: usize,
    batch_size: usize,
    n_batches: usize,
    next_batch: usize,
}

impl Batches {
    /// An epoch over `images` and `labels` (checked to hold the same number
    /// of samples, at most `MAX_SAMPLES`) in the order of `order`, or in
    /// stored order; `batch_size` is at least 1.
    pub(super) fn new(
        images: Tensor,
        labels: Tensor,
        order: Option<Tensor>,
        batch_size: usize,
        drop_last: bool,
    ) -> Batches {
        let n_samples = labels
            .size()
            .first()
            .map_or(0, |&n| usize::try_from(n).unwrap_or(0));
        let n_batches = if drop_last {
            n_samples.checked_div(batch_size).unwrap_or(0)
        } else {
            n_samples.div_ceil(batch_size.max(1))
        };
        Batches {
            images,
            labels,
            order,
            n_samples,
            batch_size,
            n_batches,
            next_batch: 0,
        }
    }

    fn batch(&self, batch_idx: usize) -> Result<(Tensor, Tensor)> {
        const OP: &str = "Batches::next";
        // batch_idx < n_batches, so start < n_samples <= MAX_SAMPLES.
        let start = batch_idx.saturating_mul(self.batch_size);
        let len = self.batch_size.min(self.n_samples.saturating_sub(start));
        let (start, len) = (start as i64, len as i64);
        let pair = match &self.order {
            None => self
                .images
                .f_narrow(0, start, len)
                .and_then(|images| Ok((images, self.labels.f_narrow(0, start, len)?))),
            Some(order) => order.f_narrow(0, start, len).and_then(|index| {
                Ok((
                    self.images.f_index_select(0, &index)?,
                    self.labels.f_index_select(0, &index)?,
                ))
            }),
        };
        pair.map_err(torch_error(OP))
    }
}

impl Iterator for Batches {
    type Item = Result<(Tensor, Tensor)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_batch >= self.n_batches {
            return None;
        }
        let batch = self.batch(self.next_batch);
        self.next_batch = self.next_batch.saturating_add(1);
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.n_batches.saturating_sub(self.next_batch);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Batches {}
