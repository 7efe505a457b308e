//! The body of one PPO update: advantage normalisation, the minibatch
//! passes and the one readback of the statistics.

use tch::{Device, Kind, Tensor};

use crate::distributed::DataParallel;
use crate::error::TorchResultExt;
use crate::{Error, Result};

use super::{
    Evaluation, LossScalars, Objective, PpoBatch, PpoStats, PpoTrainer, ppo_loss, shape_error,
};

/// Index of each scalar in the stats accumulator.
const STAT_POLICY: i64 = 0;
const STAT_VALUE: i64 = 1;
const STAT_BONUS: i64 = 2;
const STAT_PENALTY: i64 = 3;
const STAT_TOTAL: i64 = 4;
const STAT_KL: i64 = 5;
const STAT_CLIP: i64 = 6;
const STAT_Q: i64 = 7;
const STAT_CONTRIBUTION: i64 = 8;
const STAT_ANCHOR: i64 = 9;
const STAT_COUNT: i64 = 10;

impl PpoTrainer {
    /// Advantages normalised over the samples with a non-zero actor weight:
    /// `(A − mean) / max(std, floor)` (sample standard deviation).
    fn normalised_advantages(&self, batch: &PpoBatch) -> Result<Tensor> {
        if !self.config.normalize_advantages {
            return Ok(batch.advantages.shallow_clone());
        }
        let mask = batch
            .actor_weight
            .f_gt(0.0)
            .op("advantage mask")?
            .f_to_kind(Kind::Float)
            .op("advantage mask")?;
        let count = mask.f_sum(Kind::Float).op("advantage count")?;
        let mean = batch
            .advantages
            .f_mul(&mask)
            .op("advantage mean")?
            .f_sum(Kind::Float)
            .op("advantage mean")?
            .f_div(&count.f_clamp_min(1.0).op("advantage mean")?)
            .op("advantage mean")?;
        let centred = batch.advantages.f_sub(&mean).op("advantage centre")?;
        let std = centred
            .f_square()
            .op("advantage std")?
            .f_mul(&mask)
            .op("advantage std")?
            .f_sum(Kind::Float)
            .op("advantage std")?
            .f_div(
                &count
                    .f_sub_scalar(1.0)
                    .op("advantage std")?
                    .f_clamp_min(1.0)
                    .op("advantage std")?,
            )
            .op("advantage std")?
            .f_sqrt()
            .op("advantage std")?
            .f_clamp_min(self.config.advantage_std_floor)
            .op("advantage std")?;
        centred.f_div(&std).op("advantage normalise")
    }

    /// The row order of one epoch: `0..R` with one minibatch, a seeded
    /// shuffle otherwise (uniform keys from the trainer's generator, sorted
    /// on the device).
    fn row_order(&mut self, rows: i64) -> Result<Tensor> {
        if self.config.minibatches <= 1 {
            return Tensor::f_arange(rows, (Kind::Int64, self.device)).op("row order");
        }
        let keys = self.rng.uniform(&[rows], self.device)?;
        keys.f_argsort_stable(true, 0, false).op("row shuffle")
    }

    /// Gradients of the parameters that have one.
    fn grads(&self) -> Result<Vec<Tensor>> {
        let mut grads = Vec::with_capacity(self.parameters.len());
        for parameter in &self.parameters {
            let grad = parameter.f_grad().op("grad")?;
            if grad.defined() {
                grads.push(grad);
            }
        }
        Ok(grads)
    }

    /// Checks every value of `batch` in one readback: finite
    /// log-probabilities, advantages, returns and old values, finite and
    /// non-negative weights.
    fn check_batch_values(batch: &PpoBatch) -> Result<()> {
        use crate::finite::Rule::{Finite, NonNegative};
        crate::finite::require(&[
            ("PpoBatch.log_probs", &batch.log_probs, Finite),
            ("PpoBatch.advantages", &batch.advantages, Finite),
            ("PpoBatch.returns", &batch.returns, Finite),
            ("PpoBatch.old_values", &batch.old_values, Finite),
            ("PpoBatch.head_weights", &batch.head_weights, NonNegative),
            ("PpoBatch.actor_weight", &batch.actor_weight, NonNegative),
            ("PpoBatch.value_weight", &batch.value_weight, NonNegative),
        ])
    }

