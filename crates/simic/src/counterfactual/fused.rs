//! The fused validation pass: the validation set under `K` alpha
//! configurations at once (reference §4.5).
//!
//! [`fused_validation`] walks the validation set in chunks. Each chunk is
//! replicated `K` times (block `k` = configuration `k`) and run in one
//! no-grad (inference-mode), evaluation-mode forward whose seeds get
//! per-sample alphas ([`kasmina::blend::BlendAlpha::PerSample`] through
//! [`MorphogeneticModel::forward_with_alpha`]'s overrides): a slot that any
//! configuration overrides gets a `[K·B, 1, …]` alpha, the slot's own alpha
//! in the blocks that leave it alone. Evaluation mode keeps the samples
//! independent (BatchNorm uses its running statistics), so the blocks do
//! not see each other. Per configuration, the correct predictions and the
//! summed cross-entropy are accumulated in a `[K, 2]` device tensor, read
//! back once after the last chunk.
//!
//! **Shared host prefix** ([`FusedConfig::share_host_prefix`], on by
//! default): every configuration computes the same host activations up to
//! the first seed on the forward path, and the same output of that seed (a
//! seed's input there is the host's, whatever the alphas), so that prefix
//! and the first seed run once per chunk on `B` samples (the host's
//! [`kasmina::host::Host::forward_segment`] up to
//! [`MorphogeneticModel::first_active_boundary`]) and only the blends from
//! the first seed on and the rest of the network on `K·B`, through
//! Kasmina's [`MorphogeneticModel::forward_from_replicated`] (the model's
//! own forward walk, started at that boundary, the copies made at the
//! first seed).
//!
//! **Memory budget**: one fused forward holds at most
//! [`FusedConfig::max_fused_samples`] samples: configurations are taken in
//! groups of at most that many and the chunk is `max_fused_samples / group`
//! samples (at least 1).
//!
//! Inputs are `[N, …]` in the host's input layout; labels are integer class
//! ids, `[N]` on CNN hosts and `[N, T]` (one per token) on transformer
//! hosts. They may live on any device (chunks are moved to the model's).
//! Shapes are checked before libtorch sees them; label values are not (that
//! would need a readback). Autocast is the caller's choice: run the pass
//! inside a `torch_ext::AutocastGuard` to validate in reduced precision.
//! Call it outside any captured CUDA graph.

use kasmina::host::Topology;
use kasmina::model::MorphogeneticModel;
use tch::{Device, Kind, Reduction, Tensor};
use tolaria::engine::staging::StagedData;

use super::configs::SlotAlphas;
use crate::error::TorchResultExt;
use crate::{Error, Result};

/// Default sample budget of one fused forward.
pub const DEFAULT_MAX_FUSED_SAMPLES: usize = 8192;

/// Largest sample budget accepted (2²⁴).
pub const MAX_FUSED_SAMPLES: usize = 1 << 24;

/// Settings of the fused pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedConfig {
    /// Most samples (configurations × chunk) in one forward,
    /// `1..=MAX_FUSED_SAMPLES` (8192).
    pub max_fused_samples: usize,
    /// Run the host up to the first active seed once per chunk (on).
    pub share_host_prefix: bool,
}

impl Default for FusedConfig {
    /// 8192 samples per forward, shared host prefix.
    fn default() -> Self {
        FusedConfig {
            max_fused_samples: DEFAULT_MAX_FUSED_SAMPLES,
            share_host_prefix: true,
        }
    }
}

impl FusedConfig {
    /// Checks the sample budget.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_FUSED_SAMPLES).contains(&self.max_fused_samples) {
            return Err(Error::InvalidConfig {
                field: "FusedConfig.max_fused_samples",
                reason: format!(
                    "{} is outside [1, {MAX_FUSED_SAMPLES}]",
                    self.max_fused_samples
                ),
            });
        }
        Ok(())
    }
}

/// One configuration's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConfigOutcome {
    /// Accuracy in percent (correct targets / targets · 100).
    pub accuracy: f64,
    /// Mean cross-entropy per target.
    pub loss: f64,
}

/// The fused pass's results, one per configuration (same order).
#[derive(Debug, Clone, PartialEq)]
pub struct FusedValidation {
    /// Per configuration.
    pub outcomes: Vec<ConfigOutcome>,
    /// Targets scored per configuration (samples, or samples × tokens).
    pub targets: usize,
    /// Fused forwards run.
    pub forwards: usize,
}

