//! A seed slot's forward: the slot applied to host features at its
//! boundary ([`SeedSlot::forward`]), with a gradient tap and the host's
//! following 2x2 pool ([`SeedSlot::forward_tapped`]), and over replicated
//! copies for the counterfactual pass ([`SeedSlot::forward_replicated`]).
//! The blends themselves are [`crate::blend`]'s; shapes are checked by
//! `slot_checks` before libtorch sees them.

use leyline::AlphaAlgorithm;
use tch::Tensor;

use super::{LiveSeed, SeedSlot};
use crate::Result;
use crate::blend::{BlendAlpha, mix, mix_replicated, replicate_batch};
use crate::lifecycle::SeedState;
use crate::slot_checks;

impl SeedSlot {
    /// Applies the slot to host features at its boundary.
    ///
    /// `alpha_override` (`[N, 1, 1, 1]` on CNN slots, `[N, 1, 1]` on
    /// transformer slots, or anything broadcastable) replaces the
    /// controller's alpha per sample: counterfactual evaluation, or a static
    /// device tensor for a captured graph. It bypasses the incubator, which
    /// gives the same value at alpha 0 but no seed gradient: pass `None` for
    /// TRAINING seeds while training.
    ///
    /// # Shapes
    /// `[N, C, H, W] -> [N, C, H, W]` (CNN), `[N, T, C] -> [N, T, C]`
    /// (transformer).
    pub fn forward(&self, host: &Tensor, alpha_override: Option<&Tensor>) -> Result<Tensor> {
        self.forward_tapped(host, alpha_override, false)
            .map(|(output, _)| output)
    }

    /// [`SeedSlot::forward`] that can also return a *gradient tap*: with
    /// `tap` set and a live seed that sees the live (not detached) host
    /// features, the seed's input is a distinct view of `host` and is
    /// returned beside the output. The gradient of a loss with respect to
    /// that view is what flows into the host through this seed's branch
    /// alone (the trainer's gradient aggregation separates it from the
    /// host's own gradient with it). `None` for an isolated seed (its branch
    /// sends the host no gradient), an empty slot, or `tap == false`.
    pub fn forward_tapped(
        &self,
        host: &Tensor,
        alpha_override: Option<&Tensor>,
        tap: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.forward_tapped_then(host, alpha_override, tap, false)
    }

    /// [`SeedSlot::forward_tapped`], followed by the 2x2 max-pool
    /// ([`torch_ext::nn::max_pool2x2`]) of its output where `pool`: the
    /// model's walk asks for it where the host's next segment is that pool
    /// ([`crate::host::Host::pools_after`]), and a per-sample ADD blend then
    /// runs as one node with it ([`crate::blend::mix`]).
    pub(crate) fn forward_tapped_then(
        &self,
        host: &Tensor,
        alpha_override: Option<&Tensor>,
        tap: bool,
        pool: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        slot_checks::features(self.topology(), &self.spec, host)?;
        if let Some(tensor) = alpha_override {
            BlendAlpha::PerSample(tensor).check(host)?;
        }
        let pass_through = || -> Result<(Tensor, Option<Tensor>)> {
            let output = if pool {
                torch_ext::nn::max_pool2x2(host)?
            } else {
                host.shallow_clone()
            };
            Ok((output, None))
        };
        let (Some(state), Some(seed)) = (self.lifecycle.state(), &self.seed) else {
            return pass_through();
        };
        if !state.stage().is_active() {
            return pass_through();
        }
        let (seed_input, tap) = if state.isolate_gradients() {
            // Detached, layout kept: a channels-last host stays channels-last
            // (the reference's `.contiguous()` copy changes no value).
            (host.f_detach()?, None)
        } else if tap && host.requires_grad() {
            let view = host.f_view_as(host)?;
            (view.shallow_clone(), Some(view))
        } else {
            (host.shallow_clone(), None)
        };
        let output = self.blend(host, &seed_input, seed, state, alpha_override, pool)?;
        Ok((output, tap))
    }

    /// The blend of the seed's output into `host` (see [`SeedSlot::forward`]),
    /// 2x2 max-pooled where `pool`.
    fn blend(
        &self,
        host: &Tensor,
        seed_input: &Tensor,
        seed: &LiveSeed,
        state: &SeedState,
        alpha_override: Option<&Tensor>,
        pool: bool,
    ) -> Result<Tensor> {
        let seed_output = seed.module.forward(seed_input)?;
        let gate_values = match (state.algorithm(), &seed.gate) {
            (AlphaAlgorithm::Gate, Some(gate)) => Some(gate.forward(seed_input)?),
            _ => None,
        };
        mix(
            host,
            seed_input,
            &seed_output,
            gate_values.as_ref(),
            state,
            alpha_override,
            pool,
        )
    }

    /// [`SeedSlot::forward`] of `replicas` copies of `host` stacked along
    /// the batch (block `k` is copy `k`, as `Tensor::repeat` stacks them),
    /// each copy blended with its own rows of `alpha_override`
    /// (`[replicas·N, 1, …]`): the counterfactual pass's configurations of
    /// one chunk. The seed (and its gate) runs once, on `host`, where
    /// [`SeedSlot::forward`] on the replicated features would run it on
    /// every copy; an ADD or GATE blend reads `host` and the seed's output
    /// once per copy ([`torch_ext::nn::blend_lerp_replicated`]) instead of
    /// copying them first, a MULTIPLY blend blends copies. The values are
    /// those of that forward, as far as the seed's output for a sample does
    /// not depend on the rest of its batch (true in evaluation mode: a
    /// seed's normalisation is per sample). No gradient taps.
    ///
    /// # Shapes
    /// `[N, ...]` -> `[replicas·N, ...]`.
    pub fn forward_replicated(
        &self,
        host: &Tensor,
        replicas: i64,
        alpha_override: Option<&Tensor>,
    ) -> Result<Tensor> {
        slot_checks::features(self.topology(), &self.spec, host)?;
        let active = match (self.lifecycle.state(), &self.seed) {
            (Some(state), Some(seed)) if state.stage().is_active() => Some((state, seed)),
            _ => None,
        };
        let Some((state, seed)) = active else {
            let copies = replicate_batch(host, replicas)?;
            if let Some(tensor) = alpha_override {
                BlendAlpha::PerSample(tensor).check(&copies)?;
            }
            return Ok(copies);
        };
        let seed_input = if state.isolate_gradients() {
            host.f_detach()?
        } else {
            host.shallow_clone()
        };
        let seed_output = seed.module.forward(&seed_input)?;
        let gate_values = match (state.algorithm(), &seed.gate) {
            (AlphaAlgorithm::Gate, Some(gate)) => Some(gate.forward(&seed_input)?),
            _ => None,
        };
        // A lerp (ADD, GATE) blends the copies without making them.
        if let Some(blended) = mix_replicated(
            host,
            &seed_output,
            gate_values.as_ref(),
            state,
            alpha_override,
            replicas,
        )? {
            return Ok(blended);
        }
        let copies = replicate_batch(host, replicas)?;
        if let Some(tensor) = alpha_override {
            BlendAlpha::PerSample(tensor).check(&copies)?;
        }
        let seed_output = replicate_batch(&seed_output, replicas)?;
        let gate_values = gate_values
            .map(|gate| replicate_batch(&gate, replicas))
            .transpose()?;
        let seed_inputs = if state.isolate_gradients() {
            copies.f_detach()?
        } else {
            copies.shallow_clone()
        };
        mix(
            &copies,
            &seed_inputs,
            &seed_output,
            gate_values.as_ref(),
            state,
            alpha_override,
            false,
        )
    }
}
