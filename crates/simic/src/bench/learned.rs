//! A trained policy as the driver of a throughput workload
//! ([`super::Driver::Learned`]): `simic-growth` with its environments' actions
//! taken greedily by a policy that PPO (and the imitation warm-up) trained
//! elsewhere, read from a PPO checkpoint ([`crate::checkpoint::read_checkpoint`]).
//!
//! The policy's parameters and its observation normaliser are what drive;
//! the checkpoint's optimizer state, reward and value normalisers come along
//! (a checkpoint is imported whole, [`Simic::import_state`]) and change
//! nothing, since a driven round does not learn. The generators of a
//! data-parallel run's ranks are dropped: one process drives. Of the
//! settings the policy was trained under ([`crate::vectorized::settings`]),
//! those that shape what it sees and may do (`slot.*`: the auto-forward
//! gates; `blueprint.*`: its masks; `floor.*`: its heads' probability
//! floors) are applied to each variant's configuration, so the policy acts
//! under the gates and masks it learned with. Those of its learning alone
//! (`reward.*`, `ppo.*`, `imitation.*`) are not: nothing learns, no
//! observation carries a reward, and one of them, the twin-delta term
//! (`reward.twin_delta_weight`), would train a second host beside every
//! environment, work a driven round has no use for.
//!
//! Building one (not run as a doc test: a doc test's binary does not find
//! libtorch; `tests/learned_driver.rs` runs the same steps):
//!
//! ```ignore
//! use simic::bench::LearnedPolicy;
//! use simic::vectorized::{Simic, SimicConfig};
//!
//! # fn main() -> simic::Result<()> {
//! // A trained policy's state (here a fresh one, for the example).
//! let config = SimicConfig::reference(5);
//! let trainer = Simic::new(config, 3, tch::Device::Cpu, leyline::Telemetry::disabled())?;
//! let (state, tensors) = trainer.export_state()?;
//! let policy = LearnedPolicy::new("example".into(), 5, state, tensors, Vec::new())?;
//! assert_eq!(policy.episode_length(), 5);
//! assert!(policy.describe().contains("example"));
//! # Ok(())
//! # }
//! ```

use tch::Tensor;

use crate::vectorized::{Simic, SimicConfig, SimicState, settings};
use crate::{Error, Result};

/// The sections of settings that change only how a policy learns.
const LEARNING_ONLY: [&str; 3] = ["reward.", "ppo.", "imitation."];

/// A trained policy read from a checkpoint, with what it was trained under.
#[derive(Debug)]
pub struct LearnedPolicy {
    source: String,
    episode_length: u32,
    state: SimicState,
    tensors: Vec<(String, Tensor)>,
    settings: Vec<String>,
}

impl LearnedPolicy {
    /// The policy of a PPO checkpoint's `state` and `tensors` (as
    /// [`Simic::export_state`] returns them), trained with episodes of
    /// `episode_length` epochs under `settings`; `source` names it in the
    /// record (the checkpoint's folder). The settings are checked here (an
    /// unknown or refused one is an error naming it); the tensors when a
    /// variant imports them ([`Simic::import_state`]: every policy tensor of
    /// its shape, every value finite).
    pub fn new(
        source: String,
        episode_length: u32,
        mut state: SimicState,
        tensors: Vec<(String, Tensor)>,
        settings: Vec<String>,
    ) -> Result<LearnedPolicy> {
        if episode_length == 0 {
            return Err(Error::InvalidInput {
                field: "LearnedPolicy.episode_length",
                reason: "0 epochs; the policy was trained on episodes of at least one".to_owned(),
            });
        }
        settings::apply_all(&mut SimicConfig::reference(episode_length), &settings)?;
        // One process drives: a data-parallel run's rank generators would
        // make the trainer wait for a group.
        state.rank_rngs.clear();
        Ok(LearnedPolicy {
            source,
            episode_length,
            state,
            tensors,
            settings,
        })
    }

    /// The episode length the policy was trained on.
    pub fn episode_length(&self) -> u32 {
        self.episode_length
    }

    /// The settings it was trained under, in order.
    pub fn settings(&self) -> &[String] {
        &self.settings
    }

    /// Where it came from, its training rounds and settings, in one line.
    pub fn describe(&self) -> String {
        format!(
            "{} (after {} rounds, {} PPO updates; episode {}; trained under [{}], acting \
             under [{}])",
            self.source,
            self.state.rounds,
            self.state.ppo_updates,
            self.episode_length,
            self.settings.join(" "),
            self.acting_settings().join(" ")
        )
    }

    /// The settings it acts under: those of [`LearnedPolicy::settings`]
    /// that change what it sees and may do (see the module docs).
    pub fn acting_settings(&self) -> Vec<String> {
        self.settings
            .iter()
            .filter(|setting| {
                !LEARNING_ONLY
                    .iter()
                    .any(|section| setting.starts_with(section))
            })
            .cloned()
            .collect()
    }

    /// `config` with the policy's acting settings applied.
    pub(crate) fn configure(&self, mut config: SimicConfig) -> Result<SimicConfig> {
        settings::apply_all(&mut config, &self.acting_settings())?;
        Ok(config)
    }

    /// Puts the policy into `simic` (built with [`LearnedPolicy::configure`]'s
    /// configuration) and makes it act greedily.
    pub(crate) fn install(&self, simic: &mut Simic) -> Result<()> {
        simic.import_state(&self.state, &self.tensors)?;
        simic.set_sample_mode(tamiyo::policy::SampleMode::Greedy);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_acts_under_its_gates_masks_and_floors_not_its_learning_settings() {
        let config = SimicConfig::reference(5);
        let trainer = Simic::new(config, 3, tch::Device::Cpu, leyline::Telemetry::disabled())
            .expect("a trainer");
        let (state, tensors) = trainer.export_state().expect("state");
        let trained_under: Vec<String> = [
            "slot.auto_forward_g1=true",
            "reward.twin_delta_weight=20",
            "ppo.entropy_coef=0.1",
            "imitation.updates=8",
            "floor.op=0.05",
            "blueprint.conv_small=false",
        ]
        .map(str::to_owned)
        .to_vec();
        let policy = LearnedPolicy::new("p".into(), 5, state, tensors, trained_under.clone())
            .expect("a policy");
        assert_eq!(policy.settings(), trained_under.as_slice());
        assert_eq!(
            policy.acting_settings(),
            [
                "slot.auto_forward_g1=true",
                "floor.op=0.05",
                "blueprint.conv_small=false"
            ]
        );
        let reference = SimicConfig::reference(5);
        let acting = policy.configure(reference.clone()).expect("configured");
        // No twin beside the environments, the reference's PPO and warm-up.
        assert_eq!(
            acting.reward.twin_delta_weight,
            reference.reward.twin_delta_weight
        );
        assert_eq!(acting.ppo.entropy_coef, reference.ppo.entropy_coef);
        assert_eq!(acting.imitation.updates, reference.imitation.updates);
        // Its gates.
        assert!(acting.slot.auto_forward_g1);
        let described = policy.describe();
        assert!(
            described
                .contains("trained under [slot.auto_forward_g1=true reward.twin_delta_weight=20"),
            "{described}"
        );
        assert!(
            described.contains("acting under [slot.auto_forward_g1=true floor.op=0.05"),
            "{described}"
        );
    }
}
