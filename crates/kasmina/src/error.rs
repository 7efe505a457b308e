//! The crate's error type: one enum for every way a Kasmina call can fail.

/// Errors from Kasmina.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A libtorch operation failed.
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    /// A contract value was refused (enum value, message validation).
    #[error(transparent)]
    Contract(#[from] leyline::Error),

    /// A torch-ext op (a fused layer's kernels) failed.
    #[error(transparent)]
    Kernel(#[from] torch_ext::Error),
    /// A blueprint name that the registry does not know.
    #[error("unknown blueprint {name:?} (known CNN blueprints: {known})")]
    UnknownBlueprint {
        /// The name that was asked for.
        name: String,
        /// The names that exist, comma separated.
        known: String,
    },
    /// A lifecycle move the leyline transition table does not allow.
    #[error("slot {slot}: {source}")]
    IllegalTransition {
        /// Slot the seed lives in.
        slot: String,
        /// The contract error naming the refused move.
        source: leyline::Error,
    },
    /// A lifecycle target that may not be asked for explicitly (failure stages, none).
    #[error("slot {slot}: {target} cannot be requested as an advance target")]
    InvalidTarget {
        /// Slot the seed lives in.
        slot: String,
        /// The refused target stage.
        target: leyline::SeedStage,
    },
    /// Germination into a slot that still holds state (live seed or cooldown).
    #[error("slot {slot} is unavailable for germination: it holds a seed in {stage}")]
    SlotOccupied {
        /// The slot.
        slot: String,
        /// The stage of the state it still holds.
        stage: leyline::SeedStage,
    },
    /// A lifecycle call on a slot that holds no seed.
    #[error("slot {slot} holds no seed")]
    NoSeed {
        /// The slot.
        slot: String,
    },
    /// A slot id that the host does not offer (or that is not enabled).
    #[error("unknown slot {slot:?} (available: {available})")]
    UnknownSlot {
        /// The id that was asked for.
        slot: String,
        /// The ids that exist, comma separated.
        available: String,
    },
    /// A slot id that is not of the canonical form `r{row}c{col}`.
    #[error("invalid slot id {id:?}: expected r{{row}}c{{col}}")]
    InvalidSlotId {
        /// The refused id.
        id: String,
    },
    /// A tensor whose shape does not fit the operation.
    #[error("{op}: expected shape {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// The operation that checked the shape.
        op: &'static str,
        /// The expected shape (`-1` = any size).
        expected: Vec<i64>,
        /// The shape that arrived.
        got: Vec<i64>,
    },
    /// The G0 gate refused a germination.
    #[error("slot {slot}: germination refused by G0: {reason}")]
    GerminationRefused {
        /// The slot.
        slot: String,
        /// The failed checks.
        reason: String,
    },
    /// `AlphaController::retarget` outside HOLD.
    #[error("alpha controller can only be retargeted from HOLD (mode is {mode})")]
    AlphaNotHold {
        /// The controller's mode.
        mode: leyline::AlphaMode,
    },
    /// A configuration value outside its allowed range.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A number that must be finite was NaN or infinite (see
    /// [`crate::validate`]).
    #[error("{field} must be finite, got {value}")]
    NonFinite {
        /// The field or argument, e.g. `GerminationOptions.alpha_target`.
        field: &'static str,
        /// The refused value.
        value: f64,
    },
    /// A value outside its allowed range (see [`crate::validate`]).
    #[error("{field} = {value} is outside {allowed}")]
    OutOfRange {
        /// The field or argument, e.g. `CnnHostConfig.n_blocks`.
        field: &'static str,
        /// The refused value, as written by `Display`.
        value: String,
        /// The allowed range, e.g. `[1, 65536]`.
        allowed: String,
    },
    /// A prefetch request was cancelled before its seed module was handed over.
    #[error("prefetch request was cancelled")]
    Cancelled,
    /// The prefetch queue is full (only from the non-blocking request call).
    #[error("prefetch queue is full ({capacity} requests)")]
    QueueFull {
        /// Queue capacity.
        capacity: usize,
    },
    /// The prefetcher was shut down, or its worker died.
    #[error("prefetcher is closed")]
    PrefetcherClosed,
    /// The prefetcher's tokio runtime could not be started.
    #[error("cannot start the prefetch runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Result alias of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