    /// [`PpoTrainer::update_synced`] without the snapshot: on an error the
    /// state may be part-way (the caller puts back its own snapshot).
    pub(crate) fn update_unguarded(
        &mut self,
        batch: &PpoBatch,
        mut evaluate: impl FnMut(&Tensor) -> Result<Evaluation>,
        mut sync: Option<&mut DataParallel>,
        objective: Objective,
    ) -> Result<PpoStats> {
        let (rows, _, heads) = batch.check()?;
        if batch.log_probs.device() != self.device {
            return Err(shape_error(
                "PpoBatch",
                format!("tensors on {:?}", self.device),
                batch.log_probs.device(),
            ));
        }
        if usize::try_from(heads).ok() != Some(self.config.heads()) {
            return Err(shape_error(
                "PpoBatch.log_probs",
                format!("{} heads (PpoConfig)", self.config.heads()),
                heads,
            ));
        }
        let minibatches = i64::try_from(self.config.minibatches).unwrap_or(i64::MAX);
        if minibatches > rows {
            return Err(Error::InvalidInput {
                field: "PpoConfig.minibatches",
                reason: format!("{minibatches} minibatches for {rows} rows"),
            });
        }
        Self::check_batch_values(batch)?;
        let update = self.updates;
        let learning_rate = self.config.learning_rate_at(update);
        self.optimizer.set_learning_rate(learning_rate)?;
        let scalars = LossScalars {
            clip: self.config.clip,
            value_coef: self.config.value_coef_at(update),
            value_clip: self.config.value_clip,
            entropy_coef: self.config.entropy_coef_at(update),
            floor_scale: self.config.floor_penalty_scale_at(update),
            contribution_coef: self.config.contribution_coef_at(
                update,
                u64::try_from(
                    rows.saturating_mul(batch.advantages.size().get(1).copied().unwrap_or(1)),
                )
                .unwrap_or(u64::MAX),
            ),
            objective,
        };
        let batch = PpoBatch {
            advantages: self.normalised_advantages(batch)?,
            log_probs: batch.log_probs.shallow_clone(),
            returns: batch.returns.shallow_clone(),
            old_values: batch.old_values.shallow_clone(),
            head_weights: batch.head_weights.shallow_clone(),
            actor_weight: batch.actor_weight.shallow_clone(),
            value_weight: batch.value_weight.shallow_clone(),
        };
        // Minibatch sizes: the first `rows % minibatches` get one row more.
        let base = rows.checked_div(minibatches).unwrap_or(rows);
        let extra = rows.checked_rem(minibatches).unwrap_or(0);
        let sizes: Vec<i64> = (0..minibatches)
            .map(|index| base.saturating_add(i64::from(index < extra)))
            .collect();

        let zeros = |len: i64| Tensor::f_zeros([len], (Kind::Float, self.device)).op("stats");
        let mut sums = zeros(STAT_COUNT)?;
        let mut head_sums = zeros(heads)?;
        let mut grad_norm_sum = zeros(1)?;
        let mut log_ratio_max = zeros(1)?.f_fill_(f64::NEG_INFINITY).op("stats")?;
        let mut log_ratio_min = zeros(1)?.f_fill_(f64::INFINITY).op("stats")?;
        // Minibatches whose loss, and whose gradient norm, was not finite;
        // and the 0-dim flag (0 or 1) the optimizer skips its steps on.
        let mut bad_losses = zeros(1)?;
        let mut bad_grads = zeros(1)?;
        let mut skip = Tensor::f_zeros([], (Kind::Float, self.device)).op("stats")?;
        let mut evaluated: usize = 0;
        let mut steps: usize = 0;
        let mut epochs_run: usize = 0;
        let mut early_stopped = false;
        let mut anchor_coef = 0.0;

        let passes = match objective {
            Objective::Ppo => self.config.epochs,
            Objective::Imitation { epochs } => {
                if !(1..=super::config::MAX_EPOCHS).contains(&epochs) {
                    return Err(Error::InvalidInput {
                        field: "Objective::Imitation.epochs",
                        reason: format!("{epochs}, not in [1, {}]", super::config::MAX_EPOCHS),
                    });
                }
                epochs
            }
        };
        'epochs: for _ in 0..passes {
            let order = self.row_order(rows)?;
            let mut start: i64 = 0;
            for (index, size) in sizes.iter().enumerate() {
                let indices = order.f_narrow(0, start, *size).op("minibatch rows")?;
                start = start.saturating_add(*size);
                let minibatch = batch.select_rows(&indices)?;
                let evaluation = evaluate(&indices)?;
                let terms = ppo_loss(&minibatch, &evaluation, &self.coefficients, &scalars)?;
                if let Some(anchor) = &evaluation.anchor {
                    anchor_coef = anchor.coef;
                }
                let stacked = Tensor::f_stack(
                    &[
                        &terms.policy,
                        &terms.value,
                        &terms.entropy_bonus,
                        &terms.floor_penalty,
                        &terms.total.f_detach().op("stats")?,
                        &terms.approx_kl,
                        &terms.clip_fraction,
                        &terms.q,
                        &terms.contribution,
                        &terms.anchor,
                    ],
                    0,
                )
                .op("stats")?;
                sums = sums.f_add(&stacked).op("stats")?;
                head_sums = head_sums.f_add(&terms.head_entropies).op("stats")?;
                log_ratio_max = log_ratio_max
                    .f_maximum(&terms.log_ratio_max.f_reshape([1]).op("stats")?)
                    .op("stats")?;
                log_ratio_min = log_ratio_min
                    .f_minimum(&terms.log_ratio_min.f_reshape([1]).op("stats")?)
                    .op("stats")?;
                evaluated = evaluated.saturating_add(1);
                if index == 0
                    && objective == Objective::Ppo
                    && let Some(target) = self.config.target_kl
                {
                    let kl =
                        terms
                            .approx_kl
                            .f_double_value(&[])
                            .map_err(|source| Error::Readback {
                                what: "ppo.approx_kl",
                                reason: source.to_string(),
                            })?;
                    if !kl.is_finite() {
                        return Err(Error::NonFinite {
                            what: "ppo.approx_kl",
                            value: kl,
                        });
                    }
                    // Every rank must take the same decision.
                    let kl = match sync.as_deref() {
                        Some(group) => group.mean_scalar(kl)?,
                        None => kl,
                    };
                    if kl > self.config.kl_stop_factor * target {
                        early_stopped = true;
                        break 'epochs;
                    }
                }
                self.optimizer.zero_grad()?;
                terms.total.f_backward().op("backward")?;
                let grads = self.grads()?;
                if let Some(group) = sync.as_deref_mut() {
                    if grads.len() != self.parameters.len() {
                        return Err(Error::InvalidInput {
                            field: "PpoTrainer.parameters",
                            reason: format!(
                                "{} of {} parameters got no gradient; data-parallel ranks \
                                 must all-reduce the same set",
                                self.parameters.len().saturating_sub(grads.len()),
                                self.parameters.len()
                            ),
                        });
                    }
                    group.average_gradients(&grads)?;
                }
                // The finiteness flags, on the device, before the step.
                let what = "non-finite guard";
                let loss_bad = terms
                    .total
                    .f_detach()
                    .op(what)?
                    .f_isfinite()
                    .op(what)?
                    .f_logical_not()
                    .op(what)?;
                let mut bad = loss_bad.shallow_clone();
                bad_losses = bad_losses
                    .f_add(&loss_bad.f_to_kind(Kind::Float).op(what)?)
                    .op(what)?;
                if !grads.is_empty() {
                    let norm =
                        torch_ext::fused::clip_grad_norm_(&grads, self.config.max_grad_norm, 2.0)?
                            .f_to_kind(Kind::Float)
                            .op("grad norm")?;
                    let norm_bad = norm
                        .f_isfinite()
                        .op(what)?
                        .f_logical_not()
                        .op(what)?
                        .f_reshape([] as [i64; 0])
                        .op(what)?;
                    bad_grads = bad_grads
                        .f_add(&norm_bad.f_to_kind(Kind::Float).op(what)?)
                        .op(what)?;
                    bad = bad.f_logical_or(&norm_bad).op(what)?;
                    grad_norm_sum = grad_norm_sum.f_add(&norm).op("grad norm")?;
                }
                skip = skip
                    .f_maximum(&bad.f_to_kind(Kind::Float).op(what)?)
                    .op(what)?;
                // Skipped on the device once any minibatch was not finite.
                self.optimizer.step_with(Some(&skip))?;
                steps = steps.saturating_add(1);
            }
            epochs_run = epochs_run.saturating_add(1);
        }
        self.optimizer.zero_grad()?;
        self.updates = self.updates.saturating_add(1);
        if let Some(group) = sync.as_deref() {
            group.check_identical(&self.parameters)?;
        }