impl FusedValidation {
    /// The accuracies, configuration order (what
    /// [`super::ConfigSet::coalition_values`] takes).
    pub fn accuracies(&self) -> Vec<f64> {
        self.outcomes
            .iter()
            .map(|outcome| outcome.accuracy)
            .collect()
    }
}

/// [`fused_validation`] over a staged data set.
pub fn fused_validation_staged(
    model: &MorphogeneticModel,
    data: &StagedData,
    configs: &[SlotAlphas],
    config: &FusedConfig,
) -> Result<FusedValidation> {
    fused_validation(model, data.inputs(), data.labels(), configs, config)
}

/// Accuracy and loss of `model` on (`inputs`, `labels`) under every
/// configuration of `configs` (one entry per enabled slot each), in fused
/// forwards (see the module docs).
pub fn fused_validation(
    model: &MorphogeneticModel,
    inputs: &Tensor,
    labels: &Tensor,
    configs: &[SlotAlphas],
    config: &FusedConfig,
) -> Result<FusedValidation> {
    launch_fused_validation(model, inputs, labels, configs, config)?.read()
}

/// A fused pass queued on the device and not read back yet
/// ([`launch_fused_validation`]).
#[derive(Debug)]
pub struct PendingFused {
    sums: Tensor,
    configs: usize,
    targets: usize,
    forwards: usize,
}

impl PendingFused {
    /// Reads the pass back (one synchronisation with the stream that is
    /// current, which must be the stream the pass was launched on) and
    /// returns its results.
    pub fn read(self) -> Result<FusedValidation> {
        let values = Vec::<f64>::try_from(
            &self
                .sums
                .f_to_device(Device::Cpu)
                .op("fused readback")?
                .f_reshape([-1])
                .op("flatten sums")?,
        )
        .op("fused sums to vec")?;
        let denominator = self.targets as f64;
        let outcomes: Vec<ConfigOutcome> = values
            .chunks_exact(2)
            .map(|pair| match pair {
                [correct, loss] => ConfigOutcome {
                    accuracy: 100.0 * correct / denominator,
                    loss: loss / denominator,
                },
                _ => ConfigOutcome {
                    accuracy: f64::NAN,
                    loss: f64::NAN,
                },
            })
            .collect();
        if outcomes.len() != self.configs {
            return Err(Error::Readback {
                what: "fused sums",
                reason: format!(
                    "{} values for {} configurations",
                    values.len(),
                    self.configs
                ),
            });
        }
        Ok(FusedValidation {
            outcomes,
            targets: self.targets,
            forwards: self.forwards,
        })
    }
}

/// [`fused_validation`] without its readback: the forwards are queued on the
/// current stream and [`PendingFused::read`] reads them back, so several
/// models' passes (one per stream) can run before any is read.
pub fn launch_fused_validation(
    model: &MorphogeneticModel,
    inputs: &Tensor,
    labels: &Tensor,
    configs: &[SlotAlphas],
    config: &FusedConfig,
) -> Result<PendingFused> {
    config.validate()?;
    let shape = check_inputs(model, inputs, labels, configs)?;
    let group_size = configs.len().min(config.max_fused_samples);
    let chunk = i64::try_from(
        config
            .max_fused_samples
            .checked_div(group_size)
            .unwrap_or(1)
            .max(1),
    )
    .unwrap_or(i64::MAX)
    .min(shape.samples);
    let device = model.device();
    let _inference = torch_ext::InferenceModeGuard::new()?;
    let groups: Vec<Group> = configs
        .chunks(group_size)
        .scan(0usize, |start, group| {
            let first = *start;
            *start = start.saturating_add(group.len());
            Some(Group::new(model, group, first, device))
        })
        .collect::<Result<_>>()?;
    let count = i64::try_from(configs.len()).map_err(|_| too_large("configs", configs.len()))?;
    let sums = Tensor::f_zeros([count, 2], (Kind::Double, device)).op("fused sums")?;
    let prefix_boundary = if config.share_host_prefix {
        Some(model.first_active_boundary())
    } else {
        None
    };
    let mut forwards = 0usize;
    let mut start = 0i64;
    while start < shape.samples {
        let len = chunk.min(shape.samples.saturating_sub(start));
        let x = inputs
            .f_narrow(0, start, len)
            .op("narrow inputs")?
            .f_to_device(device)
            .op("inputs to device")?;
        let y = labels
            .f_narrow(0, start, len)
            .op("narrow labels")?
            .f_to_device(device)
            .op("labels to device")?
            .f_to_kind(Kind::Int64)
            .op("labels to int64")?
            .f_reshape([-1])
            .op("flatten labels")?;
        let prefix = match prefix_boundary {
            Some(boundary) => Some((
                boundary,
                model.host().forward_segment(&x, 0, boundary, false)?,
            )),
            None => None,
        };
        for group in &groups {
            let fused = group.fused_samples(len)?;
            let overrides = group.overrides(len, shape.topology)?;
            let references: Vec<Option<&Tensor>> = overrides.iter().map(Option::as_ref).collect();
            let logits = match &prefix {
                // The first seed runs once on the chunk, its output copied
                // for the group's configurations.
                Some((boundary, features)) => model.forward_from_replicated(
                    features,
                    group.len,
                    *boundary,
                    &references,
                    false,
                )?,
                None => {
                    let replicated = replicate(&x, group.len)?;
                    model.forward_with_alpha(&replicated, &references, false)?
                }
            };
            let targets = len
                .checked_mul(shape.targets_per_sample)
                .ok_or_else(|| too_large("targets", len))?;
            let row = score(&logits, &y, group.len, fused, targets)?;
            let _ = sums
                .f_narrow(0, group.first, group.len)
                .op("narrow sums")?
                .f_add_(&row)
                .op("accumulate sums")?;
            forwards = forwards.saturating_add(1);
        }
        start = start.saturating_add(len);
    }
    let targets = shape
        .samples
        .checked_mul(shape.targets_per_sample)
        .ok_or_else(|| too_large("targets", shape.samples))?;
    Ok(PendingFused {
        sums,
        configs: configs.len(),
        targets: usize::try_from(targets).map_err(|_| too_large("targets", shape.samples))?,
        forwards,
    })
}

