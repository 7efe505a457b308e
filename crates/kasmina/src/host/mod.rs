//! Host networks and where seeds can be injected into them.
//!
//! A host is a chain of segments with numbered *boundaries*: boundary 0 is
//! the input, boundary `k` the output of segment `k`, the last boundary the
//! logits. Seed slots sit at boundaries; each has an [`InjectionSpec`] with a
//! canonical [`SlotId`] (`r{row}c{col}`), its channel count, spatial size,
//! surface and action order. [`Host::forward_segment`] runs the host between
//! two boundaries, which is all the morphogenetic model needs to route the
//! forward pass through the enabled slots.
//!
//! - [`linear`]: the `tolaria-reference` host, `Linear(16 -> 4)`, no slots.
//! - [`cnn`]: the configurable CNN host with PRE_POOL (`r0c{i}`) and
//!   POST_POOL (`r1c{i}`) surfaces.
//! - [`transformer`]: a small GPT-style host with a slot after each layer
//!   group (`r0c{g}`).

pub mod cnn;
pub mod linear;
pub mod transformer;

use tch::{Tensor, nn};

use crate::{Error, Result};

pub use cnn::{CnnHost, CnnHostConfig};
pub use linear::LinearHost;
pub use transformer::{TransformerHost, TransformerHostConfig};

/// A canonical slot id `r{row}c{col}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId {
    /// Row (surface family: 0 = PRE_POOL, 1 = POST_POOL on CNN hosts).
    pub row: u32,
    /// Column (block index).
    pub col: u32,
}

impl SlotId {
    /// The slot at `row`, `col`.
    pub fn new(row: u32, col: u32) -> SlotId {
        SlotId { row, col }
    }

    /// Parses `r{row}c{col}` (pattern `^r(\d+)c(\d+)$`).
    pub fn parse(text: &str) -> Result<SlotId> {
        let invalid = || Error::InvalidSlotId {
            id: text.to_owned(),
        };
        let rest = text.strip_prefix('r').ok_or_else(invalid)?;
        let (row, col) = rest.split_once('c').ok_or_else(invalid)?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(row) || !digits(col) {
            return Err(invalid());
        }
        Ok(SlotId {
            row: row.parse().map_err(|_| invalid())?,
            col: col.parse().map_err(|_| invalid())?,
        })
    }
}

impl std::fmt::Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "r{}c{}", self.row, self.col)
    }
}

impl std::str::FromStr for SlotId {
    type Err = Error;
    fn from_str(text: &str) -> Result<SlotId> {
        SlotId::parse(text)
    }
}

/// Where on the host a slot sits (the reference `SurfaceType` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Surface {
    /// After a block (Dec-23 placement).
    BlockEnd = 0,
    /// After a block, before its pool.
    PrePool = 1,
    /// After a block's pool.
    PostPool = 2,
    /// After a transformer attention sub-layer.
    PostAttn = 3,
    /// After a transformer MLP sub-layer.
    PostMlp = 4,
}

/// How a host's features are laid out, which decides blueprint family and
/// whether gradient isolation survives BLENDING.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Topology {
    /// `[B, C, H, W]` features; isolation stays on for good.
    Cnn,
    /// `[B, T, C]` features; isolation is dropped at BLENDING.
    Transformer,
}

/// One place a seed can be injected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectionSpec {
    /// Canonical id.
    pub slot_id: SlotId,
    /// Feature channels at this boundary.
    pub channels: i64,
    /// Spatial size `(H, W)` of the features for the host's input size.
    pub spatial: (i64, i64),
    /// Surface type.
    pub surface: Surface,
    /// Action index (row-major: r0c0.., then r1c0..).
    pub order: usize,
    /// Host boundary the slot sits at (fixes execution order).
    pub boundary: usize,
}

/// A network seeds can grow in.
pub trait Host: Send {
    /// Short name (`linear-16x4`, `cnn-3x8`).
    fn name(&self) -> &str;

    /// Feature layout.
    fn topology(&self) -> Topology;

    /// The `VarStore` owning the host's parameters and buffers.
    fn var_store(&self) -> &nn::VarStore;

    /// Every injection point, in execution order (ascending boundary).
    fn injection_specs(&self) -> &[InjectionSpec];

    /// Number of segments; boundaries run from 0 (input) to this (logits).
    fn num_segments(&self) -> usize;

    /// Shape of one input sample (`[C, H, W]` or `[features]`).
    fn input_shape(&self) -> Vec<i64>;

    /// Runs segments `from + 1 ..= to`: maps the activation at boundary
    /// `from` to the activation at boundary `to`. `train` selects batch
    /// statistics for BatchNorm.
    fn forward_segment(&self, x: &Tensor, from: usize, to: usize, train: bool) -> Result<Tensor>;

    /// Whether the segment from `boundary` to `boundary + 1` is a 2x2
    /// max-pool of the activation there, exactly
    /// [`torch_ext::nn::max_pool2x2`]: the model's walk then takes a seed's
    /// blend at `boundary` and that pool as one node
    /// ([`torch_ext::nn::blend_lerp_clamped_pool2x2`]) and resumes the host
    /// at `boundary + 1`. `false` unless the host says so.
    fn pools_after(&self, boundary: usize) -> bool {
        let _ = boundary;
        false
    }

    /// The plain forward pass, input to logits.
    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.forward_segment(x, 0, self.num_segments(), train)
    }

    /// The injection spec of `slot`, or [`Error::UnknownSlot`].
    fn injection_spec(&self, slot: SlotId) -> Result<&InjectionSpec> {
        self.injection_specs()
            .iter()
            .find(|spec| spec.slot_id == slot)
            .ok_or_else(|| Error::UnknownSlot {
                slot: slot.to_string(),
                available: self
                    .injection_specs()
                    .iter()
                    .map(|spec| spec.slot_id.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

pub(crate) fn check_boundaries(host: &dyn Host, from: usize, to: usize) -> Result<()> {
    if from > to || to > host.num_segments() {
        return Err(Error::InvalidConfig {
            reason: format!(
                "{}: cannot run from boundary {from} to {to} (host has {} segments)",
                host.name(),
                host.num_segments()
            ),
        });
    }
    Ok(())
}
