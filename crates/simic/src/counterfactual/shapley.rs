//! Shapley values of the seeds (reference §4.5): which coalitions to
//! measure ([`ShapleyPlan`]) and the estimate from their accuracies.
//!
//! With `n` players the Shapley value of player `i` is the mean, over all
//! `n!` orders in which the players can join, of `i`'s marginal
//! contribution `v(P ∪ {i}) − v(P)` (`P` = the players before `i`):
//!
//! - **factorial** ([`ShapleyMethod::Exact`]): all `2ⁿ` coalitions are
//!   measured and the value is exact,
//!   `φ_i = Σ_{S ∌ i} |S|!(n−|S|−1)!/n! · (v(S ∪ {i}) − v(S))`;
//! - **sampled** ([`ShapleyMethod::Sampled`]): `permutations` seeded random
//!   orders, each followed by its antithetic (reversed) order, and every
//!   prefix of each is measured; the estimate is the mean of the
//!   `2·permutations` marginals. The ablation coalitions (all on, each off,
//!   all off) are measured as well.
//!
//! Strategy [`ShapleyStrategy::Auto`] is factorial for `n ≤ 4`, sampled
//! otherwise; the reference samples 10 permutations (`shapley_samples` =
//! 20 orders with the antithetic ones, at most 100), seeded per environment.
//! The reported std is the (population) standard deviation of the marginal
//! contributions over the orders: exact over all `n!` orders for the
//! factorial, over the sampled orders otherwise. For an additive game every
//! marginal of a player equals its weight, so both methods are exact.

use leyline::rng::SplitMix64;

use super::coalition::{Coalition, CoalitionValues};
use crate::{Error, Result};

/// Player count up to which [`ShapleyStrategy::Auto`] measures the full
/// factorial (reference: 4).
pub const AUTO_FACTORIAL_PLAYERS: usize = 4;

/// Largest player count of an explicit factorial (`2¹²` configurations).
pub const MAX_FACTORIAL_PLAYERS: usize = 12;

/// Random permutations of the reference's sample (10, each with its
/// antithetic, `shapley_samples` = 20).
pub const DEFAULT_PERMUTATIONS: usize = 10;

/// Most random permutations (the reference caps the sample at 100 orders,
/// 50 with their antithetic ones).
pub const MAX_PERMUTATIONS: usize = 50;

/// How the Shapley coalitions are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShapleyStrategy {
    /// Factorial for at most [`AUTO_FACTORIAL_PLAYERS`] players, sampled
    /// otherwise.
    #[default]
    Auto,
    /// Every coalition (at most [`MAX_FACTORIAL_PLAYERS`] players).
    Factorial,
    /// Random permutation prefixes with their antithetic reverses.
    Sampled,
}

/// Shapley sampling settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShapleyConfig {
    /// Factorial, sampled or automatic.
    pub strategy: ShapleyStrategy,
    /// Random permutations (each also reversed), `1..=MAX_PERMUTATIONS`
    /// (10).
    pub permutations: usize,
    /// Seed of the permutation sampler (the reference seeds it per
    /// environment).
    pub seed: u64,
}

impl Default for ShapleyConfig {
    /// Automatic strategy, 10 permutations, seed 0.
    fn default() -> Self {
        ShapleyConfig {
            strategy: ShapleyStrategy::Auto,
            permutations: DEFAULT_PERMUTATIONS,
            seed: 0,
        }
    }
}

impl ShapleyConfig {
    /// Checks the permutation count.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_PERMUTATIONS).contains(&self.permutations) {
            return Err(Error::InvalidConfig {
                field: "ShapleyConfig.permutations",
                reason: format!("{} is outside [1, {MAX_PERMUTATIONS}]", self.permutations),
            });
        }
        Ok(())
    }
}

/// How a plan's values are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapleyMethod {
    /// From every coalition (factorial).
    Exact,
    /// From sampled permutations.
    Sampled,
}

