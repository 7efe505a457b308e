//! The forward passes of [`PolicyNetwork`]: one step for a batch, a `T`-step
//! unroll, and the trunk and heads they share (see the parent module's docs).

use tch::{Device, Kind, Tensor};

use super::{
    LstmState, PolicyNetwork, PolicyOutput, PolicyPrecision, as_i64, cpu_bf16_lstm_supported,
};
use crate::error::{TorchResultExt, shape_mismatch};
use crate::features::NUM_BLUEPRINTS;
use crate::finite::check_finite_on_host;
use crate::heads::head_sizes;
use crate::masks::MaskTensors;
use crate::policy::layers::to_f32;
use crate::policy::sampling;
use crate::{Error, Result};
use leyline::NUM_ACTION_HEADS;

impl PolicyNetwork {
    fn check_hidden(&self, hidden: &LstmState, batch: i64) -> Result<()> {
        let shape = [
            as_i64(self.config.lstm_layers),
            batch,
            self.config.hidden_dim,
        ];
        self.check("forward.hidden.h", &hidden.h, &shape, Kind::Float)?;
        self.check("forward.hidden.c", &hidden.c, &shape, Kind::Float)?;
        check_finite_on_host("forward.hidden.h", &hidden.h)?;
        check_finite_on_host("forward.hidden.c", &hidden.c)
    }

    /// Whether this forward's LSTM layers must run in full precision: on the
    /// CPU, under bf16 (the policy's precision or a caller's CPU autocast
    /// region) where oneDNN has no bf16 LSTM, or under a caller's fp16 CPU
    /// autocast region (see the module docs).
    fn lstm_full_precision(&self) -> Result<bool> {
        if self.device != Device::Cpu {
            return Ok(false);
        }
        let outer =
            torch_ext::autocast_state(torch_ext::AutocastDevice::Cpu).map_err(|source| {
                Error::Device {
                    op: "autocast state",
                    source,
                }
            })?;
        if outer.enabled && outer.dtype == Kind::Half {
            return Ok(true);
        }
        let bf16 = self.precision == PolicyPrecision::Bf16 || outer.enabled;
        Ok(bf16 && !cpu_bf16_lstm_supported())
    }

    /// One step for a batch (see the module docs), with the base `masks`
    /// applied to a copy of the logits.
    ///
    /// # Shapes
    /// `obs [B, obs_dim]` f32, `blueprint_indices [B, num_slots]` i64,
    /// `hidden [layers, B, hidden]` ×2 → logits `[B, n_head]` per head,
    /// value `[B]`, hidden `[layers, B, hidden]`.
    pub fn forward(
        &self,
        obs: &Tensor,
        blueprint_indices: &Tensor,
        hidden: &LstmState,
        masks: &MaskTensors,
    ) -> Result<PolicyOutput> {
        let mut output = self.step(obs, blueprint_indices, hidden, masks)?;
        output.masked_logits = Some(sampling::mask_all(&output.logits, &masks.heads)?);
        Ok(output)
    }

    /// [`PolicyNetwork::forward`] without the masked copy of the logits
    /// (`masked_logits` is `None`): what acting needs, since the sampler
    /// masks the logits itself.
    pub fn step(
        &self,
        obs: &Tensor,
        blueprint_indices: &Tensor,
        hidden: &LstmState,
        masks: &MaskTensors,
    ) -> Result<PolicyOutput> {
        let batch = obs.size().first().copied().unwrap_or(0);
        if batch < 1 {
            return Err(shape_mismatch(
                "forward.obs",
                "[B >= 1, obs_dim]",
                obs.size(),
            ));
        }
        let slots = as_i64(self.config.num_slots);
        self.check("forward.obs", obs, &[batch, self.obs_dim], Kind::Float)?;
        self.check(
            "forward.blueprint_indices",
            blueprint_indices,
            &[batch, slots],
            Kind::Int64,
        )?;
        self.check_hidden(hidden, batch)?;
        masks.check(batch, self.config.num_slots, self.device)?;
        check_finite_on_host("forward.obs", obs)?;
        let full_precision_lstm = self.lstm_full_precision()?;
        let _autocast = self.autocast()?;
        let obs = obs.f_unsqueeze(1).op("forward unsqueeze")?;
        let blueprints = blueprint_indices.f_unsqueeze(1).op("forward unsqueeze")?;
        let (lstm_out, hidden) = self.core(&obs, &blueprints, hidden, full_precision_lstm)?;
        let lstm_out = lstm_out.f_squeeze_dim(1).op("forward squeeze")?;
        let (logits, value) = self.outputs(&lstm_out)?;
        Ok(PolicyOutput {
            logits,
            masked_logits: None,
            value,
            hidden,
            features: None,
        })
    }

