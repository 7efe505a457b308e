//! Inference mode (`c10::InferenceMode`, `torch.inference_mode()`): no
//! autograd recording and no version-counter bumps; tensors created inside are
//! *inference tensors*.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::Result;
use crate::ffi;

/// Enables inference mode on this thread until dropped, then restores the
/// previous autograd state.
///
/// Inference mode is thread-local, so the guard is neither `Send` nor `Sync`;
/// nested guards should be dropped in reverse order of creation. Tensors
/// created inside cannot later be used in autograd-recorded operations.
#[must_use = "inference mode is on only while the guard lives"]
#[derive(Debug)]
pub struct InferenceModeGuard {
    raw: NonNull<c_void>,
    _not_send: PhantomData<*const ()>,
}

impl InferenceModeGuard {
    /// Enters inference mode. Fails (instead of panicking) only when the C++
    /// side cannot create the guard, e.g. when the process is out of memory.
    pub fn new() -> Result<Self> {
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a live out-parameter; on success it owns a new
        // c10::InferenceMode released in `Drop` on this same thread (the guard
        // is !Send).
        unsafe {
            ffi::check(
                "InferenceModeGuard::new",
                ffi::esper_inference_mode_enter(&mut raw),
            )?
        };
        let raw = NonNull::new(raw).ok_or(crate::Error::Cpp {
            op: "InferenceModeGuard::new",
            message: "shim returned a null guard".to_owned(),
        })?;
        Ok(Self {
            raw,
            _not_send: PhantomData,
        })
    }
}

impl Drop for InferenceModeGuard {
    fn drop(&mut self) {
        // SAFETY: `self.raw` was allocated by esper_inference_mode_enter on
        // this thread and is released exactly once, here.
        unsafe { ffi::esper_inference_mode_exit(self.raw.as_ptr()) }
    }
}

/// Whether inference mode is on for this thread.
pub fn is_inference_mode_enabled() -> bool {
    // SAFETY: no arguments; reads a thread-local flag.
    unsafe { ffi::esper_inference_mode_is_enabled() != 0 }
}

/// Whether `tensor` is an inference tensor (created under inference mode).
pub fn is_inference(tensor: &tch::Tensor) -> Result<bool> {
    let mut out = 0_i32;
    // SAFETY: the pointer is the live `at::Tensor` behind `tensor`; `out` is a
    // live out-parameter.
    unsafe {
        ffi::check(
            "is_inference",
            ffi::esper_tensor_is_inference(ffi::tensor_ptr(tensor), &mut out),
        )?
    };
    Ok(out != 0)
}