/// One player's Shapley value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapleyValue {
    /// The value (exact or estimated), in the unit of the coalition values
    /// (accuracy points).
    pub mean: f64,
    /// Population std of the player's marginal contribution over the orders
    /// (all of them when exact).
    pub std: f64,
    /// Orders averaged: the sampled permutations, or `n!` when exact.
    pub samples: usize,
    /// Whether `mean` is exact (factorial).
    pub exact: bool,
}

/// The coalitions a Shapley estimate needs, and how to combine them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapleyPlan {
    players: usize,
    method: ShapleyMethod,
    permutations: Vec<Vec<usize>>,
}

impl ShapleyPlan {
    /// The plan for `players` players under `config`.
    pub fn new(players: usize, config: &ShapleyConfig) -> Result<ShapleyPlan> {
        config.validate()?;
        let method = match config.strategy {
            ShapleyStrategy::Auto if players <= AUTO_FACTORIAL_PLAYERS => ShapleyMethod::Exact,
            ShapleyStrategy::Auto | ShapleyStrategy::Sampled => ShapleyMethod::Sampled,
            ShapleyStrategy::Factorial => ShapleyMethod::Exact,
        };
        if method == ShapleyMethod::Exact && players > MAX_FACTORIAL_PLAYERS {
            return Err(Error::InvalidConfig {
                field: "ShapleyConfig.strategy",
                reason: format!(
                    "a factorial over {players} players; at most {MAX_FACTORIAL_PLAYERS}"
                ),
            });
        }
        if players > super::coalition::MAX_PLAYERS {
            return Err(Error::InvalidInput {
                field: "ShapleyPlan.players",
                reason: format!(
                    "{players} players; at most {}",
                    super::coalition::MAX_PLAYERS
                ),
            });
        }
        let permutations = match method {
            ShapleyMethod::Exact => Vec::new(),
            ShapleyMethod::Sampled => {
                let mut rng = SplitMix64::new(config.seed);
                let mut orders = Vec::with_capacity(config.permutations.saturating_mul(2));
                for _ in 0..config.permutations {
                    let order = permutation(&mut rng, players);
                    let reversed: Vec<usize> = order.iter().rev().copied().collect();
                    orders.push(order);
                    orders.push(reversed);
                }
                orders
            }
        };
        Ok(ShapleyPlan {
            players,
            method,
            permutations,
        })
    }

    /// Number of players.
    pub fn players(&self) -> usize {
        self.players
    }

    /// Exact or sampled.
    pub fn method(&self) -> ShapleyMethod {
        self.method
    }

    /// The sampled orders (empty when exact): order `2k + 1` is order `2k`
    /// reversed.
    pub fn permutations(&self) -> &[Vec<usize>] {
        &self.permutations
    }

    /// Every coalition to measure, without repeats: all `2ⁿ` in ascending
    /// bit order when exact; otherwise the ablations (all on, each off, all
    /// off) then every prefix of every order.
    pub fn coalitions(&self) -> Vec<Coalition> {
        let full = Coalition::full(self.players);
        match self.method {
            ShapleyMethod::Exact => (0..=full.bits()).map(Coalition::from_bits).collect(),
            ShapleyMethod::Sampled => {
                let mut coalitions = vec![full];
                coalitions.extend((0..self.players).map(|player| full.without(player)));
                coalitions.push(Coalition::EMPTY);
                for order in &self.permutations {
                    let mut prefix = Coalition::EMPTY;
                    for &player in order {
                        prefix = prefix.with(player);
                        coalitions.push(prefix);
                    }
                }
                let mut seen = std::collections::BTreeSet::new();
                coalitions.retain(|coalition| seen.insert(*coalition));
                coalitions
            }
        }
    }

    /// The Shapley value of every player from the measured `values` (which
    /// must hold every coalition of [`ShapleyPlan::coalitions`]).
    pub fn estimate(&self, values: &CoalitionValues) -> Result<Vec<ShapleyValue>> {
        if values.players() != self.players {
            return Err(Error::InvalidInput {
                field: "ShapleyPlan.values",
                reason: format!(
                    "values of a {}-player game for a {}-player plan",
                    values.players(),
                    self.players
                ),
            });
        }
        match self.method {
            ShapleyMethod::Exact => self.exact(values),
            ShapleyMethod::Sampled => self.sampled(values),
        }
    }

