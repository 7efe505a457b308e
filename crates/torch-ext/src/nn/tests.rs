//! The kernels' source compiles in every variant (NVRTC needs no GPU).

use super::*;

/// Every dtype and channel-width variant compiles (NVRTC needs no GPU).
#[test]
fn every_kernel_variant_compiles() {
    for bf16 in [false, true] {
        for vec4 in [false, true] {
            let source = nn_source(bf16, vec4);
            match crate::jit::compile(&source, "esper_nn", (9, 0)) {
                Ok(cubin) => {
                    assert!(!cubin.is_empty());
                    assert!(
                        !cubin.contains_symbol("esper_gn_relu"),
                        "a prefix is no symbol"
                    );
                    // Every kernel `kernels` loads is in the image.
                    for name in [
                        "esper_gn_relu_forward",
                        "esper_gn_relu_backward",
                        "esper_gn_relu_forward_narrow",
                        "esper_gn_relu_backward_narrow",
                        "esper_conv3_direct",
                        "esper_bn_relu_forward",
                        "esper_bn_relu_eval",
                        "esper_blend_lerp_forward",
                        "esper_blend_lerp_backward",
                    ] {
                        assert!(
                            cubin.contains_symbol(name),
                            "bf16 {bf16} vec4 {vec4}: no {name}"
                        );
                    }
                }
                Err(error) if error.to_string().contains("libnvrtc") => {
                    println!("skipping: NVRTC is not installed here ({error})");
                    return;
                }
                Err(error) => panic!("bf16 {bf16} vec4 {vec4}: {error}"),
            }
        }
    }
}
