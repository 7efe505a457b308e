//! The configurable CNN host (`CNNHost` of the reference).
//!
//! `n_blocks` ConvBlocks (conv k x k, padding k/2, no bias -> BatchNorm ->
//! ReLU) with `base * 2^i` channels; a 2x2 max-pool after each of the first
//! `pool_layers` blocks; then global average pooling and a linear classifier.
//!
//! Surfaces (reference HEAD): `r0c{i}` = PRE_POOL (after block `i`, before its
//! pool), `r1c{i}` = POST_POOL (after the pool, only where pooling applies).
//! Action order is row-major (`r0c0..r0c{n-1}`, then `r1c0..`); execution
//! order interleaves (`r0c0, r1c0, r0c1, r1c1, ...`). For 28x28 inputs with
//! base 8 and 3 blocks: r0c0 8ch@28², r1c0 8ch@14², r0c1 16ch@14², r1c1
//! 16ch@7², r0c2 32ch@7², r1c2 32ch@3²; for 32x32 inputs the sizes are
//! 32/16/16/8/8/4.
//!
//! Tensors are NCHW (the reference uses channels_last on GPU; the layout does
//! not change values).
//!
//! [`CnnHostConfig::validate`] bounds every size (see [`crate::validate`])
//! before anything is allocated, and [`Host::forward_segment`] checks the
//! activation's shape at its starting boundary before libtorch sees it.

#![warn(clippy::arithmetic_side_effects)]

use tch::{Device, Tensor, nn};

use super::{Host, InjectionSpec, SlotId, Surface, Topology, check_boundaries};
use crate::layers::{BatchNorm2d, Conv2d, Linear};
use crate::validate::{
    MAX_CHANNELS, MAX_CLASSES, MAX_KERNEL_SIZE, MAX_LAYERS, MAX_PARAMETERS, MAX_SPATIAL,
    checked_product, checked_sum, shape, size_in,
};
use crate::{Error, Result};

/// Shape and size of a CNN host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CnnHostConfig {
    /// Input channels (1 for Fashion-MNIST, 3 for CIFAR-10).
    pub in_channels: i64,
    /// Input height and width (28 or 32).
    pub input_size: i64,
    /// Number of conv blocks (at least 2).
    pub n_blocks: usize,
    /// Channels of the first block; block `i` has `base * 2^i`.
    pub base_channels: i64,
    /// Square kernel size (odd).
    pub kernel_size: i64,
    /// How many of the first blocks are followed by a 2x2 max-pool.
    pub pool_layers: usize,
    /// Output classes.
    pub n_classes: i64,
}

impl CnnHostConfig {
    /// Fashion-MNIST host: 1x28x28, channels 8/16/32, kernel 3, pooling
    /// everywhere, 10 classes (the `tolaria-fmnist` host).
    pub fn fashion_mnist() -> CnnHostConfig {
        CnnHostConfig {
            in_channels: 1,
            input_size: 28,
            n_blocks: 3,
            base_channels: 8,
            kernel_size: 3,
            pool_layers: 3,
            n_classes: 10,
        }
    }

    /// The reference `cifar_baseline` host: 3x32x32, channels 8/16/32, kernel
    /// 3, pooling everywhere, 10 classes (6,418 parameters).
    pub fn cifar_baseline() -> CnnHostConfig {
        CnnHostConfig {
            in_channels: 3,
            input_size: 32,
            ..CnnHostConfig::fashion_mnist()
        }
    }

