//! Run-time compiled CUDA kernels, for the few fused kernels libtorch has no
//! op for.
//!
//! [`compile`] turns CUDA C source into a cubin for one GPU architecture
//! with NVRTC (opened at run time from the torch wheel's
//! `nvidia-cuda-nvrtc`; no CUDA toolkit is needed at build time, and
//! compiling works without a GPU). [`JitKernel::load`] loads a cubin's
//! kernel through the CUDA runtime's library API, and [`JitKernel::launch`]
//! launches it on the current stream of its device, so a launch inside
//! [`crate::CudaGraph::capture`] is captured like any libtorch kernel.
//! [`JitKernel::build`] does both for a device.
//!
//! A kernel takes its arguments as [`Arg`]s: CUDA tensors (passed as their
//! data pointer; they must be contiguous and on the kernel's device, which
//! is checked before the launch) and scalars. The kernel's C signature must
//! match the arguments: a tensor is a pointer, [`Arg::I64`] a `long long`,
//! [`Arg::I32`] an `int`, [`Arg::F32`] a `float`, [`Arg::Bytes`] a
//! by-value struct whose bytes the caller lays out. Declare kernels
//! `extern "C" __global__` so their names are not mangled.
//!
//! A kernel whose body begins with [`crate::pdl::ENTRY`] is launched with
//! programmatic dependent launch on GPUs of compute capability 9.0 and
//! above (see [`crate::pdl`]): it may be scheduled while the kernel ahead of
//! it still runs, and waits for it before touching memory.
//!
//! A captured graph holds on to the kernels it launched: keep a
//! [`JitKernel`] alive as long as any graph that captured it.
//!
//! ```ignore
//! use torch_ext::jit::{Arg, JitKernel};
//! const SOURCE: &str = r#"
//! extern "C" __global__ void scale(float* x, float by, long long n) {
//!     long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
//!     if (i < n) x[i] *= by;
//! }"#;
//! let kernel = JitKernel::build(SOURCE, "scale", 0)?;
//! let x = tch::Tensor::ones([1000], (tch::Kind::Float, tch::Device::Cuda(0)));
//! kernel.launch([4, 1, 1], [256, 1, 1], 0, &[Arg::Tensor(&x), Arg::F32(2.0), Arg::I64(1000)])?;
//! ```

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::hash::Hash;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use tch::{Device, Tensor};

use crate::error::{Error, Result};
use crate::ffi;

/// Most threads in one block.
pub const MAX_BLOCK_THREADS: u32 = 1024;

/// A compiled kernel image for one GPU architecture.
#[derive(Debug, Clone)]
pub struct Cubin {
    bytes: Vec<u8>,
    name: CString,
    arch: (i32, i32),
    log: Option<String>,
    /// The source's kernels that wait for their predecessor first.
    early: Vec<crate::pdl::Kernel>,
}

impl Cubin {
    /// Whether the image names `symbol` (e.g. a kernel's unmangled name),
    /// as a whole word of its string tables.
    pub fn contains_symbol(&self, symbol: &str) -> bool {
        let mut word = symbol.as_bytes().to_vec();
        word.push(0);
        self.bytes
            .windows(word.len())
            .enumerate()
            .any(|(at, window)| {
                window == word.as_slice()
                    && (at == 0 || self.bytes.get(at.wrapping_sub(1)) == Some(&0))
            })
    }

    /// The image's size in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the image is empty (never, for a successful compile).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The architecture it was compiled for, `(major, minor)`.
    pub fn arch(&self) -> (i32, i32) {
        self.arch
    }

    /// Whether kernel `name` begins with [`crate::pdl::ENTRY`], so may be
    /// launched before its predecessor ends.
    pub fn waits_first(&self, name: &str) -> bool {
        self.early.iter().any(|kernel| kernel.matches(name))
    }

    /// NVRTC's log (warnings), if it wrote one.
    pub fn log(&self) -> Option<&str> {
        self.log.as_deref()
    }
}

fn c_string(op: &'static str, what: &str, text: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::InvalidArgument {
        op,
        message: format!("the {what} holds a NUL byte"),
    })
}

