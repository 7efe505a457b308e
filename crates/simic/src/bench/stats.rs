//! Paired statistics for the learning protocol: controller A against
//! controller B on the same environments (same model seeds, same data
//! shards), one difference per environment.
//!
//! [`paired`] gives the mean difference with a 95% confidence interval
//! (Student's t: the table's quantile below 10 degrees of freedom, a
//! Cornish-Fisher expansion within 0.5% of the table from 10 on), the
//! exact two-sided sign test (ties dropped and counted), and the two-sided
//! paired permutation (sign-flip) test of the mean: exact over every sign
//! assignment up to 20 pairs, otherwise a seeded Monte Carlo estimate over
//! [`PERMUTATIONS`] assignments. The sign and permutation tests assume
//! nothing about the differences' distribution, which matters here: final
//! accuracies tie often (two controllers that never grow give the same
//! host) and their differences are far from normal.

use leyline::rng::SplitMix64;

/// Monte Carlo sign assignments of the permutation test above 20 pairs.
pub const PERMUTATIONS: usize = 200_000;
/// Pairs up to which the permutation test enumerates every assignment.
pub const EXACT_PAIRS: usize = 20;

/// A paired comparison of A against B (differences `a - b`).
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    /// Pairs.
    pub n: usize,
    /// Mean difference.
    pub mean: f64,
    /// Sample standard deviation of the differences (0 for one pair).
    pub sd: f64,
    /// 95% confidence interval of the mean difference (the mean itself
    /// twice for one pair or no spread).
    pub ci95: (f64, f64),
    /// Pairs where A is ahead.
    pub wins: usize,
    /// Pairs where B is ahead.
    pub losses: usize,
    /// Pairs that tie exactly.
    pub ties: usize,
    /// Two-sided exact sign test (ties dropped); 1 when every pair ties.
    pub sign_p: f64,
    /// Two-sided paired permutation test of the mean.
    pub permutation_p: f64,
    /// Whether [`Paired::permutation_p`] enumerated every assignment.
    pub permutation_exact: bool,
}

/// `+0.87 points (95% CI +0.64 to +1.10, 22/2/0 wins/losses/ties, sign p
/// 0.000, permutation p 0.000)`: the line the benches print for a
/// comparison.
impl std::fmt::Display for Paired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.2} points (95% CI {:+.2} to {:+.2}, {}/{}/{} wins/losses/ties, sign p {:.3}, \
             permutation p {:.3})",
            self.mean,
            self.ci95.0,
            self.ci95.1,
            self.wins,
            self.losses,
            self.ties,
            self.sign_p,
            self.permutation_p
        )
    }
}

/// The two-sided 97.5% quantile of Student's t with `df` degrees of freedom
/// (the table below 10, then a Cornish-Fisher expansion around the
/// normal's 1.959964; infinite at 0).
pub fn t_quantile_975(df: usize) -> f64 {
    let z: f64 = 1.959_963_985;
    // Below 10 degrees of freedom the expansion drifts (3% at 2): the
    // table's values.
    const SMALL: [f64; 10] = [
        f64::INFINITY,
        12.706_205,
        4.302_653,
        3.182_446,
        2.776_445,
        2.570_582,
        2.446_912,
        2.364_624,
        2.306_004,
        2.262_157,
    ];
    if let Some(value) = SMALL.get(df) {
        return *value;
    }
    let v = df as f64;
    let z3 = z.powi(3);
    let z5 = z.powi(5);
    let z7 = z.powi(7);
    z + (z3 + z) / (4.0 * v)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * v * v)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * v * v * v)
}

/// Two-sided exact sign test of `wins` against `losses`.
pub fn sign_test(wins: usize, losses: usize) -> f64 {
    let n = wins.saturating_add(losses);
    if n == 0 {
        return 1.0;
    }
    let k = wins.min(losses);
    // P(X <= k) for X ~ Binomial(n, 1/2), the pmf built in log space.
    let mut log_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut tail = log_pmf.exp();
    for i in 1..=k {
        log_pmf += (n.saturating_add(1).saturating_sub(i) as f64).ln() - (i as f64).ln();
        tail += log_pmf.exp();
    }
    (2.0 * tail).min(1.0)
}

