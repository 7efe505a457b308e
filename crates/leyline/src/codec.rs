//! Validated encoding and decoding of the contract messages.
//!
//! Decoding (protobuf or JSON) never panics: bytes that are not a message,
//! enum values outside the contract (the reserved stage 5 included), non-finite
//! or out-of-range numbers, unknown schema versions and (JSON) unknown or
//! missing keys all return a [`Error`]. Every encoder and decoder runs
//! [`Contract::validate`], so both encodings accept exactly the same values and
//! whatever one writes, the other reads back.
//!
//! # Non-finite numbers
//!
//! JSON cannot carry NaN or the infinities (serde would write `null`, which no
//! decoder of a required number accepts), so **non-finite numbers are not
//! contract values**: `validate` refuses them with
//! [`Error::InvalidField`] naming the message and the field, and
//! therefore `encode_protobuf`, `to_json`, `decode_protobuf` and `from_json`
//! refuse them too, in protobuf as well as in JSON. Telemetry follows the same
//! rule: a [`TelemetryPacket`] with a non-finite metric value is refused as a
//! whole by [`check_finite_packet`] (and by its `validate`); a sink must count
//! such a packet failed, never delivered.
//!
//! # Ranges
//!
//! Where the contract states a range it is enforced: `alpha`, `alpha_target`
//! and gate `score` in `[0, 1]`; accuracies in `[0, 100]` percent
//! ([`MAX_ACCURACY_PERCENT`]); improvement and counterfactual contribution in
//! `[-100, 100]` percentage points ([`MAX_ABS_PERCENTAGE_POINTS`]); gradient
//! norm `>= 0`; gradient ratio in `[0, MAX_GRADIENT_RATIO]`
//! ([`crate::gate::thresholds::MAX_GRADIENT_RATIO`]). Metric and event names
//! are not empty.

use prost::Message;

use crate::action::{
    AlphaCurveAction, AlphaSpeedAction, AlphaTargetAction, BlueprintAction, GerminationStyle,
    LifecycleOp, TempoAction,
};
use crate::checks;
use crate::gate::thresholds::MAX_GRADIENT_RATIO;
use crate::proto::{
    AdaptationCommand, GateResult, SeedMetricSet, SeedState, TelemetryEvent, TelemetryMetric,
    TelemetryPacket,
};
use crate::{
    AlphaAlgorithm, AlphaCurve, AlphaMode, Error, GateLevel, Result, SCHEMA_VERSION, SeedStage,
    TelemetryLevel,
};

/// A contract message: protobuf + JSON codec and a validity check.
pub trait Contract: Message + Default + serde::Serialize + serde::de::DeserializeOwned {
    /// Message name used in errors.
    const NAME: &'static str;

    /// Checks schema version, enum values and numeric ranges.
    fn validate(&self) -> Result<()>;

    /// Encodes as protobuf bytes (after validation).
    fn encode_protobuf(&self) -> Result<Vec<u8>> {
        self.validate()?;
        Ok(self.encode_to_vec())
    }

    /// Decodes protobuf bytes and validates the result.
    fn decode_protobuf(bytes: &[u8]) -> Result<Self> {
        let message = Self::decode(bytes).map_err(|error| Error::Decode {
            message: Self::NAME,
            reason: error.to_string(),
        })?;
        message.validate()?;
        Ok(message)
    }

    /// Serialises as JSON (after validation).
    fn to_json(&self) -> Result<String> {
        self.validate()?;
        serde_json::to_string(self).map_err(|error| Error::Json {
            message: Self::NAME,
            reason: error.to_string(),
        })
    }

    /// Parses JSON (every non-optional field required) and validates the result.
    fn from_json(text: &str) -> Result<Self> {
        let message: Self = serde_json::from_str(text).map_err(|error| Error::Json {
            message: Self::NAME,
            reason: error.to_string(),
        })?;
        message.validate()?;
        Ok(message)
    }
}

/// Largest accuracy, in percent.
pub const MAX_ACCURACY_PERCENT: f64 = 100.0;

/// Largest magnitude of an accuracy difference (improvement since stage
/// start, counterfactual contribution), in percentage points.
pub const MAX_ABS_PERCENTAGE_POINTS: f64 = 100.0;

impl Contract for SeedMetricSet {
    const NAME: &'static str = "SeedMetricSet";

