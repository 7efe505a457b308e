//! [`Bf16Shadows`]: `bf16` copies of a model's `f32` weights, cast in one
//! launch at the start of a training step and taken by [`super::linear`]
//! in place of its own cast of each weight and bias.
//!
//! Under `bf16` autocast every layer casts its `f32` weight (and bias) to
//! `bf16` at each forward: on the language-model host that is a few dozen
//! launches of a microsecond or two a step, each moving a few hundred
//! kilobytes. A training step that owns its parameters can instead keep a
//! `bf16` shadow of each and refresh them all at once
//! ([`Bf16Shadows::enter`], one multi-tensor launch of
//! `crate::foreach_kernel`, libtorch's copies where it does not apply):
//! the values are the same bits as the layer's own cast (both round to
//! nearest even), so results do not change.
//!
//! The shadows are visible to [`super::linear`] on the entering thread
//! only while the returned [`ShadowScope`] lives. A shadow is looked up by
//! the weight's data address, size and dtype, so a weight replaced by
//! another tensor simply misses: the layer casts it itself, and the scope
//! records the miss. [`Bf16Shadows::adopt_misses`] then adds shadows for
//! the missed weights (outside a CUDA-graph capture, since it allocates),
//! so the second step of a model needs no cast of its own. A step
//! captured in a CUDA graph holds the refresh launch and the layers'
//! reads of the shadows; the shadows must then outlive the graph, as every
//! other tensor it reads.
//!
//! The shadow is only as fresh as the last [`Bf16Shadows::enter`]: a
//! scope must not span an update of the weights that the forward inside it
//! should see (a training step enters at its forward, after the previous
//! step's update).
//!
//! (Not run as a doctest: doctest binaries do not find libtorch.)
//!
//! ```ignore
//! use tch::{Device, Kind, Tensor};
//! let w = Tensor::randn([64, 32], (Kind::Float, Device::Cuda(0))).set_requires_grad(true);
//! let x = Tensor::randn([8, 32], (Kind::Float, Device::Cuda(0)));
//! let mut shadows = torch_ext::nn::Bf16Shadows::new();
//! for _ in 0..2 {
//!     let _autocast = torch_ext::AutocastGuard::new(torch_ext::AutocastDevice::Cuda, Kind::BFloat16)?;
//!     let scope = shadows.enter()?; // the first step misses `w` ...
//!     let y = torch_ext::nn::linear(&x, &w, None)?;
//!     drop(scope);
//!     y.sum(Kind::Float).backward();
//!     shadows.adopt_misses()?; // ... and the second reads its shadow
//! }
//! # Ok::<(), torch_ext::Error>(())
//! ```

use std::cell::RefCell;

use tch::{Device, Kind, Tensor};

use super::torch;
use crate::error::Result;
use crate::foreach_kernel::{self, Op};

/// `bf16` shadows of `f32` weights (see the module docs).
#[derive(Debug, Default)]
pub struct Bf16Shadows {
    /// The weights, each beside its shadow.
    weights: Vec<Tensor>,
    shadows: Vec<Tensor>,
    /// Weights the layers cast themselves inside a scope, not yet adopted.
    misses: RefCell<Vec<Tensor>>,
}

/// The shadows one thread's layers may read (installed by a scope).
struct Active {
    /// `(data address, size, shadow)` of every shadow.
    entries: Vec<(usize, Vec<i64>, Tensor)>,
    /// Weights looked up and not found.
    misses: Vec<Tensor>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// Makes the shadows of a [`Bf16Shadows`] visible to [`super::linear`] on
/// this thread until dropped; then hands the scope's misses to its owner
/// and restores whatever scope was active before.
#[must_use = "the shadows are visible only while the scope lives"]
pub struct ShadowScope<'a> {
    owner: &'a Bf16Shadows,
    previous: Option<Active>,
}

impl std::fmt::Debug for ShadowScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShadowScope")
            .field("shadows", &self.owner.len())
            .finish()
    }
}

impl Drop for ShadowScope<'_> {
    fn drop(&mut self) {
        let active = ACTIVE.with(|cell| cell.replace(self.previous.take()));
        if let Some(active) = active {
            self.owner.misses.borrow_mut().extend(active.misses);
        }
    }
}

