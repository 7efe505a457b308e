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

use tch::{Device, Tensor, nn};

use super::{Host, InjectionSpec, SlotId, Surface, Topology, check_boundaries};
use crate::layers::{BatchNorm2d, Conv2d, Linear};
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
    pub num_classes: i64,
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
            num_classes: 10,
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

    fn validate(&self) -> Result<()> {
        let problem = if self.n_blocks < 2 {
            Some(format!("n_blocks must be >= 2, got {}", self.n_blocks))
        } else if self.pool_layers > self.n_blocks {
            Some(format!(
                "pool_layers {} exceeds n_blocks {}",
                self.pool_layers, self.n_blocks
            ))
        } else if self.kernel_size < 1 || self.kernel_size % 2 == 0 {
            Some(format!(
                "kernel_size must be odd and >= 1, got {}",
                self.kernel_size
            ))
        } else if self.base_channels < 1 || self.in_channels < 1 || self.num_classes < 1 {
            Some("channels and classes must be >= 1".to_owned())
        } else if self.input_size >> self.pool_layers < 1 {
            Some(format!(
                "input size {} is too small for {} pools",
                self.input_size, self.pool_layers
            ))
        } else {
            None
        };
        match problem {
            Some(reason) => Err(Error::InvalidConfig { reason }),
            None => Ok(()),
        }
    }

    /// Channels of block `i`.
    pub fn block_channels(&self, block: usize) -> i64 {
        self.base_channels << block
    }
}

#[derive(Debug)]
struct ConvBlock {
    conv: Conv2d,
    bn: BatchNorm2d,
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
    specs: Vec<InjectionSpec>,
    name: String,
}

impl CnnHost {
    /// Builds the host on `device` (parameters from tch's global generator).
    pub fn new(config: CnnHostConfig, device: Device) -> Result<CnnHost> {
        config.validate()?;
        let var_store = nn::VarStore::new(device);
        let root = var_store.root();
        let mut blocks = Vec::with_capacity(config.n_blocks);
        let mut in_channels = config.in_channels;
        for block in 0..config.n_blocks {
            let out_channels = config.block_channels(block);
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
        let classifier = Linear::new(
            &root.sub("classifier"),
            in_channels,
            config.num_classes,
            true,
        )?;

        let mut segments = Vec::new();
        let mut specs = Vec::new();
        let mut size = config.input_size;
        for block in 0..config.n_blocks {
            let channels = config.block_channels(block);
            segments.push(Segment::Block(block));
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
                specs.push(InjectionSpec {
                    slot_id: SlotId::new(1, block as u32),
                    channels,
                    spatial: (size, size),
                    surface: Surface::PostPool,
                    order: config.n_blocks + block,
                    boundary: segments.len(),
                });
            }
        }
        segments.push(Segment::Head);
        let name = format!("cnn-{}x{}", config.n_blocks, config.base_channels);
        drop(root);
        Ok(CnnHost {
            config,
            var_store,
            blocks,
            classifier,
            segments,
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
        self.var_store
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum()
    }

    fn run_segment(&self, segment: &Segment, x: &Tensor, train: bool) -> Result<Tensor> {
        Ok(match segment {
            Segment::Block(index) => {
                let block = &self.blocks[*index];
                block.bn.forward(&block.conv.forward(x)?, train)?.f_relu()? // [B, C_i, H, W]
            }
            Segment::Pool => x.f_max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false)?, // [B, C, H/2, W/2]
            Segment::Head => {
                let pooled = x.f_mean_dim([2i64, 3].as_slice(), false, None)?; // [B, C_last]
                self.classifier.forward(&pooled)? // [B, classes]
            }
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

    /// # Shapes
    /// Boundary 0 is `[B, in_channels, S, S]`; a PRE_POOL boundary after block
    /// `i` is `[B, base 2^i, s, s]`, the POST_POOL one `[B, base 2^i, s/2, s/2]`;
    /// the last boundary is `[B, num_classes]`.
    fn forward_segment(&self, x: &Tensor, from: usize, to: usize, train: bool) -> Result<Tensor> {
        check_boundaries(self, from, to)?;
        if from == 0 {
            let expected = self.input_shape();
            let size = x.size();
            if size.len() != 4 || size[1..] != expected[..] {
                return Err(Error::ShapeMismatch {
                    op: "cnn host input",
                    expected: [vec![-1], expected].concat(),
                    got: size,
                });
            }
        }
        let mut activation = x.shallow_clone();
        for segment in &self.segments[from..to] {
            activation = self.run_segment(segment, &activation, train)?;
        }
        Ok(activation)
    }
}