    fn validate(&self) -> Result<()> {
        let name = Self::NAME;
        checks::schema(name, self.schema_version)?;
        for (field, value) in [
            ("train_accuracy", self.train_accuracy),
            ("val_accuracy", self.val_accuracy),
            ("accuracy_at_stage_start", self.accuracy_at_stage_start),
        ] {
            checks::in_range(name, field, value, 0.0, MAX_ACCURACY_PERCENT)?;
        }
        let points = MAX_ABS_PERCENTAGE_POINTS;
        checks::in_range(
            name,
            "improvement_since_stage_start",
            self.improvement_since_stage_start,
            -points,
            points,
        )?;
        checks::in_range(name, "gradient_norm", self.gradient_norm, 0.0, f64::MAX)?;
        if let Some(ratio) = self.gradient_ratio {
            checks::in_range(name, "gradient_ratio", ratio, 0.0, MAX_GRADIENT_RATIO)?;
        }
        if let Some(contribution) = self.counterfactual_contribution {
            checks::in_range(
                name,
                "counterfactual_contribution",
                contribution,
                -points,
                points,
            )?;
        }
        Ok(())
    }
}

impl SeedState {
    /// The seed's stage as a contract enum.
    pub fn seed_stage(&self) -> Result<SeedStage> {
        SeedStage::from_value(self.stage)
    }

    /// The stage before the last transition.
    pub fn previous_seed_stage(&self) -> Result<SeedStage> {
        SeedStage::from_value(self.previous_stage)
    }

    /// The alpha controller mode.
    pub fn alpha_mode_enum(&self) -> Result<AlphaMode> {
        AlphaMode::from_value(self.alpha_mode)
    }

    /// The alpha schedule curve.
    pub fn alpha_curve_enum(&self) -> Result<AlphaCurve> {
        AlphaCurve::from_value(self.alpha_curve)
    }

    /// The blend algorithm.
    pub fn alpha_algorithm_enum(&self) -> Result<AlphaAlgorithm> {
        AlphaAlgorithm::from_value(self.alpha_algorithm)
    }
}

impl Contract for SeedState {
    const NAME: &'static str = "SeedState";

    fn validate(&self) -> Result<()> {
        checks::schema(Self::NAME, self.schema_version)?;
        self.seed_stage()?;
        self.previous_seed_stage()?;
        self.alpha_mode_enum()?;
        self.alpha_curve_enum()?;
        self.alpha_algorithm_enum()?;
        checks::in_range(Self::NAME, "alpha", self.alpha, 0.0, 1.0)?;
        checks::in_range(Self::NAME, "alpha_target", self.alpha_target, 0.0, 1.0)?;
        if let Some(metrics) = &self.metrics {
            metrics.validate()?;
        }
        Ok(())
    }
}

impl GateResult {
    /// The gate as a contract enum.
    pub fn gate_level(&self) -> Result<GateLevel> {
        GateLevel::from_value(self.gate)
    }
}

impl Contract for GateResult {
    const NAME: &'static str = "GateResult";

    fn validate(&self) -> Result<()> {
        checks::schema(Self::NAME, self.schema_version)?;
        self.gate_level()?;
        checks::in_range(Self::NAME, "score", self.score, 0.0, 1.0)
    }
}

impl TelemetryMetric {
    /// A metric with no attributes.
    pub fn new(name: &str, value: f64, unit: &str) -> Self {
        TelemetryMetric {
            name: name.to_owned(),
            value,
            unit: unit.to_owned(),
            attributes: Default::default(),
        }
    }
}

impl TelemetryEvent {
    /// An event with no attributes.
    pub fn new(name: &str, level: TelemetryLevel, message: &str) -> Self {
        TelemetryEvent {
            name: name.to_owned(),
            level: level.value(),
            message: message.to_owned(),
            attributes: Default::default(),
        }
    }

    /// The event level as a contract enum.
    pub fn telemetry_level(&self) -> Result<TelemetryLevel> {
        TelemetryLevel::from_value(self.level)
    }
}

