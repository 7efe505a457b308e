//! What a round writes about itself: the first environment's episode
//! (`episode.jsonl`), its line of the rounds log and its progress line.

use std::path::Path;

use anyhow::{Context, Result};
use simic::vectorized::RoundReport;

use super::EPISODE_FILE;
use crate::train::epoch_log;

/// Rewrites `run_dir/episode.jsonl` with the first environment's episode of
/// `report` (atomically: a reader sees the previous round's or this one's).
pub(super) fn write_episode(run_dir: &Path, report: &RoundReport) -> Result<()> {
    let Some(outcome) = report.outcomes.first() else {
        return Ok(());
    };
    let mut text = String::new();
    for epoch in &outcome.trace {
        let record = epoch_log::EpochRecord::from_trace(epoch);
        text.push_str(&serde_json::to_string(&record).context("encoding an episode line")?);
        text.push('\n');
    }
    let path = run_dir.join(EPISODE_FILE);
    durable::write_file(&path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

pub(super) fn round_line(report: &RoundReport, eps: Option<f64>) -> serde_json::Value {
    let finite = |value: f64| value.is_finite().then_some(value);
    serde_json::json!({
        "round": report.round,
        "env_epochs": report.env_epochs,
        "mean_episode_reward": finite(report.mean_episode_reward),
        "final_accuracies": report.final_accuracies,
        "mean_active_seeds": finite(report.mean_active_seeds),
        "germinations": report.germinations,
        "fossilizations": report.fossilizations,
        "prunes": report.prunes,
        "rollbacks": report.rollbacks,
        "actions": actions_json(&report.actions),
        "eps": eps.and_then(finite),
        "policy_inference_ms": finite(report.inference_ms),
        "round_ms": finite(report.timings.total_ms),
        // An imitation round's demonstrator and what its update imitated
        // (null in a PPO round).
        "imitation": report.imitation.map(|figures| serde_json::json!({
            "demonstrator": figures.demonstrator.name(),
            "imitated": figures.imitated,
            "advances_as_wait": figures.advances_as_wait,
            "not_imitable": figures.not_imitable,
        })),
        // An anchored PPO round's labels (null otherwise).
        "anchor": report.anchor.map(|figures| serde_json::json!({
            "demonstrator": figures.demonstrator.name(),
            "labelled": figures.imitated,
            "not_imitable": figures.not_imitable,
        })),
        "ppo": report.ppo.as_ref().map(|ppo| serde_json::json!({
            "policy_loss": finite(ppo.policy_loss),
            "value_loss": finite(ppo.value_loss),
            "q_loss": finite(ppo.q_loss),
            "contribution_loss": finite(ppo.contribution_loss),
            "approx_kl": finite(ppo.approx_kl),
            "clip_fraction": finite(ppo.clip_fraction),
            "epochs_run": ppo.epochs_run,
            "early_stopped": ppo.early_stopped,
            "anchor_loss": finite(ppo.anchor_loss),
            "anchor_coef": finite(ppo.anchor_coef),
        })),
    })
}

/// The round's decision analytics: ops chosen and carried out by name,
/// blueprints germinated, forced steps and the episodes' outcomes.
fn actions_json(actions: &simic::vectorized::ActionDistribution) -> serde_json::Value {
    let ops = |counts: &simic::vectorized::OpCounts| {
        leyline::LifecycleOp::ALL
            .iter()
            .map(|&op| (op.name().to_owned(), serde_json::json!(counts.get(op))))
            .collect::<serde_json::Map<_, _>>()
    };
    serde_json::json!({
        "steps": actions.steps,
        "forced_steps": actions.forced_steps,
        "chosen": ops(&actions.chosen),
        "executed": ops(&actions.executed),
        "germinated": actions.germinated,
        "outcomes": actions.outcomes,
    })
}

pub(super) fn progress_line(report: &RoundReport, rounds: usize, eps: Option<f64>) -> String {
    let accuracy = if report.final_accuracies.is_empty() {
        f64::NAN
    } else {
        report.final_accuracies.iter().sum::<f64>() / report.final_accuracies.len() as f64
    };
    // The share of decisions per chosen op, ops never chosen left out.
    let chosen = leyline::LifecycleOp::ALL
        .iter()
        .filter(|&&op| report.actions.chosen.get(op) > 0)
        .map(|&op| {
            format!(
                "{} {:.0}%",
                op.name(),
                100.0 * report.actions.chosen_fraction(op)
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    // In an imitation round the decisions were the demonstrator's.
    let imitation = report.imitation.map_or(String::new(), |figures| {
        format!(" (imitation of {})", figures.demonstrator.name())
    });
    format!(
        "round {}/{rounds}{imitation}: reward {:.3}, final accuracy {accuracy:.2}%, live seeds \
         {:.2}, germinated {} fossilized {} pruned {}, chose {chosen}, {:.1} eps",
        report.round.saturating_add(1),
        report.mean_episode_reward,
        report.mean_active_seeds,
        report.germinations,
        report.fossilizations,
        report.prunes,
        eps.unwrap_or(0.0)
    )
}
