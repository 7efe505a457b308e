//! The governor: catches a run that has gone wrong at an epoch boundary
//! (NaN/Inf loss, lobotomy, divergence) and rolls the model back to its last
//! good state (reference §5, "Governor"; behaviours of §9 item 13).
//!
//! Driven by the general trainer at every epoch boundary
//! ([`crate::engine::trainer::ModelTrainer::train_epoch`]).
//!
//! - [`Governor::check`] takes the one loss read back at the end of an epoch
//!   (the caller's readback; the governor reads nothing from the device) and
//!   answers a [`Verdict`].
//!   - NaN or ±inf: [`Verdict::Panic`] with [`PanicReason::Nan`] at once.
//!   - Lobotomy: with at least `min_samples` losses in the history, their
//!     mean below `lobotomy_average_factor`·`random_guess_loss` and
//!     |loss − `random_guess_loss`| below
//!     `lobotomy_tolerance`·`random_guess_loss`: [`PanicReason::Lobotomy`]
//!     at once.
//!   - Divergence (at least `min_samples` losses): loss > `absolute_threshold`
//!     **and** loss > mean + `sensitivity`·σ (population σ of the history)
//!     **and** loss > `multiplier`·mean is an anomaly. Each anomaly counts
//!     one consecutive panic ([`Verdict::Anomaly`]); the
//!     `min_panics_before_rollback`-th in a row is
//!     [`PanicReason::Divergence`]. A normal loss resets the count.
//!   - A loss that panics or is an anomaly is **not** added to the history;
//!     a normal one is (the history keeps the last `history_window`).
//! - [`Governor::snapshot`] copies the host's parameters and buffers and the
//!   FOSSILIZED seeds' variables into host tensors allocated once per layout
//!   and reused (pinned, with the copies queued on a side stream, on CUDA):
//!   see the `snapshot` submodule.
//! - [`Governor::rollback`] restores the snapshot bitwise, prunes every live
//!   seed with the panic's reason (initiator `governor`), drops the pruned
//!   seeds' optimizer state and zeroes the rest through
//!   [`crate::optim::GroupOptimizers`], and emits `tolaria.rollback.*`
//!   through the [`leyline::Telemetry`] handle (whose emitter panics are
//!   contained, so a failing sink cannot stop a rollback).
//!
//! Deviation from the reference: the Python governor leaves clearing the
//! optimizer state to its caller (§9 item 13); here Tolaria owns every
//! optimizer (`tolaria::optim`), so the rollback does it in the same call.
//! [`Governor::check`] itself touches no optimizer.

mod snapshot;

pub use snapshot::{FossilSnapshot, GovernorState, RollbackReport, SnapshotState};

use crate::{Error, Result};
use std::collections::VecDeque;

/// The governor's thresholds (reference §5 defaults; [`GovernorConfig::validate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GovernorConfig {
    /// Divergence: how many standard deviations above the history mean a
    /// loss must be (6.0).
    pub sensitivity: f64,
    /// Divergence: how many times the history mean a loss must exceed (3.0).
    pub multiplier: f64,
    /// Divergence: the loss must exceed this absolute value (12.0).
    pub absolute_threshold: f64,
    /// Reward penalty for a rollback, for the controller's use (10.0).
    pub death_penalty: f64,
    /// Losses kept in the history (20; at least `min_samples`).
    pub history_window: usize,
    /// Losses needed in the history before lobotomy and divergence are
    /// checked (10).
    pub min_samples: usize,
    /// Consecutive divergence anomalies that make a panic (3; at least 1).
    pub min_panics_before_rollback: u32,
    /// The loss of a random guess, ln(number of classes).
    pub random_guess_loss: f64,
    /// Lobotomy: the history mean must be below this fraction of
    /// `random_guess_loss` (0.6).
    pub lobotomy_average_factor: f64,
    /// Lobotomy: |loss − `random_guess_loss`| must be below this fraction of
    /// `random_guess_loss` (0.065).
    pub lobotomy_tolerance: f64,
    /// Epochs between snapshots (5, reference §4.7).
    pub snapshot_interval_epochs: usize,
}

