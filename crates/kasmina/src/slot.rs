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

use crate::blend::GatedBlend;
use crate::blueprint::{Blueprint, SeedModule};
use crate::gate::GateOutcome;
use crate::groups::{GroupEvent, GroupKey};
use crate::host::{InjectionSpec, SlotId, Topology};
use crate::lifecycle::{
    GerminationOptions, Lifecycle, PruneInitiator, PruneSchedule, SeedState, SlotConfig,
};
use crate::masks::trainable_parameters;
use crate::{Error, Result};
use leyline::Telemetry;

mod forward;

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
