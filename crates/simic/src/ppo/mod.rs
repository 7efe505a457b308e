//! The PPO update (reference §4.2): [`PpoTrainer`] trains any policy whose
//! evaluation of stored actions it can ask for, on rows of a [`PpoBatch`].
//!
//! The batch is laid out by rows on dim 0, `[R, T, ...]`: Tamiyo's recurrent
//! factored policy has one row per environment, unrolled over `T` steps, with
//! `H = 8` heads; a feed-forward policy such as CartPole's MLP has one row per
//! sample, `T = 1`, `H = 1`. The trainer never sees observations or actions:
//! it hands the caller's closure a tensor of row indices and gets back an
//! [`Evaluation`] (new log-probabilities, entropies, values) of exactly those
//! rows, so the same update serves both.
//!
//! One [`PpoTrainer::update`]:
//!
//! 1. sets this update's learning rate (CleanRL's linear anneal, optional),
//!    entropy coefficient (optional anneal), value coefficient (warm-up) and
//!    floor-penalty scale (see [`PpoConfig`]);
//! 2. normalises the advantages over the batch's samples with a non-zero
//!    actor weight (mean 0, standard deviation floored at 0.1);
//! 3. for each epoch, shuffles the rows with a seeded generator (when there
//!    is more than one minibatch), and per minibatch evaluates the policy,
//!    computes the loss ([`loss`]), backpropagates, clips the gradients to
//!    `max_grad_norm` on the device (torch-ext's read-back-free
//!    `clip_grad_norm_`) and takes one optimizer step;
//! 4. when `target_kl` is set, reads back the approximate KL of each epoch's
//!    first minibatch *before* its step, and stops (skipping that step and
//!    the rest) when it exceeds `kl_stop_factor · target_kl`: the one readback
//!    inside the update, one scalar per epoch;
//! 5. reads every statistic back once, at the end ([`PpoStats`]).
//!
//! **A refused update changes nothing.** Before anything runs, the batch is
//! checked: shapes, kinds and devices on the host, then one readback that
//! counts the NaN and infinite values of every tensor (and the negative
//! weights), refused as [`Error::InvalidInput`] naming the field. The
//! update then keeps a device copy of the parameters and the optimizer
//! state (moments, step counts, learning rate) with the update counter and
//! the row-order generator; any error from there on (a non-finite loss or
//! gradient, a failed evaluation, the KL readback, a data-parallel
//! collective) puts all of it back before the error is returned.
//!
//! **Non-finite losses and gradients never reach the optimizer.** Each
//! minibatch's total loss and (pre-clip) gradient norm are checked on the
//! device before its step: a non-finite one sets a device flag that the
//! fused AdamW kernel reads as its `found_inf` (AMP's skipped step), so that
//! step and every later one of the update are skipped without a readback of
//! their own. The flag is read with the statistics at the end (the one
//! readback the update makes anyway) and the update is refused as
//! [`Error::NonFinite`] (`ppo.loss` or `ppo.grad_norm`), the state put back
//! as above. The price of the guarantee is the device copy of the
//! parameters and the optimizer state per update, and the batch check's one
//! readback of a few integers.
//!
//! The optimizer is Tolaria's: one [`GroupOptimizer`] with AdamW (β 0.9,
//! 0.999, no weight decay, `adam_eps`) over every parameter of the policy,
//! keyed [`GroupKey::Host`] because the policy is one parameter group (it
//! has no seeds).

use tch::{Device, Tensor};

use kasmina::groups::GroupKey;
use tamiyo::policy::PolicyRng;
use tolaria::optim::{AdamWConfig, GroupOptimizer, GroupOptimizerConfig, OptimizerConfig};

use crate::distributed::DataParallel;
use crate::{Error, Result};

pub mod anomaly;
pub mod auxiliary;
mod batch;
pub mod config;
pub mod loss;
mod snapshot;
mod update;
pub mod value_norm;

pub use anomaly::{AnomalyThresholds, PpoAnomaly};
pub use auxiliary::AuxiliaryEvaluation;
pub use batch::{AnchorEvaluation, Evaluation, PpoBatch};
pub use config::{EntropyAnneal, PpoConfig};
pub use loss::{HeadCoefficients, LossScalars, LossTerms, Objective, ppo_loss};
pub use value_norm::{ValueNormaliser, ValueNormaliserConfig, ValueNormaliserState};

