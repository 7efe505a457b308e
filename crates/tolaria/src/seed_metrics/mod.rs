//! Deferred seed metrics: per-group and per-layer gradient norms gathered on
//! the device during an epoch and read back once, at its end.
//!
//! Used by the general step ([`crate::engine::model_step::ModelStep`]),
//! reduced by the general trainer at every epoch's end.
//!
//! # What is measured
//!
//! Every `gradient_telemetry_stride`-th step (`step_index % stride == 0`,
//! as the reference's `batch_step % gradient_telemetry_stride == 0`, default
//! stride 10), [`SeedMetricsAccumulator::observe_step`] takes the gradients
//! of every parameter group (the host's and each live seed's, as Kasmina's
//! [`kasmina::model::MorphogeneticModel::parameter_groups`] lists them) and,
//! with one `torch._foreach_norm` call per group
//! ([`torch_ext::fused::foreach_norm`]), adds into one preallocated float64
//! device tensor per group:
//!
//! - each parameter tensor's ("layer's") gradient L2 norm;
//! - the group's gradient L2 norm, `sqrt(sum of the layers' squared norms)`:
//!   exactly Kasmina's `slot::gradient_norm` (a tensor without a gradient
//!   counts 0), the norm `measure_gradients` records;
//! - that norm squared;
//! - a sample count (1 per observed step).
//!
//! Nothing is read back, no persistent buffer is allocated (the
//! accumulators are built when the layout is, and zeroed in place), and all
//! state is in device tensors, so the observation can sit inside a captured
//! CUDA graph (the per-step temporaries come from the graph's pool).
//!
//! # What is reported
//!
//! [`SeedMetricsAccumulator::finish_epoch`] reads every accumulator back in
//! one transfer, zeroes them in place, and reduces per group to
//! ([`GroupGradientMetrics`]):
//!
//! - `gradient_norm`: the **mean over the group's observed steps of the
//!   per-step group norm** (what averaging Kasmina's per-step measurement
//!   over the same steps gives);
//! - `rms_gradient_norm`: `sqrt(mean of the squared per-step group norm)`;
//! - per layer, the mean over observed steps of that tensor's norm.
//!
//! and per seed ([`SeedGradientMetrics`]) the epoch's gradient ratio with
//! Kasmina's formula on those means:
//! `(seed / host) * sqrt(host_params / seed_params)`, clamped to
//! [`leyline::gate::thresholds::MAX_GRADIENT_RATIO`], 0 when the host norm is below
//! [`leyline::gate::thresholds::MIN_HOST_GRAD_NORM`] or the seed has no parameters. This is the epoch's
//! raw ratio; Kasmina's [`kasmina::slot::SeedSlot::record_gradient_norms`]
//! (fed from [`SeedGradientMetrics::record_arguments`]) keeps the EMA the
//! gates read. Each seed's numbers also come as a leyline [`leyline::proto::SeedMetricSet`]
//! holding the gradient fields only (norm, ratio, parameter count, the
//! vanishing/exploding flags with Kasmina's thresholds; accuracies and epoch
//! counts are Kasmina's and stay 0), validated by leyline's codec, so a
//! non-finite or out-of-range value is an [`Error::SeedMetrics`] and never a
//! message.
//!
//! A group with no observed step this epoch (the stride is larger than the
//! epoch, or the seed appeared after the last observed step) reports
//! `samples == 0` and `gradient_norm == None`, never NaN; a seed then has
//! no ratio, no metric set and no record arguments, as does every seed when
//! the host has no sample.
//!
//! # Layout changes
//!
//! The trainer applies Kasmina's [`GroupEvent`]s (drained outside any
//! captured region) with [`SeedMetricsAccumulator::on_group_event`]: `Added`
//! builds a fresh accumulator for the group (its count starts at 0, so its
//! mean covers only the steps it existed for; an `Added` for a group already
//! held with the same layout keeps it), `Removed` drops the group and what it
//! gathered this epoch (a pruned seed's partial epoch is not reported).
//! Changing the layout changes the tensors a captured graph touches: the
//! graph must be recaptured.

mod report;

use kasmina::groups::{GroupEvent, GroupKey, ParamGroup};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, TorchResultExt};
pub use report::{EpochSeedMetrics, GroupGradientMetrics, SeedGradientMetrics};
use report::{reduce, seed_metrics};

/// The reference's default `gradient_telemetry_stride`.
pub const DEFAULT_GRADIENT_TELEMETRY_STRIDE: u64 = 10;