/// Compiles `source` (CUDA C++) for architecture `sm_<major><minor>`;
/// `name` is the kernel to load later. A compile error carries NVRTC's log.
pub fn compile(source: &str, name: &str, arch: (i32, i32)) -> Result<Cubin> {
    const OP: &str = "jit::compile";
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(Error::InvalidArgument {
            op: OP,
            message: format!("kernel name {name:?} is not a C identifier"),
        });
    }
    // The early-launch macros, then the source at its own line 1 (so
    // NVRTC's messages keep the source's line numbers).
    let c_source = c_string(
        OP,
        "source",
        &format!("{}#line 1\n{source}", crate::pdl::PRELUDE),
    )?;
    let c_name = c_string(OP, "name", name)?;
    let mut cubin: *mut u8 = std::ptr::null_mut();
    let mut len = 0_u64;
    let mut log: *mut c_char = std::ptr::null_mut();
    // SAFETY: the strings live across the call; the out-parameters are live
    // locals; the log and cubin are taken over (and freed) below exactly
    // once whatever the result.
    let status = unsafe {
        ffi::esper_jit_compile(
            c_source.as_ptr(),
            c_name.as_ptr(),
            arch.0,
            arch.1,
            &mut cubin,
            &mut len,
            &mut log,
        )
    };
    // SAFETY: `log` is NULL or a string the shim allocated, freed here.
    let log = unsafe { ffi::take_string(log) };
    // SAFETY: `status` comes straight from the shim.
    if let Err(error) = unsafe { ffi::check(OP, status) } {
        return Err(match (error, &log) {
            (Error::Cpp { op, message }, Some(log)) => Error::Cpp {
                op,
                message: format!("{message}\n{log}"),
            },
            (error, _) => error,
        });
    }
    let bytes = match NonNull::new(cubin) {
        Some(pointer) => {
            let len = usize::try_from(len).unwrap_or(0);
            // SAFETY: the shim returned `len` initialised bytes at `pointer`,
            // which stay valid until freed just below.
            let bytes = unsafe { std::slice::from_raw_parts(pointer.as_ptr(), len) }.to_vec();
            // SAFETY: allocated by the shim's malloc, freed exactly once.
            unsafe { ffi::esper_jit_free_cubin(pointer.as_ptr()) };
            bytes
        }
        None => Vec::new(),
    };
    if bytes.is_empty() {
        return Err(Error::Cpp {
            op: OP,
            message: "NVRTC returned an empty cubin".to_owned(),
        });
    }
    Ok(Cubin {
        bytes,
        name: c_name,
        arch,
        log: log.filter(|text| !text.trim().is_empty()),
        early: crate::pdl::waiting_kernels(source),
    })
}

/// A process-wide cache of built kernels (or anything built from them),
/// one per key: each key is built once, and a failed build is kept as its
/// message so it is not retried at every call. Entries are never dropped,
/// so graphs that captured their launches stay valid.
pub struct KernelCache<K, T> {
    map: OnceLock<Mutex<HashMap<K, Built<T>>>>,
}

/// A cache entry: what was built, or why it could not be.
type Built<T> = std::result::Result<Arc<T>, String>;

impl<K: Eq + Hash, T> KernelCache<K, T> {
    /// An empty cache (for a `static`).
    pub const fn new() -> Self {
        KernelCache {
            map: OnceLock::new(),
        }
    }

    /// The entry for `key`, built by `build` the first time.
    pub fn get_or_build(
        &self,
        key: K,
        build: impl FnOnce() -> std::result::Result<T, String>,
    ) -> std::result::Result<Arc<T>, String> {
        let map = self.map.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map
            .lock()
            .map_err(|_| "the kernel cache was poisoned by a panic".to_owned())?;
        map.entry(key)
            .or_insert_with(|| build().map(Arc::new))
            .clone()
    }
}

impl<K: Eq + Hash, T> Default for KernelCache<K, T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A loaded kernel, launched on one CUDA device (see the module docs).
#[derive(Debug)]
pub struct JitKernel {
    raw: NonNull<c_void>,
    device: usize,
    name: String,
    early: bool,
}

// SAFETY: the handle is a CUDA runtime library and kernel, which the runtime
// lets any thread use; it is freed once, in `Drop`.
unsafe impl Send for JitKernel {}
// SAFETY: launching takes `&self` and only reads the handle; the runtime
// serialises what it must.
unsafe impl Sync for JitKernel {}

