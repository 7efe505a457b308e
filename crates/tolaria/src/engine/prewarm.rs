//! Paying the blueprints' first-use cost before their first germination.
//!
//! On CUDA, the first forward and backward of a seed module at a shape the
//! process has not met yet is slow: its kernels are loaded and cuDNN and
//! cuBLAS choose their algorithms for that shape. Without a warm-up that
//! cost lands on whichever epoch first germinates the blueprint (and its
//! graph capture), at a time the controller chose.
//!
//! [`prewarm_blueprints`] pays it at a time the caller chooses: for every
//! enabled slot of a model and every blueprint of the host's topology, it
//! runs a scratch seed module once per batch size, forward and backward,
//! under the step's precision and memory layout. The model itself is not
//! touched; the scratch modules draw their parameters from tch's global
//! generator, so call it before seeding what must be reproducible.
//!
//! Only CNN hosts are warmed: Simic's environments are CNN hosts, and that
//! is where the first-use cost was measured (depthwise 3 - 6 s before it
//! ran in NCHW, attention and bottleneck 0.1 - 0.3 s, on the H100). A
//! transformer host's seeds are not warmed. On the CPU it does nothing.

use std::time::Instant;

use kasmina::blueprint::Blueprint;
use kasmina::host::Topology;
use kasmina::model::MorphogeneticModel;
use tch::{Device, Kind, Tensor};

use crate::amp::Precision;
use crate::error::{Error, Result, TorchResultExt};

/// Largest batch size [`prewarm_blueprints`] accepts (2^20).
pub const MAX_PREWARM_BATCH: i64 = 1 << 20;

/// What [`prewarm_blueprints`] ran.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prewarm {
    /// Forward + backward passes run (slots x blueprints x batch sizes).
    pub runs: usize,
    /// Wall time, ms, the device synchronised at the end.
    pub ms: f64,
    /// Wall time per blueprint over every slot and batch size, ms (the
    /// device synchronised after each blueprint), in the topology's order.
    pub per_blueprint: Vec<(Blueprint, f64)>,
}

impl Prewarm {
    /// Adds `other`'s passes and times into this one (several devices).
    pub fn absorb(&mut self, other: &Prewarm) {
        self.runs = self.runs.saturating_add(other.runs);
        self.ms += other.ms;
        for &(blueprint, ms) in &other.per_blueprint {
            match self.per_blueprint.iter_mut().find(|(b, _)| *b == blueprint) {
                Some((_, total)) => *total += ms,
                None => self.per_blueprint.push((blueprint, ms)),
            }
        }
    }
}

/// Runs every blueprint of `model`'s topology at every enabled slot once
/// per batch size in `batch_sizes` (forward and backward, under
/// `precision`'s autocast, channels-last when `channels_last`), on scratch
/// modules. Does nothing on the CPU or on a non-CNN host.
///
/// # Errors
/// [`Error::InvalidConfig`] for a batch size outside
/// `1..=MAX_PREWARM_BATCH`; a blueprint that cannot be built at a slot's
/// width, or a failing pass, as [`Error::Lifecycle`] or [`Error::Torch`].
pub fn prewarm_blueprints(
    model: &MorphogeneticModel,
    precision: Precision,
    channels_last: bool,
    batch_sizes: &[i64],
) -> Result<Prewarm> {
    if let Some(&bad) = batch_sizes
        .iter()
        .find(|&&b| !(1..=MAX_PREWARM_BATCH).contains(&b))
    {
        return Err(Error::InvalidConfig {
            field: "prewarm batch size",
            reason: format!("{bad} is outside 1..={MAX_PREWARM_BATCH}"),
        });
    }
    let device = model.device();
    let topology = model.host().topology();
    let Device::Cuda(index) = device else {
        return Ok(Prewarm::default());
    };
    if topology != Topology::Cnn {
        return Ok(Prewarm::default());
    }
    let started = Instant::now();
    let mut runs = 0usize;
    let blueprints: Vec<Blueprint> = Blueprint::for_topology(topology)
        .iter()
        .copied()
        .filter(|&b| b != Blueprint::Noop)
        .collect();
    let mut per_blueprint: Vec<(Blueprint, f64)> = blueprints.iter().map(|&b| (b, 0.0)).collect();
    for slot in model.slots() {
        let spec = slot.spec();
        let (height, width) = spec.spatial;
        for (&blueprint, (_, spent)) in blueprints.iter().zip(per_blueprint.iter_mut()) {
            let blueprint_started = Instant::now();
            let module = blueprint
                .build(topology, spec.channels, device)
                .map_err(|source| Error::Lifecycle {
                    op: "prewarm build",
                    source,
                })?;
            if channels_last {
                for parameter in module.var_store().trainable_variables() {
                    let _ = torch_ext::memory::set_channels_last_(&parameter)?;
                }
            }
            for &batch in batch_sizes {
                let x =
                    Tensor::f_zeros([batch, spec.channels, height, width], (Kind::Float, device))
                        .op("prewarm input")?;
                let x = if channels_last {
                    torch_ext::memory::contiguous_channels_last(&x)?
                } else {
                    x
                };
                // As the training step: no weight-cast cache.
                let autocast = precision.autocast(device, false)?;
                let y = module.forward(&x).map_err(|source| Error::Lifecycle {
                    op: "prewarm forward",
                    source,
                })?;
                drop(autocast);
                y.f_to_kind(Kind::Float)
                    .op("prewarm cast")?
                    .f_sum(Kind::Float)
                    .op("prewarm sum")?
                    .f_backward()
                    .op("prewarm backward")?;
                runs = runs.saturating_add(1);
            }
            torch_ext::cuda::synchronize(index)?;
            *spent += blueprint_started.elapsed().as_secs_f64() * 1000.0;
        }
    }
    Ok(Prewarm {
        runs,
        ms: started.elapsed().as_secs_f64() * 1000.0,
        per_blueprint,
    })
}
