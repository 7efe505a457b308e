//! Tolaria: the Esper-rs training engine.
//!
//! Tolaria is the one training loop of Esper-rs. [`engine`] holds it: the
//! [`engine::Engine`] owns streams, staging, capture, replay, readback and
//! the epoch loop for any [`engine::Step`]; [`engine::model_step::ModelStep`]
//! is the general step (any Kasmina model with seeds, libtorch autograd,
//! AMP, microbatches, device clipping, PCGrad, deferred seed metrics);
//! [`ModelTrainer`] adds the epoch boundary (validation, governor,
//! counterfactual contributions, the controller with a deadline, Kasmina's
//! epoch tick). Every CUDA graph of the crate lives in the engine's one
//! process-wide pool per device and lane ([`engine::shared_pool`]). The
//! `tolaria-reference` workload runs through the engine as a
//! `Linear(16->4)` host with no slot.
//!
//! The front door is the engine's: [`ModelTrainer`] and its
//! [`ModelTrainerConfig`], the [`ExecutionMode`] and [`DataPlacement`] it
//! runs with, amp's training precision ([`Precision`], [`PrecisionConfig`],
//! [`MatmulPrecision`]), [`DeviceChoice`], [`Error`] and [`Result`].
//!
//! Beside it, explicitly special and named so: [`reference`](mod@reference), the
//! hand-derived fused step of `tolaria-reference` (a `Linear` + softmax
//! cross-entropy + SGD with a hand-written backward) and its own
//! [`reference::Trainer`], kept as the `fused-*` variants of that benchmark.
//! It uses the engine, amp and the data layer; nothing else in the crate
//! uses it.
//!
//! Tolaria is the trainer side: it owns every data set and its staging
//! ([`data`], [`engine::staging`]) and every optimizer ([`optim`]: the state
//! of each parameter group Kasmina exposes). It defines no model structure
//! (hosts, slots and seeds are Kasmina's) and resolves devices only through
//! `torch_ext::device::select`.
//!
//! - [`engine`]: the engine, the general step and trainer
//!   ([`engine::trainer`]), the execution modes, the shared graph pool, their
//!   benchmarks ([`engine::bench`]).
//! - [`amp`]: training precision: autocast dtype, the device-side
//!   `GradScaler`, and the TF32/matmul settings applied once per trainer
//!   ([`amp::apply_precision`]).
//! - [`data`]: every data set (Fashion-MNIST, CIFAR-10, seeded synthetic
//!   tasks, the `tolaria-reference` task) as one [`data::Dataset`] type, with
//!   seeded shuffle, split and batches, and the reference task's packed
//!   microbatch layout.
//! - [`optim`]: the optimizer state of every parameter group of a
//!   morphogenetic model (host and seeds), built and dropped as Kasmina's
//!   group events arrive, stepped with fused kernels, learning rate and step
//!   count on the device. The trainer is the one owner of optimizers.
//! - [`controller`]: what the trainer asks at each epoch boundary, with a
//!   deadline.
//! - [`governor`]: NaN, lobotomy and divergence rollback.
//! - [`grad_agg`]: gradient aggregation across seeds (PCGrad).
//! - [`seed_metrics`]: deferred per-seed gradient metrics.
//! - [`task`]: a data set wired to the host that matches it (`fmnist`,
//!   `fmnist-impaired`, `cifar10`, `cifar10-impaired`, `synthetic`), the one
//!   place `esper train`, the simic workloads and library users get a task.
//! - [`engine::trainer::checkpoint`]: a [`ModelTrainer`]'s checkpoint
//!   directory ([`ModelTrainer::save_checkpoint`],
//!   [`engine::trainer::read_checkpoint`]) through `durable`'s one
//!   checkpoint-directory writer.
//! - [`reference`](mod@reference): the special `tolaria-reference` path (its
//!   [`reference::config::TrainerConfig`], step, graphs, trainer and the
//!   benchmark behind `esper bench tolaria-reference`,
//!   [`reference::bench`]).
//! - [`error`]: the crate's [`Error`].
//!
//! Telemetry leaves through a [`leyline::Telemetry`] handle, under leyline's
//! source `leyline::telemetry::sources::TOLARIA`.
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
pub mod controller;
pub mod data;
pub mod engine;
pub mod error;
pub mod governor;
pub mod grad_agg;
pub mod optim;
pub mod reference;
pub mod seed_metrics;
pub mod task;

pub use amp::{MatmulPrecision, Precision, PrecisionConfig};
pub use engine::trainer::{ModelTrainer, ModelTrainerConfig};
pub use engine::{DataPlacement, ExecutionMode};
pub use error::{Error, Result};
/// Which device to train on: torch-ext's, the workspace's one device choice
/// (resolved by [`torch_ext::device::select`]).
pub use torch_ext::DeviceChoice;
