//! Seed slots: the tensor side of one seed (its module, forward and blend).
//!
//! A [`SeedSlot`] sits at one host boundary. Its [`Lifecycle`] (the
//! tensor-free state machine of [`crate::lifecycle`]) decides stages, gates,
//! alpha and the cooldown; the slot holds what those decisions act on: the
//! live seed's [`SeedModule`] (own `VarStore`) and, for the GATE blend, its
//! [`GatedBlend`] network. After every lifecycle call the slot follows the
//! state: it frees the module when the state no longer
//! [holds one](crate::lifecycle::SeedState::holds_module) (prune, scheduled
//! prune) and switches the module's gradients off while the
//! [blend-out freeze](crate::lifecycle::SeedState::blend_out_freeze) is on.
//!
//! - [`SeedSlot::germinate`] builds and probes the module (output shape must
//!   equal input shape: probe `[1, C, H, W]` on CNN slots, `[2, 8, C]` on
//!   transformer slots), then lets the lifecycle pass G0.
//! - [`SeedSlot::forward`]: identity without an active seed; the seed sees a
//!   detached copy of the host features when isolation is on; TRAINING at
//!   alpha 0 is the straight-through incubator; otherwise ADD / MULTIPLY /
//!   GATE (see [`crate::blend`]).
//! - The slot owns no optimizer: it records a [`GroupEvent`] when its seed's
//!   parameters appear or go, and the trainer drains them (see
//!   [`crate::groups`]).
//!
//! Bad input: the injection spec is checked by [`SeedSlot::new`]
//! (the configuration by [`Lifecycle::new`]), the germination options at
//! germination, host features and per-sample alphas by their shape before
//! libtorch sees them (`slot_checks`); measurements are checked by the
//! lifecycle where they are recorded.

use leyline::{AlphaAlgorithm, AlphaCurve, SeedStage};
use tch::{Device, Tensor};

use crate::blend::{BlendAlpha, GatedBlend, mix, mix_replicated, replicate_batch};
use crate::blueprint::{Blueprint, SeedModule};
use crate::gate::GateOutcome;
use crate::groups::{GroupEvent, GroupKey};
use crate::host::{InjectionSpec, SlotId, Topology};
use crate::lifecycle::{
    GerminationOptions, Lifecycle, PruneInitiator, PruneSchedule, SeedState, SlotConfig,
};
use crate::masks::trainable_parameters;
use crate::slot_checks;
use crate::{Error, Result};
use leyline::Telemetry;

/// Sequence length of the germination probe on transformer slots (`[2, 8, C]`).
pub const TRANSFORMER_PROBE_TOKENS: i64 = 8;

/// The live seed: module, optional gate network, and whether its gradients
/// are currently switched off (blend-out freeze).
#[derive(Debug)]
struct LiveSeed {
    module: SeedModule,
    gate: Option<GatedBlend>,
    frozen: bool,
}

/// One injection point and the seed it holds.
#[derive(Debug)]
pub struct SeedSlot {
    spec: InjectionSpec,
    probe_shape: Vec<i64>,
    lifecycle: Lifecycle,
    seed: Option<LiveSeed>,
    group_events: Vec<GroupEvent>,
}

impl SeedSlot {
    /// An empty slot at `spec` of a host with `topology`. The config must
    /// pass [`SlotConfig::validate`] and the spec
    /// [`InjectionSpec::validate`].
    pub fn new(
        spec: InjectionSpec,
        topology: Topology,
        config: SlotConfig,
        telemetry: Telemetry,
    ) -> Result<SeedSlot> {
        let lifecycle = Lifecycle::new(spec.slot_id, topology, config, telemetry)?;
        let probe_shape = spec.validate(topology)?;
        Ok(SeedSlot {
            spec,
            probe_shape,
            lifecycle,
            seed: None,
            group_events: Vec::new(),
        })
    }

    /// Slot id.
    pub fn id(&self) -> SlotId {
        self.spec.slot_id
    }

    /// Injection spec.
    pub fn spec(&self) -> &InjectionSpec {
        &self.spec
    }

    /// Slot configuration.
    pub fn config(&self) -> &SlotConfig {
        self.lifecycle.config()
    }

    /// Host topology the slot lives in.
    pub fn topology(&self) -> Topology {
        self.lifecycle.topology()
    }

    /// The seed's lifecycle (read only: lifecycle calls go through the slot,
    /// which keeps the module in step with the state).
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// Lifecycle state, if the slot holds any.
    pub fn state(&self) -> Option<&SeedState> {
        self.lifecycle.state()
    }