impl GovernorConfig {
    /// The reference defaults for a classifier over `num_classes` classes
    /// (at least 2): `random_guess_loss` = ln(`num_classes`).
    pub fn for_classes(num_classes: usize) -> Result<GovernorConfig> {
        if num_classes < 2 {
            return Err(Error::Governor {
                field: "num_classes",
                reason: format!("{num_classes} classes; a classifier needs at least 2"),
            });
        }
        let config = GovernorConfig {
            sensitivity: 6.0,
            multiplier: 3.0,
            absolute_threshold: 12.0,
            death_penalty: 10.0,
            history_window: 20,
            min_samples: 10,
            min_panics_before_rollback: 3,
            random_guess_loss: (num_classes as f64).ln(),
            lobotomy_average_factor: 0.6,
            lobotomy_tolerance: 0.065,
            snapshot_interval_epochs: 5,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks every field, naming the first bad one and its value.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("sensitivity", self.sensitivity),
            ("multiplier", self.multiplier),
            ("absolute_threshold", self.absolute_threshold),
            ("random_guess_loss", self.random_guess_loss),
            ("lobotomy_average_factor", self.lobotomy_average_factor),
            ("lobotomy_tolerance", self.lobotomy_tolerance),
        ];
        for (field, value) in positive {
            if !value.is_finite() || value <= 0.0 {
                return Err(Error::Governor {
                    field,
                    reason: format!("{value} must be finite and positive"),
                });
            }
        }
        if !self.death_penalty.is_finite() || self.death_penalty < 0.0 {
            return Err(Error::Governor {
                field: "death_penalty",
                reason: format!("{} must be finite and non-negative", self.death_penalty),
            });
        }
        if self.min_samples < 1 {
            return Err(Error::Governor {
                field: "min_samples",
                reason: "0 samples; at least 1 is needed for a mean".to_owned(),
            });
        }
        if self.history_window < self.min_samples {
            return Err(Error::Governor {
                field: "history_window",
                reason: format!(
                    "{} is below min_samples {}: the checks would never run",
                    self.history_window, self.min_samples
                ),
            });
        }
        if self.min_panics_before_rollback < 1 {
            return Err(Error::Governor {
                field: "min_panics_before_rollback",
                reason: "0; at least one anomaly must be seen".to_owned(),
            });
        }
        if self.snapshot_interval_epochs < 1 {
            return Err(Error::Governor {
                field: "snapshot_interval_epochs",
                reason: "0; snapshots need an interval of at least 1 epoch".to_owned(),
            });
        }
        Ok(())
    }
}

/// Why the governor panicked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PanicReason {
    /// The loss was NaN or infinite.
    Nan,
    /// The model collapsed to a random guess after having learnt.
    Lobotomy,
    /// The loss exploded for `min_panics_before_rollback` checks in a row.
    Divergence,
}

impl PanicReason {
    /// The prune reason and telemetry label: `governor_nan`,
    /// `governor_lobotomy` or `governor_divergence`.
    pub fn as_str(self) -> &'static str {
        match self {
            PanicReason::Nan => "governor_nan",
            PanicReason::Lobotomy => "governor_lobotomy",
            PanicReason::Divergence => "governor_divergence",
        }
    }
}

impl std::fmt::Display for PanicReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`Governor::check`] concluded about one epoch's loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A normal loss (added to the history; the panic count is reset).
    Healthy,
    /// A divergence anomaly short of a panic: `consecutive` anomalies in a
    /// row so far (not added to the history).
    Anomaly {
        /// Anomalies in a row, this one included.
        consecutive: u32,
    },
    /// Roll back now ([`Governor::rollback`] with this reason).
    Panic(PanicReason),
}

