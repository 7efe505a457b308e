//! The morphogenetic model: a host plus its enabled seed slots.
//!
//! [`MorphogeneticModel::forward`] walks the enabled slots in execution order
//! (ascending host boundary): the host runs up to a slot's boundary, the slot
//! is applied, and after the last slot the host runs to the logits. Slots
//! without an active seed are identities and are skipped, so a model with no
//! active seed runs exactly the host's plain forward. Lifecycle calls are
//! addressed by slot id and delegate to [`SeedSlot`].
//!
//! The model owns no optimizer: [`MorphogeneticModel::parameter_groups`]
//! lists the host's group and one per live seed, and
//! [`MorphogeneticModel::drain_group_events`] says which groups appeared or
//! went since the last call (see [`crate::groups`]); the trainer builds and
//! drops optimizer state from those.
//!
//! The forward pass itself ([`MorphogeneticModel::forward`],
//! [`MorphogeneticModel::forward_with_alpha`],
//! [`MorphogeneticModel::forward_tapped`] and
//! [`MorphogeneticModel::forward_from`], which starts the walk at a host
//! boundary) lives in the private `model::forward` module.
//!
//! Bad input: the slot configuration is checked once when the model is built
//! ([`SlotConfig::validate`]); the input's shape is checked by the host
//! before libtorch sees it; more alpha overrides than slots are an error;
//! [`MorphogeneticModel::record_accuracy`] checks its values before any slot
//! records them.

mod forward;

use leyline::gate::thresholds::MIN_PRUNE_AGE;
use leyline::{AlphaCurve, LifecycleOp, SeedStage};
use tch::{Device, Tensor};

use crate::blueprint::SeedModule;
use crate::gate::GateOutcome;
use crate::groups::{GroupEvent, GroupKey, ParamGroup};
use crate::host::{Host, SlotId};
use crate::lifecycle::{GerminationOptions, PruneInitiator, PruneSchedule, SeedState, SlotConfig};
use crate::masks::{SeedMasks, trainable_parameters};
use crate::slot::{SeedSlot, gradient_norm};
use crate::{Error, Result};
use leyline::Telemetry;

/// One parameter in the model's documented order (see [`crate::masks`]).
#[derive(Debug)]
pub struct NamedParameter {
    /// The group the parameter belongs to.
    pub group: GroupKey,
    /// `VarStore` name.
    pub name: String,
    /// The variable (a shallow handle).
    pub tensor: Tensor,
}

/// Which lifecycle operations the slots allow right now: the Kasmina side
/// of Tamiyo's action masks (reference §3.2 / §9 item 7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpAvailability {
    /// One entry per `LifecycleOp` (in `LifecycleOp::ALL` order).
    pub ops: Vec<bool>,
    /// Per enabled slot (execution order): GERMINATE possible there.
    pub germinate_slots: Vec<bool>,
    /// Per enabled slot: FOSSILIZE possible there (a HOLDING seed).
    pub fossilize_slots: Vec<bool>,
    /// Per enabled slot: PRUNE possible there (a live, non-fossilized seed
    /// at least `MIN_PRUNE_AGE` epochs old).
    pub prune_slots: Vec<bool>,
}

impl OpAvailability {
    /// Whether `op` is available in at least one slot (WAIT always is).
    pub fn allows(&self, op: LifecycleOp) -> bool {
        LifecycleOp::ALL
            .iter()
            .position(|candidate| *candidate == op)
            .and_then(|index| self.ops.get(index).copied())
            .unwrap_or(false)
    }
}

/// A host with seed slots.
pub struct MorphogeneticModel {
    host: Box<dyn Host>,
    slots: Vec<SeedSlot>,
    telemetry: Telemetry,
    /// Host group events not yet drained (`Added(Host)` at construction).
    host_events: Vec<GroupEvent>,
}

impl std::fmt::Debug for MorphogeneticModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MorphogeneticModel")
            .field("host", &self.host.name())
            .field("slots", &self.slot_ids())
            .finish()
    }
}

impl MorphogeneticModel {
    /// Wraps `host` with slots at `enabled` (any order; duplicates are
    /// ignored). Unknown ids are [`Error::UnknownSlot`].
    pub fn new(
        host: impl Host + 'static,
        enabled: &[SlotId],
        config: SlotConfig,
        telemetry: Telemetry,
    ) -> Result<MorphogeneticModel> {
        MorphogeneticModel::from_boxed(Box::new(host), enabled, config, telemetry)
    }