    fn exact(&self, values: &CoalitionValues) -> Result<Vec<ShapleyValue>> {
        let n = self.players;
        let orders = (1..=n).try_fold(1usize, usize::checked_mul);
        // |S|!(n−|S|−1)!/n! for |S| = 0..n.
        let weights: Vec<f64> = (0..n)
            .map(|size| {
                factorial(size) * factorial(n.saturating_sub(size).saturating_sub(1)) / factorial(n)
            })
            .collect();
        let full = Coalition::full(n);
        (0..n)
            .map(|player| {
                let mut mean = 0.0;
                let mut square = 0.0;
                for bits in 0..=full.bits() {
                    let coalition = Coalition::from_bits(bits);
                    if coalition.contains(player) {
                        continue;
                    }
                    let delta = value(values, coalition.with(player))? - value(values, coalition)?;
                    let weight = weights.get(coalition.len()).copied().unwrap_or(0.0);
                    mean += weight * delta;
                    square += weight * delta * delta;
                }
                Ok(ShapleyValue {
                    mean,
                    std: (square - mean * mean).max(0.0).sqrt(),
                    samples: orders.unwrap_or(usize::MAX),
                    exact: true,
                })
            })
            .collect()
    }

    fn sampled(&self, values: &CoalitionValues) -> Result<Vec<ShapleyValue>> {
        let mut marginals = vec![Vec::with_capacity(self.permutations.len()); self.players];
        for order in &self.permutations {
            let mut prefix = Coalition::EMPTY;
            let mut before = value(values, prefix)?;
            for &player in order {
                prefix = prefix.with(player);
                let after = value(values, prefix)?;
                if let Some(list) = marginals.get_mut(player) {
                    list.push(after - before);
                }
                before = after;
            }
        }
        Ok(marginals
            .iter()
            .map(|list| {
                let count = list.len().max(1) as f64;
                let mean = list.iter().sum::<f64>() / count;
                let variance = list.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / count;
                ShapleyValue {
                    mean,
                    std: variance.max(0.0).sqrt(),
                    samples: list.len(),
                    exact: false,
                }
            })
            .collect())
    }
}

/// `k!` as a float (exact for the factorial's `k ≤ 12`).
fn factorial(k: usize) -> f64 {
    (1..=k).map(|factor| factor as f64).product()
}

/// The measured value of `coalition`, or an error naming it.
fn value(values: &CoalitionValues, coalition: Coalition) -> Result<f64> {
    values.get(coalition).ok_or_else(|| Error::InvalidInput {
        field: "ShapleyPlan.values",
        reason: format!("coalition {coalition} was not measured"),
    })
}

/// A uniform permutation of `0..n` (Fisher–Yates), each pick drawn by
/// Lemire's multiply-shift ([`SplitMix64::below_by_shift`]).
fn permutation(rng: &mut SplitMix64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for last in (1..n).rev() {
        let bound = last.saturating_add(1) as u64;
        let pick = usize::try_from(rng.below_by_shift(bound)).unwrap_or(0);
        order.swap(last, pick);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_permutations_and_seeded() {
        let mut rng = SplitMix64::new(7);
        for n in 0..9 {
            let mut order = permutation(&mut rng, n);
            order.sort_unstable();
            assert_eq!(order, (0..n).collect::<Vec<_>>());
        }
        let a = permutation(&mut SplitMix64::new(3), 20);
        let b = permutation(&mut SplitMix64::new(3), 20);
        let c = permutation(&mut SplitMix64::new(4), 20);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn exact_weights_sum_to_one() {
        for n in 1..=MAX_FACTORIAL_PLAYERS {
            // Σ_s C(n−1, s)·s!(n−s−1)!/n! = 1.
            let total: f64 = (0..n)
                .map(|s| {
                    let choose = factorial(n - 1) / (factorial(s) * factorial(n - 1 - s));
                    choose * factorial(s) * factorial(n - s - 1) / factorial(n)
                })
                .sum();
            assert!((total - 1.0).abs() < 1e-12, "n = {n}: {total}");
        }
    }
}