/// The governor of one training run (one per environment).
#[derive(Debug)]
pub struct Governor {
    config: GovernorConfig,
    history: VecDeque<f64>,
    consecutive_panics: u32,
    last_panic_loss: Option<f64>,
    rollbacks: u64,
    snapshot: Option<snapshot::Snapshot>,
}

impl Governor {
    /// A governor with `config` (validated) and no snapshot yet.
    pub fn new(config: GovernorConfig) -> Result<Governor> {
        config.validate()?;
        Ok(Governor {
            config,
            history: VecDeque::with_capacity(config.history_window),
            consecutive_panics: 0,
            last_panic_loss: None,
            rollbacks: 0,
            snapshot: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &GovernorConfig {
        &self.config
    }

    /// The losses kept, oldest first.
    pub fn history(&self) -> Vec<f64> {
        self.history.iter().copied().collect()
    }

    /// Anomalies (or panics) in a row so far.
    pub fn consecutive_panics(&self) -> u32 {
        self.consecutive_panics
    }

    /// Rollbacks completed by this governor.
    pub fn rollbacks(&self) -> u64 {
        self.rollbacks
    }

    /// Whether a snapshot should be taken after `epoch` (zero-based epochs
    /// trained so far): every `snapshot_interval_epochs`, epoch 0 included.
    pub fn snapshot_due(&self, epoch: usize) -> bool {
        epoch
            .checked_rem(self.config.snapshot_interval_epochs)
            .is_some_and(|rest| rest == 0)
    }

    /// The epoch of the snapshot held, if any.
    pub fn snapshot_epoch(&self) -> Option<usize> {
        self.snapshot
            .as_ref()
            .filter(|snapshot| snapshot.is_taken())
            .map(snapshot::Snapshot::epoch)
    }

    /// The data pointers of the snapshot's host buffers (host variables,
    /// then fossils), empty without a snapshot: equal across two snapshots
    /// of the same layout, since the buffers are reused.
    pub fn snapshot_data_ptrs(&self) -> Vec<usize> {
        self.snapshot
            .as_ref()
            .map(snapshot::Snapshot::data_ptrs)
            .unwrap_or_default()
    }

    /// Judges one epoch's loss (see the module docs for the rules). Host
    /// arithmetic only: the caller has read the loss back once.
    pub fn check(&mut self, loss: f64) -> Verdict {
        let threshold = self.config.min_panics_before_rollback;
        if !loss.is_finite() {
            return self.panic(loss, PanicReason::Nan, threshold);
        }
        let samples = self.history.len();
        if samples < self.config.min_samples {
            self.push(loss);
            return Verdict::Healthy;
        }
        let count = samples as f64;
        let mean = self.history.iter().sum::<f64>() / count;
        let guess = self.config.random_guess_loss;
        if mean < self.config.lobotomy_average_factor * guess
            && (loss - guess).abs() < self.config.lobotomy_tolerance * guess
        {
            return self.panic(loss, PanicReason::Lobotomy, threshold);
        }
        let variance = self
            .history
            .iter()
            .map(|value| (value - mean) * (value - mean))
            .sum::<f64>()
            / count;
        let anomaly = loss > self.config.absolute_threshold
            && loss > mean + self.config.sensitivity * variance.sqrt()
            && loss > self.config.multiplier * mean;
        if !anomaly {
            self.consecutive_panics = 0;
            self.push(loss);
            return Verdict::Healthy;
        }
        let consecutive = self.consecutive_panics.saturating_add(1);
        if consecutive >= threshold {
            return self.panic(loss, PanicReason::Divergence, consecutive);
        }
        self.consecutive_panics = consecutive;
        Verdict::Anomaly { consecutive }
    }

    fn panic(&mut self, loss: f64, reason: PanicReason, consecutive: u32) -> Verdict {
        self.consecutive_panics = consecutive;
        self.last_panic_loss = Some(loss);
        Verdict::Panic(reason)
    }

    fn push(&mut self, loss: f64) {
        while self.history.len() >= self.config.history_window {
            self.history.pop_front();
        }
        self.history.push_back(loss);
    }
}