    /// Like [`MorphogeneticModel::new`] for a host chosen at run time.
    pub fn from_boxed(
        host: Box<dyn Host>,
        enabled: &[SlotId],
        config: SlotConfig,
        telemetry: Telemetry,
    ) -> Result<MorphogeneticModel> {
        config.validate()?;
        for slot in enabled {
            host.injection_spec(*slot)?;
        }
        let topology = host.topology();
        let slots = host
            .injection_specs()
            .iter()
            .filter(|spec| enabled.contains(&spec.slot_id))
            .map(|spec| SeedSlot::new(spec.clone(), topology, config, telemetry.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(MorphogeneticModel {
            host,
            slots,
            telemetry,
            host_events: vec![GroupEvent::Added(GroupKey::Host)],
        })
    }

    /// Like [`MorphogeneticModel::new`] with slot ids as text (`"r0c1"`).
    pub fn with_slot_names(
        host: impl Host + 'static,
        enabled: &[&str],
        config: SlotConfig,
        telemetry: Telemetry,
    ) -> Result<MorphogeneticModel> {
        let ids = enabled
            .iter()
            .map(|text| SlotId::parse(text))
            .collect::<Result<Vec<_>>>()?;
        MorphogeneticModel::new(host, &ids, config, telemetry)
    }

    /// The host.
    pub fn host(&self) -> &dyn Host {
        self.host.as_ref()
    }

    /// Device of the host parameters.
    pub fn device(&self) -> Device {
        self.host.var_store().device()
    }

    /// Enabled slots in execution order.
    pub fn slots(&self) -> &[SeedSlot] {
        &self.slots
    }

    /// Enabled slot ids in execution order.
    pub fn slot_ids(&self) -> Vec<SlotId> {
        self.slots.iter().map(SeedSlot::id).collect()
    }

    fn unknown_slot(&self, slot: SlotId) -> Error {
        Error::UnknownSlot {
            slot: slot.to_string(),
            available: self
                .slot_ids()
                .iter()
                .map(SlotId::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    fn slot_index(&self, slot: SlotId) -> Result<usize> {
        self.slots
            .iter()
            .position(|s| s.id() == slot)
            .ok_or_else(|| self.unknown_slot(slot))
    }

    /// The enabled slot `slot`.
    pub fn slot(&self, slot: SlotId) -> Result<&SeedSlot> {
        let index = self.slot_index(slot)?;
        self.slots.get(index).ok_or_else(|| self.unknown_slot(slot))
    }

    /// The enabled slot `slot`, mutably.
    pub fn slot_mut(&mut self, slot: SlotId) -> Result<&mut SeedSlot> {
        let index = self.slot_index(slot)?;
        let unknown = self.unknown_slot(slot);
        self.slots.get_mut(index).ok_or(unknown)
    }

    /// Seeds on the forward path.
    pub fn active_seed_count(&self) -> usize {
        self.slots.iter().filter(|slot| slot.is_active()).count()
    }

    /// Which lifecycle ops the slots allow with at most `max_seeds` live
    /// seeds: WAIT always; GERMINATE iff an enabled slot is empty and fewer
    /// than `max_seeds` enabled slots hold a live seed; FOSSILIZE iff a seed
    /// is HOLDING; PRUNE iff a live, non-fossilized seed is at least
    /// `MIN_PRUNE_AGE` epochs old; SET_ALPHA_TARGET iff a seed is BLENDING or
    /// HOLDING with its alpha controller in HOLD; ADVANCE iff a seed is
    /// GERMINATED, TRAINING, BLENDING or HOLDING. (The reference HEAD's extra
    /// "D3" germination block is not applied here.)
    pub fn op_availability(&self, max_seeds: usize) -> OpAvailability {
        let live_seeds = self
            .slots
            .iter()
            .filter(|slot| slot.seed_module().is_some())
            .count();
        let under_limit = live_seeds < max_seeds;
        let germinate_slots: Vec<bool> = self
            .slots
            .iter()
            .map(|slot| under_limit && slot.is_empty())
            .collect();
        let fossilize_slots: Vec<bool> = self
            .slots
            .iter()
            .map(|slot| slot.stage() == Some(SeedStage::Holding))
            .collect();
        let prune_slots: Vec<bool> = self
            .slots
            .iter()
            .map(|slot| {
                slot.seed_module().is_some()
                    && slot
                        .stage()
                        .is_some_and(|stage| stage != SeedStage::Fossilized)
                    && slot
                        .state()
                        .is_some_and(|state| state.metrics().epochs_total >= MIN_PRUNE_AGE)
            })
            .collect();
        let set_alpha = self.slots.iter().any(|slot| {
            slot.state().is_some_and(|state| {
                matches!(state.stage(), SeedStage::Blending | SeedStage::Holding)
                    && state.alpha_controller().mode() == leyline::AlphaMode::Hold
            })
        });
        let advance = self.slots.iter().any(|slot| {
            slot.stage().is_some_and(|stage| {
                matches!(
                    stage,
                    SeedStage::Germinated
                        | SeedStage::Training
                        | SeedStage::Blending
                        | SeedStage::Holding
                )
            })
        });
        let ops = LifecycleOp::ALL
            .iter()
            .map(|op| match op {
                LifecycleOp::Wait => true,
                LifecycleOp::Germinate => germinate_slots.iter().any(|&ok| ok),
                LifecycleOp::SetAlphaTarget => set_alpha,
                LifecycleOp::Prune => prune_slots.iter().any(|&ok| ok),
                LifecycleOp::Fossilize => fossilize_slots.iter().any(|&ok| ok),
                LifecycleOp::Advance => advance,
            })
            .collect();
        OpAvailability {
            ops,
            germinate_slots,
            fossilize_slots,
            prune_slots,
        }
    }

    /// Germinates `blueprint` in `slot` on the host's device.
    pub fn germinate(
        &mut self,
        slot: SlotId,
        blueprint: &str,
        options: GerminationOptions,
    ) -> Result<()> {
        let device = self.device();
        self.slot_mut(slot)?.germinate(blueprint, options, device)
    }

    /// Germinates a prebuilt module (from [`crate::prefetch`]) in `slot`;
    /// the module must live on the host's device.
    pub fn germinate_module(
        &mut self,
        slot: SlotId,
        module: SeedModule,
        options: GerminationOptions,
    ) -> Result<()> {
        if module.device() != self.device() {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "seed module on {:?} cannot join a host on {:?}",
                    module.device(),
                    self.device()
                ),
            });
        }
        self.slot_mut(slot)?.germinate_module(module, options)
    }

    /// Puts a seed back into `slot` from a checkpoint, on the model's device
    /// (see [`SeedSlot::restore`]).
    pub fn restore_seed(&mut self, slot: SlotId, state: SeedState) -> Result<()> {
        let device = self.device();
        self.slot_mut(slot)?.restore(state, device)
    }

    /// See [`SeedSlot::advance_stage`].
    pub fn advance_stage(
        &mut self,
        slot: SlotId,
        target: Option<SeedStage>,
    ) -> Result<GateOutcome> {
        self.slot_mut(slot)?.advance_stage(target)
    }

    /// See [`SeedSlot::fossilize`].
    pub fn fossilize(&mut self, slot: SlotId) -> Result<GateOutcome> {
        self.slot_mut(slot)?.fossilize()
    }

    /// See [`SeedSlot::prune`].
    pub fn prune(&mut self, slot: SlotId, reason: &str, initiator: PruneInitiator) -> Result<bool> {
        self.slot_mut(slot)?.prune(reason, initiator)
    }

    /// See [`SeedSlot::schedule_prune`].
    pub fn schedule_prune(
        &mut self,
        slot: SlotId,
        steps: u32,
        curve: AlphaCurve,
        steepness: f64,
    ) -> Result<PruneSchedule> {
        self.slot_mut(slot)?.schedule_prune(steps, curve, steepness)
    }

    /// Emits every seed's gauges ([`SeedSlot::emit_metrics`]) and the number
    /// of active seeds (`kasmina.seeds.active`). Call it once per epoch,
    /// outside any captured CUDA graph.
    pub fn emit_seed_metrics(&self) {
        if !self.telemetry.is_enabled() {
            return;
        }
        for slot in &self.slots {
            slot.emit_metrics();
        }
        self.telemetry.emit_metrics(
            crate::telemetry::SOURCE,
            leyline::TelemetryLevel::Debug,
            [leyline::metric(
                leyline::telemetry::KASMINA_SEEDS_ACTIVE,
                self.active_seed_count() as f64,
            )],
        );
    }

    /// Runs [`SeedSlot::step_epoch`] on every slot.
    pub fn step_epoch(&mut self) -> Result<()> {
        self.slots.iter_mut().try_for_each(SeedSlot::step_epoch)
    }

    /// Records accuracies (percent, finite, in `[0, 100]`) on every slot
    /// that holds a live seed; refused values reach no slot.
    pub fn record_accuracy(&mut self, train_accuracy: f64, val_accuracy: f64) -> Result<()> {
        crate::lifecycle::measure::accuracies(train_accuracy, val_accuracy)?;
        for slot in &mut self.slots {
            if slot.stage().is_some_and(|stage| !stage.is_failure()) {
                slot.record_accuracy(train_accuracy, val_accuracy)?;
            }
        }
        Ok(())
    }

    /// Measures the current gradients (after `backward`): the host's L2
    /// norm and every live seed's, recorded on each slot (gradient ratio
    /// EMA and health, used by G2). Reads values back: call it outside any
    /// captured CUDA graph.
    pub fn measure_gradients(&mut self) -> Result<()> {
        let host_parameters: Vec<Tensor> =
            self.host_parameters().into_iter().map(|(_, t)| t).collect();
        let host_norm = gradient_norm(&host_parameters)?;
        let host_count = crate::validate::element_count(&host_parameters);
        for slot in &mut self.slots {
            if slot.seed_module().is_some() {
                let seed_norm = slot.seed_gradient_norm()?;
                slot.record_gradient_norms(seed_norm, host_norm, host_count)?;
            }
        }
        Ok(())
    }

    /// The host's trainable parameters, sorted by name.
    pub fn host_parameters(&self) -> Vec<(String, Tensor)> {
        trainable_parameters(self.host.var_store())
    }

    /// Every trainable parameter in the documented order: host (sorted by
    /// name), then each live seed in slot execution order.
    pub fn parameters(&self) -> Vec<NamedParameter> {
        let mut parameters: Vec<NamedParameter> = self
            .host_parameters()
            .into_iter()
            .map(|(name, tensor)| NamedParameter {
                group: GroupKey::Host,
                name,
                tensor,
            })
            .collect();
        for slot in &self.slots {
            parameters.extend(
                slot.parameters()
                    .into_iter()
                    .map(|(name, tensor)| NamedParameter {
                        group: GroupKey::Seed(slot.id()),
                        name,
                        tensor,
                    }),
            );
        }
        parameters
    }

    /// The flattened-parameter layout (see [`crate::masks`]).
    pub fn seed_masks(&self) -> SeedMasks {
        let mut owners = vec![("host".to_owned(), None, self.host_parameters())];
        for slot in &self.slots {
            if slot.seed_module().is_some() {
                owners.push((
                    slot.id().to_string(),
                    slot.state().map(|state| state.seed_id().to_owned()),
                    slot.parameters(),
                ));
            }
        }
        SeedMasks::layout(owners)
    }

    /// The parameter groups: the host's ([`GroupKey::Host`], sorted by
    /// name), then one per live seed ([`GroupKey::Seed`]) in slot execution
    /// order. A FOSSILIZED seed keeps its own group; a pruned one has none.
    pub fn parameter_groups(&self) -> Vec<ParamGroup> {
        let mut groups = vec![ParamGroup::new(GroupKey::Host, self.host_parameters())];
        for slot in &self.slots {
            if slot.seed_module().is_some() {
                groups.push(ParamGroup::new(
                    GroupKey::Seed(slot.id()),
                    slot.parameters(),
                ));
            }
        }
        groups
    }

    /// The group `key`, if it exists now.
    pub fn parameter_group(&self, key: GroupKey) -> Option<ParamGroup> {
        match key {
            GroupKey::Host => Some(ParamGroup::new(GroupKey::Host, self.host_parameters())),
            GroupKey::Seed(id) => self
                .slots
                .iter()
                .find(|slot| slot.id() == id && slot.seed_module().is_some())
                .map(|slot| ParamGroup::new(key, slot.parameters())),
        }
    }

    /// Hands over the group events recorded since the last call: the
    /// host's (`Added(Host)` once, after construction), then each slot's in
    /// execution order, each slot's oldest first (see [`crate::groups`] for
    /// why events are queued).
    pub fn drain_group_events(&mut self) -> Vec<GroupEvent> {
        let mut events = std::mem::take(&mut self.host_events);
        for slot in &mut self.slots {
            events.extend(slot.drain_group_events());
        }
        events
    }
}