/// A stride that observes no step: gradient telemetry off (the
/// `tolaria-reference` benchmark, whose Python peers measure none).
pub const NEVER: u64 = u64::MAX;

/// Accumulator slots after the per-layer ones: group-norm sum, squared
/// group-norm sum, sample count.
const TAIL: usize = 3;

fn metrics_error(field: &'static str, reason: String) -> Error {
    Error::SeedMetrics { field, reason }
}

/// One group's gradients for one step, in the group's tensor order (an
/// undefined tensor means "no gradient" and counts 0).
#[derive(Debug)]
pub struct GroupGrads<'a> {
    /// The group.
    pub key: GroupKey,
    /// Its gradients, one per parameter tensor of the layout.
    pub grads: &'a [Tensor],
}

/// One group's layout and device accumulator.
#[derive(Debug)]
struct GroupAccumulator {
    key: GroupKey,
    names: Vec<String>,
    shapes: Vec<Vec<i64>>,
    param_count: i64,
    /// float64 `[layers + TAIL]`: layer-norm sums, group-norm sum, squared
    /// group-norm sum, samples.
    acc: Tensor,
    /// float64 0-dim zero: the norm of a missing gradient.
    zero: Tensor,
    /// float64 `[1]` one: the sample increment.
    one: Tensor,
    /// float64 `[0]`: the layer norms of a group without tensors.
    no_layers: Tensor,
}

impl GroupAccumulator {
    fn new(group: &ParamGroup, device: Device) -> Result<GroupAccumulator> {
        if group.names.len() != group.tensors.len() {
            return Err(metrics_error(
                "group",
                format!(
                    "group {} has {} names and {} tensors",
                    group.key,
                    group.names.len(),
                    group.tensors.len()
                ),
            ));
        }
        let shapes: Vec<Vec<i64>> = group.tensors.iter().map(Tensor::size).collect();
        let mut param_count: i64 = 0;
        for shape in &shapes {
            let numel = shape
                .iter()
                .try_fold(1_i64, |total, &dim| total.checked_mul(dim));
            param_count = numel
                .and_then(|numel| param_count.checked_add(numel))
                .ok_or_else(|| {
                    metrics_error(
                        "group",
                        format!("group {}: parameter count overflows i64", group.key),
                    )
                })?;
        }
        let len = i64::try_from(shapes.len().saturating_add(TAIL)).map_err(|_| {
            metrics_error("group", format!("group {}: too many tensors", group.key))
        })?;
        let options = (Kind::Double, device);
        Ok(GroupAccumulator {
            key: group.key,
            names: group.names.clone(),
            shapes,
            param_count,
            acc: Tensor::f_zeros([len], options).op("seed_metrics::zeros")?,
            zero: Tensor::f_zeros([], options).op("seed_metrics::zeros")?,
            one: Tensor::f_ones([1], options).op("seed_metrics::ones")?,
            no_layers: Tensor::f_zeros([0], options).op("seed_metrics::zeros")?,
        })
    }

    fn same_layout(&self, group: &ParamGroup) -> bool {
        self.names == group.names
            && self.shapes.len() == group.tensors.len()
            && self
                .shapes
                .iter()
                .zip(&group.tensors)
                .all(|(shape, tensor)| *shape == tensor.size())
    }