    /// Current stage, if the slot holds a state.
    pub fn stage(&self) -> Option<SeedStage> {
        self.lifecycle.stage()
    }

    /// Whether the slot holds no state at all (germination possible).
    pub fn is_empty(&self) -> bool {
        self.lifecycle.is_empty()
    }

    /// Whether the seed is on the forward path (TRAINING..FOSSILIZED).
    pub fn is_active(&self) -> bool {
        self.seed.is_some() && self.stage().is_some_and(SeedStage::is_active)
    }

    /// The live seed module, if any.
    pub fn seed_module(&self) -> Option<&SeedModule> {
        self.seed.as_ref().map(|seed| &seed.module)
    }

    /// Current alpha (0 without a state).
    pub fn alpha(&self) -> f64 {
        self.lifecycle.alpha()
    }

    /// Hands over the group events recorded since the last call, oldest
    /// first (see [`crate::groups`]).
    pub fn drain_group_events(&mut self) -> Vec<GroupEvent> {
        std::mem::take(&mut self.group_events)
    }

    /// Runs a lifecycle call, then makes the module follow the state (also
    /// when the call failed part-way).
    fn lifecycle_call<T>(&mut self, call: impl FnOnce(&mut Lifecycle) -> Result<T>) -> Result<T> {
        let result = call(&mut self.lifecycle);
        self.follow_state()?;
        result
    }

    /// Frees the module once the state no longer holds one (recording
    /// `Removed`), and switches its gradients off and on with the blend-out
    /// freeze.
    fn follow_state(&mut self) -> Result<()> {
        if !self.lifecycle.holds_module() {
            if self.seed.take().is_some() {
                self.group_events
                    .push(GroupEvent::Removed(GroupKey::Seed(self.id())));
            }
            return Ok(());
        }
        let frozen = self
            .lifecycle
            .state()
            .is_some_and(SeedState::blend_out_freeze);
        if let Some(seed) = self.seed.as_mut()
            && seed.frozen != frozen
        {
            for (_, parameter) in trainable_parameters(seed.module.var_store()) {
                let _ = parameter.f_set_requires_grad(!frozen)?;
            }
            seed.frozen = frozen;
        }
        Ok(())
    }

    /// Builds `blueprint` (a registry name) at the slot's channel count on
    /// `device` and germinates it. See [`SeedSlot::germinate_module`].
    pub fn germinate(
        &mut self,
        blueprint: &str,
        options: GerminationOptions,
        device: Device,
    ) -> Result<()> {
        self.lifecycle.check_available()?;
        options.validate()?;
        let topology = self.topology();
        let blueprint = Blueprint::from_name(topology, blueprint)?;
        let module = blueprint.build(topology, self.spec.channels, device)?;
        self.germinate_module(module, options)
    }

    /// Germinates an already built module (e.g. from the prefetcher): checks
    /// that the slot is empty and the channels match, probes the module with
    /// a zero input `[1, C, H, W]` of the slot's spatial size (output shape
    /// must equal input shape), zero-initialises the final affine layer for
    /// the MULTIPLY blend, creates the gate network for GATE, and lets the
    /// lifecycle pass G0 to reach GERMINATED (a G0 failure is
    /// [`Error::GerminationRefused`]). Records `Added(Seed(slot))`.
    pub fn germinate_module(
        &mut self,
        mut module: SeedModule,
        options: GerminationOptions,
    ) -> Result<()> {
        self.lifecycle.check_available()?;
        let topology = self.topology();
        if module.topology() != topology {
            return Err(Error::UnknownBlueprint {
                name: module.blueprint().name().to_owned(),
                known: format!(
                    "a {:?} module cannot grow in a {:?} slot",
                    module.topology(),
                    topology
                ),
            });
        }
        if module.channels() != self.spec.channels {
            return Err(Error::ShapeMismatch {
                op: "germinate (seed channels)",
                expected: vec![self.spec.channels],
                got: vec![module.channels()],
            });
        }
        options.validate()?;
        let probe_shape = self.probe_shape.clone();
        let probe = Tensor::f_zeros(probe_shape.as_slice(), (tch::Kind::Float, module.device()))?;
        let probe_out = tch::no_grad(|| module.forward(&probe))?;
        if probe_out.size() != probe_shape {
            return Err(Error::ShapeMismatch {
                op: "germination probe",
                expected: probe_shape,
                got: probe_out.size(),
            });
        }
        if options.algorithm == AlphaAlgorithm::Multiply {
            module.zero_init_final_affine()?;
        }
        let gate = if options.algorithm == AlphaAlgorithm::Gate {
            let root = module.var_store().root();
            Some(GatedBlend::new(
                &root.sub("gate"),
                self.spec.channels,
                topology,
            )?)
        } else {
            None
        };
        let param_count = module.param_count();
        self.lifecycle
            .germinate(module.blueprint(), &options, param_count)?;
        self.seed = Some(LiveSeed {
            module,
            gate,
            frozen: false,
        });
        self.group_events
            .push(GroupEvent::Added(GroupKey::Seed(self.id())));
        Ok(())
    }

