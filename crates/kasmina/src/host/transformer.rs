//! A small GPT-style transformer host (`TransformerHost` of the reference).
//!
//! Token and position embeddings; `n_layer` pre-norm blocks (LayerNorm ->
//! causal multi-head self-attention -> residual, LayerNorm -> MLP 4x with
//! GELU -> residual); a final LayerNorm and an LM head tied to the token
//! embedding. No dropout (the reference trains with 0.1; this host is for
//! lifecycle work and tests, where it would only add noise).
//!
//! Boundaries: 0 = token ids `[B, T]`, 1 = embeddings `[B, T, C]`, then one
//! per group of `n_layer / num_segments` layers, then the logits
//! `[B, T, vocab]`. Slots `r0c{g}` sit after group `g` (after layers 2/4/6
//! for the reference's 6 layers and 3 segments), all with `C` channels.
//!
//! [`TransformerHostConfig::validate`] bounds every size (see
//! [`crate::validate`]) before anything is allocated, and
//! [`Host::forward_segment`] checks the activation's shape at its starting
//! boundary. Token ids are not range-checked on the device (that would be a
//! readback): an id outside `[0, vocab)` is a libtorch error on CPU and a
//! device-side assert on CUDA, so data sets must be validated when loaded.

#![warn(clippy::arithmetic_side_effects)]

use tch::{Device, Kind, Tensor, nn};

use super::{Host, InjectionSpec, SlotId, Surface, Topology, check_boundaries};
use crate::layers::{LayerNorm, Linear, causal_self_attention};
use crate::validate::{
    MAX_CHANNELS, MAX_CLASSES, MAX_LAYERS, MAX_PARAMETERS, MAX_SPATIAL, size_in,
};
use crate::{Error, Result};

/// Standard deviation of the embedding initialisation (GPT-2).
pub const EMBEDDING_INIT_STD: f64 = 0.02;

/// Shape of a transformer host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransformerHostConfig {
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Model width `C`.
    pub n_embd: i64,
    /// Attention heads (divides `n_embd`).
    pub n_head: i64,
    /// Transformer blocks (a multiple of `num_segments`).
    pub n_layer: usize,
    /// Longest sequence.
    pub block_size: i64,
    /// Layer groups; one slot after each.
    pub num_segments: usize,
}

impl TransformerHostConfig {
    /// The reference TinyStories host: vocab 50257, width 384, 6 heads, 6
    /// layers, block 256, 3 segments (30,044,544 parameters).
    pub fn reference() -> TransformerHostConfig {
        TransformerHostConfig {
            vocab_size: 50257,
            n_embd: 384,
            n_head: 6,
            n_layer: 6,
            block_size: 256,
            num_segments: 3,
        }
    }

    /// A tiny host for tests: vocab 97, width 32, 4 heads, 3 layers, block 16.
    pub fn tiny() -> TransformerHostConfig {
        TransformerHostConfig {
            vocab_size: 97,
            n_embd: 32,
            n_head: 4,
            n_layer: 3,
            block_size: 16,
            num_segments: 3,
        }
    }

    /// Trainable parameters of a host of this shape (head tied to the
    /// token embedding); an error where the count overflows `i64`.
    pub fn param_count(&self) -> Result<i64> {
        let overflow = || Error::OutOfRange {
            field: "TransformerHostConfig (parameters)",
            value: format!("{self:?}"),
            allowed: "a parameter count that fits i64".to_owned(),
        };
        let c = self.n_embd;
        let layers = i64::try_from(self.n_layer).map_err(|_| overflow())?;
        let count = (|| {
            let c2 = c.checked_mul(c)?;
            // 2 LayerNorms (4C), qkv + attention projection (4C^2 + 4C),
            // MLP 4x (8C^2 + 5C).
            let per_layer = c2.checked_mul(12)?.checked_add(c.checked_mul(13)?)?;
            self.vocab_size
                .checked_mul(c)?
                .checked_add(self.block_size.checked_mul(c)?)?
                .checked_add(layers.checked_mul(per_layer)?)?
                .checked_add(c.checked_mul(2)?)
        })();
        count.ok_or_else(overflow)
    }