    /// Checks every field: `in_channels` and `base_channels` in
    /// `[1, MAX_CHANNELS]`, `input_size` in `[1, MAX_SPATIAL]`, `n_blocks` in
    /// `[2, MAX_LAYERS]` with the last block's `base 2^(n-1)` channels at most
    /// `MAX_CHANNELS`, `pool_layers <= n_blocks` with at least one pixel left
    /// after the pools, `kernel_size` odd in `[1, MAX_KERNEL_SIZE]`,
    /// `n_classes` in `[1, MAX_CLASSES]`, and at most `MAX_PARAMETERS`
    /// parameters in all. Returns the parameter count.
    pub fn validate(&self) -> Result<i64> {
        size_in(
            "CnnHostConfig.in_channels",
            self.in_channels,
            1,
            MAX_CHANNELS,
        )?;
        size_in(
            "CnnHostConfig.base_channels",
            self.base_channels,
            1,
            MAX_CHANNELS,
        )?;
        size_in("CnnHostConfig.input_size", self.input_size, 1, MAX_SPATIAL)?;
        size_in("CnnHostConfig.n_blocks", self.n_blocks, 2, MAX_LAYERS)?;
        size_in(
            "CnnHostConfig.pool_layers",
            self.pool_layers,
            0,
            self.n_blocks,
        )?;
        size_in(
            "CnnHostConfig.kernel_size",
            self.kernel_size,
            1,
            MAX_KERNEL_SIZE,
        )?;
        if self.kernel_size % 2 == 0 {
            return Err(Error::OutOfRange {
                field: "CnnHostConfig.kernel_size",
                value: self.kernel_size.to_string(),
                allowed: format!("odd values in [1, {MAX_KERNEL_SIZE}]"),
            });
        }
        size_in("CnnHostConfig.n_classes", self.n_classes, 1, MAX_CLASSES)?;
        let last = self.block_channels(self.n_blocks.saturating_sub(1))?;
        size_in("CnnHostConfig (last block channels)", last, 1, MAX_CHANNELS)?;
        let remaining = u32::try_from(self.pool_layers)
            .ok()
            .and_then(|pools| self.input_size.checked_shr(pools))
            .unwrap_or(0);
        if remaining < 1 {
            return Err(Error::OutOfRange {
                field: "CnnHostConfig.pool_layers",
                value: self.pool_layers.to_string(),
                allowed: format!("at most log2(input_size = {}) pools", self.input_size),
            });
        }
        let k = self.kernel_size;
        let mut counts = Vec::new();
        let mut in_channels = self.in_channels;
        for block in 0..self.n_blocks {
            let out = self.block_channels(block)?;
            let field = "CnnHostConfig (conv parameters)";
            counts.push(checked_product(
                field,
                &[in_channels, out, k, k],
                MAX_PARAMETERS,
            )?);
            counts.push(checked_product(field, &[2, out], MAX_PARAMETERS)?);
            in_channels = out;
        }
        let field = "CnnHostConfig (classifier parameters)";
        counts.push(checked_product(
            field,
            &[in_channels, self.n_classes],
            MAX_PARAMETERS,
        )?);
        counts.push(self.n_classes);
        checked_sum("CnnHostConfig (parameters)", &counts, MAX_PARAMETERS)
    }

    /// Channels of block `i`, `base * 2^i` (an error where that overflows).
    pub fn block_channels(&self, block: usize) -> Result<i64> {
        u32::try_from(block)
            .ok()
            .filter(|&shift| shift < 62)
            .and_then(|shift| self.base_channels.checked_mul(1i64 << shift))
            .ok_or_else(|| Error::OutOfRange {
                field: "CnnHostConfig.block_channels",
                value: format!("base {} * 2^{block}", self.base_channels),
                allowed: "a product that fits i64".to_owned(),
            })
    }
}

#[derive(Debug)]
struct ConvBlock {
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl ConvBlock {
    /// Conv, then batch norm, ReLU and the 2x2 max-pool as one node.
    fn forward_pooled(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.bn.forward_relu_pool(&self.conv.forward(x)?, train) // [B, C_i, H/2, W/2]
    }
}

#[derive(Debug)]
enum Segment {
    Block(usize),
    Pool,
    Head,
}

/// A CNN host built from a [`CnnHostConfig`].
#[derive(Debug)]
pub struct CnnHost {
    config: CnnHostConfig,
    var_store: nn::VarStore,
    blocks: Vec<ConvBlock>,
    classifier: Linear,
    segments: Vec<Segment>,
    /// Expected activation shape at each boundary (`-1` = any batch).
    boundary_shapes: Vec<Vec<i64>>,
    specs: Vec<InjectionSpec>,
    name: String,
}

impl CnnHost {
    /// Builds the host on `device` (parameters from tch's global generator)
    /// once [`CnnHostConfig::validate`] accepts the configuration.
    pub fn new(config: CnnHostConfig, device: Device) -> Result<CnnHost> {
        config.validate()?;
        let var_store = nn::VarStore::new(device);
        let root = var_store.root();
        let mut blocks = Vec::with_capacity(config.n_blocks);
        let mut in_channels = config.in_channels;
        for block in 0..config.n_blocks {
            let out_channels = config.block_channels(block)?;
            let path = root.sub(format!("block{block}"));
            blocks.push(ConvBlock {
                conv: Conv2d::new(
                    &path.sub("conv"),
                    in_channels,
                    out_channels,
                    config.kernel_size,
                    1,
                    false,
                )?,
                bn: BatchNorm2d::new(&path.sub("bn"), out_channels)?,
            });
            in_channels = out_channels;
        }
        let classifier = Linear::new(&root.sub("classifier"), in_channels, config.n_classes, true)?;

        let mut segments = Vec::new();
        let mut specs = Vec::new();
        let mut size = config.input_size;
        let mut boundary_shapes = vec![vec![-1, config.in_channels, size, size]];
        for block in 0..config.n_blocks {
            let channels = config.block_channels(block)?;
            segments.push(Segment::Block(block));
            boundary_shapes.push(vec![-1, channels, size, size]);
            specs.push(InjectionSpec {
                slot_id: SlotId::new(0, block as u32),
                channels,
                spatial: (size, size),
                surface: Surface::PrePool,
                order: block,
                boundary: segments.len(),
            });
            if block < config.pool_layers {
                segments.push(Segment::Pool);
                size /= 2;
                boundary_shapes.push(vec![-1, channels, size, size]);
                specs.push(InjectionSpec {
                    slot_id: SlotId::new(1, block as u32),
                    channels,
                    spatial: (size, size),
                    surface: Surface::PostPool,
                    // n_blocks <= MAX_LAYERS (validated): no overflow.
                    order: config.n_blocks.saturating_add(block),
                    boundary: segments.len(),
                });
            }
        }
        segments.push(Segment::Head);
        boundary_shapes.push(vec![-1, config.n_classes]);
        let name = format!("cnn-{}x{}", config.n_blocks, config.base_channels);
        drop(root);
        Ok(CnnHost {
            config,
            var_store,
            blocks,
            classifier,
            segments,
            boundary_shapes,
            specs,
            name,
        })
    }