    /// Puts a seed back into this empty slot from a checkpoint: `state` as
    /// exported (serde) by the run that wrote it. When the state holds a
    /// module (GERMINATED through FOSSILIZED) the state's blueprint is built
    /// at the slot's channels on `device`, with the gate network for GATE;
    /// its weights are fresh, and the caller copies the checkpoint's
    /// variables into [`SeedSlot::seed_module`]'s variable store. A state in
    /// cooldown (PRUNED, EMBARGOED, RESETTING) gets no module. No lifecycle
    /// event or telemetry is emitted; the blend-out freeze is applied and
    /// `Added(Seed(slot))` is recorded for a module. [`Error::SlotOccupied`]
    /// when the slot holds a state; a refused restore (occupied slot, a
    /// module that cannot be built here) leaves the slot unchanged.
    pub fn restore(&mut self, state: SeedState, device: Device) -> Result<()> {
        self.lifecycle.check_available()?;
        let seed = if state.holds_module() {
            let topology = self.topology();
            let module = state
                .blueprint()
                .build(topology, self.spec.channels, device)?;
            let gate = if state.algorithm() == AlphaAlgorithm::Gate {
                let root = module.var_store().root();
                Some(GatedBlend::new(
                    &root.sub("gate"),
                    self.spec.channels,
                    topology,
                )?)
            } else {
                None
            };
            Some(LiveSeed {
                module,
                gate,
                frozen: false,
            })
        } else {
            None
        };
        self.lifecycle.restore(state)?;
        if seed.is_some() {
            self.seed = seed;
            self.group_events
                .push(GroupEvent::Added(GroupKey::Seed(self.id())));
        }
        self.follow_state()
    }

    /// See [`Lifecycle::advance_stage`].
    pub fn advance_stage(&mut self, target: Option<SeedStage>) -> Result<GateOutcome> {
        self.lifecycle_call(|lifecycle| lifecycle.advance_stage(target))
    }

    /// Advances HOLDING -> FOSSILIZED through G5 (the seed keeps its
    /// parameter group: see [`crate::groups`]).
    pub fn fossilize(&mut self) -> Result<GateOutcome> {
        self.lifecycle_call(Lifecycle::fossilize)
    }

    /// Prunes now: the state moves to PRUNED for the cooldown and the module
    /// is freed at once (recording `Removed(Seed(slot))`). Returns `false`
    /// (and does nothing) for a FOSSILIZED seed or one already pruned.
    pub fn prune(&mut self, reason: &str, initiator: PruneInitiator) -> Result<bool> {
        self.lifecycle_call(|lifecycle| lifecycle.prune(reason, initiator))
    }

    /// See [`Lifecycle::schedule_prune`]; the module is freed when the
    /// prune happens.
    pub fn schedule_prune(
        &mut self,
        steps: u32,
        curve: AlphaCurve,
        steepness: f64,
    ) -> Result<PruneSchedule> {
        self.lifecycle_call(|lifecycle| lifecycle.schedule_prune(steps, curve, steepness))
    }

    /// Sets alpha directly (finite, in `[0, 1]`), holding there.
    pub fn set_alpha(&mut self, alpha: f64) -> Result<()> {
        self.lifecycle_call(|lifecycle| lifecycle.set_alpha(alpha))
    }

    /// See [`Lifecycle::retarget_alpha`].
    pub fn retarget_alpha(
        &mut self,
        target: f64,
        steps: u32,
        curve: AlphaCurve,
        steepness: f64,
    ) -> Result<()> {
        self.lifecycle_call(|lifecycle| lifecycle.retarget_alpha(target, steps, curve, steepness))
    }

    /// Once per epoch, after the controller's action: see
    /// [`Lifecycle::step_epoch`].
    pub fn step_epoch(&mut self) -> Result<()> {
        self.lifecycle_call(Lifecycle::step_epoch)
    }

    /// See [`Lifecycle::emit_metrics`].
    pub fn emit_metrics(&self) {
        self.lifecycle.emit_metrics();
    }

