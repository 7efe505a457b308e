//! The lifecycle's telemetry: the `KASMINA_SEED_*` events (germinated, stage
//! changed, gate evaluated, fossilized, pruned) and the per-seed gauges,
//! built from the state alone (see [`crate::telemetry`] for the handle and
//! the attribute conventions). Emission never fails a lifecycle operation.

use leyline::SeedStage;

use super::Lifecycle;
use crate::gate::GateOutcome;

impl Lifecycle {
    /// Emits event `name` with the slot's and seed's attributes plus `extra`.
    pub(super) fn emit(&self, name: &str, message: &str, mut extra: Vec<(&'static str, String)>) {
        if !self.telemetry.is_enabled() {
            return;
        }
        let mut attributes = vec![("slot_id", self.slot.to_string())];
        if let Some(state) = &self.state {
            attributes.push(("seed_id", state.seed_id.clone()));
            attributes.push(("blueprint_id", state.blueprint.name().to_owned()));
            attributes.push(("alpha", format!("{}", state.alpha())));
            attributes.push(("epochs_in_stage", state.metrics.epochs_in_stage.to_string()));
            attributes.push(("stage", state.stage.name().to_owned()));
        }
        attributes.append(&mut extra);
        self.telemetry
            .emit_event(&self.source, name, message, attributes);
    }

    pub(super) fn emit_stage_changed(&self, from: SeedStage, to: SeedStage) {
        self.emit(
            leyline::telemetry::KASMINA_SEED_STAGE_CHANGED,
            &format!("{from} -> {to}"),
            vec![
                ("from", from.name().to_owned()),
                ("to", to.name().to_owned()),
            ],
        );
    }

    pub(super) fn emit_gate(&self, outcome: &GateOutcome, target: SeedStage) {
        self.emit(
            leyline::telemetry::KASMINA_SEED_GATE_EVALUATED,
            &outcome.message,
            vec![
                ("gate", outcome.gate.name().to_owned()),
                ("passed", outcome.passed.to_string()),
                ("target_stage", target.name().to_owned()),
                ("score", format!("{}", outcome.score)),
                ("checks_passed", outcome.checks_passed.join(",")),
                ("checks_failed", outcome.checks_failed.join(",")),
            ],
        );
    }

    pub(super) fn emit_fossilized(&self) {
        let Some(state) = &self.state else {
            return;
        };
        let improvement = state.metrics.improvement_since_stage_start();
        let counterfactual = state.metrics.counterfactual_contribution.unwrap_or(0.0);
        self.emit(
            leyline::telemetry::KASMINA_SEED_FOSSILIZED,
            "seed fossilized",
            vec![
                ("improvement", format!("{improvement}")),
                ("params_added", state.param_count.to_string()),
                ("counterfactual", format!("{counterfactual}")),
            ],
        );
    }

    /// Emits the seed's gauges (alpha, stage, epochs in stage, gradient norm
    /// and ratio, accuracy change, parameters) as one packet; nothing for an
    /// empty slot.
    pub fn emit_metrics(&self) {
        use leyline::metric;
        use leyline::telemetry as names;
        let Some(state) = &self.state else {
            return;
        };
        if !self.telemetry.is_enabled() {
            return;
        }
        let metrics = &state.metrics;
        let mut values = vec![
            metric(names::KASMINA_SEED_ALPHA, state.alpha()),
            metric(names::KASMINA_SEED_STAGE, f64::from(state.stage.value())),
            metric(
                names::KASMINA_SEED_EPOCHS_IN_STAGE,
                f64::from(metrics.epochs_in_stage),
            ),
            metric(names::KASMINA_SEED_GRADIENT_NORM, metrics.gradient_norm),
            metric(
                names::KASMINA_SEED_ACCURACY_DELTA,
                metrics.improvement_since_stage_start(),
            ),
            metric(names::KASMINA_SEED_PARAMS, state.param_count as f64),
        ];
        if let Some(ratio) = metrics.gradient_ratio {
            values.push(metric(names::KASMINA_SEED_GRADIENT_RATIO, ratio));
        }
        let mut packet =
            leyline::proto::TelemetryPacket::new(&self.source, leyline::TelemetryLevel::Debug);
        for mut value in values {
            value
                .attributes
                .insert("slot_id".to_owned(), self.slot.to_string());
            value
                .attributes
                .insert("seed_id".to_owned(), state.seed_id.clone());
            packet = packet.with_metric(value);
        }
        self.telemetry.emit_packet(packet);
    }
}
