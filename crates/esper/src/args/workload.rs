//! The workloads `esper bench` runs, by name, and what each takes.

/// The workloads `esper bench` runs (DESIGN.md §6), each measured by its
/// crate's `bench` module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// `tolaria::reference::bench`: every execution mode of the special
    /// reference trainer, and the general trainer's on the same workload.
    TolariaReference,
    /// `nissa::bench`: hot-path emit with a slow sink.
    NissaEmit,
    /// `kasmina::bench`: germination requests through the prefetcher.
    KasminaPrefetch,
    /// `tolaria::engine::bench`: the CNN host with two seeds on
    /// Fashion-MNIST through the general trainer.
    TolariaFmnist,
    /// `tolaria::engine::bench`: the language-model task's transformer with
    /// two blending seeds on the fortunes corpus through the general trainer.
    TolariaLm,
    /// The decision-deadline drill.
    TolariaTimeout,
    /// The governor-rollback drill.
    TolariaRollback,
    /// `simic::bench`: vectorized PPO on Fashion-MNIST.
    SimicThroughput,
    /// `simic::bench`: vectorized PPO on CIFAR-10 (`ESPER_CIFAR10_DIR`).
    SimicCifar,
    /// `simic::bench`: vectorized PPO on the language-model task (the
    /// transformer host, the fortunes corpus).
    SimicLm,
    /// `simic::bench`: the `simic-cifar` environments driven by the
    /// max-growth controller, where seeds live.
    SimicGrowth,
    /// `simic::bench`: PPO rounds beside the heuristic and no growth.
    SimicLearning,
    /// `simic::bench`: the PPO update on CartPole-v1.
    PpoCartpole,
}

impl Workload {
    /// Every workload, in the order `cargo xtask bench` runs them.
    pub(crate) const ALL: [Workload; 13] = [
        Workload::TolariaReference,
        Workload::NissaEmit,
        Workload::KasminaPrefetch,
        Workload::TolariaFmnist,
        Workload::TolariaLm,
        Workload::TolariaTimeout,
        Workload::TolariaRollback,
        Workload::SimicThroughput,
        Workload::SimicCifar,
        Workload::SimicLm,
        Workload::SimicGrowth,
        Workload::SimicLearning,
        Workload::PpoCartpole,
    ];

    /// The record's workload name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::TolariaReference => tolaria::reference::bench::WORKLOAD,
            Workload::NissaEmit => nissa::bench::WORKLOAD,
            Workload::KasminaPrefetch => kasmina::bench::WORKLOAD,
            Workload::TolariaFmnist => tolaria::engine::bench::FMNIST_WORKLOAD,
            Workload::TolariaLm => tolaria::engine::bench::LM_WORKLOAD,
            Workload::TolariaTimeout => tolaria::engine::bench::TIMEOUT_WORKLOAD,
            Workload::TolariaRollback => tolaria::engine::bench::ROLLBACK_WORKLOAD,
            Workload::SimicThroughput => simic::bench::THROUGHPUT_WORKLOAD,
            Workload::SimicCifar => simic::bench::CIFAR_WORKLOAD,
            Workload::SimicLm => simic::bench::LM_WORKLOAD,
            Workload::SimicGrowth => simic::bench::GROWTH_WORKLOAD,
            Workload::SimicLearning => simic::bench::LEARNING_WORKLOAD,
            Workload::PpoCartpole => simic::bench::CARTPOLE_WORKLOAD,
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Workload> {
        Workload::ALL
            .into_iter()
            .find(|workload| workload.name() == name)
    }

    /// Whether the workload runs on a torch device (takes `--device`).
    pub(crate) fn uses_torch(self) -> bool {
        self != Workload::NissaEmit
    }
}
