//! Seeded, device-independent randomness for shuffling and synthetic data.
//!
//! Permutations are computed on the host with a small PRNG (SplitMix64) and an
//! unbiased Fisher-Yates shuffle, so the same seed gives the same order on
//! every machine and device, whatever libtorch's generators do. Only integer
//! arithmetic and exactly rounded IEEE-754 operations (add, multiply) are used,
//! never `ln`/`cos`, so synthetic values are bitwise reproducible across
//! platforms too.

use super::Result;
use super::limits::{MAX_SAMPLES, at_most, reserve};

/// SplitMix64 (Steele, Lea and Flood, 2014): a 64-bit state advanced by a
/// constant, then mixed. Small, fast, and every seed (0 included) is usable.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..bound` without modulo bias (Lemire's
    /// multiply-and-reject method). Returns 0 when `bound` is 0.
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        // bound > 0 here, so the remainder exists.
        let threshold = bound.wrapping_neg().checked_rem(bound).unwrap_or(0);
        loop {
            // A 64 x 64-bit product always fits 128 bits: it never wraps.
            let product = u128::from(self.next_u64()).wrapping_mul(u128::from(bound));
            // The low half decides rejection; the high half is the draw.
            if (product as u64) >= threshold {
                return (product >> 64) as u64;
            }
        }
    }

    /// A uniform float in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform float in `[low, high)`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.next_f64()
    }

    /// An approximately standard normal draw: the sum of four uniforms,
    /// centred and scaled to unit variance (Irwin-Hall with n = 4).
    ///
    /// Values lie in `[-2√3, 2√3]`; the shape is close enough to a Gaussian
    /// for synthetic tasks, and it needs no transcendental functions, so the
    /// result is bitwise identical on every platform.
    pub fn normal(&mut self) -> f64 {
        // Var(U(0,1)) = 1/12, so the sum of 4 has variance 1/3.
        const SQRT_3: f64 = 1.732_050_807_568_877_2;
        let sum = self.next_f64() + self.next_f64() + self.next_f64() + self.next_f64();
        (sum - 2.0) * SQRT_3
    }
}

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
