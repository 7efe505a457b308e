//! Every telemetry metric and event name Esper-rs emits, in one place.
//!
//! Parity checks, Nissa's Prometheus registry, alert rules and dashboards all
//! read these constants; no crate spells a telemetry name itself. Metric names
//! keep the dotted form of the Python system (`tolaria.training.latency_ms`);
//! Prometheus exposition replaces dots with underscores.

contract_enum! {
    /// Severity of a telemetry packet or event.
    pub enum TelemetryLevel {
        /// Verbose diagnostics.
        Debug = 0 => "DEBUG",
        /// Normal operation.
        Info = 1 => "INFO",
        /// Degraded but recovered (fallback, drop).
        Warning = 2 => "WARNING",
        /// An operation failed.
        Error = 3 => "ERROR",
        /// Training safety at risk (rollback).
        Critical = 4 => "CRITICAL",
    }
}

/// How a metric aggregates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    /// Monotonically increasing count.
    Counter,
    /// Last value wins.
    Gauge,
    /// Distribution of observations.
    Histogram,
}

/// A named metric with its kind, unit and help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MetricSpec {
    /// Dotted metric name.
    pub name: &'static str,
    /// Aggregation kind.
    pub kind: MetricKind,
    /// Unit (`ms`, `us`, `count`, `bool`, `ratio`, `bytes`, `per_s`, ...).
    pub unit: &'static str,
    /// One-line description.
    pub help: &'static str,
}

/// A named event with the level it is normally emitted at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EventSpec {
    /// Dotted event name.
    pub name: &'static str,
    /// Usual level.
    pub level: TelemetryLevel,
    /// One-line description.
    pub help: &'static str,
}