impl Bf16Shadows {
    /// No shadows yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Shadows held.
    pub fn len(&self) -> usize {
        self.shadows.len()
    }

    /// Whether no shadow is held.
    pub fn is_empty(&self) -> bool {
        self.shadows.is_empty()
    }

    /// The weights shadowed, in the order they were adopted.
    pub fn weights(&self) -> &[Tensor] {
        &self.weights
    }

    /// Casts every weight into its shadow (one launch on CUDA where the
    /// multi-tensor kernel applies, libtorch's copies otherwise) and makes
    /// the shadows visible to [`super::linear`] on this thread while the
    /// scope lives. Nothing is read back, so a captured step may enter.
    ///
    /// # Errors
    /// [`Error::Cpp`](crate::Error::Cpp) when the cast cannot be launched.
    pub fn enter(&self) -> Result<ShadowScope<'_>> {
        self.refresh()?;
        let entries = self
            .weights
            .iter()
            .zip(&self.shadows)
            .map(|(weight, shadow)| {
                (
                    weight.data_ptr() as usize,
                    weight.size(),
                    shadow.shallow_clone(),
                )
            })
            .collect();
        let previous = ACTIVE.with(|cell| {
            cell.replace(Some(Active {
                entries,
                misses: Vec::new(),
            }))
        });
        Ok(ShadowScope {
            owner: self,
            previous,
        })
    }

    /// Adds a shadow ([`Bf16Shadows::add`]) for every distinct weight the
    /// layers cast themselves in this object's scopes since the last call,
    /// and returns how many were added. Allocates, so while the current
    /// CUDA stream of a missed weight's device captures a graph it adds
    /// nothing and keeps the misses for a later call.
    ///
    /// # Errors
    /// [`Error::Cpp`](crate::Error::Cpp) when a shadow cannot be allocated
    /// or the stream's capture state cannot be read.
    pub fn adopt_misses(&mut self) -> Result<usize> {
        let misses = std::mem::take(self.misses.get_mut());
        let mut capturing = false;
        for weight in &misses {
            if let Device::Cuda(index) = weight.device() {
                capturing |= crate::stream::CudaStream::current(index)?.is_capturing()?;
            }
        }
        if capturing {
            *self.misses.get_mut() = misses;
            return Ok(0);
        }
        let mut added = 0_usize;
        for weight in &misses {
            if self.add(weight)? {
                added = added.saturating_add(1);
            }
        }
        Ok(added)
    }

    /// Adds a shadow for `weight` (a contiguous `f32` tensor not yet
    /// shadowed) and returns whether it did; the shadow is filled at the
    /// next [`Bf16Shadows::enter`]. Allocates: not while a graph captures.
    ///
    /// # Errors
    /// [`Error::Cpp`](crate::Error::Cpp) when the shadow cannot be
    /// allocated.
    pub fn add(&mut self, weight: &Tensor) -> Result<bool> {
        const OP: &str = "nn::Bf16Shadows::add";
        let known = self.weights.iter().any(|w| same_weight(w, weight));
        if known || !shadowable(weight) {
            return Ok(false);
        }
        let shadow = Tensor::f_empty(weight.size(), (Kind::BFloat16, weight.device()))
            .map_err(|error| torch(OP, error))?;
        self.weights
            .push(weight.f_detach().map_err(|error| torch(OP, error))?);
        self.shadows.push(shadow);
        Ok(true)
    }

    /// The shadows, each at its weight's position in
    /// [`Bf16Shadows::weights`]; current as of the last
    /// [`Bf16Shadows::enter`].
    pub fn shadows(&self) -> &[Tensor] {
        &self.shadows
    }

    /// Drops every shadow (and pending miss): the next scopes cast as the
    /// layers do.
    pub fn clear(&mut self) {
        self.weights.clear();
        self.shadows.clear();
        self.misses.get_mut().clear();
    }

    fn refresh(&self) -> Result<()> {
        if self.shadows.is_empty() {
            return Ok(());
        }
        if foreach_kernel::run(Op::CastBf16, &self.shadows, &self.weights, 1.0)? {
            return Ok(());
        }
        for (shadow, weight) in self.shadows.iter().zip(&self.weights) {
            shadow
                .shallow_clone()
                .f_copy_(weight)
                .map_err(|error| torch("nn::Bf16Shadows::enter", error))?;
        }
        Ok(())
    }
}

