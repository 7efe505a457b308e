//! Tolaria: the Esper-rs training engine.
//!
//! Tolaria is the one training loop of Esper-rs. [`engine`] holds it: the
//! [`engine::Engine`] owns streams, staging, capture, replay, readback and
//! the epoch loop for any [`engine::Step`]; [`engine::model_step::ModelStep`]
//! is the general step (any Kasmina model with seeds, libtorch autograd,
//! AMP, microbatches, device clipping, PCGrad, deferred seed metrics);
//! [`engine::trainer::ModelTrainer`] adds the epoch boundary (validation,
//! governor, counterfactual contributions, the controller with a deadline,
//! Kasmina's epoch tick). The `tolaria-reference` workload runs through it as
//! a `Linear(16->4)` host with no slot.
//!
//! Beside it, explicitly special: the hand-derived fused step of
//! `tolaria-reference` ([`step`], [`graph`], [`trainer::Trainer`]), a
//! `Linear` + softmax cross-entropy + SGD with a hand-written backward, kept
//! as the `fused-*` variants of that benchmark.
//!
//! Tolaria is the trainer side: it owns every data set and its staging
//! ([`data`], [`engine::staging`]) and every optimizer ([`optim`]: the state
//! of each parameter group Kasmina exposes). It defines no model structure
//! (hosts, slots and seeds are Kasmina's) and resolves devices only through
//! `torch_ext::device::select`.
//!
//! - [`config`]: the serde [`TrainerConfig`].
//! - [`data`]: every data set (Fashion-MNIST, CIFAR-10, seeded synthetic
//!   tasks, the `tolaria-reference` task) as one [`data::Dataset`] type, with
//!   seeded shuffle, split and batches, and the reference task's packed
//!   microbatch layout.
//! - [`engine`]: the engine, the general step and trainer, their benchmarks.
//! - [`step`]: the special `tolaria-reference` step (hand-derived fused
//!   backward, or autograd) on device-resident parameters.
//! - [`graph`]: streams, events, step/epoch graph capture and fallback.
//! - [`optim`]: the optimizer state of every parameter group of a
//!   morphogenetic model (host and seeds), built and dropped as Kasmina's
//!   group events arrive, stepped with fused kernels, learning rate and step
//!   count on the device. The trainer is the one owner of optimizers.
//! - [`trainer`]: the special reference [`Trainer`] of the fused step.
//! - [`telemetry`]: the trainer's packets; they leave through the
//!   [`leyline::Telemetry`] handle given to [`Trainer::with_telemetry`].
//! - [`bench`](mod@bench): the `tolaria-reference` benchmark behind `esper bench`.
//!
//! GPU-only paths compile everywhere; on a machine without CUDA the graph
//! modes return [`Error::CudaRequired`].

// No panics on caller- or file-supplied values: the panic lints are on for
// library code, and every integer operation is checked, saturating or bounded
// where it is written (sizes are validated where they enter).
#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]

pub mod amp;
pub mod bench;
pub mod config;
pub mod controller;
pub mod data;
pub mod engine;
pub mod error;
pub mod governor;
pub mod grad_agg;
pub mod graph;
pub mod optim;
mod placement;
pub mod seed_metrics;
pub mod step;
pub mod telemetry;
pub mod trainer;

pub use config::{
    DataPlacement, DeviceChoice, ExecutionMode, MatmulPrecision, PrecisionConfig, StepKind,
    TrainerConfig,
};
pub use error::{Error, Result};
pub use trainer::{EpochReport, Trainer, ValidationReport};