    /// The configuration the host was built from.
    pub fn config(&self) -> &CnnHostConfig {
        &self.config
    }

    /// Number of trainable parameters.
    pub fn param_count(&self) -> i64 {
        crate::validate::element_count(&self.var_store.trainable_variables())
    }

    fn block(&self, index: usize) -> Result<&ConvBlock> {
        self.blocks.get(index).ok_or(Error::InvalidConfig {
            reason: format!("cnn host has no block {index}"),
        })
    }

    fn run_segment(&self, segment: &Segment, x: &Tensor, train: bool) -> Result<Tensor> {
        Ok(match segment {
            Segment::Block(index) => {
                let block = self.block(*index)?;
                block.bn.forward_relu(&block.conv.forward(x)?, train)? // [B, C_i, H, W]
            }
            Segment::Pool => torch_ext::nn::max_pool2x2(x)?, // [B, C, H/2, W/2]
            // The channel means through the classifier, fused on CUDA.
            Segment::Head => self.classifier.forward_pooled(x)?, // [B, classes]
        })
    }
}

impl Host for CnnHost {
    fn name(&self) -> &str {
        &self.name
    }

    fn topology(&self) -> Topology {
        Topology::Cnn
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.var_store
    }

    fn injection_specs(&self) -> &[InjectionSpec] {
        &self.specs
    }

    fn num_segments(&self) -> usize {
        self.segments.len()
    }

    fn input_shape(&self) -> Vec<i64> {
        vec![
            self.config.in_channels,
            self.config.input_size,
            self.config.input_size,
        ]
    }

    /// The segment after every PRE_POOL boundary is the block's pool.
    fn pools_after(&self, boundary: usize) -> bool {
        matches!(self.segments.get(boundary), Some(Segment::Pool))
    }

    /// # Shapes
    /// Boundary 0 is `[B, in_channels, S, S]`; a PRE_POOL boundary after block
    /// `i` is `[B, base 2^i, s, s]`, the POST_POOL one `[B, base 2^i, s/2, s/2]`;
    /// the last boundary is `[B, n_classes]`.
    fn forward_segment(&self, x: &Tensor, from: usize, to: usize, train: bool) -> Result<Tensor> {
        check_boundaries(self, from, to)?;
        let expected = self
            .boundary_shapes
            .get(from)
            .map_or(&[][..], Vec::as_slice);
        shape(
            "cnn host (activation at the start boundary)",
            &x.size(),
            expected,
        )?;
        let mut activation = x.shallow_clone();
        let mut segments = self
            .segments
            .get(from..to)
            .unwrap_or_default()
            .iter()
            .peekable();
        while let Some(segment) = segments.next() {
            // A block whose pool runs in the same range (no seed between
            // them) takes its normalisation, ReLU and pool as one node.
            if let (Segment::Block(index), Some(Segment::Pool)) = (segment, segments.peek()) {
                let _pool = segments.next();
                activation = self.block(*index)?.forward_pooled(&activation, train)?;
                continue;
            }
            activation = self.run_segment(segment, &activation, train)?;
        }
        Ok(activation)
    }
}