/// Whether a weight can have a shadow: a contiguous `f32` tensor (on the
/// CPU too, where only the bookkeeping is of use: [`super::linear`] looks
/// shadows up on CUDA only).
fn shadowable(weight: &Tensor) -> bool {
    weight.defined() && weight.kind() == Kind::Float && weight.is_contiguous()
}

/// Whether `a` and `b` are one weight for the shadows: the same data
/// address and size (what a scope's entries key on).
fn same_weight(a: &Tensor, b: &Tensor) -> bool {
    a.data_ptr() == b.data_ptr() && a.size() == b.size()
}

/// The active scope's shadow of `weight` (an `f32` weight about to be cast
/// to `bf16`), or `None` when no scope is active or it holds none, in
/// which case an active scope records the miss.
pub(super) fn lookup(weight: &Tensor) -> Option<Tensor> {
    ACTIVE.with(|cell| {
        let mut active = cell.borrow_mut();
        let active = active.as_mut()?;
        if !shadowable(weight) {
            return None;
        }
        let address = weight.data_ptr() as usize;
        let size = weight.size();
        let found = active
            .entries
            .iter()
            .find(|(a, s, _)| *a == address && *s == size)
            .map(|(_, _, shadow)| shadow.shallow_clone());
        if found.is_none() && !active.misses.iter().any(|m| same_weight(m, weight)) {
            active.misses.push(weight.shallow_clone());
        }
        found
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(values: &[f32]) -> Tensor {
        Tensor::from_slice(values)
    }

    #[test]
    fn a_scope_records_misses_and_the_next_reads_fresh_shadows() {
        let weight = cpu(&[1.0, 2.5, -3.0, 1.0 + 1.0 / 512.0]);
        let mut shadows = Bf16Shadows::new();
        assert!(lookup(&weight).is_none(), "no scope, no shadow");
        {
            let _scope = shadows.enter().unwrap();
            assert!(lookup(&weight).is_none());
            assert!(lookup(&weight).is_none(), "a second miss is the same miss");
        }
        assert_eq!(shadows.adopt_misses().unwrap(), 1);
        assert_eq!(shadows.adopt_misses().unwrap(), 0, "misses are taken once");
        {
            let _scope = shadows.enter().unwrap();
            let shadow = lookup(&weight).expect("the adopted shadow");
            assert_eq!(shadow.kind(), Kind::BFloat16);
            assert!(shadow.equal(&weight.to_kind(Kind::BFloat16)));
        }
        // The weight changes in place: the next scope's refresh sees it.
        let _ = weight.shallow_clone().f_add_scalar_(1.0).unwrap();
        let _scope = shadows.enter().unwrap();
        let shadow = lookup(&weight).unwrap();
        assert!(shadow.equal(&weight.to_kind(Kind::BFloat16)));
        assert_eq!(shadows.len(), 1);
    }

    #[test]
    fn an_inner_scope_hides_the_outer_until_it_drops() {
        let (a, b) = (cpu(&[1.0, 2.0]), cpu(&[3.0]));
        let mut outer = Bf16Shadows::new();
        assert!(outer.add(&a).unwrap());
        assert!(!outer.add(&a).unwrap(), "already shadowed");
        assert!(!outer.add(&a.to_kind(Kind::Double)).unwrap(), "not f32");
        let mut inner = Bf16Shadows::new();
        assert!(inner.add(&b).unwrap());
        let _outer_scope = outer.enter().unwrap();
        assert!(lookup(&a).is_some());
        {
            let _inner_scope = inner.enter().unwrap();
            assert!(lookup(&a).is_none(), "the inner scope holds only b");
            assert!(lookup(&b).is_some());
        }
        assert!(lookup(&a).is_some(), "the outer scope is back");
        // A tensor of another size at the same address is not the weight.
        assert!(lookup(&a.narrow(0, 0, 1)).is_none());
        drop(_outer_scope);
        assert_eq!(inner.adopt_misses().unwrap(), 1, "the inner scope missed a");
        assert_eq!(
            outer.adopt_misses().unwrap(),
            1,
            "the outer scope missed the view"
        );
        outer.clear();
        assert!(outer.is_empty() && outer.weights().is_empty() && outer.shadows().is_empty());
    }
}
