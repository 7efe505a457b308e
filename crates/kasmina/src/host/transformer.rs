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

use tch::{Device, Kind, Tensor, nn};

use super::{Host, InjectionSpec, SlotId, Surface, Topology, check_boundaries};
use crate::layers::{LayerNorm, Linear, causal_self_attention};
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
    /// token embedding).
    pub fn param_count(&self) -> i64 {
        let c = self.n_embd;
        let per_layer = 2 * (2 * c) + (4 * c * c + 4 * c) + (8 * c * c + 5 * c);
        self.vocab_size * c + self.block_size * c + self.n_layer as i64 * per_layer + 2 * c
    }

    fn validate(&self) -> Result<()> {
        let problem = if self.n_head < 1 || self.n_embd % self.n_head != 0 {
            Some(format!(
                "n_embd {} is not divisible by n_head {}",
                self.n_embd, self.n_head
            ))
        } else if self.num_segments == 0 || !self.n_layer.is_multiple_of(self.num_segments) {
            Some(format!(
                "n_layer {} is not a multiple of num_segments {}",
                self.n_layer, self.num_segments
            ))
        } else if self.vocab_size < 1 || self.block_size < 1 {
            Some("vocab_size and block_size must be >= 1".to_owned())
        } else {
            None
        };
        match problem {
            Some(reason) => Err(Error::InvalidConfig { reason }),
            None => Ok(()),
        }
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
    fn forward(&self, x: &Tensor, heads: i64) -> Result<Tensor> {
        let attended = causal_self_attention(
            &self.attention_norm.forward(x)?,
            &self.qkv,
            &self.attention_proj,
            heads,
        )?;
        let x = x.f_add(&attended)?;
        let hidden = self
            .mlp_in
            .forward(&self.mlp_norm.forward(&x)?)?
            .f_gelu("none")?;
        Ok(x.f_add(&self.mlp_out.forward(&hidden)?)?)
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
        let per_segment = config.n_layer / config.num_segments;
        let mut segments = vec![Segment::Embed];
        let mut specs = Vec::with_capacity(config.num_segments);
        for group in 0..config.num_segments {
            segments.push(Segment::Layers(
                group * per_segment..(group + 1) * per_segment,
            ));
            specs.push(InjectionSpec {
                slot_id: SlotId::new(0, group as u32),
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
        self.var_store
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum()
    }

    fn run_segment(&self, segment: &Segment, x: &Tensor) -> Result<Tensor> {
        Ok(match segment {
            Segment::Embed => {
                let (_, time) = x.size2()?;
                let tokens = Tensor::f_embedding(&self.token_embedding, x, -1, false, false)?; // [B, T, C]
                let positions = self.position_embedding.f_narrow(0, 0, time)?; // [T, C]
                tokens.f_add(&positions)?
            }
            Segment::Layers(range) => {
                let mut hidden = x.shallow_clone();
                for block in &self.blocks[range.clone()] {
                    hidden = block.forward(&hidden, self.config.n_head)?;
                }
                hidden
            }
            Segment::Head => {
                let normed = self.final_norm.forward(x)?; // [B, T, C]
                normed.f_matmul(&self.token_embedding.f_transpose(0, 1)?)? // [B, T, vocab]
            }
        })
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
        if from == 0 && to > 0 {
            let size = x.size();
            let integer = matches!(x.kind(), Kind::Int64 | Kind::Int);
            if size.len() != 2 || size[1] > self.config.block_size || size[1] < 1 || !integer {
                return Err(Error::ShapeMismatch {
                    op: "transformer host input (int64 token ids)",
                    expected: vec![-1, self.config.block_size],
                    got: size,
                });
            }
        }
        let mut activation = x.shallow_clone();
        for segment in &self.segments[from..to] {
            activation = self.run_segment(segment, &activation)?;
        }
        Ok(activation)
    }
}
