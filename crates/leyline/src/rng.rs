//! Random numbers: the workspace's one seeded generator and integer hash.
//!
//! [`SplitMix64`] (Steele, Lea and Flood, 2014) is the stream every seeded
//! host-side draw comes from: shuffles and synthetic data sets
//! (`tolaria::data`, including the `tolaria-reference` task its Python peer
//! mirrors bit for bit), CartPole resets and the Shapley permutation sampler
//! (simic), and the fuzz loops of the tests. [`mix64`] is its finaliser, the
//! 64-bit integer hash that the device-side counter hash
//! (`torch_ext::rng`) computes with tensor integer ops; [`GOLDEN`], [`MIX1`]
//! and [`MIX2`] are its constants, shared by both.
//!
//! It is a contract because the numbers are: the same seed gives the same
//! stream on every machine, and peers in other languages reproduce it. Only
//! integer arithmetic and exactly rounded IEEE-754 operations (add, multiply)
//! are used, never `ln`/`cos`, so the floats drawn from it are bitwise
//! reproducible across platforms too.

/// The SplitMix64 increment (the golden-ratio constant).
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// The finaliser's first multiplier.
pub const MIX1: u64 = 0xBF58_476D_1CE4_E5B9;
/// The finaliser's second multiplier.
pub const MIX2: u64 = 0x94D0_49BB_1331_11EB;

/// The SplitMix64 finaliser: a bijective 64-bit integer hash.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(MIX1);
    z = (z ^ (z >> 27)).wrapping_mul(MIX2);
    z ^ (z >> 31)
}

/// SplitMix64: a 64-bit state advanced by [`GOLDEN`], then mixed by
/// [`mix64`]. Small, fast, and every seed (0 included) is usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole stream is fixed by `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
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

    /// A uniform integer in `0..bound` by Lemire's multiply-shift alone (no
    /// rejection: one draw per call, bias below 2⁻⁶⁴·bound). Returns 0 when
    /// `bound` is 0.
    pub fn below_by_shift(&mut self, bound: u64) -> u64 {
        let wide = u128::from(self.next_u64()).wrapping_mul(u128::from(bound));
        (wide >> 64) as u64
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_matches_the_reference() {
        // First outputs of Vigna's splitmix64.c seeded with 0.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn next_u64_is_the_finaliser_of_the_counter() {
        let mut rng = SplitMix64::new(7);
        assert_eq!(rng.next_u64(), mix64(7_u64.wrapping_add(GOLDEN)));
    }

    #[test]
    fn the_shift_draw_is_the_high_half_of_the_product() {
        let mut a = SplitMix64::new(3);
        let mut b = SplitMix64::new(3);
        let bits = b.next_u64();
        let expected = ((u128::from(bits) * 10) >> 64) as u64;
        assert_eq!(a.below_by_shift(10), expected);
        assert_eq!(SplitMix64::new(1).below_by_shift(0), 0);
    }
}