/// One kernel argument (see the module docs).
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// A contiguous CUDA tensor on the kernel's device, passed as a pointer.
    Tensor(&'a Tensor),
    /// A `long long`.
    I64(i64),
    /// An `int`.
    I32(i32),
    /// A `float`.
    F32(f32),
    /// A parameter passed by value whose type is not one of the above (a
    /// struct): its bytes, in the kernel's layout for that type.
    Bytes(&'a [u8]),
}

impl JitKernel {
    /// Loads `cubin`'s kernel for launches on CUDA device `device`.
    pub fn load(cubin: &Cubin, device: usize) -> Result<JitKernel> {
        JitKernel::load_named(cubin, &cubin.name, device)
    }

    /// Loads kernel `name` of `cubin` (one compiled source may hold several
    /// kernels) for launches on CUDA device `device`.
    pub fn load_named(cubin: &Cubin, name: &CStr, device: usize) -> Result<JitKernel> {
        let (major, minor) = crate::cuda::device_capability(device)?;
        if (major, minor) != cubin.arch {
            return Err(Error::InvalidArgument {
                op: "jit::load",
                message: format!(
                    "the cubin is for sm_{}{}, device {device} is sm_{major}{minor}",
                    cubin.arch.0, cubin.arch.1
                ),
            });
        }
        let text = name.to_string_lossy().into_owned();
        let early = major >= 9 && cubin.waits_first(&text) && crate::pdl::enabled()?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: the cubin bytes and name live across the call; `raw` is a
        // live out-parameter.
        unsafe {
            ffi::check(
                "jit::load",
                ffi::esper_jit_load(
                    cubin.bytes.as_ptr(),
                    name.as_ptr(),
                    i32::from(early),
                    &mut raw,
                ),
            )?;
        }
        let raw = NonNull::new(raw).ok_or_else(|| Error::Cpp {
            op: "jit::load",
            message: "the runtime returned no kernel".to_owned(),
        })?;
        Ok(JitKernel {
            raw,
            device,
            name: text,
            early,
        })
    }

    /// Compiles `source` for device `device`'s architecture and loads
    /// kernel `name`.
    pub fn build(source: &str, name: &str, device: usize) -> Result<JitKernel> {
        let arch = crate::cuda::device_capability(device)?;
        JitKernel::load(&compile(source, name, arch)?, device)
    }

    /// The loaded kernel's handle, for the shim's own launches (`nn.cpp`).
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw.as_ptr()
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is launched with programmatic dependent launch (its body
    /// waits first, the device is sm_90 or newer, and `ESPER_PDL` allows
    /// it).
    pub fn launches_early(&self) -> bool {
        self.early
    }

    /// The device it launches on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Launches the kernel on its device's current stream with `grid`
    /// blocks of `block` threads and `shared` bytes of dynamic shared
    /// memory. Tensors are checked (defined, contiguous, on this device)
    /// before anything is launched; the kernel itself cannot be checked
    /// against the arguments, so they must match its signature.
    pub fn launch(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[Arg<'_>],
    ) -> Result<()> {
        const OP: &str = "jit::launch";
        let threads = block
            .iter()
            .try_fold(1_u32, |total, dim| total.checked_mul(*dim));
        if grid.contains(&0) || !matches!(threads, Some(1..=MAX_BLOCK_THREADS)) {
            return Err(Error::InvalidArgument {
                op: OP,
                message: format!(
                    "grid {grid:?} and block {block:?}: every dimension must be at least 1 and \
                     a block at most {MAX_BLOCK_THREADS} threads"
                ),
            });
        }
        // Every argument's value in an 8-byte slot; the runtime reads as
        // many bytes of each as the kernel's parameter takes (little-endian,
        // so a 4-byte int or float sits in the slot's first bytes).
        // (`Bytes` are passed from the caller's slice, which outlives the
        // call.)
        let mut slots = Vec::with_capacity(args.len());
        for (index, arg) in args.iter().enumerate() {
            slots.push(match arg {
                Arg::Tensor(tensor) => self.tensor_slot(index, tensor)?,
                Arg::I64(value) => u64::from_ne_bytes(value.to_ne_bytes()),
                Arg::I32(value) => u64::from(u32::from_ne_bytes(value.to_ne_bytes())),
                Arg::F32(value) => u64::from(value.to_bits()),
                Arg::Bytes(_) => 0,
            });
        }
        let mut pointers: Vec<*mut c_void> = slots
            .iter_mut()
            .zip(args)
            .map(|(slot, arg)| match arg {
                Arg::Bytes(bytes) => bytes.as_ptr().cast_mut().cast::<c_void>(),
                _ => std::ptr::from_mut(slot).cast::<c_void>(),
            })
            .collect();
        let device = i32::try_from(self.device).map_err(|_| Error::InvalidArgument {
            op: OP,
            message: format!("device {} does not fit i32", self.device),
        })?;
        // SAFETY: the handle is live (freed only in Drop); grid, block and
        // the argument pointers (into `slots`, or the callers' `Bytes`) live
        // across the call, which
        // copies the values before it returns.
        unsafe {
            ffi::check(
                OP,
                ffi::esper_jit_launch(
                    self.raw.as_ptr(),
                    device,
                    grid.as_ptr(),
                    block.as_ptr(),
                    shared,
                    pointers.as_mut_ptr(),
                ),
            )
        }
    }

    fn tensor_slot(&self, index: usize, tensor: &Tensor) -> Result<u64> {
        let fail = |message: String| Error::InvalidArgument {
            op: "jit::launch",
            message: format!("argument {index} of {}: {message}", self.name),
        };
        if !tensor.defined() {
            return Err(fail("an undefined tensor".to_owned()));
        }
        if tensor.device() != Device::Cuda(self.device) {
            return Err(fail(format!(
                "a tensor on {:?}, the kernel runs on cuda:{}",
                tensor.device(),
                self.device
            )));
        }
        if !tensor.is_contiguous() {
            return Err(fail(format!(
                "a non-contiguous tensor of shape {:?}",
                tensor.size()
            )));
        }
        Ok(tensor.data_ptr() as usize as u64)
    }
}

impl Drop for JitKernel {
    fn drop(&mut self) {
        // SAFETY: the handle came from esper_jit_load and is freed once.
        unsafe { ffi::esper_jit_unload(self.raw.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r#"
extern "C" __global__ void fill(float* x, float value, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}
"#;

    #[test]
    fn compiles_without_a_gpu() {
        let cubin = compile(SOURCE, "fill", (9, 0)).expect("NVRTC compiles for sm_90");
        assert!(cubin.len() > 100);
        assert!(!cubin.is_empty());
        assert_eq!(cubin.arch(), (9, 0));
    }

    #[test]
    fn the_cubin_knows_which_kernels_wait_first() {
        let source = format!(
            "{SOURCE}\nextern \"C\" __global__ void early(float* x) {{ {} x[0] = 1.0f; }}",
            crate::pdl::ENTRY
        );
        let cubin = compile(&source, "early", (9, 0)).expect("NVRTC compiles the macro");
        assert!(cubin.waits_first("early"));
        assert!(!cubin.waits_first("fill"));
        // Below sm_90 the macro compiles to nothing.
        let old = compile(&source, "early", (8, 0)).expect("NVRTC compiles for sm_80");
        assert!(old.waits_first("early"));
    }

    #[test]
    fn a_compile_error_carries_the_log() {
        let error = compile("extern \"C\" __global__ void broken( {", "broken", (9, 0))
            .expect_err("not C++");
        let text = error.to_string();
        assert!(text.contains("nvrtcCompileProgram"), "{text}");
        assert!(text.contains("error"), "{text}");
    }

    #[test]
    fn bad_names_and_architectures_are_refused() {
        assert!(matches!(
            compile(SOURCE, "fill; rm", (9, 0)),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            compile(SOURCE, "", (9, 0)),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            compile("a\0b", "fill", (9, 0)),
            Err(Error::InvalidArgument { .. })
        ));
        let error = compile(SOURCE, "fill", (1, 0)).expect_err("sm_10");
        assert!(error.to_string().contains("sm_10"), "{error}");
    }

    #[test]
    fn loading_needs_a_device_of_the_cubins_architecture() {
        let cubin = compile(SOURCE, "fill", (9, 0)).expect("compiles");
        match JitKernel::load(&cubin, 0) {
            // No GPU here: a clear error, no crash.
            Err(Error::CudaUnavailable | Error::InvalidDevice { .. }) => {}
            // A GPU of another architecture: refused by name.
            Err(Error::InvalidArgument { message, .. }) => assert!(message.contains("sm_90")),
            Err(other) => panic!("unexpected error: {other}"),
            Ok(kernel) => assert_eq!(kernel.name(), "fill"),
        }
    }
}
