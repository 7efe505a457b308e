//! What a round reports through Nissa (leyline's names): throughput, each
//! step's policy-inference time, the mean episode reward and, after an
//! update, its time, KL and clip fraction with a
//! `simic.ppo.update_completed` event; one `simic.shapley.computed` event
//! per environment whose seeds' Shapley values were measured; one
//! `simic.episode.outcome` event per environment and one
//! `simic.analytics.action_distribution` event per round (the decision
//! analytics, [`super::outcome`]).

use leyline::proto::TelemetryPacket;
use leyline::telemetry as names;
use leyline::{Telemetry, TelemetryLevel, event, metric};
use tch::Device;

use super::RoundReport;
use crate::ppo::AnomalyThresholds;

/// Telemetry source of Simic's packets: leyline's
/// [`leyline::telemetry::sources::SIMIC`].
pub use leyline::telemetry::sources::SIMIC as SOURCE;

/// `simic.ppo.numerical_instability` for an update that failed on a
/// non-finite statistic (the round ends with that error).
pub(super) fn emit_numerical_instability(
    telemetry: &Telemetry,
    round: u64,
    what: &str,
    value: f64,
) {
    if !telemetry.is_enabled() {
        return;
    }
    let packet = TelemetryPacket::new(SOURCE, TelemetryLevel::Error).with_event(event(
        names::SIMIC_PPO_NUMERICAL_INSTABILITY,
        "PPO numerical instability",
        [
            ("round".to_owned(), round.to_string()),
            ("what".to_owned(), what.to_owned()),
            ("value".to_owned(), value.to_string()),
        ],
    ));
    telemetry.emit_packet(packet);
}

/// Peak memory the caching allocator has held on the policy's device
/// since the process started or its last reset, MiB (0 on the CPU or
/// when it cannot be read).
fn peak_memory_mb(device: Device) -> f64 {
    match device {
        tch::Device::Cuda(index) => torch_ext::cuda::max_memory_allocated(index)
            .map_or(0.0, |bytes| bytes as f64 / 1_048_576.0),
        _ => 0.0,
    }
}

