//! The run-time compiled kernels of `super`: the whole CUDA source for one
//! dtype and channel width (`nn_source`: every `*_source` module's text)
//! and the per-device cache of its compiled kernels (`kernels`).

use std::ffi::CString;
use std::sync::Arc;

use super::blend_source::BLEND_SOURCE;
use super::bn_pool_source::BN_POOL_SOURCE;
use super::conv_fixed_source::CONV_FIXED_SOURCE;
use super::conv_source::CONV_SOURCE;
use super::embedding_source::EMBEDDING_SOURCE;
use super::excite_source::EXCITE_SOURCE;
use super::gram_source::GRAM_SOURCE;
use super::layer_norm_source::LAYER_NORM_SOURCE;
use super::linear_source::LINEAR_SOURCE;
use super::norm_source::GROUP_NORM_SOURCE;
use super::pooled_source::POOLED_SOURCE;
use super::source::SOURCE;
use crate::error::{Error, Result};
use crate::jit::{JitKernel, KernelCache};

/// The kernels for one dtype and channel width on one device.
pub(super) struct Kernels {
    pub(super) bn_stats: JitKernel,
    pub(super) bn_forward: JitKernel,
    pub(super) bn_reduce: JitKernel,
    pub(super) bn_apply: JitKernel,
    pub(super) bn_eval: JitKernel,
    pub(super) bn_pool_forward: JitKernel,
    pub(super) bn_pool_reduce: JitKernel,
    pub(super) bn_pool_apply: JitKernel,
    pub(super) pool_forward: JitKernel,
    pub(super) pool_backward: JitKernel,
    pub(super) conv_partial: JitKernel,
    pub(super) conv_reduce: JitKernel,
    pub(super) conv_forward_small: JitKernel,
    pub(super) conv_direct: JitKernel,
    pub(super) conv_wgrad_mma: JitKernel,
    /// The direct convolution for 8, 16 or 32 channels each way, in the
    /// order of [`DIRECT_FIXED_KERNELS`].
    pub(super) conv_direct_fixed: Vec<JitKernel>,
    pub(super) gn_forward: JitKernel,
    pub(super) gn_backward: JitKernel,
    pub(super) gn_forward_narrow: JitKernel,
    pub(super) gn_backward_narrow: JitKernel,
    pub(super) blend_forward: JitKernel,
    pub(super) blend_backward: JitKernel,
    pub(super) blend_pool_forward: JitKernel,
    pub(super) blend_pool_backward: JitKernel,
    pub(super) ln_forward: JitKernel,
    pub(super) ln_backward: JitKernel,
    /// The f32 build's layer norm with a bf16 output (none in the bf16
    /// build): forward and backward.
    pub(super) ln_bf16_out: Option<(JitKernel, JitKernel)>,
    pub(super) col_sum: JitKernel,
    /// The bf16 build's linear weight-and-bias gradient (none in the f32
    /// build).
    pub(super) linear_wgrad: Option<JitKernel>,
    pub(super) embedding_backward: JitKernel,
    pub(super) gram_partial: JitKernel,
    pub(super) se_forward: JitKernel,
    pub(super) se_backward: JitKernel,
    pub(super) pooled_forward: JitKernel,
    pub(super) pooled_backward: JitKernel,
}

/// The direct convolution's compile-time-sized kernels, input channels
/// 8, 16, 32 (outer) by output channels 8, 16, 32 (inner): the order the
/// C++ side indexes them in (`direct_fixed_index` in `nn_conv.cpp`).
pub(super) const DIRECT_FIXED_KERNELS: [&str; 9] = [
    "esper_conv3_direct_c1_n1",
    "esper_conv3_direct_c1_n2",
    "esper_conv3_direct_c1_n4",
    "esper_conv3_direct_c2_n1",
    "esper_conv3_direct_c2_n2",
    "esper_conv3_direct_c2_n4",
    "esper_conv3_direct_c4_n1",
    "esper_conv3_direct_c4_n2",
    "esper_conv3_direct_c4_n4",
];