macro_rules! metric_names {
    ($( $(#[$doc:meta])* $constant:ident = $name:literal, $kind:ident, $unit:literal, $help:literal; )+) => {
        $( $(#[$doc])* pub const $constant: &str = $name; )+
        /// Every metric, with kind, unit and help.
        pub static METRICS: &[MetricSpec] = &[
            $( MetricSpec { name: $name, kind: MetricKind::$kind, unit: $unit, help: $help } ),+
        ];
    };
}

macro_rules! event_names {
    ($( $(#[$doc:meta])* $constant:ident = $name:literal, $level:ident, $help:literal; )+) => {
        $( $(#[$doc])* pub const $constant: &str = $name; )+
        /// Every event, with its usual level and help.
        pub static EVENTS: &[EventSpec] = &[
            $( EventSpec { name: $name, level: TelemetryLevel::$level, help: $help } ),+
        ];
    };
}

metric_names! {
    /// Wall time of one training epoch.
    TOLARIA_TRAINING_LATENCY_MS = "tolaria.training.latency_ms", Histogram, "ms", "Training epoch latency";
    /// Validation pass latency.
    TOLARIA_VALIDATION_LATENCY_MS = "tolaria.validation.latency_ms", Histogram, "ms", "Validation pass latency";
    /// Mean validation loss of the epoch (per sample; per token for a
    /// language model).
    TOLARIA_VALIDATION_LOSS = "tolaria.validation.loss", Gauge, "nats", "Validation loss";
    /// Validation accuracy of the epoch (per token for a language model).
    TOLARIA_VALIDATION_ACCURACY = "tolaria.validation.accuracy", Gauge, "pct", "Validation accuracy";
    /// A language model's validation perplexity, `exp` of its per-token
    /// validation loss.
    TOLARIA_VALIDATION_PERPLEXITY = "tolaria.validation.perplexity", Gauge, "ratio", "Validation perplexity";
    /// Host-to-device staging time of one epoch's microbatches.
    TOLARIA_H2D_COPY_MS = "tolaria.h2d_copy_ms", Histogram, "ms", "Host-to-device staging time per epoch";
    /// Whether the training step currently replays a CUDA graph (1) or runs eagerly (0).
    TOLARIA_TRAIN_GRAPH_ENABLED = "tolaria.train.graph_enabled", Gauge, "bool", "Training step runs as a CUDA graph";
    /// Whether a compiled step is active (kept for parity with the Python names).
    TOLARIA_TRAIN_COMPILE_ENABLED = "tolaria.train.compile_enabled", Gauge, "bool", "Training step runs compiled";
    /// Warm-up steps left before graph capture.
    TOLARIA_GRAPH_WARMUP_REMAINING = "tolaria.graph.warmup_remaining", Gauge, "count", "Warm-up steps left before capture";
    /// Warm-up steps left before compilation (Python parity name).
    TOLARIA_COMPILE_WARMUP_REMAINING = "tolaria.compile_warmup_remaining", Gauge, "count", "Warm-up steps left before compile";
    /// Time to capture a CUDA graph.
    TOLARIA_GRAPH_CAPTURE_MS = "tolaria.graph.capture_ms", Histogram, "ms", "CUDA graph capture time";
    /// Time of one CUDA graph replay as seen by the host.
    TOLARIA_GRAPH_REPLAY_US = "tolaria.graph.replay_us", Histogram, "us", "CUDA graph replay launch time";
    /// Number of fallbacks from a graph mode to eager.
    TOLARIA_GRAPH_FALLBACK_TOTAL = "tolaria.graph.fallback_total", Counter, "count", "Graph-to-eager fallbacks";
    /// Peak device memory of the run so far.
    TOLARIA_PEAK_MEMORY_BYTES = "tolaria.memory.peak_bytes", Gauge, "bytes", "Peak device memory";
    /// Tamiyo decisions that missed their deadline.
    TOLARIA_TIMEOUT_DECISIONS_TOTAL = "tolaria.timeout.decisions_total", Counter, "count", "Controller decisions that missed the deadline";
    /// The decision deadline in force.
    TOLARIA_TIMEOUT_DEADLINE_MS = "tolaria.timeout.deadline_ms", Gauge, "ms", "Controller decision deadline";
    /// How long the late decision took.
    TOLARIA_TIMEOUT_ELAPSED_MS = "tolaria.timeout.elapsed_ms", Histogram, "ms", "Elapsed time of decisions that timed out";
    /// Rollbacks performed by the governor.
    TOLARIA_ROLLBACK_TOTAL = "tolaria.rollback.total", Counter, "count", "Governor rollbacks";
    /// Time from panic to restored state.
    TOLARIA_ROLLBACK_RECOVERY_MS = "tolaria.rollback.recovery_ms", Histogram, "ms", "Rollback recovery time";
    /// Consecutive governor panics at the time of the check.
    TOLARIA_ROLLBACK_CONSECUTIVE_PANICS = "tolaria.rollback.consecutive_panics", Gauge, "count", "Consecutive governor panics";
    /// Rollbacks that missed their deadline.
    TOLARIA_ROLLBACK_DEADLINE_EXCEEDED_TOTAL = "tolaria.rollback.deadline_exceeded_total", Counter, "count", "Rollbacks slower than their deadline";
    /// Gradient aggregation time per step.
    TOLARIA_GRAD_AGG_LATENCY_MS = "tolaria.grad_agg.latency_ms", Histogram, "ms", "Gradient aggregation time";
    /// PCGrad conflicts (negative cosine between task gradients) per epoch.
    TOLARIA_GRAD_AGG_CONFLICTS = "tolaria.grad_agg.conflicts", Counter, "count", "PCGrad gradient conflicts";
    /// PCGrad projections applied per epoch.
    TOLARIA_GRAD_AGG_PROJECTIONS = "tolaria.grad_agg.projections", Counter, "count", "PCGrad projections applied";
    /// Flattened parameter count aggregated.
    TOLARIA_GRAD_AGG_FLAT_PARAMS = "tolaria.grad_agg.flat_params", Gauge, "count", "Parameters in the flattened gradient";
    /// Seed-gradient pairs that conflicted (negative dot product) per pair compared, over an epoch.
    TOLARIA_GRAD_AGG_CONFLICT_RATIO = "tolaria.grad_agg.conflict_ratio", Gauge, "ratio", "Conflicting seed-gradient pairs per pair";
    /// Mean share of the teacher (host) gradient in the aggregated gradient's norms, over an epoch.
    TOLARIA_GRAD_AGG_TEACHER_SHARE = "tolaria.grad_agg.teacher_share", Gauge, "ratio", "Teacher share of the aggregated gradient";
    /// Per-seed alpha.
    KASMINA_SEED_ALPHA = "kasmina.seed.alpha", Gauge, "ratio", "Seed blend amplitude";
    /// Per-seed stage contract value.
    KASMINA_SEED_STAGE = "kasmina.seed.stage", Gauge, "stage", "Seed lifecycle stage value";
    /// Per-seed epochs in the current stage.
    KASMINA_SEED_EPOCHS_IN_STAGE = "kasmina.seed.epochs_in_stage", Gauge, "count", "Epochs in the current stage";
    /// Per-seed gradient norm.
    KASMINA_SEED_GRADIENT_NORM = "kasmina.seed.gradient_norm", Gauge, "norm", "Seed gradient L2 norm";
    /// Per-seed gradient ratio EMA.
    KASMINA_SEED_GRADIENT_RATIO = "kasmina.seed.gradient_ratio", Gauge, "ratio", "Seed-to-host gradient ratio (EMA)";
    /// Per-seed accuracy change since stage start.
    KASMINA_SEED_ACCURACY_DELTA = "kasmina.seed.accuracy_delta", Gauge, "pp", "Accuracy change since stage start";
    /// Per-seed parameter count.
    KASMINA_SEED_PARAMS = "kasmina.seed.params", Gauge, "count", "Seed parameters";
    /// Seeds in an active stage.
    KASMINA_SEEDS_ACTIVE = "kasmina.seeds.active", Gauge, "count", "Seeds on the forward path";
    /// Germinations requested.
    KASMINA_GERMINATIONS_TOTAL = "kasmina.germinations_total", Counter, "count", "Seeds germinated";
    /// Blueprint prefetch latency.
    KASMINA_PREFETCH_LATENCY_MS = "kasmina.prefetch.latency_ms", Histogram, "ms", "Async blueprint prefetch latency";
    /// Env-epochs per second of vectorized PPO.
    SIMIC_ENV_EPOCHS_PER_S = "simic.throughput.env_epochs_per_s", Gauge, "per_s", "Environment epochs per second";
    /// Policy inference time per decision batch.
    SIMIC_POLICY_INFERENCE_MS = "simic.policy.inference_ms", Histogram, "ms", "Policy inference time";
    /// PPO update time.
    SIMIC_PPO_UPDATE_MS = "simic.ppo.update_ms", Histogram, "ms", "PPO update time";
    /// PPO approximate KL.
    SIMIC_PPO_APPROX_KL = "simic.ppo.approx_kl", Gauge, "ratio", "PPO approximate KL divergence";
    /// PPO clip fraction.
    SIMIC_PPO_CLIP_FRACTION = "simic.ppo.clip_fraction", Gauge, "ratio", "PPO clip fraction";
    /// Mean episode reward.
    SIMIC_EPISODE_REWARD = "simic.episode.reward", Gauge, "reward", "Mean episode reward";
    /// Events the hub dropped (main queue full).
    NISSA_DROPPED_TOTAL = "nissa.dropped_total", Counter, "count", "Events dropped by the hub";
    /// Events a sink dropped (its queue full).
    NISSA_SINK_DROPPED_TOTAL = "nissa.sink.dropped_total", Counter, "count", "Events dropped per sink";
    /// Events a sink failed to write.
    NISSA_SINK_FAILED_TOTAL = "nissa.sink.failed_total", Counter, "count", "Events a sink failed to write";
    /// Events emitted after the hub closed.
    NISSA_AFTER_CLOSE_TOTAL = "nissa.after_close_total", Counter, "count", "Events emitted after close";
}

event_names! {
    /// A CUDA graph was captured and is in use (attribute `capture_ms`).
    TOLARIA_GRAPH_ENABLED = "tolaria.graph_enabled", Info, "Graph capture succeeded";
    /// A graph mode fell back to eager (attribute `reason`).
    TOLARIA_GRAPH_FALLBACK = "tolaria.graph_fallback", Warning, "Graph mode fell back to eager";
    /// Compilation became active (Python parity).
    TOLARIA_COMPILE_ENABLED = "tolaria.compile_enabled", Info, "Compiled step enabled";
    /// Compilation failed and the step runs eagerly (Python parity).
    TOLARIA_COMPILE_FALLBACK = "tolaria.compile_fallback", Warning, "Compiled step fell back to eager";
    /// A controller decision missed its deadline.
    TOLARIA_TIMEOUT_DECISION_MISSED = "tolaria.timeout.decision_missed", Warning, "Controller decision deadline missed";
    /// A controller's decision failed (error or panic) and WAIT was applied
    /// (attributes `epoch`, `request_id`, `reason`).
    TOLARIA_CONTROLLER_FAILED = "tolaria.controller.failed", Error, "Controller decision failed; WAIT applied";
    /// Kasmina or the trainer refused a controller's decision (an occupied
    /// slot, a missing seed, a germination that failed) and the epoch went
    /// on as WAIT (attributes `epoch`, `op`, `reason`).
    TOLARIA_DECISION_REFUSED = "tolaria.decision.refused", Warning, "Controller decision refused; WAIT applied";
    /// The governor triggered a rollback (attribute `reason`).
    TOLARIA_ROLLBACK_TRIGGERED = "tolaria.rollback.triggered", Critical, "Governor rollback started";
    /// A rollback restored the last good state (attribute `recovery_ms`).
    TOLARIA_ROLLBACK_COMPLETED = "tolaria.rollback.completed", Warning, "Governor rollback finished";
    /// A rollback failed.
    TOLARIA_ROLLBACK_FAILED = "tolaria.rollback.failed", Critical, "Governor rollback failed";
    /// Gradient aggregation switched mode or fell back.
    TOLARIA_GRAD_AGG_FALLBACK = "tolaria.grad_agg.fallback", Warning, "Gradient aggregation fell back";
    /// A seed was germinated.
    KASMINA_SEED_GERMINATED = "kasmina.seed.germinated", Info, "Seed germinated";
    /// A seed changed stage (attributes `from`, `to`).
    KASMINA_SEED_STAGE_CHANGED = "kasmina.seed.stage_changed", Info, "Seed stage changed";
    /// A lifecycle gate was evaluated (attributes `gate`, `passed`).
    KASMINA_SEED_GATE_EVALUATED = "kasmina.seed.gate_evaluated", Debug, "Gate evaluated";
    /// A seed was fossilized.
    KASMINA_SEED_FOSSILIZED = "kasmina.seed.fossilized", Info, "Seed fossilized";
    /// A seed was pruned (attributes `reason`, `initiator`).
    KASMINA_SEED_PRUNED = "kasmina.seed.pruned", Info, "Seed pruned";
    /// The heuristic controller saw the host stabilise (reference §3.5's
    /// one-way latch; the reference's `TAMIYO_INITIATED`).
    TAMIYO_INITIATED = "tamiyo.initiated", Info, "The host stabilised: Tamiyo initiated";
    /// The policy runs in bf16 on a CPU whose oneDNN has no bf16 LSTM (no
    /// AVX-512): its LSTM runs outside bf16, the other layers in bf16; sent
    /// once by the PPO trainer that set the precision (attribute `reason`).
    TAMIYO_PRECISION_FALLBACK = "tamiyo.precision_fallback", Warning, "Policy LSTM runs outside bf16 on this CPU";
    /// A PPO update finished.
    SIMIC_PPO_UPDATE_COMPLETED = "simic.ppo.update_completed", Info, "PPO update completed";
    /// A PPO update's joint ratio rose far above the clip range (the
    /// reference's `RATIO_EXPLOSION_DETECTED`).
    SIMIC_PPO_RATIO_EXPLOSION = "simic.ppo.ratio_explosion", Warning, "PPO ratio explosion detected";
    /// A PPO update's joint ratio fell far below the clip range (the
    /// reference's `RATIO_COLLAPSE_DETECTED`).
    SIMIC_PPO_RATIO_COLLAPSE = "simic.ppo.ratio_collapse", Warning, "PPO ratio collapse detected";
    /// The critic predicts one value for every state (the reference's
    /// `VALUE_COLLAPSE_DETECTED`).
    SIMIC_PPO_VALUE_COLLAPSE = "simic.ppo.value_collapse", Warning, "PPO value collapse detected";
    /// A PPO statistic is not finite (the reference's
    /// `NUMERICAL_INSTABILITY_DETECTED`).
    SIMIC_PPO_NUMERICAL_INSTABILITY = "simic.ppo.numerical_instability", Error, "PPO numerical instability detected";
    /// A step's reward matched an anti-gaming pattern
    /// (`attribution_ratio` or `ransomware_signature`; the reference's
    /// `REWARD_HACKING_SUSPECTED`).
    SIMIC_REWARD_HACKING_SUSPECTED = "simic.reward.hacking_suspected", Warning, "Reward hacking suspected";
    /// The Shapley values of an environment's seeds at its episode's last
    /// epoch (reference §4.5).
    SIMIC_SHAPLEY_COMPUTED = "simic.shapley.computed", Info, "Shapley values computed";
    /// An environment's episode ended: final accuracy, reward, outcome,
    /// seeds and the controller's op counts (reference §6.3's
    /// `EPISODE_OUTCOME`).
    SIMIC_EPISODE_OUTCOME = "simic.episode.outcome", Info, "Episode outcome";
    /// The round's decisions over every environment: ops chosen and carried
    /// out, blueprints germinated, forced steps (reference §6.3's
    /// `ANALYTICS_SNAPSHOT` of kind `action_distribution`).
    SIMIC_ACTION_DISTRIBUTION = "simic.analytics.action_distribution", Info, "Action distribution of a round";
    /// The hub started dropping events.
    NISSA_DROPPING = "nissa.dropping", Warning, "Telemetry is dropping events";
    /// A sink failed (reported once per sink).
    NISSA_SINK_FAILED = "nissa.sink.failed", Error, "A telemetry sink failed";
}

/// The `source` of every packet: one per producing crate. A slot's packets
/// add the slot (`kasmina.r0c1`); everything else uses these as they are.
pub mod sources {
    /// Kasmina's model-wide packets (`kasmina.seeds.active`), and the prefix
    /// of its per-slot sources.
    pub const KASMINA: &str = "kasmina";
    /// Tolaria's trainer, governor and decision-deadline packets.
    pub const TOLARIA: &str = "tolaria";
    /// Tamiyo's controller packets.
    pub const TAMIYO: &str = "tamiyo";
    /// Simic's PPO packets.
    pub const SIMIC: &str = "simic";
    /// Every source above.
    pub static ALL: &[&str] = &[KASMINA, TOLARIA, TAMIYO, SIMIC];
}

/// Looks a metric up by name.
pub fn metric_spec(name: &str) -> Option<&'static MetricSpec> {
    METRICS.iter().find(|spec| spec.name == name)
}

/// Looks an event up by name.
pub fn event_spec(name: &str) -> Option<&'static EventSpec> {
    EVENTS.iter().find(|spec| spec.name == name)
}

/// Every metric and event name, metrics first (for baseline `telemetry_names`).
pub fn all_names() -> impl Iterator<Item = &'static str> {
    METRICS
        .iter()
        .map(|spec| spec.name)
        .chain(EVENTS.iter().map(|spec| spec.name))
}

/// Prometheus form of a dotted name: dots become underscores.
pub fn prometheus_name(name: &str) -> String {
    name.replace('.', "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = HashSet::new();
        for name in all_names() {
            assert!(seen.insert(name), "duplicate telemetry name {name}");
            assert!(
                name.split('.').count() >= 2,
                "{name} lacks a subsystem prefix"
            );
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_'),
                "{name} has characters outside [a-z0-9._]"
            );
        }
    }

    #[test]
    fn seed_guardrail_names_exist() {
        for name in [
            "tolaria.training.latency_ms",
            "tolaria.train.graph_enabled",
            "tolaria.graph_enabled",
            "tolaria.graph_fallback",
        ] {
            assert!(metric_spec(name).is_some() || event_spec(name).is_some());
        }
        for prefix in ["tolaria.timeout.", "tolaria.rollback.", "tolaria.grad_agg."] {
            assert!(
                all_names().any(|name| name.starts_with(prefix)),
                "{prefix}*"
            );
        }
    }
}
