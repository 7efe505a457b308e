//! The policy: the recurrent actor-critic network ([`network`]), its layers
//! ([`layers`]), masked sampling ([`sampling`], and the same as one CUDA
//! kernel in [`fused_sampling`]) and its seeded generator ([`rng`]).
//!
//! [`Policy`] owns the `VarStore` and the [`PolicyNetwork`] built in it (the
//! store saves and loads checkpoints and moves the variables between
//! devices); [`Policy::act`] runs one batched forward and samples an action
//! for every environment; [`graphed::GraphedAct`] captures that step in a
//! CUDA graph for a fixed batch.

pub mod fused_sampling;
pub mod graphed;
pub mod layers;
pub mod network;
pub mod rng;
pub mod sampling;
pub mod staging;

use tch::{Device, Tensor, nn};

use crate::Result;
use crate::masks::MaskTensors;

pub use crate::heads::relevant_head_count;
pub use graphed::{GraphedAct, StepRecord, StepSink};
pub use network::{
    AuxiliaryOutput, LstmHealth, LstmState, PolicyConfig, PolicyNetwork, PolicyOutput,
    PolicyPrecision, cpu_bf16_lstm_fallback_reason, cpu_bf16_lstm_supported,
};
pub use rng::PolicyRng;
pub use sampling::{
    ActionReadback, MASKED_LOGIT_VALUE, SampleMode, SampledActions, Sampler, SamplingConfig,
};
pub use staging::StepStaging;

/// A policy network with the `VarStore` that holds its variables.
#[derive(Debug)]
pub struct Policy {
    var_store: nn::VarStore,
    network: PolicyNetwork,
}

/// What [`Policy::act`] returns.
#[derive(Debug)]
pub struct Act {
    /// The sampled actions, log-probabilities, entropies and relevance.
    pub sample: SampledActions,
    /// The critic's V(s), `[B]` fp32.
    pub value: Tensor,
    /// The LSTM state after this step.
    pub hidden: LstmState,
}

impl Policy {
    /// A freshly initialised policy on `device` (seed libtorch's generator
    /// first for a reproducible initialisation).
    pub fn new(config: PolicyConfig, device: Device) -> Result<Policy> {
        let var_store = nn::VarStore::new(device);
        let network = PolicyNetwork::new(&var_store.root(), config)?;
        Ok(Policy { var_store, network })
    }

    /// The network.
    pub fn network(&self) -> &PolicyNetwork {
        &self.network
    }

    /// Sets the forward passes' precision ([`PolicyNetwork::set_precision`]).
    pub fn set_precision(&mut self, precision: PolicyPrecision) {
        self.network.set_precision(precision);
    }

    /// The variables (save, load, optimizers).
    pub fn var_store(&self) -> &nn::VarStore {
        &self.var_store
    }

    /// The variables, mutably (load a checkpoint, freeze).
    pub fn var_store_mut(&mut self) -> &mut nn::VarStore {
        &mut self.var_store
    }

    /// Number of trainable parameters.
    pub fn parameter_count(&self) -> usize {
        self.var_store
            .trainable_variables()
            .iter()
            .map(Tensor::numel)
            .sum()
    }

    /// One batched forward and a sampled action per environment, without
    /// gradients (a rollout or a controller step).
    pub fn act(
        &self,
        obs: &Tensor,
        blueprint_indices: &Tensor,
        hidden: &LstmState,
        masks: &MaskTensors,
        sampler: &mut Sampler,
    ) -> Result<Act> {
        let _guard = tch::no_grad_guard();
        let output = self.network.step(obs, blueprint_indices, hidden, masks)?;
        let sample = sampler.sample(&output.logits, masks)?;
        Ok(Act {
            sample,
            value: output.value,
            hidden: output.hidden,
        })
    }
}