/// A shape error naming the argument.
pub(crate) fn shape_error(
    what: &'static str,
    expected: String,
    got: impl std::fmt::Debug,
) -> Error {
    Error::ShapeMismatch {
        what,
        expected,
        got: format!("{got:?}"),
    }
}

/// What one update did, read back once at its end. Losses and telemetry are
/// means over the minibatches evaluated (including one stopped by the KL
/// check); `grad_norm` is the mean over the steps taken (0 without a step).
#[derive(Debug, Clone, PartialEq)]
pub struct PpoStats {
    /// The clipped surrogate summed over heads.
    pub policy_loss: f64,
    /// `0.5·` weighted MSE of the critic.
    pub value_loss: f64,
    /// `Σ_h m_h·H_h`, the entropy bonus before its coefficient.
    pub entropy_bonus: f64,
    /// The entropy-floor penalty.
    pub floor_penalty: f64,
    /// The total loss.
    pub total_loss: f64,
    /// Mean entropy per head (`H` values).
    pub head_entropies: Vec<f64>,
    /// Approximate KL on the joint ratio.
    pub approx_kl: f64,
    /// Fraction of samples whose joint ratio was clipped.
    pub clip_fraction: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Epochs completed (an epoch stopped by the KL check does not count).
    pub epochs_run: usize,
    /// Optimizer steps taken.
    pub steps: usize,
    /// The KL check stopped the update.
    pub early_stopped: bool,
    /// Learning rate of this update.
    pub learning_rate: f64,
    /// Entropy coefficient of this update.
    pub entropy_coef: f64,
    /// Value coefficient of this update.
    pub value_coef: f64,
    /// The Q head's loss (0 without auxiliary heads).
    pub q_loss: f64,
    /// The contribution predictor's loss (0 without auxiliary heads).
    pub contribution_loss: f64,
    /// Coefficient of the contribution predictor's loss in this update.
    pub contribution_coef: f64,
    /// `1 − Var(R − V_old) / Var(R)` over the rollout's valid steps (NaN
    /// when the returns do not vary).
    pub explained_variance: f64,
    /// Standard deviation of the rollout's values over the steps the critic
    /// learns from (near 0: the critic has collapsed to one value).
    pub value_std: f64,
    /// The largest joint ratio of the update's passes, measured before each
    /// minibatch's step, over the samples that train the actor (NaN
    /// without any).
    pub ratio_max: f64,
    /// The smallest such ratio (NaN without any).
    pub ratio_min: f64,
    /// The anchor's negative log-likelihood of the demonstrator's labels,
    /// before its coefficient (0 without an anchor;
    /// [`AnchorEvaluation`]).
    pub anchor_loss: f64,
    /// The anchor's coefficient in this update (0 without one).
    pub anchor_coef: f64,
}

/// Trains a policy's parameters with PPO (see the module docs).
#[derive(Debug)]
pub struct PpoTrainer {
    config: PpoConfig,
    device: Device,
    parameters: Vec<Tensor>,
    optimizer: GroupOptimizer,
    coefficients: HeadCoefficients,
    rng: PolicyRng,
    updates: u64,
}