/// What [`check_inputs`] learned about the inputs.
#[derive(Debug, Clone, Copy)]
struct InputShape {
    /// `N`.
    samples: i64,
    /// 1 (CNN) or `T` (transformer).
    targets_per_sample: i64,
    topology: Topology,
}

/// The configurations match the model's slots, `inputs` is `[N ≥ 1, …]`,
/// `labels` integer ids `[N]` (CNN) or `[N, T]` (transformer).
fn check_inputs(
    model: &MorphogeneticModel,
    inputs: &Tensor,
    labels: &Tensor,
    configs: &[SlotAlphas],
) -> Result<InputShape> {
    if configs.is_empty() {
        return Err(Error::InvalidInput {
            field: "fused_validation.configs",
            reason: "no configuration to measure".to_owned(),
        });
    }
    let slots = model.slots().len();
    if let Some(bad) = configs.iter().find(|alphas| alphas.len() != slots) {
        return Err(Error::ShapeMismatch {
            what: "fused_validation.configs",
            expected: format!("{slots} entries (one per enabled slot)"),
            got: format!("{} entries", bad.len()),
        });
    }
    let size = inputs.size();
    let Some(&samples) = size.first() else {
        return Err(Error::ShapeMismatch {
            what: "fused_validation.inputs",
            expected: "[N, ...]".to_owned(),
            got: format!("{size:?}"),
        });
    };
    if samples < 1 {
        return Err(Error::InvalidInput {
            field: "fused_validation.inputs",
            reason: "an empty validation set".to_owned(),
        });
    }
    let topology = model.host().topology();
    let expected: Vec<i64> = match topology {
        Topology::Cnn => vec![samples],
        Topology::Transformer => size.iter().take(2).copied().collect(),
    };
    let integer = matches!(
        labels.kind(),
        Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8
    );
    if labels.size() != expected || !integer {
        return Err(Error::ShapeMismatch {
            what: "fused_validation.labels",
            expected: format!("integer class ids {expected:?}"),
            got: format!("{:?} {:?}", labels.kind(), labels.size()),
        });
    }
    let targets_per_sample = expected.get(1).copied().unwrap_or(1);
    Ok(InputShape {
        samples,
        targets_per_sample,
        topology,
    })
}

/// One group of configurations run in the same forward.
struct Group {
    /// Index of the group's first configuration.
    first: i64,
    /// Configurations in the group (`G`).
    len: i64,
    /// Per enabled slot: `[G, 1]` alphas on the device when some
    /// configuration of the group overrides an active slot.
    alphas: Vec<Option<Tensor>>,
}