/// The round's telemetry: throughput (`eps`, the run's so far), each
/// step's policy-inference time, the mean episode reward and, after an
/// update, its time, KL and clip fraction with a
/// `simic.ppo.update_completed` event (leyline's names; the memory peak
/// of the policy's `device`), and the round's events (Shapley values,
/// anomalies by `thresholds`, reward hacking, outcomes, the action
/// distribution).
pub(super) fn emit_round(
    telemetry: &Telemetry,
    device: Device,
    report: &RoundReport,
    eps: Option<f64>,
    thresholds: &AnomalyThresholds,
) {
    if !telemetry.is_enabled() {
        return;
    }
    let mut packet = TelemetryPacket::new(SOURCE, TelemetryLevel::Info).with_metric(metric(
        names::SIMIC_EPISODE_REWARD,
        report.mean_episode_reward,
    ));
    if let Some(eps) = eps {
        packet = packet.with_metric(metric(names::SIMIC_ENV_EPOCHS_PER_S, eps));
    }
    for &inference in &report.inference_samples {
        packet = packet.with_metric(metric(names::SIMIC_POLICY_INFERENCE_MS, inference));
    }
    if let Some(ppo) = &report.ppo {
        packet = packet
            .with_metric(metric(names::SIMIC_PPO_UPDATE_MS, report.timings.update_ms))
            .with_metric(metric(names::SIMIC_PPO_APPROX_KL, ppo.approx_kl))
            .with_metric(metric(names::SIMIC_PPO_CLIP_FRACTION, ppo.clip_fraction))
            .with_event(event(
                names::SIMIC_PPO_UPDATE_COMPLETED,
                "PPO update completed",
                [
                    ("round", report.round.to_string()),
                    ("policy_loss", ppo.policy_loss.to_string()),
                    ("value_loss", ppo.value_loss.to_string()),
                    ("q_loss", ppo.q_loss.to_string()),
                    ("contribution_loss", ppo.contribution_loss.to_string()),
                    ("approx_kl", ppo.approx_kl.to_string()),
                    ("clip_fraction", ppo.clip_fraction.to_string()),
                    ("epochs_run", ppo.epochs_run.to_string()),
                    ("early_stopped", ppo.early_stopped.to_string()),
                    ("grad_norm", ppo.grad_norm.to_string()),
                    ("explained_variance", ppo.explained_variance.to_string()),
                    ("value_std", ppo.value_std.to_string()),
                    ("ratio_max", ppo.ratio_max.to_string()),
                    ("ratio_min", ppo.ratio_min.to_string()),
                    ("learning_rate", ppo.learning_rate.to_string()),
                    ("anchor_loss", ppo.anchor_loss.to_string()),
                    ("anchor_coef", ppo.anchor_coef.to_string()),
                    ("rollbacks", report.rollbacks.to_string()),
                    (
                        "lstm_h_norm",
                        report.lstm.map_or(f64::NAN, |l| l.h_norm).to_string(),
                    ),
                    (
                        "lstm_c_norm",
                        report.lstm.map_or(f64::NAN, |l| l.c_norm).to_string(),
                    ),
                    (
                        "lstm_max_abs",
                        report.lstm.map_or(f64::NAN, |l| l.max_abs).to_string(),
                    ),
                    (
                        "lstm_finite",
                        report.lstm.is_some_and(|l| l.finite).to_string(),
                    ),
                    ("memory_peak_mb", peak_memory_mb(device).to_string()),
                    (
                        "q_per_op",
                        report.q_per_op.as_ref().map_or_else(String::new, |values| {
                            leyline::LifecycleOp::ALL
                                .iter()
                                .zip(values)
                                .map(|(op, q)| format!("{}={q}", op.name()))
                                .collect::<Vec<_>>()
                                .join(",")
                        }),
                    ),
                    (
                        "head_entropies",
                        leyline::HEAD_NAMES
                            .iter()
                            .zip(&ppo.head_entropies)
                            .map(|(head, entropy)| format!("{head}={entropy}"))
                            .collect::<Vec<_>>()
                            .join(","),
                    ),
                ],
            ));
    }
    for (env, values) in report.shapley.iter().enumerate() {
        if values.is_empty() {
            continue;
        }
        let mut attributes = vec![
            ("round".to_owned(), report.round.to_string()),
            ("env".to_owned(), env.to_string()),
        ];
        for (slot, value) in values {
            attributes.push((format!("shapley.{slot}"), value.mean.to_string()));
            attributes.push((format!("shapley_std.{slot}"), value.std.to_string()));
            attributes.push((format!("exact.{slot}"), value.exact.to_string()));
        }
        packet = packet.with_event(event(
            names::SIMIC_SHAPLEY_COMPUTED,
            "Shapley values computed",
            attributes,
        ));
    }
    for anomaly in &report.anomalies {
        let mut attributes = vec![("round".to_owned(), report.round.to_string())];
        attributes.extend(anomaly.attributes(thresholds));
        packet = packet.with_event(event(anomaly.event_name(), "PPO anomaly", attributes));
    }
    for suspicion in &report.reward_hacking {
        packet = packet.with_event(event(
            names::SIMIC_REWARD_HACKING_SUSPECTED,
            "Reward hacking suspected",
            suspicion.attributes(report.round),
        ));
    }
    for outcome in &report.outcomes {
        packet = packet.with_event(event(
            names::SIMIC_EPISODE_OUTCOME,
            "Episode outcome",
            outcome.attributes(report.round),
        ));
    }
    if !report.outcomes.is_empty() {
        packet = packet.with_event(event(
            names::SIMIC_ACTION_DISTRIBUTION,
            "Action distribution of a round",
            report.actions.attributes(report.round),
        ));
    }
    telemetry.emit_packet(packet);
}