/// Two-sided paired permutation test of the mean of `differences` (see the
/// module docs); returns the p-value and whether it is exact.
pub fn permutation_test(differences: &[f64], seed: u64) -> (f64, bool) {
    let n = differences.len();
    if n == 0 {
        return (1.0, true);
    }
    let observed: f64 = differences.iter().sum::<f64>().abs();
    // Sums within this of the observed one count as "as extreme" (the
    // differences are sums of percentages with rounding noise).
    let tolerance = 1e-9 * (1.0 + observed);
    if n <= EXACT_PAIRS {
        let assignments = 1_u64 << n;
        let mut extreme = 0_u64;
        for mask in 0..assignments {
            let sum: f64 = differences
                .iter()
                .enumerate()
                .map(|(i, d)| if mask >> i & 1 == 1 { -d } else { *d })
                .sum();
            if sum.abs() >= observed - tolerance {
                extreme = extreme.saturating_add(1);
            }
        }
        return (extreme as f64 / assignments as f64, true);
    }
    let mut rng = SplitMix64::new(seed);
    let mut extreme = 0_usize;
    for _ in 0..PERMUTATIONS {
        let mut sum = 0.0;
        let mut bits = 0_u64;
        for (i, d) in differences.iter().enumerate() {
            if i % 64 == 0 {
                bits = rng.next_u64();
            }
            sum += if bits >> (i % 64) & 1 == 1 { -d } else { *d };
        }
        if sum.abs() >= observed - tolerance {
            extreme = extreme.saturating_add(1);
        }
    }
    ((extreme as f64 + 1.0) / (PERMUTATIONS as f64 + 1.0), false)
}

/// The paired comparison of `a` against `b` (equal lengths, one entry per
/// environment; extra entries of the longer are ignored). Non-finite pairs
/// are dropped.
pub fn paired(a: &[f64], b: &[f64]) -> Paired {
    let differences: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| x - y)
        .filter(|d| d.is_finite())
        .collect();
    let n = differences.len();
    let mean = if n == 0 {
        f64::NAN
    } else {
        differences.iter().sum::<f64>() / n as f64
    };
    let sd = if n < 2 {
        0.0
    } else {
        (differences.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / n.saturating_sub(1) as f64)
            .sqrt()
    };
    let half = if n < 2 {
        0.0
    } else {
        t_quantile_975(n.saturating_sub(1)) * sd / (n as f64).sqrt()
    };
    let wins = differences.iter().filter(|d| **d > 0.0).count();
    let losses = differences.iter().filter(|d| **d < 0.0).count();
    let (permutation_p, permutation_exact) = permutation_test(&differences, 0x005e_ed0f_7e57);
    Paired {
        n,
        mean,
        sd,
        ci95: (mean - half, mean + half),
        wins,
        losses,
        ties: n.saturating_sub(wins).saturating_sub(losses),
        sign_p: sign_test(wins, losses),
        permutation_p,
        permutation_exact,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_t_quantile_matches_the_table() {
        // Student's t, two-sided 95%: df 2, 5, 10, 30, 120.
        for (df, table) in [
            (2, 4.302_653),
            (5, 2.570_582),
            (10, 2.228_139),
            (30, 2.042_272),
            (120, 1.979_930),
        ] {
            let got = t_quantile_975(df);
            let tolerance = 0.005;
            assert!(
                (got - table).abs() / table < tolerance,
                "df {df}: {got} vs {table}"
            );
        }
        assert!((t_quantile_975(1) - 12.706).abs() < 1e-3);
    }

    #[test]
    fn the_sign_test_is_exact() {
        // 10 of 12 up: P = 2 * (1 + 12 + 66) / 4096.
        assert!((sign_test(10, 2) - 2.0 * 79.0 / 4096.0).abs() < 1e-12);
        assert_eq!(sign_test(0, 0), 1.0);
        assert_eq!(sign_test(3, 3), 1.0);
        assert!((sign_test(5, 0) - 2.0 / 32.0).abs() < 1e-12);
    }

    #[test]
    fn the_permutation_test_enumerates_small_samples_and_estimates_large_ones() {
        // All four positive: only the two all-same-sign assignments are as
        // extreme, 2 of 16.
        let (p, exact) = permutation_test(&[1.0, 2.0, 3.0, 4.0], 1);
        assert!(exact);
        assert!((p - 2.0 / 16.0).abs() < 1e-12);
        let (p, _) = permutation_test(&[0.0, 0.0], 1);
        assert_eq!(p, 1.0, "all ties are as extreme as anything");
        // 30 pairs of a clear shift: tiny p; no shift: large p.
        let shifted: Vec<f64> = (0..30).map(|i| 1.0 + 0.1 * f64::from(i % 3)).collect();
        let (p, exact) = permutation_test(&shifted, 7);
        assert!(!exact);
        assert!(p < 1e-3, "{p}");
        let balanced: Vec<f64> = (0..30)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        assert!(permutation_test(&balanced, 7).0 > 0.5);
    }

    #[test]
    fn paired_differences_count_wins_losses_and_ties() {
        let a = [70.0, 71.0, 69.0, 70.0, 72.0];
        let b = [69.0, 71.0, 70.0, 68.0, 70.0];
        let result = paired(&a, &b);
        assert_eq!(result.n, 5);
        assert_eq!((result.wins, result.losses, result.ties), (3, 1, 1));
        assert!((result.mean - 0.8).abs() < 1e-12);
        assert!(result.ci95.0 < result.mean && result.mean < result.ci95.1);
        assert!(result.permutation_exact);
        let one = paired(&[1.0], &[0.0]);
        assert_eq!(one.ci95, (1.0, 1.0));
        assert!(paired(&[f64::NAN], &[1.0]).mean.is_nan());
    }
}
