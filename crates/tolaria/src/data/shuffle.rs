//! Seeded, device-independent randomness for shuffling and synthetic data.
//!
//! Permutations are computed on the host with leyline's seeded generator
//! ([`leyline::rng::SplitMix64`], the workspace's one) and an unbiased
//! Fisher-Yates shuffle, so the same seed gives the same order on
//! every machine and device, whatever libtorch's generators do. Only integer
//! arithmetic and exactly rounded IEEE-754 operations (add, multiply) are used,
//! never `ln`/`cos`, so synthetic values are bitwise reproducible across
//! platforms too.

use leyline::rng::SplitMix64;

use super::Result;
use super::limits::{MAX_SAMPLES, at_most, reserve};

/// A uniformly random permutation of `0..n` fixed by `seed` (Fisher-Yates
/// driven by [`SplitMix64`]). Indices are `i64` so they can go straight into
/// a tensor for `index_select`.
///
/// # Errors
/// [`super::DataError::TooLarge`] when `n` is above [`MAX_SAMPLES`] (checked before
/// anything is allocated) or the allocator refuses the indices.
pub fn permutation(n: usize, seed: u64) -> Result<Vec<i64>> {
    const OP: &str = "shuffle::permutation";
    let n = at_most(OP, "n", n, MAX_SAMPLES)?;
    let mut order: Vec<i64> = reserve(OP, "permutation", n)?;
    // n <= MAX_SAMPLES < i64::MAX.
    order.extend(0..n as i64);
    let mut rng = SplitMix64::new(seed);
    for i in (1..n).rev() {
        // j <= i < n: `below(i + 1)` draws from 0..=i.
        let j = rng.below((i as u64).saturating_add(1)) as usize;
        order.swap(i, j.min(i));
    }
    Ok(order)
}

/// The shuffle seed of epoch `epoch` of a run seeded with `run_seed`: one
/// SplitMix64 step over both, so consecutive epochs get unrelated orders.
pub fn epoch_seed(run_seed: u64, epoch: u64) -> u64 {
    let mut rng = SplitMix64::new(run_seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    rng.next_u64()
}