    /// Checks every field: `vocab_size` in `[1, MAX_CLASSES]`, `n_embd` in
    /// `[1, MAX_CHANNELS]`, `n_head` in `[1, n_embd]` dividing `n_embd`,
    /// `n_layer` in `[1, MAX_LAYERS]`, `num_segments` in `[1, n_layer]`
    /// dividing `n_layer`, `block_size` in `[1, MAX_SPATIAL]`, and at most
    /// `MAX_PARAMETERS` parameters. Returns the parameter count.
    pub fn validate(&self) -> Result<i64> {
        size_in(
            "TransformerHostConfig.vocab_size",
            self.vocab_size,
            1,
            MAX_CLASSES,
        )?;
        size_in("TransformerHostConfig.n_embd", self.n_embd, 1, MAX_CHANNELS)?;
        size_in("TransformerHostConfig.n_head", self.n_head, 1, self.n_embd)?;
        size_in("TransformerHostConfig.n_layer", self.n_layer, 1, MAX_LAYERS)?;
        size_in(
            "TransformerHostConfig.num_segments",
            self.num_segments,
            1,
            self.n_layer,
        )?;
        size_in(
            "TransformerHostConfig.block_size",
            self.block_size,
            1,
            MAX_SPATIAL,
        )?;
        if self.n_embd.checked_rem(self.n_head) != Some(0) {
            return Err(Error::OutOfRange {
                field: "TransformerHostConfig.n_head",
                value: self.n_head.to_string(),
                allowed: format!("divisors of n_embd = {}", self.n_embd),
            });
        }
        if !self.n_layer.is_multiple_of(self.num_segments) {
            return Err(Error::OutOfRange {
                field: "TransformerHostConfig.num_segments",
                value: self.num_segments.to_string(),
                allowed: format!("divisors of n_layer = {}", self.n_layer),
            });
        }
        size_in(
            "TransformerHostConfig (parameters)",
            self.param_count()?,
            0,
            MAX_PARAMETERS,
        )
    }
}

#[derive(Debug)]
struct Block {
    attention_norm: LayerNorm,
    qkv: Linear,
    attention_proj: Linear,
    mlp_norm: LayerNorm,
    mlp_in: Linear,
    mlp_out: Linear,
}

impl Block {
    #[expect(
        clippy::arithmetic_side_effects,
        reason = "width = n_embd <= MAX_CHANNELS (validated), so 4 width cannot overflow"
    )]
    fn new(path: &nn::Path<'_>, width: i64) -> Result<Block> {
        Ok(Block {
            attention_norm: LayerNorm::new(&path.sub("ln1"), width)?,
            qkv: Linear::new(&path.sub("qkv"), width, 3 * width, true)?,
            attention_proj: Linear::new(&path.sub("attn_proj"), width, width, true)?,
            mlp_norm: LayerNorm::new(&path.sub("ln2"), width)?,
            mlp_in: Linear::new(&path.sub("fc"), width, 4 * width, true)?,
            mlp_out: Linear::new(&path.sub("mlp_proj"), 4 * width, width, true)?,
        })
    }

    /// `[B, T, C] -> [B, T, C]`.
    /// The layer norms fork the residual stream (`LayerNorm::fork_into_linear`),
    /// so each adds the stream's gradient in its own backward kernel.
    fn forward(&self, x: &Tensor, heads: i64) -> Result<Tensor> {
        let (stream, normed) = self.attention_norm.fork_into_linear(x)?;
        let attended = causal_self_attention(&normed, &self.qkv, &self.attention_proj, heads)?;
        let x = stream.f_add(&attended)?;
        let (stream, normed) = self.mlp_norm.fork_into_linear(&x)?;
        let hidden = self.mlp_in.forward(&normed)?.f_gelu("none")?;
        Ok(stream.f_add(&self.mlp_out.forward(&hidden)?)?)
    }
}

#[derive(Debug)]
enum Segment {
    Embed,
    Layers(std::ops::Range<usize>),
    Head,
}

/// A transformer host built from a [`TransformerHostConfig`].
#[derive(Debug)]
pub struct TransformerHost {
    config: TransformerHostConfig,
    var_store: nn::VarStore,
    token_embedding: Tensor,
    position_embedding: Tensor,
    blocks: Vec<Block>,
    final_norm: LayerNorm,
    segments: Vec<Segment>,
    specs: Vec<InjectionSpec>,
    name: String,
}

