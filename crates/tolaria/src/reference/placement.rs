//! Where the special reference trainer's training set lives: packed, in
//! host memory (page-locked on CUDA) and on the device, with one set of step
//! views per microbatch; and the checks a replacement training set must
//! pass. (The engine stages every other training set,
//! [`crate::engine::staging`].)

use tch::{Device, Tensor};

use super::config::{MAX_TRAINER_SAMPLES, TrainerConfig};
use super::step::StepViews;
use crate::data::{Dataset, MicrobatchSpan, PackedEpoch, pack_epoch, tabular_features};
use crate::error::{Error, Result, TorchResultExt};

/// Training data in its host and device forms, with per-microbatch views.
pub(crate) struct EpochData {
    /// Packed microbatches on the host (page-locked on CUDA).
    pub(crate) host: Tensor,
    /// The same on the device (staged every epoch, or resident).
    pub(crate) device: Tensor,
    pub(crate) spans: Vec<MicrobatchSpan>,
    /// Views into `device`, one per microbatch.
    pub(crate) views: Vec<StepViews>,
    pub(crate) samples: usize,
}

/// Packs `set`, puts it in host memory (pinned on CUDA) and on the device.
pub(crate) fn place_training_set(
    config: &TrainerConfig,
    device: Device,
    set: &Dataset,
) -> Result<EpochData> {
    let PackedEpoch { values, spans } = pack_epoch(set, config.batch_size)?;
    let host = Tensor::f_from_slice(&values).op("from_slice")?;
    let (host, device_buffer) = match device {
        Device::Cuda(_) => {
            let pinned = torch_ext::memory::pin(&host)?;
            let on_device = pinned.f_to_device(device).op("to_device")?;
            (pinned, on_device)
        }
        _ => {
            let copy = host.f_detach_copy().op("copy")?;
            (host, copy)
        }
    };
    let views = spans
        .iter()
        .map(|&span| StepViews::new(&device_buffer, span, config.n_features, config.n_classes))
        .collect::<Result<Vec<_>>>()?;
    Ok(EpochData {
        host,
        device: device_buffer,
        spans,
        views,
        samples: set.len(),
    })
}

/// What [`super::Trainer::replace_training_set`] requires beyond
/// [`Dataset::new`]'s own checks: `batch_size` in `1..=`[`MAX_TRAINER_SAMPLES`],
/// between 1 and [`MAX_TRAINER_SAMPLES`] samples of `[n_features]` rows, and the
/// trainer's features and classes.
pub(crate) fn check_replacement(
    config: &TrainerConfig,
    set: &Dataset,
    batch_size: usize,
) -> Result<()> {
    let invalid = |field: &'static str, reason: String| Error::InvalidConfig { field, reason };
    if !(1..=MAX_TRAINER_SAMPLES).contains(&batch_size) {
        return Err(invalid(
            "batch_size",
            format!("{batch_size} is outside 1..={MAX_TRAINER_SAMPLES}"),
        ));
    }
    if set.is_empty() || set.len() > MAX_TRAINER_SAMPLES {
        return Err(invalid(
            "training set",
            format!(
                "{} holds {} samples, expected 1..={MAX_TRAINER_SAMPLES}",
                set.name(),
                set.len()
            ),
        ));
    }
    let n_features = tabular_features(set)?;
    if n_features != config.n_features {
        return Err(invalid(
            "n_features",
            format!(
                "the set has {n_features} features, the trainer {}",
                config.n_features
            ),
        ));
    }
    if set.n_classes() != config.n_classes {
        return Err(invalid(
            "n_classes",
            format!(
                "the set has {} classes, the trainer {}",
                set.n_classes(),
                config.n_classes
            ),
        ));
    }
    Ok(())
}