impl PpoTrainer {
    /// A trainer for `parameters` (every trainable tensor of the policy, on
    /// `device`, requiring gradients) with `config` (validated here).
    pub fn new(parameters: Vec<Tensor>, config: PpoConfig, device: Device) -> Result<PpoTrainer> {
        config.validate()?;
        if parameters.is_empty() {
            return Err(Error::InvalidInput {
                field: "PpoTrainer.parameters",
                reason: "no parameters".to_owned(),
            });
        }
        for parameter in &parameters {
            if parameter.device() != device {
                return Err(shape_error(
                    "PpoTrainer.parameters",
                    format!("tensors on {device:?}"),
                    parameter.device(),
                ));
            }
            if !parameter.requires_grad() {
                return Err(Error::InvalidInput {
                    field: "PpoTrainer.parameters",
                    reason: format!(
                        "a parameter of shape {:?} does not require gradients",
                        parameter.size()
                    ),
                });
            }
        }
        let adamw = GroupOptimizerConfig::AdamW(AdamWConfig {
            learning_rate: config.learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            eps: config.adam_eps,
            weight_decay: 0.0,
        });
        OptimizerConfig {
            host: adamw,
            seed: adamw,
        }
        .validate()?;
        let handles = parameters.iter().map(Tensor::shallow_clone).collect();
        let optimizer = GroupOptimizer::new(GroupKey::Host, adamw, handles, device)?;
        let coefficients = HeadCoefficients::new(&config, device)?;
        let rng = PolicyRng::new(config.shuffle_seed);
        Ok(PpoTrainer {
            config,
            device,
            parameters,
            optimizer,
            coefficients,
            rng,
            updates: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PpoConfig {
        &self.config
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Updates run so far (the schedules' clock).
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// The generator of the minibatches' row order.
    pub fn rng(&self) -> &PolicyRng {
        &self.rng
    }

    /// Puts the update counter (the schedules' clock) and the row-order
    /// generator back where a checkpoint left them.
    pub fn resume_at(&mut self, updates: u64, rng: PolicyRng) {
        self.updates = updates;
        self.rng = rng;
    }

    /// The parameters this trainer updates.
    pub fn parameters(&self) -> &[Tensor] {
        &self.parameters
    }

    /// The optimizer state (Tolaria's AdamW over the policy's one group).
    pub fn optimizer(&self) -> &GroupOptimizer {
        &self.optimizer
    }

    /// One PPO update on `batch` (see the module docs). `evaluate` gets an
    /// `i64` tensor of row indices on the device and returns the current
    /// policy's [`Evaluation`] of those rows, with gradient.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] for a batch whose shapes, kinds or device do
    /// not fit, [`Error::InvalidInput`] naming the batch field that holds a
    /// NaN or infinite value (or a negative weight), [`Error::NonFinite`]
    /// when a minibatch's loss (`ppo.loss`), gradient norm (`ppo.grad_norm`)
    /// or KL reading (`ppo.approx_kl`) is not finite; whatever the error,
    /// the parameters, the optimizer state, the update counter and the
    /// row-order generator are as they were before the call.
    pub fn update(
        &mut self,
        batch: &PpoBatch,
        evaluate: impl FnMut(&Tensor) -> Result<Evaluation>,
    ) -> Result<PpoStats> {
        self.update_synced(batch, evaluate, None)
    }

    /// [`PpoTrainer::update`] as one rank of a data-parallel group (`sync`):
    /// every minibatch's gradients are averaged over the ranks before
    /// clipping, the KL early stop decides on the ranks' mean, and the
    /// parameters are checked identical on every rank at the end
    /// ([`crate::distributed`]). Every rank must call it with batches of the
    /// same row count. `None` is the single-process update.
    ///
    /// Refused calls change nothing, as [`PpoTrainer::update`]'s do. A
    /// non-finite gradient is seen alike by every rank (the check reads the
    /// averaged gradients), so the ranks refuse together.
    pub fn update_synced(
        &mut self,
        batch: &PpoBatch,
        evaluate: impl FnMut(&Tensor) -> Result<Evaluation>,
        sync: Option<&mut DataParallel>,
    ) -> Result<PpoStats> {
        self.update_with(batch, evaluate, sync, Objective::Ppo)
    }

    /// [`PpoTrainer::update_synced`] with the policy term of `objective`:
    /// [`Objective::Imitation`] fits the policy to the batch's actions
    /// (a demonstrator's) instead of improving it on their advantages; the
    /// value, entropy, floor and auxiliary terms, the minibatches, the
    /// clipping, the schedules and the failure guarantee are the same.
    pub fn update_with(
        &mut self,
        batch: &PpoBatch,
        evaluate: impl FnMut(&Tensor) -> Result<Evaluation>,
        sync: Option<&mut DataParallel>,
        objective: Objective,
    ) -> Result<PpoStats> {
        let snapshot = self.snapshot()?;
        let result = self.update_unguarded(batch, evaluate, sync, objective);
        if result.is_err() {
            // The original error says what went wrong; a failed restore is
            // the worse news (the state is then not the one before).
            self.restore(&snapshot)?;
        }
        result
    }
}