impl TransformerHost {
    /// Builds the host on `device` (parameters from tch's global generator).
    pub fn new(config: TransformerHostConfig, device: Device) -> Result<TransformerHost> {
        config.validate()?;
        let var_store = nn::VarStore::new(device);
        let root = var_store.root();
        let width = config.n_embd;
        let token_embedding = root.sub("wte").f_randn(
            "weight",
            &[config.vocab_size, width],
            0.0,
            EMBEDDING_INIT_STD,
        )?;
        let position_embedding = root.sub("wpe").f_randn(
            "weight",
            &[config.block_size, width],
            0.0,
            EMBEDDING_INIT_STD,
        )?;
        let blocks = (0..config.n_layer)
            .map(|layer| Block::new(&root.sub(format!("h{layer}")), width))
            .collect::<Result<Vec<_>>>()?;
        let final_norm = LayerNorm::new(&root.sub("ln_f"), width)?;
        let per_segment = config
            .n_layer
            .checked_div(config.num_segments)
            .unwrap_or(config.n_layer);
        let mut segments = vec![Segment::Embed];
        let mut specs = Vec::with_capacity(config.num_segments);
        let slot_col = |group: usize| {
            u32::try_from(group).map_err(|_| Error::OutOfRange {
                field: "TransformerHostConfig.num_segments",
                value: config.num_segments.to_string(),
                allowed: format!("[1, {MAX_LAYERS}]"),
            })
        };
        let firsts = (0..).step_by(per_segment.max(1));
        for (group, first) in (0..config.num_segments).zip(firsts) {
            // first + per_segment <= n_layer <= MAX_LAYERS (validated).
            segments.push(Segment::Layers(first..first.saturating_add(per_segment)));
            specs.push(InjectionSpec {
                slot_id: SlotId::new(0, slot_col(group)?),
                channels: width,
                spatial: (config.block_size, 1),
                surface: Surface::BlockEnd,
                order: group,
                boundary: segments.len(),
            });
        }
        segments.push(Segment::Head);
        let name = format!("transformer-{}x{}", config.n_layer, width);
        drop(root);
        Ok(TransformerHost {
            config,
            var_store,
            token_embedding,
            position_embedding,
            blocks,
            final_norm,
            segments,
            specs,
            name,
        })
    }

    /// The configuration the host was built from.
    pub fn config(&self) -> &TransformerHostConfig {
        &self.config
    }

    /// Number of trainable parameters.
    pub fn param_count(&self) -> i64 {
        crate::validate::element_count(&self.var_store.trainable_variables())
    }

    fn run_segment(&self, segment: &Segment, x: &Tensor) -> Result<Tensor> {
        Ok(match segment {
            Segment::Embed => {
                let (_, time) = x.size2()?;
                let tokens = torch_ext::nn::embedding(&self.token_embedding, x)?; // [B, T, C]
                let positions = self.position_embedding.f_narrow(0, 0, time)?; // [T, C]
                tokens.f_add(&positions)?
            }
            Segment::Layers(range) => {
                let mut hidden = x.shallow_clone();
                for block in self.blocks.get(range.clone()).unwrap_or_default() {
                    hidden = block.forward(&hidden, self.config.n_head)?;
                }
                hidden
            }
            Segment::Head => {
                // The head is tied to the token embedding: normed Eᵀ, as a
                // linear layer (its own backward on CUDA; the embedding's
                // bf16 shadow in a training step).
                let normed = self.final_norm.forward_into_linear(x)?; // [B, T, C]
                torch_ext::nn::linear(&normed, &self.token_embedding, None)? // [B, T, vocab]
            }
        })
    }
}

impl TransformerHost {
    /// The activation at `boundary`: int64/int32 token ids `[B, T]` at 0,
    /// `[B, T, C]` inside, `[B, T, vocab]` at the last, with
    /// `1 <= T <= block_size` (the error shows `block_size` for `T`).
    fn check_activation(&self, x: &Tensor, boundary: usize) -> Result<()> {
        let size = x.size();
        let config = &self.config;
        let longest = config.block_size;
        let (op, expected, token_ids) = if boundary == 0 {
            (
                "transformer host input (int64 token ids)",
                vec![-1, longest],
                true,
            )
        } else if boundary == self.segments.len() {
            (
                "transformer host logits",
                vec![-1, longest, config.vocab_size],
                false,
            )
        } else {
            (
                "transformer host hidden states",
                vec![-1, longest, config.n_embd],
                false,
            )
        };
        let time = size.get(1).copied().unwrap_or(0);
        let kind_fits = !token_ids || matches!(x.kind(), Kind::Int64 | Kind::Int);
        let fits = kind_fits
            && size.len() == expected.len()
            && (1..=longest).contains(&time)
            && size.iter().zip(&expected).skip(2).all(|(g, e)| g == e);
        if fits {
            Ok(())
        } else {
            Err(Error::ShapeMismatch {
                op,
                expected,
                got: size,
            })
        }
    }
}

impl Host for TransformerHost {
    fn name(&self) -> &str {
        &self.name
    }

    fn topology(&self) -> Topology {
        Topology::Transformer
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
        vec![self.config.block_size]
    }

    /// # Shapes
    /// Boundary 0 is token ids `[B, T]` (int64, `T <= block_size`); inner
    /// boundaries are `[B, T, C]`; the last is `[B, T, vocab]`.
    fn forward_segment(&self, x: &Tensor, from: usize, to: usize, _train: bool) -> Result<Tensor> {
        check_boundaries(self, from, to)?;
        self.check_activation(x, from)?;
        let mut activation = x.shallow_clone();
        for segment in self.segments.get(from..to).unwrap_or_default() {
            activation = self.run_segment(segment, &activation)?;
        }
        Ok(activation)
    }
}
