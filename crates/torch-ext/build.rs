//! Compiles the C++ shim in `cpp/` against the provisioned libtorch and links
//! the CUDA pieces of libtorch that tch does not link on its own.
//!
//! Paths come from the environment `.cargo/config.toml` sets: `LIBTORCH`
//! (`<site-packages>/torch`) and `ESPER_TORCH_SITE` (`<site-packages>`, where the
//! `nvidia/cu13` CUDA runtime headers and libraries live). When only `LIBTORCH`
//! is set, the site folder is taken to be its parent, which is how the PyPI
//! wheel lays them out.

use std::env;
use std::path::{Path, PathBuf};

/// The C++ sources, one per responsibility; each includes only the ATen
/// headers it needs because header parsing dominates the build time.
const SOURCES: &[&str] = &[
    "cpp/device.cpp",
    "cpp/graph.cpp",
    "cpp/modes.cpp",
    "cpp/fused.cpp",
    "cpp/memory.cpp",
    "cpp/dist.cpp",
    "cpp/dist_nccl.cpp",
    "cpp/jit.cpp",
    "cpp/autograd.cpp",
    "cpp/nn.cpp",
    "cpp/nn_conv.cpp",
    "cpp/nn_group_norm.cpp",
    "cpp/nn_layer_norm.cpp",
    "cpp/nn_linear.cpp",
    "cpp/nn_embedding.cpp",
    "cpp/nn_attention.cpp",
    "cpp/nn_blend.cpp",
    "cpp/nn_excite.cpp",
    "cpp/nn_pooled.cpp",
    "cpp/side_stream.cpp",
    "cpp/profile.cpp",
];
const HEADERS: &[&str] = &[
    "cpp/esper_torch_ext.h",
    "cpp/error.h",
    "cpp/stream_pack.h",
    "cpp/dist_internal.h",
    "cpp/jit_internal.h",
    "cpp/nn_internal.h",
    "cpp/gloo_decl/gloo/algorithm.h",
    "cpp/gloo_decl/gloo/context.h",
    "cpp/gloo_decl/gloo/common/error.h",
    "cpp/gloo_decl/gloo/rendezvous/store.h",
    "cpp/gloo_decl/gloo/transport/device.h",
];

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=ESPER_TORCH_SITE");
    for path in SOURCES.iter().chain(HEADERS) {
        println!("cargo:rerun-if-changed={path}");
    }

    let libtorch = match env::var_os("LIBTORCH") {
        Some(path) => PathBuf::from(path),
        None => panic!(
            "torch-ext: LIBTORCH is not set; run `cargo xtask provision` (or set LIBTORCH to the \
             torch folder of a torch==2.11.0 wheel)"
        ),
    };
    let site = env::var_os("ESPER_TORCH_SITE")
        .map(PathBuf::from)
        .unwrap_or_else(|| libtorch.join(".."));
    let cuda = site.join("nvidia").join("cu13");

    let include_dirs = [
        libtorch.join("include"),
        libtorch.join("include/torch/csrc/api/include"),
        cuda.join("include"),
        // nccl.h, for c10d's ProcessGroupNCCL header (nvidia-nccl-cu13).
        site.join("nvidia").join("nccl").join("include"),
        // `nv/target` (nvidia-cuda-cccl) lands either directly in cu13/include
        // (next to `crt/host_config.h` from nvidia-cuda-crt) or under `cccl/`.
        cuda.join("include/cccl"),
    ];
    for dir in &include_dirs[..4] {
        require_dir(dir);
    }

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        // The wheel's libtorch is built with both c10d backends; these switch
        // their headers on (see cpp/dist.cpp and cpp/gloo_decl/README.md).
        .define("USE_C10D_GLOO", None)
        .define("USE_C10D_NCCL", None)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .flag_if_supported("-Wno-missing-field-initializers")
        .warnings(false);
    for dir in include_dirs.iter().filter(|dir| dir.is_dir()) {
        build.include(dir);
    }
    build.include("cpp");
    build.include("cpp/gloo_decl");
    for source in SOURCES {
        build.file(source);
    }
    build.compile("esper_torch_ext");

    // libtorch's CUDA half. torch-sys links torch_cuda too, but the linker
    // drops it as not needed unless something references it: the shim does,
    // and `torch_ext::cuda::load_backend` also loads it at run time.
    let torch_lib = libtorch.join("lib");
    let cuda_lib = cuda.join("lib");
    require_dir(&torch_lib);
    require_dir(&cuda_lib);
    println!("cargo:rustc-link-search=native={}", torch_lib.display());
    println!("cargo:rustc-link-search=native={}", cuda_lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cuda");
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    // The wheel ships only the versioned soname, so name the file verbatim.
    println!("cargo:rustc-link-lib=dylib:+verbatim=libcudart.so.13");
}

fn require_dir(dir: &Path) {
    if !dir.is_dir() {
        panic!(
            "torch-ext: expected folder {} (is libtorch provisioned? run `cargo xtask provision`)",
            dir.display()
        );
    }
}
