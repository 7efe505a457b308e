//! The auxiliary heads of the policy network (reference §3.4), evaluated by
//! the PPO update only, never while acting:
//!
//! - `q_head`, Q(s, op): the trunk's output, detached, concatenated with
//!   the one-hot op taken, through a critic-shaped MLP to one value. It is
//!   telemetry: its loss trains the Q head alone.
//! - `contribution_predictor`: the trunk's output through
//!   `hidden/2 (LayerNorm, ReLU, dropout 0.1) -> hidden/4 (ReLU) -> num_slots`,
//!   one predicted counterfactual contribution per slot. Its loss reaches
//!   the trunk (an auxiliary task for the representation).
//!
//! Both output layers are initialised with gain 0.1, as the critic's.

use tch::{Kind, Tensor, nn};

use super::{PolicyConfig, PolicyNetwork, as_i64, shape_mismatch};
use crate::Result;
use crate::error::TorchResultExt;
use crate::features::NUM_OPS;
use crate::policy::layers::{BlockSpec, Mlp, to_f32};

/// Gain of the Q head's and the contribution predictor's output layers.
pub const AUXILIARY_OUTPUT_GAIN: f64 = 0.1;
/// Dropout after the contribution predictor's first layer (training only).
pub const CONTRIBUTION_DROPOUT: f64 = 0.1;

/// What [`PolicyNetwork::auxiliary`] returns, fp32.
#[derive(Debug)]
pub struct AuxiliaryOutput {
    /// Q(s, op) of the op taken, `[B, T]`.
    pub q: Tensor,
    /// Predicted contribution per slot, percentage points, `[B, T, S]`.
    pub contribution: Tensor,
}

/// The two heads under `path` (`q_head`, `contribution_predictor`).
pub(super) fn build(path: &nn::Path<'_>, config: &PolicyConfig, hidden: i64) -> Result<(Mlp, Mlp)> {
    let normed = |output: i64| BlockSpec { output, norm: true };
    let plain = |output: i64| BlockSpec {
        output,
        norm: false,
    };
    let q_head = Mlp::new(
        &path.sub("q_head"),
        hidden.saturating_add(as_i64(NUM_OPS)),
        &[
            normed(hidden / 2),
            normed(hidden / 4),
            plain(hidden / 8),
            plain(1),
        ],
        AUXILIARY_OUTPUT_GAIN,
    )?;
    let contribution = Mlp::new(
        &path.sub("contribution_predictor"),
        hidden,
        &[
            normed(hidden / 2),
            plain(hidden / 4),
            plain(as_i64(config.num_slots)),
        ],
        AUXILIARY_OUTPUT_GAIN,
    )?;
    Ok((q_head, contribution))
}

impl PolicyNetwork {
    /// The auxiliary heads (see the module docs) on the trunk's output
    /// `features` `[B, T, hidden]` ([`super::PolicyOutput::features`] of
    /// [`PolicyNetwork::forward_sequence`]) for the ops taken, `ops`
    /// `[B, T]` i64 (values outside `[0, NUM_OPS)` are clamped into it);
    /// `train` turns the predictor's dropout on. `features` is the trunk's
    /// own output, whose inputs [`PolicyNetwork::forward_sequence`] checked;
    /// its values are not checked again here (the PPO update checks its
    /// loss).
    pub fn auxiliary(
        &self,
        features: &Tensor,
        ops: &Tensor,
        train: bool,
    ) -> Result<AuxiliaryOutput> {
        let size = features.size();
        let (batch, steps) = match size.as_slice() {
            [batch, steps, width] if *width == self.config.hidden_dim => (*batch, *steps),
            _ => {
                return Err(shape_mismatch(
                    "auxiliary.features",
                    format!("[B, T, {}]", self.config.hidden_dim),
                    size,
                ));
            }
        };
        self.check(
            "auxiliary.features",
            features,
            &[batch, steps, self.config.hidden_dim],
            features.kind(),
        )?;
        self.check("auxiliary.ops", ops, &[batch, steps], Kind::Int64)?;
        let _autocast = self.autocast()?;
        let ops = ops
            .f_clamp(0, as_i64(NUM_OPS).saturating_sub(1))
            .op("auxiliary ops")?;
        let one_hot = ops
            .f_one_hot(as_i64(NUM_OPS))
            .op("op one-hot")?
            .f_to_kind(features.kind())
            .op("op one-hot")?;
        let q_input = Tensor::f_cat(&[&features.detach(), &one_hot], -1).op("q input")?;
        let q = self
            .q_head
            .forward(&q_input)?
            .f_squeeze_dim(-1)
            .op("q squeeze")?;
        let contribution =
            self.contribution
                .forward_dropout_first(features, CONTRIBUTION_DROPOUT, train)?;
        Ok(AuxiliaryOutput {
            q: to_f32(&q)?,
            contribution: to_f32(&contribution)?,
        })
    }
}
