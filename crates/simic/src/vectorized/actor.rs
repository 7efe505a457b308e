//! The acting policy of vectorized PPO: Tamiyo's network being trained, its
//! action sampler (and the sampler's generator), and the batched policy step
//! captured as a CUDA graph ([`tamiyo::policy::GraphedAct`], eager on the
//! CPU or when capture fails). One call acts for every environment of a
//! step at once; the learner trains the same network.

use leyline::Telemetry;
use tamiyo::heads::FactoredAction;
use tamiyo::masks::{ActionMasks, MaskTensors};
use tamiyo::normaliser::RunningMeanStd;
use tamiyo::policy::{
    Act, GraphedAct, LstmState, Policy, PolicyConfig, PolicyPrecision, PolicyRng, SampleMode,
    SampledActions, Sampler, StepSink,
};
use tch::{Device, Tensor};

use super::{SOURCE, SimicConfig};
use crate::Result;

/// The acting policy (see the module docs).
pub(super) struct Actor {
    policy: Policy,
    sampler: Sampler,
    /// The captured step, built at the first step when `graph_policy`.
    graphed: Option<GraphedAct>,
    graph_policy: bool,
    n_envs: usize,
}

impl Actor {
    /// A fresh policy for environments with `num_slots` slots on `device`
    /// (libtorch's generator seeded by the caller), in the precision
    /// [`SimicConfig::policy_precision`] chooses (by default the reference's
    /// rule, §4.6: bf16 autocast only when the environments train in bf16),
    /// and its sampler seeded from `config.seed`. A bf16 policy on a CPU
    /// without oneDNN's bf16 LSTM says so once through `telemetry`.
    pub(super) fn new(
        config: &SimicConfig,
        num_slots: usize,
        device: Device,
        telemetry: &Telemetry,
    ) -> Result<Actor> {
        let policy_config = PolicyConfig {
            num_slots,
            ..config.policy
        };
        let mut policy = Policy::new(policy_config, device)?;
        let precision = match (config.policy_precision, config.trainer.precision) {
            (Some(chosen), _) => chosen,
            (None, Some(training)) => PolicyPrecision::for_training(training),
            (None, None) => PolicyPrecision::for_training(tolaria::amp::Precision::auto(device)?),
        };
        policy.set_precision(precision);
        if precision == PolicyPrecision::Bf16
            && device == Device::Cpu
            && let Some(reason) = tamiyo::policy::cpu_bf16_lstm_fallback_reason()
        {
            // Once per trainer: the policy still runs, its LSTM outside bf16.
            telemetry.emit_event(
                SOURCE,
                leyline::telemetry::TAMIYO_PRECISION_FALLBACK,
                "bf16 policy on a CPU without oneDNN's bf16 LSTM: the LSTM runs outside bf16",
                vec![("reason", reason)],
            );
        }
        let sampler = Sampler::new(config.sampling, config.seed, device)?;
        Ok(Actor {
            policy,
            sampler,
            graphed: None,
            graph_policy: config.graph_policy,
            n_envs: config.n_envs,
        })
    }

    /// The policy.
    pub(super) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The sampler.
    pub(super) fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Samples in `mode` from the next step on.
    pub(super) fn set_sample_mode(&mut self, mode: SampleMode) {
        self.sampler.set_mode(mode);
    }

    /// Why the policy step runs eagerly, when it does.
    pub(super) fn fallback(&self) -> Option<&str> {
        if !self.graph_policy {
            return Some("graph_policy is off");
        }
        self.graphed.as_ref().and_then(GraphedAct::fallback)
    }

    /// The step of this actor, built at its first use: captured when
    /// `graph_policy`, else always eager.
    fn step(&mut self) -> Result<&mut GraphedAct> {
        if self.graphed.is_none() {
            self.graphed = Some(if self.graph_policy {
                GraphedAct::new(&self.policy, &self.sampler, self.n_envs)?
            } else {
                GraphedAct::eager(
                    &self.policy,
                    &self.sampler,
                    self.n_envs,
                    "graph_policy is off",
                )?
            });
        }
        self.graphed
            .as_mut()
            .ok_or_else(|| crate::Error::InvalidConfig {
                field: "Actor",
                reason: "no policy step".to_owned(),
            })
    }

    /// Packs and uploads one step's host inputs in one copy
    /// ([`GraphedAct::stage`]): the raw observations and blueprint indices
    /// of every environment, row after row, their masks and the step's
    /// index in the episode.
    pub(super) fn stage(
        &mut self,
        obs: &[f32],
        blueprints: &[i64],
        masks: &[ActionMasks],
        step: usize,
    ) -> Result<()> {
        let step = i64::try_from(step).map_err(|_| crate::Error::InvalidInput {
            field: "Actor.stage.step",
            reason: format!("{step} does not fit i64"),
        })?;
        self.step()?;
        if let Some(graphed) = self.graphed.as_mut() {
            graphed.stage(&mut self.sampler, obs, blueprints, masks, step)?;
        }
        Ok(())
    }

    /// The step on the staged inputs ([`GraphedAct::act_staged`]): the
    /// observations normalised by `normaliser`, the step's tensors written
    /// by `sink` (the rollout buffer), all inside the captured graph.
    pub(super) fn act_staged(
        &mut self,
        normaliser: Option<&RunningMeanStd>,
        hidden: &LstmState,
        sink: Option<&dyn StepSink>,
    ) -> Result<Act> {
        let graphed = self
            .graphed
            .as_mut()
            .ok_or_else(|| crate::Error::InvalidConfig {
                field: "Actor.act_staged",
                reason: "nothing staged".to_owned(),
            })?;
        Ok(graphed.act_staged(&self.policy, &mut self.sampler, normaliser, hidden, sink)?)
    }

    /// The actions of `sample` (what the last step returned) on the host:
    /// read from the page-locked buffer the captured step copied them into,
    /// or copied through it ([`GraphedAct::read_actions`]).
    pub(super) fn read_actions(
        &mut self,
        sample: &SampledActions,
        num_slots: usize,
    ) -> Result<Vec<FactoredAction>> {
        Ok(self.step()?.read_actions(sample, num_slots)?)
    }

    /// The device time of the last replay of the captured step, once.
    pub(super) fn take_replay_ms(&mut self) -> Option<f64> {
        self.graphed.as_mut().and_then(GraphedAct::take_replay_ms)
    }

    /// The critic's values `[n_envs]` on the given inputs, without gradients
    /// and without sampling (the truncated episodes' bootstrap).
    pub(super) fn values(
        &self,
        obs: &Tensor,
        blueprints: &Tensor,
        hidden: &LstmState,
        masks: &MaskTensors,
    ) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        Ok(self
            .policy
            .network()
            .forward(obs, blueprints, hidden, masks)?
            .value)
    }

    /// The sampler's generator.
    pub(super) fn rng(&self) -> &PolicyRng {
        self.sampler.rng()
    }

    /// Puts the sampler's generator back (a failed round).
    pub(super) fn restore_rng(&mut self, rng: PolicyRng) {
        self.sampler.set_rng(rng);
    }

    /// Continues from a checkpoint's generator; the captured step is built
    /// again at the next step.
    pub(super) fn resume(&mut self, rng: PolicyRng) {
        self.sampler.set_rng(rng);
        self.graphed = None;
    }

    /// A new sampler (a rank's own stream); the captured step is built again
    /// at the next step.
    pub(super) fn reseed(&mut self, sampler: Sampler) {
        self.sampler = sampler;
        self.graphed = None;
    }
}
