//! [`PpoBatch`], what one update trains on (checked before libtorch sees
//! it), and [`Evaluation`], the current policy's evaluation of its rows.

use tch::{Kind, Tensor};

use super::shape_error;
use crate::Result;
use crate::error::TorchResultExt;

/// What one update trains on. All tensors `f32` on the policy's device, rows
/// on dim 0.
#[derive(Debug)]
pub struct PpoBatch {
    /// Per-head log-probabilities of the stored actions under the rollout
    /// policy, `[R, T, H]`.
    pub log_probs: Tensor,
    /// Advantages, `[R, T]` (normalised by the trainer when configured).
    pub advantages: Tensor,
    /// Critic targets, `[R, T]`, already in the critic's space (normalised
    /// when a [`ValueNormaliser`](super::ValueNormaliser) is used).
    pub returns: Tensor,
    /// The critic's values at rollout time, `[R, T]` (value clipping).
    pub old_values: Tensor,
    /// Causal relevance of each head at each step (0/1), `[R, T, H]`.
    pub head_weights: Tensor,
    /// Actor weight, `[R, T]`: 1 for a normal step, 0 for a forced step or
    /// padding.
    pub actor_weight: Tensor,
    /// Value weight, `[R, T]`: 1 for a normal step, 0.2 for a forced step, 0
    /// for padding.
    pub value_weight: Tensor,
}

impl PpoBatch {
    /// Checks every shape, kind and device; returns `(R, T, H)`.
    pub fn check(&self) -> Result<(i64, i64, i64)> {
        let size = self.log_probs.size();
        let (rows, steps, heads) = match size.as_slice() {
            [rows, steps, heads] if *rows >= 1 && *steps >= 1 && *heads >= 1 => {
                (*rows, *steps, *heads)
            }
            _ => {
                return Err(shape_error(
                    "PpoBatch.log_probs",
                    "[R >= 1, T >= 1, H >= 1]".to_owned(),
                    size,
                ));
            }
        };
        let device = self.log_probs.device();
        let heads_shape = vec![rows, steps, heads];
        let steps_shape = vec![rows, steps];
        for (what, tensor, expected) in [
            ("PpoBatch.log_probs", &self.log_probs, &heads_shape),
            ("PpoBatch.advantages", &self.advantages, &steps_shape),
            ("PpoBatch.returns", &self.returns, &steps_shape),
            ("PpoBatch.old_values", &self.old_values, &steps_shape),
            ("PpoBatch.head_weights", &self.head_weights, &heads_shape),
            ("PpoBatch.actor_weight", &self.actor_weight, &steps_shape),
            ("PpoBatch.value_weight", &self.value_weight, &steps_shape),
        ] {
            if tensor.size() != *expected {
                return Err(shape_error(what, format!("{expected:?}"), tensor.size()));
            }
            if tensor.kind() != Kind::Float {
                return Err(shape_error(what, "an f32 tensor".to_owned(), tensor.kind()));
            }
            if tensor.device() != device {
                return Err(shape_error(
                    what,
                    format!("a tensor on {device:?}"),
                    tensor.device(),
                ));
            }
        }
        Ok((rows, steps, heads))
    }

    /// The variance of `x` over the steps with a critic weight (0-dim
    /// `f32`; 0 without such steps).
    fn critic_variance(&self, x: &Tensor) -> Result<Tensor> {
        let what = "critic-weighted variance";
        let mask = self
            .value_weight
            .f_gt(0.0)
            .op(what)?
            .f_to_kind(Kind::Float)
            .op(what)?;
        let count = mask
            .f_sum(Kind::Float)
            .op(what)?
            .f_clamp_min(1.0)
            .op(what)?;
        let mean = x
            .f_mul(&mask)
            .op(what)?
            .f_sum(Kind::Float)
            .op(what)?
            .f_div(&count)
            .op(what)?;
        x.f_sub(&mean)
            .op(what)?
            .f_square()
            .op(what)?
            .f_mul(&mask)
            .op(what)?
            .f_sum(Kind::Float)
            .op(what)?
            .f_div(&count)
            .op(what)
    }

    /// `1 − Var(R − V_old) / Var(R)` over the steps with a critic weight
    /// (0-dim `f32`; NaN when the returns do not vary): how much of the
    /// returns the rollout's values explained.
    pub fn explained_variance(&self) -> Result<Tensor> {
        let residual = self
            .returns
            .f_sub(&self.old_values)
            .op("explained variance")?;
        self.critic_variance(&residual)?
            .f_div(&self.critic_variance(&self.returns)?)
            .op("explained variance")?
            .f_neg()
            .op("explained variance")?
            .f_add_scalar(1.0)
            .op("explained variance")
    }

    /// The standard deviation of the rollout's values over the steps with a
    /// critic weight (0-dim `f32`): near 0, the critic predicts one value
    /// for every state.
    pub fn value_std(&self) -> Result<Tensor> {
        self.critic_variance(&self.old_values)?
            .f_sqrt()
            .op("value std")
    }

    /// The rows `indices` (an `i64` tensor on the batch's device) of every
    /// tensor.
    pub fn select_rows(&self, indices: &Tensor) -> Result<PpoBatch> {
        let select = |tensor: &Tensor| tensor.f_index_select(0, indices).op("select rows");
        Ok(PpoBatch {
            log_probs: select(&self.log_probs)?,
            advantages: select(&self.advantages)?,
            returns: select(&self.returns)?,
            old_values: select(&self.old_values)?,
            head_weights: select(&self.head_weights)?,
            actor_weight: select(&self.actor_weight)?,
            value_weight: select(&self.value_weight)?,
        })
    }
}

/// The current policy's evaluation of a set of rows, with gradient.
#[derive(Debug)]
pub struct Evaluation {
    /// Per-head log-probabilities of the stored actions, `[r, T, H]`.
    pub log_probs: Tensor,
    /// Per-head entropies, `[r, T, H]` (Tamiyo's are normalised by the log of
    /// the number of valid options; the entropy floors compare against
    /// whatever the policy returns here).
    pub entropies: Tensor,
    /// The critic's values, `[r, T]`.
    pub values: Tensor,
    /// The auxiliary heads' outputs and targets, for policies that have
    /// them (Tamiyo's); `None` adds no auxiliary loss.
    pub auxiliary: Option<super::AuxiliaryEvaluation>,
    /// The anchor's labels under the current policy, when the update has
    /// an anchor; `None` adds no anchor term.
    pub anchor: Option<AnchorEvaluation>,
}

/// The anchor's part of an [`Evaluation`]: how likely the current policy
/// finds a demonstrator's labels of the rows' states
/// (`crate::vectorized::ImitationConfig::anchor_weight`). The loss adds
/// `coef·Σ_h −⟨ℓ_h⟩_{w_h}` over the heads, with `w` the label weights
/// times the batch's actor weight ([`super::loss`]).
#[derive(Debug)]
pub struct AnchorEvaluation {
    /// Per-head log-probabilities of the labelled actions, `[r, T, H]`, with
    /// gradient.
    pub log_probs: Tensor,
    /// Weight of each head's label, `[r, T, H]` f32: 1 where the head
    /// matters for the labelled op, 0 elsewhere and where no label was.
    pub weights: Tensor,
    /// The term's coefficient in this update (finite, at least 0).
    pub coef: f64,
}
