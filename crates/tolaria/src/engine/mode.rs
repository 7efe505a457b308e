//! How the engine runs: the execution mode of its steps and where the
//! training set lives between epochs. Serde values, spelled in kebab-case on
//! the command line and in records.

use serde::{Deserialize, Serialize};

/// How each training step is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecutionMode {
    /// Every op launched from the host, every step.
    Eager,
    /// Warm up eagerly on the capture stream, capture one step per microbatch
    /// shape, then copy each microbatch into static buffers and replay.
    GraphStep,
    /// Dataset resident on the device; a whole epoch (accumulator reset and
    /// every microbatch's step) captured once and replayed with no per-step
    /// host work: by the engine as a chain of graphs of a few steps each
    /// ([`super::EngineConfig::epoch_graph_steps`]), by the reference
    /// trainer as one graph.
    GraphEpoch,
}

impl ExecutionMode {
    /// Every mode, in benchmark order.
    pub const ALL: [ExecutionMode; 3] = [
        ExecutionMode::Eager,
        ExecutionMode::GraphStep,
        ExecutionMode::GraphEpoch,
    ];

    /// The kebab-case name used on the command line and in records.
    pub fn name(self) -> &'static str {
        match self {
            ExecutionMode::Eager => "eager",
            ExecutionMode::GraphStep => "graph-step",
            ExecutionMode::GraphEpoch => "graph-epoch",
        }
    }

    /// Parses [`ExecutionMode::name`].
    pub fn from_name(name: &str) -> Option<ExecutionMode> {
        ExecutionMode::ALL
            .into_iter()
            .find(|mode| mode.name() == name)
    }

    /// Whether the mode replays CUDA graphs.
    pub fn uses_graphs(self) -> bool {
        !matches!(self, ExecutionMode::Eager)
    }
}

/// Where the training set lives between epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataPlacement {
    /// Page-locked host memory (plain host memory on a CPU-only run); each
    /// epoch's microbatches are staged to the device on the staging stream.
    PinnedHost,
    /// Copied to the device once at start-up; epochs read it in place.
    Device,
}