    /// `T` steps for a batch from `hidden` (the PPO update's unroll); no
    /// masks.
    ///
    /// # Shapes
    /// `obs [B, T, obs_dim]`, `blueprint_indices [B, T, num_slots]` →
    /// logits `[B, T, n_head]`, value `[B, T]`.
    pub fn forward_sequence(
        &self,
        obs: &Tensor,
        blueprint_indices: &Tensor,
        hidden: &LstmState,
    ) -> Result<PolicyOutput> {
        let size = obs.size();
        let (batch, steps) = match size.as_slice() {
            [batch, steps, _] if *batch >= 1 && *steps >= 1 => (*batch, *steps),
            _ => {
                return Err(shape_mismatch(
                    "forward_sequence.obs",
                    "[B >= 1, T >= 1, obs_dim]",
                    size,
                ));
            }
        };
        let slots = as_i64(self.config.num_slots);
        self.check(
            "forward_sequence.obs",
            obs,
            &[batch, steps, self.obs_dim],
            Kind::Float,
        )?;
        self.check(
            "forward_sequence.blueprint_indices",
            blueprint_indices,
            &[batch, steps, slots],
            Kind::Int64,
        )?;
        self.check_hidden(hidden, batch)?;
        check_finite_on_host("forward_sequence.obs", obs)?;
        let full_precision_lstm = self.lstm_full_precision()?;
        let _autocast = self.autocast()?;
        let (lstm_out, hidden) = self.core(obs, blueprint_indices, hidden, full_precision_lstm)?;
        let (logits, value) = self.outputs(&lstm_out)?;
        Ok(PolicyOutput {
            logits,
            masked_logits: None,
            value,
            hidden,
            features: Some(lstm_out),
        })
    }

    /// Embedding, feature net and residual LSTM on `[B, T, ...]` inputs
    /// (the LSTM layers in full precision when `full_precision_lstm`).
    fn core(
        &self,
        obs: &Tensor,
        blueprint_indices: &Tensor,
        hidden: &LstmState,
        full_precision_lstm: bool,
    ) -> Result<(Tensor, LstmState)> {
        let null = as_i64(NUM_BLUEPRINTS);
        let valid = blueprint_indices
            .f_ge(0)
            .op("blueprint valid")?
            .f_logical_and(&blueprint_indices.f_lt(null).op("blueprint valid")?)
            .op("blueprint valid")?;
        let null_index = Tensor::f_full([], null, (Kind::Int64, self.device)).op("null index")?;
        let safe = blueprint_indices
            .f_where_self(&valid, &null_index)
            .op("blueprint index")?;
        let embedded = Tensor::f_embedding(&self.embedding, &safe, -1, false, false)
            .op("blueprint embedding")?
            .f_flatten(2, -1)
            .op("blueprint embedding flatten")?;
        let x = Tensor::f_cat(&[obs, &embedded], -1).op("feature input")?;
        let x = self.feature.forward(&x)?;
        let x = self.feature_norm.forward(&x)?.f_relu().op("feature relu")?;
        let mut x = match &self.input_proj {
            Some(projection) => projection.forward(&x)?,
            None => x,
        };
        let mut hs = Vec::with_capacity(self.lstm.len());
        let mut cs = Vec::with_capacity(self.lstm.len());
        for (layer, (lstm, norm)) in self.lstm.iter().enumerate() {
            let layer = as_i64(layer);
            let h = hidden.h.f_narrow(0, layer, 1).op("lstm state h")?;
            let c = hidden.c.f_narrow(0, layer, 1).op("lstm state c")?;
            let [output, h, c] = if full_precision_lstm {
                lstm.forward_full_precision(&x, &h, &c)?
            } else {
                lstm.forward(&x, &h, &c)?
            };
            x = norm.forward(&output)?.f_add(&x).op("lstm residual")?;
            hs.push(h);
            cs.push(c);
        }
        let hidden = LstmState {
            h: to_f32(&Tensor::f_cat(&hs, 0).op("lstm state")?)?,
            c: to_f32(&Tensor::f_cat(&cs, 0).op("lstm state")?)?,
        };
        Ok((x, hidden))
    }

    /// Logits per head and the value from the LSTM output `[..., hidden]`.
    ///
    /// The heads run together, not one by one: their first layers as one
    /// matrix product over the concatenated weights, the blueprint head's
    /// middle layer, then every head's output layer as one product of each
    /// head's hidden slice with all output weights, of which a gather keeps
    /// each head's own block. The result is one packed `[..., sum of head
    /// sizes]` tensor whose per-head views are the logits. The arithmetic is
    /// each head's MLP; it takes a dozen kernels instead of thirty.
    fn outputs(&self, lstm_out: &Tensor) -> Result<([Tensor; NUM_ACTION_HEADS], Tensor)> {
        let packed = to_f32(&self.packed_logits(lstm_out)?)?;
        let mut logits = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut offset = 0_i64;
        for size in head_sizes(self.config.num_slots) {
            let size = as_i64(size);
            logits.push(packed.f_narrow(-1, offset, size).op("head logits")?);
            offset = offset.saturating_add(size);
        }
        let logits: [Tensor; NUM_ACTION_HEADS] = logits
            .try_into()
            .map_err(|_| shape_mismatch("policy heads", NUM_ACTION_HEADS, "another count"))?;
        let value = to_f32(
            &self
                .critic
                .forward(lstm_out)?
                .f_squeeze_dim(-1)
                .op("value squeeze")?,
        )?;
        Ok((logits, value))
    }
}
