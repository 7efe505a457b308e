//! The one error type of the contracts crate.

/// Why a contract value was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An integer that names no variant of a contract enum (including the
    /// reserved `SeedStage` value 5).
    #[error("invalid {enum_name} value {value}")]
    InvalidEnumValue {
        /// The contract enum.
        enum_name: &'static str,
        /// The refused value.
        value: i64,
    },
    /// A name that names no variant of a contract enum.
    #[error("invalid {enum_name} name {name:?}")]
    InvalidEnumName {
        /// The contract enum.
        enum_name: &'static str,
        /// The refused name.
        name: String,
    },
    /// A lifecycle move the transition table does not allow.
    #[error("illegal seed transition {from} -> {to}")]
    IllegalTransition {
        /// Stage the seed is in.
        from: crate::SeedStage,
        /// Stage that was asked for.
        to: crate::SeedStage,
    },
    /// A message written by a schema version this build does not read.
    #[error("{message} has schema version {got}, expected {expected}")]
    SchemaVersion {
        /// Message type.
        message: &'static str,
        /// Version this build reads.
        expected: u32,
        /// Version found.
        got: u32,
    },
    /// A field whose value is outside its contract range.
    #[error("{message}.{field}: {reason}")]
    InvalidField {
        /// Message type.
        message: &'static str,
        /// Offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Bytes that are not a valid protobuf encoding of the message.
    #[error("cannot decode {message} from protobuf: {reason}")]
    Decode {
        /// Message type.
        message: &'static str,
        /// Decoder's explanation.
        reason: String,
    },
    /// Text that is not valid JSON for the message.
    #[error("cannot parse {message} from JSON: {reason}")]
    Json {
        /// Message type.
        message: &'static str,
        /// Parser's explanation.
        reason: String,
    },
}

/// Result alias of the contracts crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
