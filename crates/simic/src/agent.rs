//! Tamiyo's policy as the PPO update sees it: the re-evaluation of stored
//! rows (the rollout acts through `Policy::act` or `GraphedAct::act`).
//!
//! The update unrolls each environment's row as one sequence of `T` steps
//! from a zero LSTM state (reference §4.2: the whole rollout is one batch,
//! each row one sequence of `chunk_length` = episode length), through
//! [`tamiyo::policy::PolicyNetwork::forward_sequence`], and scores the
//! stored actions under the stored base masks with the same op-conditioned
//! masking the sampler used ([`tamiyo::policy::Sampler::evaluate_actions`]),
//! so the log-probability ratio is exactly new over old. The same unroll
//! feeds the auxiliary heads ([`tamiyo::policy::PolicyNetwork::auxiliary`]):
//! Q of the stored op, and the contribution predictor against the
//! contributions measured at each step.

use tamiyo::policy::{Policy, Sampler};
use tch::{Kind, Tensor};

use crate::buffer::Rollout;
use crate::error::TorchResultExt;
use crate::ppo::{AnchorEvaluation, AuxiliaryEvaluation, Evaluation};
use crate::{Error, Result};
use leyline::NUM_ACTION_HEADS;

/// Rows `r` and steps `T` of observations `[r, T, obs_dim]`, and `r` as
/// the batch size the LSTM's initial state takes.
fn rows_and_steps(obs: &Tensor, what: &'static str) -> Result<(i64, i64, usize)> {
    let size = obs.size();
    let (r, t) = match size.as_slice() {
        [r, t, _] => (*r, *t),
        _ => {
            return Err(Error::ShapeMismatch {
                what,
                expected: "[r, T, obs_dim]".to_owned(),
                got: format!("{size:?}"),
            });
        }
    };
    let batch = usize::try_from(r).map_err(|_| Error::ShapeMismatch {
        what,
        expected: "a non-negative row count".to_owned(),
        got: r.to_string(),
    })?;
    Ok((r, t, batch))
}

/// Re-evaluates the rollout's `rows` (`[r]` i64) under the current policy,
/// with gradients: per-head log-probabilities and normalised entropies
/// `[r, T, 8]`, values `[r, T]`, the auxiliary heads' outputs with
/// their targets, and, when the rollout holds the anchor's labels and
/// `anchor_coef > 0`, their log-probabilities from the same unroll (the
/// labels scored under the same stored masks as the actions).
pub fn evaluate_rows(
    policy: &Policy,
    sampler: &Sampler,
    rollout: &Rollout,
    rows: &Tensor,
    anchor_coef: f64,
) -> Result<Evaluation> {
    let rows = rows
        .f_to_device(rollout.obs.device())
        .op("rows to device")?;
    let obs = rollout.obs.f_index_select(0, &rows).op("rows obs")?;
    let blueprints = rollout
        .blueprints
        .f_index_select(0, &rows)
        .op("rows blueprints")?;
    let actions = rollout
        .actions
        .f_index_select(0, &rows)
        .op("rows actions")?;
    let (r, t, batch) = rows_and_steps(&obs, "evaluate_rows.obs")?;
    let network = policy.network();
    let hidden = network.initial_state(batch)?;
    let output = network.forward_sequence(&obs, &blueprints, &hidden)?;
    let flat = r.saturating_mul(t);
    let logits = output
        .logits
        .iter()
        .map(|logits| {
            let width = logits.size().last().copied().unwrap_or(0);
            logits
                .f_reshape([flat, width])
                .op("flatten logits")?
                .f_to_kind(Kind::Float)
                .op("logits to f32")
        })
        .collect::<Result<Vec<_>>>()?;
    let logits: [Tensor; NUM_ACTION_HEADS] =
        logits.try_into().map_err(|_| Error::ShapeMismatch {
            what: "evaluate_rows.logits",
            expected: NUM_ACTION_HEADS.to_string(),
            got: "another count".to_owned(),
        })?;
    let masks = rollout.flat_masks(&rows)?;
    let heads = i64::try_from(NUM_ACTION_HEADS).unwrap_or(8);
    let actions = actions.f_reshape([flat, heads]).op("flatten actions")?;
    let (log_probs, entropies) = sampler.evaluate_actions(&logits, &masks, &actions)?;
    let anchor = match &rollout.anchor {
        Some(labels) if anchor_coef > 0.0 => {
            let labelled = labels
                .actions
                .f_index_select(0, &rows)
                .op("rows anchor labels")?
                .f_reshape([flat, heads])
                .op("flatten anchor labels")?;
            let (label_log_probs, _) = sampler.evaluate_actions(&logits, &masks, &labelled)?;
            Some(AnchorEvaluation {
                log_probs: label_log_probs
                    .f_reshape([r, t, heads])
                    .op("anchor log probs rows")?,
                weights: labels
                    .relevance
                    .f_index_select(0, &rows)
                    .op("rows anchor weights")?,
                coef: anchor_coef,
            })
        }
        _ => None,
    };
    let auxiliary = match output.features.as_ref() {
        Some(features) => {
            let op = i64::try_from(tamiyo::heads::OP).unwrap_or(0);
            let ops = actions
                .f_select(1, op)
                .op("stored ops")?
                .f_reshape([r, t])
                .op("stored ops")?;
            let heads = network.auxiliary(features, &ops, true)?;
            Some(AuxiliaryEvaluation {
                q: heads.q,
                contribution: heads.contribution,
                contribution_target: rollout
                    .contributions
                    .f_index_select(0, &rows)
                    .op("rows contributions")?,
                contribution_mask: rollout
                    .contribution_mask
                    .f_index_select(0, &rows)
                    .op("rows contribution mask")?,
            })
        }
        None => None,
    };
    Ok(Evaluation {
        log_probs: log_probs.f_reshape([r, t, heads]).op("log probs rows")?,
        entropies: entropies.f_reshape([r, t, heads]).op("entropies rows")?,
        values: output
            .value
            .f_to_kind(Kind::Float)
            .op("values to f32")?
            .f_reshape([r, t])
            .op("values rows")?,
        auxiliary,
        anchor,
    })
}

