//! [`PolicyPrecision`]: fp32, or bf16 autocast with fp32 outputs (see the
//! parent module's docs), and [`cpu_bf16_lstm_supported`], whether this
//! CPU's oneDNN runs the LSTM in bf16.
//!
//! Under CPU autocast, libtorch sends the LSTM to oneDNN and casts it to
//! bf16; oneDNN has no bf16 LSTM on CPUs without AVX-512 (AVX2 only, or
//! `ONEDNN_MAX_CPU_ISA=AVX2`) and fails with "could not create a primitive
//! descriptor for the LSTM forward propagation primitive". The first bf16
//! forward on the CPU therefore probes once per process: a tiny LSTM, forward
//! and backward, under CPU bf16 autocast. Where the probe fails, the
//! network's LSTM layers run in full precision instead (their inputs,
//! states and weights cast to `f64`, which autocast never casts down; the
//! outputs cast back to `f32`), while every other layer stays under bf16
//! autocast; this is reported once through `tracing` (a warning, target
//! `tamiyo`). [`cpu_bf16_lstm_supported`] tells callers and telemetry which
//! way the CPU went. CUDA is not affected (cuDNN has bf16 LSTMs).

use std::sync::OnceLock;

use tch::{Device, Kind, Tensor};

use crate::error::TorchResultExt;

/// The arithmetic precision of the policy's forward passes (not part of the
/// checkpoint: the variables are fp32 either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum PolicyPrecision {
    /// fp32 throughout (the default).
    #[default]
    Fp32,
    /// bf16 autocast; outputs and the LSTM state in fp32.
    Bf16,
}

impl PolicyPrecision {
    /// The policy precision the reference pairs with the environments'
    /// training precision (§4.6): bf16 autocast only when the environments
    /// train in bf16; fp32 otherwise, fp16 included, because the policy's
    /// optimizer has no gradient scaler.
    pub fn for_training(precision: tolaria::amp::Precision) -> PolicyPrecision {
        match precision {
            tolaria::amp::Precision::Bf16 => PolicyPrecision::Bf16,
            tolaria::amp::Precision::Fp16 | tolaria::amp::Precision::Fp32 => PolicyPrecision::Fp32,
        }
    }

    /// Short name (`fp32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            PolicyPrecision::Fp32 => "fp32",
            PolicyPrecision::Bf16 => "bf16",
        }
    }
}

/// The probe's outcome: `Ok` when oneDNN ran a bf16 LSTM, else why not.
static CPU_BF16_LSTM: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Whether this CPU runs the LSTM under bf16 autocast (oneDNN has a bf16
/// LSTM for it), probed once per process on first use (see the module
/// docs). `false` means the policy's LSTM layers run in full precision
/// inside bf16 forwards on the CPU.
pub fn cpu_bf16_lstm_supported() -> bool {
    cpu_bf16_lstm_probe().is_ok()
}

/// Why the CPU cannot run a bf16 LSTM (`None` when it can): the probe's
/// error, for telemetry and logs.
pub fn cpu_bf16_lstm_fallback_reason() -> Option<String> {
    cpu_bf16_lstm_probe().err()
}

fn cpu_bf16_lstm_probe() -> std::result::Result<(), String> {
    CPU_BF16_LSTM
        .get_or_init(|| {
            let outcome = probe().map_err(|error| error.to_string());
            if let Err(reason) = &outcome {
                tracing::warn!(
                    target: "tamiyo",
                    reason = %reason,
                    "oneDNN has no bf16 LSTM on this CPU: the policy's LSTM runs in full \
                     precision inside bf16 autocast (the other layers stay in bf16)"
                );
            }
            outcome
        })
        .clone()
}

/// A tiny LSTM, forward under CPU bf16 autocast and backward.
fn probe() -> crate::Result<()> {
    tch::with_grad(|| {
        let options = (Kind::Float, Device::Cpu);
        let (width, gates) = (8_i64, 32_i64);
        let x = Tensor::f_full([2, 2, width], 0.5, options)
            .op("lstm probe")?
            .f_set_requires_grad(true)
            .op("lstm probe")?;
        let state = Tensor::f_zeros([1, 2, width], options).op("lstm probe")?;
        let weight = |rows: i64, columns: i64| -> crate::Result<Tensor> {
            Tensor::f_full([rows, columns], 0.1, options)
                .op("lstm probe")?
                .f_set_requires_grad(true)
                .op("lstm probe")
        };
        let w_ih = weight(gates, width)?;
        let w_hh = weight(gates, width)?;
        let bias = Tensor::f_zeros([gates], options).op("lstm probe")?;
        let output = {
            let _autocast = torch_ext::AutocastGuard::with_cache(
                torch_ext::AutocastDevice::Cpu,
                Kind::BFloat16,
                false,
            )
            .map_err(|source| crate::Error::Device {
                op: "lstm probe autocast",
                source,
            })?;
            let (output, _, _) = x
                .f_lstm(
                    &[&state, &state],
                    &[&w_ih, &w_hh, &bias, &bias],
                    true,
                    1,
                    0.0,
                    true,
                    false,
                    true,
                )
                .op("lstm probe")?;
            output
        };
        let loss = output
            .f_to_kind(Kind::Float)
            .op("lstm probe")?
            .f_sum(Kind::Float)
            .op("lstm probe")?;
        Tensor::f_run_backward(&[&loss], &[&x, &w_ih, &w_hh], false, false)
            .op("lstm probe backward")?;
        Ok(())
    })
}