        // The one readback of the statistics.
        let explained = batch.explained_variance()?.f_reshape([1]).op("stats")?;
        let value_std = batch.value_std()?.f_reshape([1]).op("stats")?;
        let all = Tensor::f_cat(
            &[
                &sums,
                &grad_norm_sum,
                &explained,
                &value_std,
                &log_ratio_max,
                &log_ratio_min,
                &bad_losses,
                &bad_grads,
                &head_sums,
            ],
            0,
        )
        .op("stats")?
        .f_to_kind(Kind::Double)
        .op("stats")?
        .f_to_device(Device::Cpu)
        .op("stats")?;
        let values = Vec::<f64>::try_from(&all).map_err(|source| Error::Readback {
            what: "ppo.stats",
            reason: source.to_string(),
        })?;
        let per_minibatch = 1.0 / (evaluated.max(1) as f64);
        let per_step = 1.0 / (steps.max(1) as f64);
        let stat = |index: i64| -> f64 {
            usize::try_from(index)
                .ok()
                .and_then(|index| values.get(index))
                .copied()
                .unwrap_or(f64::NAN)
                * per_minibatch
        };
        let grad_norm = values
            .get(usize::try_from(STAT_COUNT).unwrap_or(usize::MAX))
            .copied()
            .unwrap_or(f64::NAN)
            * per_step;
        // After the sums: grad norm, explained variance, value std, the
        // log-ratio extremes, the non-finite counts, then the heads'
        // entropies.
        let after = |offset: usize| {
            values
                .get(
                    usize::try_from(STAT_COUNT)
                        .unwrap_or(usize::MAX)
                        .saturating_add(offset),
                )
                .copied()
                .unwrap_or(f64::NAN)
        };
        let explained_variance = after(1);
        let value_std = after(2);
        // An infinite extreme: no sample trained the actor.
        let ratio = |log_ratio: f64| {
            if log_ratio.is_infinite() {
                f64::NAN
            } else {
                log_ratio.exp()
            }
        };
        let ratio_max = ratio(after(3));
        let ratio_min = ratio(after(4));
        let bad_losses = after(5);
        let bad_grads = after(6);
        let head_entropies: Vec<f64> = values
            .iter()
            .skip(
                usize::try_from(STAT_COUNT)
                    .unwrap_or(usize::MAX)
                    .saturating_add(7),
            )
            .map(|sum| sum * per_minibatch)
            .collect();
        let stats = PpoStats {
            policy_loss: stat(STAT_POLICY),
            value_loss: stat(STAT_VALUE),
            entropy_bonus: stat(STAT_BONUS),
            floor_penalty: stat(STAT_PENALTY),
            total_loss: stat(STAT_TOTAL),
            head_entropies,
            approx_kl: stat(STAT_KL),
            clip_fraction: stat(STAT_CLIP),
            grad_norm,
            epochs_run,
            steps,
            early_stopped,
            learning_rate,
            entropy_coef: scalars.entropy_coef,
            value_coef: scalars.value_coef,
            q_loss: stat(STAT_Q),
            contribution_loss: stat(STAT_CONTRIBUTION),
            contribution_coef: scalars.contribution_coef,
            explained_variance,
            value_std,
            ratio_max,
            ratio_min,
            anchor_loss: stat(STAT_ANCHOR),
            anchor_coef,
        };
        // Any non-finite minibatch refuses the whole update (its steps and
        // every later one were skipped on the device; the caller puts back
        // the earlier ones).
        if bad_losses != 0.0 || !stats.total_loss.is_finite() {
            return Err(Error::NonFinite {
                what: "ppo.loss",
                value: stats.total_loss,
            });
        }
        if bad_grads != 0.0 || !stats.grad_norm.is_finite() {
            return Err(Error::NonFinite {
                what: "ppo.grad_norm",
                value: stats.grad_norm,
            });
        }
        Ok(stats)
    }
}
