//! CartPole-v1 as the PPO core's proof: the environment ([`env`](mod@env)), CleanRL's
//! MLP actor-critic ([`agent`]) and [`train_cartpole`] ([`train`]), which
//! trains it with exactly the [`crate::ppo::PpoTrainer`] and
//! [`crate::gae::compute_gae`] that train Tamiyo.
//!
//! CleanRL's `ppo.py` reaches a mean episodic return of about 490 within
//! 500 000 steps with the defaults of [`CartpoleConfig`]; the example
//! `cargo run -p simic --release --example cartpole` checks it.

pub mod agent;
pub mod env;
pub mod train;

pub use agent::ActorCritic;
pub use env::{CartPoleVec, Episode, State, VecStep};
pub use train::{
    CartpoleConfig, CartpoleReport, RolloutRecord, train_cartpole, train_cartpole_with,
};