/// The Q head's mean estimate for each lifecycle op, over the rollout's
/// valid steps, in [`leyline::LifecycleOp::ALL`] order (reference §6.3's
/// "Q per op"): one more unroll of the rollout without gradient, the Q head
/// evaluated once per op, one readback. `None` for a policy without
/// auxiliary heads. For the round's boundary, after the update.
pub fn q_per_op(policy: &Policy, rollout: &Rollout) -> Result<Option<Vec<f64>>> {
    let _no_grad = tch::no_grad_guard();
    let (r, t, batch) = rows_and_steps(&rollout.obs, "q_per_op.obs")?;
    let network = policy.network();
    let hidden = network.initial_state(batch)?;
    let output = network.forward_sequence(&rollout.obs, &rollout.blueprints, &hidden)?;
    let Some(features) = output.features.as_ref() else {
        return Ok(None);
    };
    let device = rollout.obs.device();
    let valid = rollout.valid.f_to_kind(Kind::Float).op("q per op")?;
    let count = valid
        .f_sum(Kind::Float)
        .op("q per op")?
        .f_clamp_min(1.0)
        .op("q per op")?;
    let means = leyline::LifecycleOp::ALL
        .iter()
        .map(|op| {
            let ops = Tensor::f_full([r, t], i64::from(op.value()), (Kind::Int64, device))
                .op("q per op")?;
            network
                .auxiliary(features, &ops, false)?
                .q
                .f_to_kind(Kind::Float)
                .op("q per op")?
                .f_mul(&valid)
                .op("q per op")?
                .f_sum(Kind::Float)
                .op("q per op")?
                .f_div(&count)
                .op("q per op")
        })
        .collect::<Result<Vec<_>>>()?;
    let values = Tensor::f_stack(&means, 0)
        .op("q per op")?
        .f_to_kind(Kind::Double)
        .op("q per op")?
        .f_to_device(tch::Device::Cpu)
        .op("q per op")?;
    let values = Vec::<f64>::try_from(&values).map_err(|source| Error::Readback {
        what: "q per op",
        reason: source.to_string(),
    })?;
    Ok(Some(values))
}