impl TelemetryPacket {
    /// An empty packet from `source` at `level`, stamped with the current time.
    pub fn new(source: &str, level: TelemetryLevel) -> Self {
        let timestamp_unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| i64::try_from(elapsed.as_nanos()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        TelemetryPacket {
            schema_version: SCHEMA_VERSION,
            source: source.to_owned(),
            timestamp_unix_ns,
            level: level.value(),
            metrics: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Adds a metric (builder style).
    pub fn with_metric(mut self, metric: TelemetryMetric) -> Self {
        self.metrics.push(metric);
        self
    }

    /// Adds an event (builder style).
    pub fn with_event(mut self, event: TelemetryEvent) -> Self {
        self.events.push(event);
        self
    }

    /// The packet level as a contract enum.
    pub fn telemetry_level(&self) -> Result<TelemetryLevel> {
        TelemetryLevel::from_value(self.level)
    }
}

impl Contract for TelemetryPacket {
    const NAME: &'static str = "TelemetryPacket";

    fn validate(&self) -> Result<()> {
        checks::schema(Self::NAME, self.schema_version)?;
        self.telemetry_level()?;
        for metric in &self.metrics {
            checks::non_empty(Self::NAME, "metrics.name", &metric.name)?;
        }
        check_finite_packet(self)?;
        for event in &self.events {
            event.telemetry_level()?;
            checks::non_empty(Self::NAME, "events.name", &event.name)?;
        }
        Ok(())
    }
}

/// Refuses a packet that carries a non-finite metric value (see the module
/// docs): `Err(InvalidField { message: "TelemetryPacket", field:
/// "metrics.value", .. })` naming the first such metric and its index, `Ok`
/// otherwise. It checks nothing else; [`Contract::validate`] runs it along
/// with the other checks. Costs one comparison per metric, no allocation on
/// success.
pub fn check_finite_packet(packet: &TelemetryPacket) -> Result<()> {
    match packet
        .metrics
        .iter()
        .enumerate()
        .find(|(_, metric)| !metric.value.is_finite())
    {
        None => Ok(()),
        Some((index, metric)) => Err(checks::invalid(
            TelemetryPacket::NAME,
            "metrics.value",
            format!(
                "metric {} (index {index}) has value {}, which is not finite",
                checks::shown(&metric.name),
                metric.value
            ),
        )),
    }
}

/// An [`AdaptationCommand`] with every head decoded into its contract enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedCommand {
    /// Slot index in the run's slot configuration.
    pub slot: u32,
    /// Blueprint head.
    pub blueprint: BlueprintAction,
    /// Style head.
    pub style: GerminationStyle,
    /// Tempo head.
    pub tempo: TempoAction,
    /// Alpha target head.
    pub alpha_target: AlphaTargetAction,
    /// Alpha speed head.
    pub alpha_speed: AlphaSpeedAction,
    /// Alpha curve head.
    pub alpha_curve: AlphaCurveAction,
    /// Operation head.
    pub op: LifecycleOp,
}

impl AdaptationCommand {
    /// Decodes every head value.
    pub fn decoded(&self) -> Result<DecodedCommand> {
        Ok(DecodedCommand {
            slot: self.slot,
            blueprint: BlueprintAction::from_value(self.blueprint)?,
            style: GerminationStyle::from_value(self.style)?,
            tempo: TempoAction::from_value(self.tempo)?,
            alpha_target: AlphaTargetAction::from_value(self.alpha_target)?,
            alpha_speed: AlphaSpeedAction::from_value(self.alpha_speed)?,
            alpha_curve: AlphaCurveAction::from_value(self.alpha_curve)?,
            op: LifecycleOp::from_value(self.op)?,
        })
    }

    /// Builds a command from decoded heads.
    pub fn from_decoded(command: DecodedCommand, env_id: u32, epoch: u64) -> Self {
        AdaptationCommand {
            schema_version: SCHEMA_VERSION,
            slot: command.slot,
            blueprint: command.blueprint.value(),
            style: command.style.value(),
            tempo: command.tempo.value(),
            alpha_target: command.alpha_target.value(),
            alpha_speed: command.alpha_speed.value(),
            alpha_curve: command.alpha_curve.value(),
            op: command.op.value(),
            env_id,
            epoch,
        }
    }
}

impl Contract for AdaptationCommand {
    const NAME: &'static str = "AdaptationCommand";

    fn validate(&self) -> Result<()> {
        checks::schema(Self::NAME, self.schema_version)?;
        self.decoded().map(|_| ())
    }
}