    /// See [`Lifecycle::record_accuracy`].
    pub fn record_accuracy(&mut self, train_accuracy: f64, val_accuracy: f64) -> Result<()> {
        self.lifecycle.record_accuracy(train_accuracy, val_accuracy)
    }

    /// See [`Lifecycle::record_gradient_norms`].
    pub fn record_gradient_norms(
        &mut self,
        seed_norm: f64,
        host_norm: f64,
        host_params: i64,
    ) -> Result<()> {
        self.lifecycle
            .record_gradient_norms(seed_norm, host_norm, host_params)
    }

    /// See [`Lifecycle::set_counterfactual_contribution`].
    pub fn set_counterfactual_contribution(&mut self, contribution: f64) -> Result<()> {
        self.lifecycle.set_counterfactual_contribution(contribution)
    }

    /// See [`Lifecycle::set_healthy`].
    pub fn set_healthy(&mut self, healthy: bool) -> Result<()> {
        self.lifecycle.set_healthy(healthy)
    }

    /// L2 norm of the seed's current gradients (0 without gradients or seed).
    pub fn seed_gradient_norm(&self) -> Result<f64> {
        let parameters: Vec<Tensor> = self.parameters().into_iter().map(|(_, t)| t).collect();
        gradient_norm(&parameters)
    }