impl Group {
    fn new(
        model: &MorphogeneticModel,
        configs: &[SlotAlphas],
        first: usize,
        device: Device,
    ) -> Result<Group> {
        let len = i64::try_from(configs.len()).map_err(|_| too_large("group", configs.len()))?;
        let first = i64::try_from(first).map_err(|_| too_large("group start", first))?;
        let alphas = model
            .slots()
            .iter()
            .enumerate()
            .map(|(index, slot)| {
                let overridden = configs
                    .iter()
                    .any(|alphas| alphas.as_slice().get(index).copied().flatten().is_some());
                if !slot.is_active() || !overridden {
                    return Ok(None);
                }
                let values: Vec<f32> = configs
                    .iter()
                    .map(|alphas| {
                        alphas
                            .as_slice()
                            .get(index)
                            .copied()
                            .flatten()
                            .unwrap_or(slot.alpha()) as f32
                    })
                    .collect();
                Tensor::f_from_slice(&values)
                    .op("group alphas")?
                    .f_reshape([len, 1])
                    .op("group alphas shape")?
                    .f_to_device(device)
                    .op("group alphas to device")
                    .map(Some)
            })
            .collect::<Result<_>>()?;
        Ok(Group { first, len, alphas })
    }

    /// `G · len`.
    fn fused_samples(&self, len: i64) -> Result<i64> {
        self.len
            .checked_mul(len)
            .ok_or_else(|| too_large("fused samples", len))
    }

    /// The per-sample alpha of every overridden slot for a chunk of `len`
    /// samples: `[G·len, 1, 1, 1]` (CNN) or `[G·len, 1, 1]` (transformer),
    /// block-major.
    fn overrides(&self, len: i64, topology: Topology) -> Result<Vec<Option<Tensor>>> {
        let fused = self.fused_samples(len)?;
        let shape: &[i64] = match topology {
            Topology::Cnn => &[fused, 1, 1, 1],
            Topology::Transformer => &[fused, 1, 1],
        };
        self.alphas
            .iter()
            .map(|column| {
                column
                    .as_ref()
                    .map(|column| {
                        column
                            .f_expand([self.len, len], false)
                            .op("expand alphas")?
                            .f_reshape(shape)
                            .op("per-sample alphas")
                    })
                    .transpose()
            })
            .collect()
    }
}

/// `x` (`[B, …]`) repeated `copies` times along the batch, block-major.
fn replicate(x: &Tensor, copies: i64) -> Result<Tensor> {
    let mut repeats = vec![copies];
    repeats.extend(std::iter::repeat_n(1, x.dim().saturating_sub(1)));
    x.f_repeat(repeats.as_slice()).op("replicate chunk")
}

/// `[G, 2]` (correct targets, summed cross-entropy) per configuration of a
/// group from its fused logits `[G·B, …, C]` and the chunk's flattened
/// labels `[B·T]` (`targets` = `B·T`).
fn score(
    logits: &Tensor,
    labels: &Tensor,
    groups: i64,
    fused: i64,
    targets: i64,
) -> Result<Tensor> {
    let size = logits.size();
    let classes = size.last().copied().unwrap_or(0);
    let per_sample: i64 = size
        .get(1..size.len().saturating_sub(1))
        .unwrap_or_default()
        .iter()
        .product();
    let expected_rows = groups.checked_mul(targets);
    if size.len() < 2
        || size.first() != Some(&fused)
        || classes < 1
        || fused.checked_mul(per_sample) != expected_rows
    {
        return Err(Error::ShapeMismatch {
            what: "fused_validation logits",
            expected: format!("[{fused}, ..., classes] with {targets} targets per block"),
            got: format!("{size:?}"),
        });
    }
    let flat = logits
        .f_to_kind(Kind::Float)
        .op("logits to f32")?
        .f_reshape([-1, classes])
        .op("flatten logits")?;
    let repeated = labels.f_repeat([groups]).op("repeat labels")?;
    let loss = flat
        .f_cross_entropy_loss::<Tensor>(&repeated, None, Reduction::None, -100, 0.0)
        .op("fused loss")?
        .f_reshape([groups, targets])
        .op("loss per block")?
        .f_sum_dim_intlist([1i64].as_slice(), false, Kind::Double)
        .op("loss sums")?;
    let hits = flat
        .f_argmax(-1, false)
        .op("argmax")?
        .f_eq_tensor(&repeated)
        .op("eq")?
        .f_reshape([groups, targets])
        .op("hits per block")?
        .f_sum_dim_intlist([1i64].as_slice(), false, Kind::Double)
        .op("hit sums")?;
    Tensor::f_stack(&[hits, loss], 1).op("stack sums")
}

fn too_large(what: &'static str, value: impl std::fmt::Display) -> Error {
    Error::InvalidInput {
        field: "fused_validation",
        reason: format!("{what} ({value}) does not fit the index type"),
    }
}