/// The whole CUDA source for one dtype and width (every kernel of
/// [`Kernels`]).
pub(super) fn nn_source(bf16: bool, vec4: bool) -> String {
    format!(
        "#define ESPER_BF16 {}\n#define VEC {}\n{SOURCE}{BN_POOL_SOURCE}{CONV_SOURCE}{CONV_FIXED_SOURCE}{GROUP_NORM_SOURCE}{BLEND_SOURCE}{LAYER_NORM_SOURCE}{EMBEDDING_SOURCE}{GRAM_SOURCE}{LINEAR_SOURCE}{EXCITE_SOURCE}{POOLED_SOURCE}",
        u8::from(bf16),
        if vec4 { 4 } else { 1 }
    )
}

pub(super) fn kernels(
    op: &'static str,
    device: usize,
    bf16: bool,
    vec4: bool,
) -> Result<Arc<Kernels>> {
    static CACHE: KernelCache<(usize, bool, bool), Kernels> = KernelCache::new();
    CACHE
        .get_or_build((device, bf16, vec4), || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            let source = nn_source(bf16, vec4);
            let cubin =
                crate::jit::compile(&source, "esper_nn", arch).map_err(|e| e.to_string())?;
            let load = |name: &str| {
                let name = CString::new(name).map_err(|e| e.to_string())?;
                JitKernel::load_named(&cubin, &name, device).map_err(|e| e.to_string())
            };
            Ok(Kernels {
                bn_stats: load("esper_bn_stats")?,
                bn_forward: load("esper_bn_relu_forward")?,
                bn_reduce: load("esper_bn_relu_backward_reduce")?,
                bn_apply: load("esper_bn_relu_backward_apply")?,
                bn_eval: load("esper_bn_relu_eval")?,
                bn_pool_forward: load("esper_bn_relu_pool_forward")?,
                bn_pool_reduce: load("esper_bn_relu_pool_backward_reduce")?,
                bn_pool_apply: load("esper_bn_relu_pool_backward_apply")?,
                pool_forward: load("esper_pool2_forward")?,
                pool_backward: load("esper_pool2_backward")?,
                conv_partial: load("esper_conv3_wgrad_partial")?,
                conv_reduce: load("esper_conv3_wgrad_reduce")?,
                conv_forward_small: load("esper_conv3_forward_small")?,
                conv_direct: load("esper_conv3_direct")?,
                conv_wgrad_mma: load("esper_conv3_wgrad_mma")?,
                conv_direct_fixed: DIRECT_FIXED_KERNELS
                    .iter()
                    .map(|name| load(name))
                    .collect::<std::result::Result<_, _>>()?,
                gn_forward: load("esper_gn_relu_forward")?,
                gn_backward: load("esper_gn_relu_backward")?,
                gn_forward_narrow: load("esper_gn_relu_forward_narrow")?,
                gn_backward_narrow: load("esper_gn_relu_backward_narrow")?,
                blend_forward: load("esper_blend_lerp_forward")?,
                blend_backward: load("esper_blend_lerp_backward")?,
                blend_pool_forward: load("esper_blend_lerp_pool_forward")?,
                blend_pool_backward: load("esper_blend_lerp_pool_backward")?,
                ln_forward: load("esper_ln_forward")?,
                ln_backward: load("esper_ln_backward")?,
                ln_bf16_out: if bf16 {
                    None
                } else {
                    Some((
                        load("esper_ln_forward_bf16_out")?,
                        load("esper_ln_backward_bf16_out")?,
                    ))
                },
                col_sum: load("esper_col_sum")?,
                linear_wgrad: if bf16 {
                    Some(load("esper_linear_wgrad")?)
                } else {
                    None
                },
                embedding_backward: load("esper_embedding_backward")?,
                gram_partial: load("esper_gram_partial")?,
                se_forward: load("esper_se_forward")?,
                se_backward: load("esper_se_backward")?,
                pooled_forward: load("esper_pooled_linear_forward")?,
                pooled_backward: load("esper_pooled_linear_backward")?,
            })
        })
        .map_err(|message| Error::Cpp { op, message })
}
