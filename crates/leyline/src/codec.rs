//! Validated encoding and decoding of the contract messages.
//!
//! Decoding (protobuf or JSON) never panics: bytes that are not a message,
//! enum values outside the contract (the reserved stage 5 included), non-finite
//! or out-of-range numbers and unknown schema versions all return a
//! [`ContractError`].

use prost::Message;

use crate::action::{
    AlphaCurveAction, AlphaSpeedAction, AlphaTargetAction, BlueprintAction, GerminationStyle,
    LifecycleOp, TempoAction,
};
use crate::proto::{
    AdaptationCommand, GateResult, SeedMetricSet, SeedState, TelemetryEvent, TelemetryMetric,
    TelemetryPacket,
};
use crate::{
    AlphaAlgorithm, AlphaCurve, AlphaMode, ContractError, GateLevel, Result, SCHEMA_VERSION,
    SeedStage, TelemetryLevel,
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
        let message = Self::decode(bytes).map_err(|error| ContractError::Decode {
            message: Self::NAME,
            reason: error.to_string(),
        })?;
        message.validate()?;
        Ok(message)
    }

    /// Serialises as JSON (after validation).
    fn to_json(&self) -> Result<String> {
        self.validate()?;
        serde_json::to_string(self).map_err(|error| ContractError::Json {
            message: Self::NAME,
            reason: error.to_string(),
        })
    }

    /// Parses JSON (every non-optional field required) and validates the result.
    fn from_json(text: &str) -> Result<Self> {
        let message: Self = serde_json::from_str(text).map_err(|error| ContractError::Json {
            message: Self::NAME,
            reason: error.to_string(),
        })?;
        message.validate()?;
        Ok(message)
    }
}

fn check_schema(message: &'static str, got: u32) -> Result<()> {
    if got == SCHEMA_VERSION {
        Ok(())
    } else {
        Err(ContractError::SchemaVersion {
            message,
            expected: SCHEMA_VERSION,
            got,
        })
    }
}

fn check_finite(message: &'static str, field: &'static str, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(ContractError::InvalidField {
            message,
            field,
            reason: format!("{value} is not finite"),
        })
    }
}

fn check_unit_interval(message: &'static str, field: &'static str, value: f64) -> Result<()> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(ContractError::InvalidField {
            message,
            field,
            reason: format!("{value} is outside [0, 1]"),
        })
    }
}

impl Contract for SeedMetricSet {
    const NAME: &'static str = "SeedMetricSet";

    fn validate(&self) -> Result<()> {
        check_schema(Self::NAME, self.schema_version)?;
        for (field, value) in [
            ("train_accuracy", self.train_accuracy),
            ("val_accuracy", self.val_accuracy),
            ("accuracy_at_stage_start", self.accuracy_at_stage_start),
            (
                "improvement_since_stage_start",
                self.improvement_since_stage_start,
            ),
            ("gradient_norm", self.gradient_norm),
        ] {
            check_finite(Self::NAME, field, value)?;
        }
        if let Some(ratio) = self.gradient_ratio {
            check_finite(Self::NAME, "gradient_ratio", ratio)?;
        }
        if let Some(contribution) = self.counterfactual_contribution {
            check_finite(Self::NAME, "counterfactual_contribution", contribution)?;
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
        check_schema(Self::NAME, self.schema_version)?;
        self.seed_stage()?;
        self.previous_seed_stage()?;
        self.alpha_mode_enum()?;
        self.alpha_curve_enum()?;
        self.alpha_algorithm_enum()?;
        check_unit_interval(Self::NAME, "alpha", self.alpha)?;
        check_unit_interval(Self::NAME, "alpha_target", self.alpha_target)?;
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
        check_schema(Self::NAME, self.schema_version)?;
        self.gate_level()?;
        check_unit_interval(Self::NAME, "score", self.score)
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
        check_schema(Self::NAME, self.schema_version)?;
        self.telemetry_level()?;
        for metric in &self.metrics {
            if metric.name.is_empty() {
                return Err(ContractError::InvalidField {
                    message: Self::NAME,
                    field: "metrics.name",
                    reason: "empty metric name".to_owned(),
                });
            }
        }
        for event in &self.events {
            event.telemetry_level()?;
            if event.name.is_empty() {
                return Err(ContractError::InvalidField {
                    message: Self::NAME,
                    field: "events.name",
                    reason: "empty event name".to_owned(),
                });
            }
        }
        Ok(())
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
        check_schema(Self::NAME, self.schema_version)?;
        self.decoded().map(|_| ())
    }
}
