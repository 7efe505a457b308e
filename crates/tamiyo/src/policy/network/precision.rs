//! [`PolicyPrecision`]: fp32, or bf16 autocast with fp32 outputs (see the
//! parent module's docs).

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