    /// The seed's trainable parameters (module and gate), sorted by name;
    /// empty without a live seed. These are the seed's parameter group.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.seed
            .as_ref()
            .map(|seed| trainable_parameters(seed.module.var_store()))
            .unwrap_or_default()
    }

    /// Applies the slot to host features at its boundary.
    ///
    /// `alpha_override` (`[N, 1, 1, 1]` on CNN slots, `[N, 1, 1]` on
    /// transformer slots, or anything broadcastable) replaces the
    /// controller's alpha per sample: counterfactual evaluation, or a static
    /// device tensor for a captured graph. It bypasses the incubator, which
    /// gives the same value at alpha 0 but no seed gradient: pass `None` for
    /// TRAINING seeds while training.
    ///
    /// # Shapes
    /// `[N, C, H, W] -> [N, C, H, W]` (CNN), `[N, T, C] -> [N, T, C]`
    /// (transformer).
    pub fn forward(&self, host: &Tensor, alpha_override: Option<&Tensor>) -> Result<Tensor> {
        self.forward_tapped(host, alpha_override, false)
            .map(|(output, _)| output)
    }

    /// [`SeedSlot::forward`] that can also return a *gradient tap*: with
    /// `tap` set and a live seed that sees the live (not detached) host
    /// features, the seed's input is a distinct view of `host` and is
    /// returned beside the output. The gradient of a loss with respect to
    /// that view is what flows into the host through this seed's branch
    /// alone (the trainer's gradient aggregation separates it from the
    /// host's own gradient with it). `None` for an isolated seed (its branch
    /// sends the host no gradient), an empty slot, or `tap == false`.
    pub fn forward_tapped(
        &self,
        host: &Tensor,
        alpha_override: Option<&Tensor>,
        tap: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.forward_tapped_then(host, alpha_override, tap, false)
    }

    /// [`SeedSlot::forward_tapped`], followed by the 2x2 max-pool
    /// ([`torch_ext::nn::max_pool2x2`]) of its output where `pool`: the
    /// model's walk asks for it where the host's next segment is that pool
    /// ([`crate::host::Host::pools_after`]), and a per-sample ADD blend then
    /// runs as one node with it ([`crate::blend::mix`]).
    pub(crate) fn forward_tapped_then(
        &self,
        host: &Tensor,
        alpha_override: Option<&Tensor>,
        tap: bool,
        pool: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        slot_checks::features(self.topology(), &self.spec, host)?;
        if let Some(tensor) = alpha_override {
            BlendAlpha::PerSample(tensor).check(host)?;
        }
        let pass_through = || -> Result<(Tensor, Option<Tensor>)> {
            let output = if pool {
                torch_ext::nn::max_pool2x2(host)?
            } else {
                host.shallow_clone()
            };
            Ok((output, None))
        };
        let (Some(state), Some(seed)) = (self.lifecycle.state(), &self.seed) else {
            return pass_through();
        };
        if !state.stage().is_active() {
            return pass_through();
        }
        let (seed_input, tap) = if state.isolate_gradients() {
            // Detached, layout kept: a channels-last host stays channels-last
            // (the reference's `.contiguous()` copy changes no value).
            (host.f_detach()?, None)
        } else if tap && host.requires_grad() {
            let view = host.f_view_as(host)?;
            (view.shallow_clone(), Some(view))
        } else {
            (host.shallow_clone(), None)
        };
        let output = self.blend(host, &seed_input, seed, state, alpha_override, pool)?;
        Ok((output, tap))
    }

    /// The blend of the seed's output into `host` (see [`SeedSlot::forward`]),
    /// 2x2 max-pooled where `pool`.
    fn blend(
        &self,
        host: &Tensor,
        seed_input: &Tensor,
        seed: &LiveSeed,
        state: &SeedState,
        alpha_override: Option<&Tensor>,
        pool: bool,
    ) -> Result<Tensor> {
        let seed_output = seed.module.forward(seed_input)?;
        let gate_values = match (state.algorithm(), &seed.gate) {
            (AlphaAlgorithm::Gate, Some(gate)) => Some(gate.forward(seed_input)?),
            _ => None,
        };
        mix(
            host,
            seed_input,
            &seed_output,
            gate_values.as_ref(),
            state,
            alpha_override,
            pool,
        )
    }

    /// [`SeedSlot::forward`] of `replicas` copies of `host` stacked along
    /// the batch (block `k` is copy `k`, as `Tensor::repeat` stacks them),
    /// each copy blended with its own rows of `alpha_override`
    /// (`[replicas·N, 1, …]`): the counterfactual pass's configurations of
    /// one chunk. The seed (and its gate) runs once, on `host`, where
    /// [`SeedSlot::forward`] on the replicated features would run it on
    /// every copy; an ADD or GATE blend reads `host` and the seed's output
    /// once per copy ([`torch_ext::nn::blend_lerp_replicated`]) instead of
    /// copying them first, a MULTIPLY blend blends copies. The values are
    /// those of that forward, as far as the seed's output for a sample does
    /// not depend on the rest of its batch (true in evaluation mode: a
    /// seed's normalisation is per sample). No gradient taps.
    ///
    /// # Shapes
    /// `[N, ...]` -> `[replicas·N, ...]`.
    pub fn forward_replicated(
        &self,
        host: &Tensor,
        replicas: i64,
        alpha_override: Option<&Tensor>,
    ) -> Result<Tensor> {
        slot_checks::features(self.topology(), &self.spec, host)?;
        let active = match (self.lifecycle.state(), &self.seed) {
            (Some(state), Some(seed)) if state.stage().is_active() => Some((state, seed)),
            _ => None,
        };
        let Some((state, seed)) = active else {
            let copies = replicate_batch(host, replicas)?;
            if let Some(tensor) = alpha_override {
                BlendAlpha::PerSample(tensor).check(&copies)?;
            }
            return Ok(copies);
        };
        let seed_input = if state.isolate_gradients() {
            host.f_detach()?
        } else {
            host.shallow_clone()
        };
        let seed_output = seed.module.forward(&seed_input)?;
        let gate_values = match (state.algorithm(), &seed.gate) {
            (AlphaAlgorithm::Gate, Some(gate)) => Some(gate.forward(&seed_input)?),
            _ => None,
        };
        // A lerp (ADD, GATE) blends the copies without making them.
        if let Some(blended) = mix_replicated(
            host,
            &seed_output,
            gate_values.as_ref(),
            state,
            alpha_override,
            replicas,
        )? {
            return Ok(blended);
        }
        let copies = replicate_batch(host, replicas)?;
        if let Some(tensor) = alpha_override {
            BlendAlpha::PerSample(tensor).check(&copies)?;
        }
        let seed_output = replicate_batch(&seed_output, replicas)?;
        let gate_values = gate_values
            .map(|gate| replicate_batch(&gate, replicas))
            .transpose()?;
        let seed_inputs = if state.isolate_gradients() {
            copies.f_detach()?
        } else {
            copies.shallow_clone()
        };
        mix(
            &copies,
            &seed_inputs,
            &seed_output,
            gate_values.as_ref(),
            state,
            alpha_override,
            false,
        )
    }
}

/// L2 norm over the gradients of `parameters` (those that have one).
pub fn gradient_norm(parameters: &[Tensor]) -> Result<f64> {
    let mut squared = 0.0;
    for parameter in parameters {
        let grad = parameter.f_grad()?;
        if grad.defined() {
            let norm = grad
                .f_detach()?
                .f_to_kind(tch::Kind::Double)?
                .f_square()?
                .f_sum(tch::Kind::Double)?;
            squared += f64::try_from(&norm)?;
        }
    }
    Ok(squared.sqrt())
}