    /// Shape and device checks, before anything reaches libtorch.
    fn check(&self, grads: &[Tensor], device: Device) -> Result<()> {
        if grads.len() != self.shapes.len() {
            return Err(metrics_error(
                "grads",
                format!(
                    "group {}: {} gradients for {} parameter tensors",
                    self.key,
                    grads.len(),
                    self.shapes.len()
                ),
            ));
        }
        for ((grad, shape), name) in grads.iter().zip(&self.shapes).zip(&self.names) {
            if !grad.defined() {
                continue;
            }
            if grad.size() != *shape {
                return Err(metrics_error(
                    "grads",
                    format!(
                        "group {} tensor `{name}`: gradient shape {:?}, parameter shape {shape:?}",
                        self.key,
                        grad.size()
                    ),
                ));
            }
            if grad.device() != device {
                return Err(metrics_error(
                    "grads",
                    format!(
                        "group {} tensor `{name}`: gradient on {:?}, metrics on {device:?}",
                        self.key,
                        grad.device()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Adds one step's norms into `acc` (device only, no readback).
    fn observe(&mut self, grads: &[Tensor]) -> Result<()> {
        let defined: Vec<Tensor> = grads
            .iter()
            .filter(|grad| grad.defined())
            .map(Tensor::shallow_clone)
            .collect();
        let mut norms = torch_ext::fused::foreach_norm(&defined, 2.0)?.into_iter();
        let mut layers = Vec::with_capacity(grads.len());
        for grad in grads {
            let norm = if grad.defined() {
                norms
                    .next()
                    .ok_or_else(|| {
                        metrics_error("foreach_norm", "returned too few norms".to_owned())
                    })?
                    .f_to_kind(Kind::Double)
                    .op("seed_metrics::to_kind")?
            } else {
                self.zero.shallow_clone()
            };
            layers.push(norm);
        }
        let layers = if layers.is_empty() {
            self.no_layers.shallow_clone()
        } else {
            Tensor::f_stack(&layers, 0).op("seed_metrics::stack")?
        };
        let squared = layers
            .f_square()
            .op("seed_metrics::square")?
            .f_sum(Kind::Double)
            .op("seed_metrics::sum")?
            .f_reshape([1])
            .op("seed_metrics::reshape")?;
        let norm = squared.f_sqrt().op("seed_metrics::sqrt")?;
        let step = Tensor::f_cat(&[layers, norm, squared, self.one.shallow_clone()], 0)
            .op("seed_metrics::cat")?;
        let _ = self.acc.f_add_(&step).op("seed_metrics::add_")?;
        Ok(())
    }
}

/// Per-group and per-layer gradient norms accumulated on the device and
/// reduced once per epoch (see the module docs).
#[derive(Debug)]
pub struct SeedMetricsAccumulator {
    stride: u64,
    device: Device,
    groups: Vec<GroupAccumulator>,
}

impl SeedMetricsAccumulator {
    /// An accumulator for `groups` (Kasmina's `parameter_groups()`) on
    /// `device`, observing every `stride`-th step; `stride >= 1`.
    pub fn new(stride: u64, groups: &[ParamGroup], device: Device) -> Result<Self> {
        if stride == 0 {
            return Err(Error::InvalidConfig {
                field: "gradient_telemetry_stride",
                reason: "is 0, must be >= 1".to_owned(),
            });
        }
        let mut accumulator = SeedMetricsAccumulator {
            stride,
            device,
            groups: Vec::with_capacity(groups.len()),
        };
        for group in groups {
            if accumulator.position(group.key).is_some() {
                return Err(metrics_error(
                    "groups",
                    format!("group {} listed twice", group.key),
                ));
            }
            accumulator
                .groups
                .push(GroupAccumulator::new(group, device)?);
        }
        Ok(accumulator)
    }

    /// The stride.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// The groups held, in layout order.
    pub fn keys(&self) -> Vec<GroupKey> {
        self.groups.iter().map(|group| group.key).collect()
    }

    /// The device accumulator of group `key` (float64 `[layers + 3]`: layer
    /// norm sums, group norm sum, squared group norm sum, samples): the
    /// buffer a captured graph writes into.
    pub fn accumulator(&self, key: GroupKey) -> Option<&Tensor> {
        self.groups
            .iter()
            .find(|group| group.key == key)
            .map(|group| &group.acc)
    }

    /// Whether step `step_index` is observed (`step_index % stride == 0`;
    /// never with stride [`NEVER`]).
    pub fn observes(&self, step_index: u64) -> bool {
        self.stride != NEVER && step_index.checked_rem(self.stride) == Some(0)
    }

    fn position(&self, key: GroupKey) -> Option<usize> {
        self.groups.iter().position(|group| group.key == key)
    }

    /// Observes step `step_index`: on observed steps, adds every group's
    /// norms into its accumulator (device only). `grads` must name every
    /// held group exactly once, with its layout's tensor count and shapes,
    /// on the accumulator's device; all of it is checked before any tensor
    /// operation, so a refused call changes nothing. Returns whether the
    /// step was observed (unobserved steps check nothing).
    pub fn observe_step(&mut self, step_index: u64, grads: &[GroupGrads<'_>]) -> Result<bool> {
        if !self.observes(step_index) {
            return Ok(false);
        }
        if grads.len() != self.groups.len() {
            return Err(metrics_error(
                "grads",
                format!(
                    "{} groups given, {} held ({:?})",
                    grads.len(),
                    self.groups.len(),
                    self.keys()
                ),
            ));
        }
        let mut order = Vec::with_capacity(grads.len());
        for given in grads {
            let position = self.position(given.key).ok_or_else(|| {
                metrics_error("grads", format!("group {} is not held", given.key))
            })?;
            if order.contains(&position) {
                return Err(metrics_error(
                    "grads",
                    format!("group {} given twice", given.key),
                ));
            }
            let group = self.groups.get(position).ok_or_else(|| {
                metrics_error("grads", format!("group {} is not held", given.key))
            })?;
            group.check(given.grads, self.device)?;
            order.push(position);
        }
        for (given, position) in grads.iter().zip(order) {
            if let Some(group) = self.groups.get_mut(position) {
                group.observe(given.grads)?;
            }
        }
        Ok(true)
    }

    /// [`Self::observe_step`] with the gradients of `groups`' parameters
    /// (`.grad()`, undefined where a tensor has none).
    pub fn observe_params(&mut self, step_index: u64, groups: &[ParamGroup]) -> Result<bool> {
        if !self.observes(step_index) {
            return Ok(false);
        }
        let grads: Vec<Vec<Tensor>> = groups
            .iter()
            .map(|group| {
                group
                    .tensors
                    .iter()
                    .map(|tensor| tensor.f_grad().op("seed_metrics::grad"))
                    .collect::<Result<Vec<Tensor>>>()
            })
            .collect::<Result<_>>()?;
        let given: Vec<GroupGrads<'_>> = groups
            .iter()
            .zip(&grads)
            .map(|(group, grads)| GroupGrads {
                key: group.key,
                grads,
            })
            .collect();
        self.observe_step(step_index, &given)
    }

    /// Applies one of Kasmina's group events: `Added` (with the group, from
    /// `parameter_group(key)`) builds a fresh accumulator, or keeps the one
    /// held for the same key and layout; `Removed` drops the group and its
    /// epoch so far (nothing to do when not held).
    pub fn on_group_event(&mut self, event: GroupEvent, group: Option<&ParamGroup>) -> Result<()> {
        match event {
            GroupEvent::Removed(key) => {
                self.groups.retain(|held| held.key != key);
                Ok(())
            }
            GroupEvent::Added(key) => {
                let group = group.filter(|group| group.key == key).ok_or_else(|| {
                    metrics_error(
                        "group",
                        format!(
                            "Added({key}) needs that group's parameters, got {:?}",
                            group.map(|group| group.key)
                        ),
                    )
                })?;
                let fresh = GroupAccumulator::new(group, self.device)?;
                match self.position(key) {
                    Some(position) => {
                        if let Some(held) = self.groups.get_mut(position)
                            && !held.same_layout(group)
                        {
                            *held = fresh;
                        }
                    }
                    None => self.groups.push(fresh),
                }
                Ok(())
            }
        }
    }

    /// The epoch's one readback: reduces every group (see the module docs),
    /// zeroes the accumulators in place (also when the reduction is refused:
    /// the next epoch starts clean) and returns the metrics. A non-finite
    /// accumulated value (a NaN or infinite gradient on an observed step) is
    /// an [`Error::SeedMetrics`] naming the group and the value.
    pub fn finish_epoch(&mut self) -> Result<EpochSeedMetrics> {
        let values = self.read_back();
        for group in &mut self.groups {
            let _ = group.acc.f_zero_().op("seed_metrics::zero_")?;
        }
        let values = values?;
        let mut rest: &[f64] = &values;
        let mut reduced = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let (own, tail) = rest
                .split_at_checked(group.shapes.len().saturating_add(TAIL))
                .ok_or_else(|| {
                    metrics_error("readback", format!("{} values read back", values.len()))
                })?;
            rest = tail;
            reduced.push(reduce(group, own)?);
        }
        let host = reduced
            .iter()
            .find(|group| group.key == GroupKey::Host)
            .cloned();
        let host_reading = host
            .as_ref()
            .and_then(|host| host.gradient_norm.map(|norm| (norm, host.param_count)));
        let mut seeds = Vec::new();
        for group in reduced {
            if group.key == GroupKey::Host {
                continue;
            }
            seeds.push(seed_metrics(group, host_reading)?);
        }
        Ok(EpochSeedMetrics {
            stride: self.stride,
            host,
            seeds,
        })
    }

    fn read_back(&self) -> Result<Vec<f64>> {
        if self.groups.is_empty() {
            return Ok(Vec::new());
        }
        let all: Vec<&Tensor> = self.groups.iter().map(|group| &group.acc).collect();
        let joined = Tensor::f_cat(&all, 0)
            .op("seed_metrics::cat")?
            .f_to_device(Device::Cpu)
            .op("seed_metrics::to_cpu")?;
        Vec::<f64>::try_from(&joined).op("seed_metrics::readback")
    }
}
