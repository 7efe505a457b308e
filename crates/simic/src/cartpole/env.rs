//! CartPole-v1 with gymnasium's constants and rules, vectorised over `N`
//! environments with auto-reset; the state is `f64` on the host.
//!
//! One step (gymnasium's `CartPoleEnv`, "euler" kinematics): the force is
//! `+FORCE_MAG` for action 1 and `−FORCE_MAG` for action 0, then
//!
//! - `temp = (force + m_p·l·θ̇²·sin θ) / M`
//! - `θ̈ = (g·sin θ − cos θ·temp) / (l·(4/3 − m_p·cos²θ / M))`
//! - `ẍ = temp − m_p·l·θ̈·cos θ / M`
//! - `x += τ·ẋ`, `ẋ += τ·ẍ`, `θ += τ·θ̇`, `θ̇ += τ·θ̈`
//!
//! (`M` the total mass, `l` the half pole length). Every step pays reward 1;
//! the episode terminates when `|x| > 2.4` or `|θ| > 12°` after the step, and
//! is truncated at [`MAX_EPISODE_STEPS`] steps (gymnasium's `TimeLimit`; a
//! step can be both). A reset draws all four state values uniformly in
//! `[−0.05, 0.05)` from the vector's own seeded generator ([`leyline::rng::SplitMix64`]).
//!
//! Auto-reset happens in the same step (gymnasium's "same-step" mode, which
//! CleanRL's recipe was written for): an environment whose episode ended
//! is reset at once, its next observation is the new episode's first, and
//! the last state of the finished episode is handed back in
//! [`VecStep::final_states`] so a truncated episode can be bootstrapped.

use leyline::rng::SplitMix64;
use tch::{Device, Tensor};

use crate::error::TorchResultExt;
use crate::{Error, Result};

/// Gravity (m/s²).
pub const GRAVITY: f64 = 9.8;
/// Cart mass (kg).
pub const MASS_CART: f64 = 1.0;
/// Pole mass (kg).
pub const MASS_POLE: f64 = 0.1;
/// Cart plus pole.
pub const TOTAL_MASS: f64 = MASS_CART + MASS_POLE;
/// Half the pole's length (m).
pub const LENGTH: f64 = 0.5;
/// Pole mass times half length.
pub const POLE_MASS_LENGTH: f64 = MASS_POLE * LENGTH;
/// Magnitude of the push (N).
pub const FORCE_MAG: f64 = 10.0;
/// Seconds per step.
pub const TAU: f64 = 0.02;
/// Pole angle beyond which the episode terminates: 12 degrees in radians.
pub const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
/// Cart position beyond which the episode terminates (m).
pub const X_THRESHOLD: f64 = 2.4;
/// Episode length at which `TimeLimit` truncates.
pub const MAX_EPISODE_STEPS: u32 = 500;
/// Half-width of the uniform reset distribution.
pub const RESET_BOUND: f64 = 0.05;
/// Largest number of environments in one vector.
pub const MAX_ENVS: usize = 1 << 16;

/// `[x, ẋ, θ, θ̇]`.
pub type State = [f64; 4];

/// The state after pushing with `action` (0 left, 1 right) from `state`
/// (see the module docs).
pub fn step_state(state: State, action: u8) -> State {
    let [x, x_dot, theta, theta_dot] = state;
    let force = if action == 1 { FORCE_MAG } else { -FORCE_MAG };
    let (sin, cos) = theta.sin_cos();
    let temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS;
    let theta_acc =
        (GRAVITY * sin - cos * temp) / (LENGTH * (4.0 / 3.0 - MASS_POLE * cos * cos / TOTAL_MASS));
    let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS;
    [
        x + TAU * x_dot,
        x_dot + TAU * x_acc,
        theta + TAU * theta_dot,
        theta_dot + TAU * theta_acc,
    ]
}

/// Whether `state` ends the episode (cart out of bounds or pole fallen).
pub fn is_terminal(state: &State) -> bool {
    let [x, _, theta, _] = *state;
    !(-X_THRESHOLD..=X_THRESHOLD).contains(&x)
        || !(-THETA_THRESHOLD..=THETA_THRESHOLD).contains(&theta)
}

/// A finished episode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Episode {
    /// The environment it ran in.
    pub env: usize,
    /// Sum of its rewards.
    pub episodic_return: f64,
    /// Its number of steps.
    pub length: u32,
}

/// What one vector step returns, one entry per environment.
#[derive(Debug, Clone, PartialEq)]
pub struct VecStep {
    /// Reward of the step (1 everywhere).
    pub rewards: Vec<f32>,
    /// The step ended its episode by the pole or the track.
    pub terminated: Vec<bool>,
    /// The step hit the time limit.
    pub truncated: Vec<bool>,
    /// The last state of an episode that ended in this step (before the
    /// auto-reset), `None` where the episode goes on.
    pub final_states: Vec<Option<State>>,
    /// The episodes that ended in this step.
    pub episodes: Vec<Episode>,
}

/// `N` CartPole-v1 environments with auto-reset (see the module docs).
#[derive(Debug, Clone)]
pub struct CartPoleVec {
    states: Vec<State>,
    lengths: Vec<u32>,
    returns: Vec<f64>,
    rng: SplitMix64,
}

impl CartPoleVec {
    /// `n_envs` environments, all reset from `seed`.
    pub fn new(n_envs: usize, seed: u64) -> Result<CartPoleVec> {
        if !(1..=MAX_ENVS).contains(&n_envs) {
            return Err(Error::InvalidConfig {
                field: "CartPoleVec.n_envs",
                reason: format!("{n_envs} is outside [1, {MAX_ENVS}]"),
            });
        }
        let mut rng = SplitMix64::new(seed);
        let states = (0..n_envs).map(|_| reset_state(&mut rng)).collect();
        Ok(CartPoleVec {
            states,
            lengths: vec![0; n_envs],
            returns: vec![0.0; n_envs],
            rng,
        })
    }

    /// Number of environments.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Always false (a vector has at least one environment).
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// The current states.
    pub fn states(&self) -> &[State] {
        &self.states
    }

    /// Overwrites the state of environment `env` (tests, replays). Every
    /// value must be finite and inside the `f32` range (the observations
    /// are `f32`); a refused state changes nothing.
    pub fn set_state(&mut self, env: usize, state: State) -> Result<()> {
        check_state("CartPoleVec.set_state.state", &state)?;
        match self.states.get_mut(env) {
            Some(slot) => {
                *slot = state;
                Ok(())
            }
            None => Err(Error::InvalidInput {
                field: "CartPoleVec.env",
                reason: format!("{env} is not below {}", self.lengths.len()),
            }),
        }
    }

    /// The observations, `[N, 4]` `f32` on `device`.
    pub fn observations(&self, device: Device) -> Result<Tensor> {
        states_tensor(&self.states, device)
    }

    /// Steps every environment with its action (0 or 1), resetting those
    /// whose episode ended. Every action is checked before any environment
    /// moves: a refused call changes nothing.
    pub fn step(&mut self, actions: &[i64]) -> Result<VecStep> {
        let n_envs = self.states.len();
        if actions.len() != n_envs {
            return Err(Error::InvalidInput {
                field: "CartPoleVec.step.actions",
                reason: format!("{} actions for {n_envs} environments", actions.len()),
            });
        }
        let pushes = actions
            .iter()
            .enumerate()
            .map(|(env, action)| match action {
                0 => Ok(0_u8),
                1 => Ok(1_u8),
                other => Err(Error::InvalidInput {
                    field: "CartPoleVec.step.actions",
                    reason: format!("action {other} for environment {env} is not 0 or 1"),
                }),
            })
            .collect::<Result<Vec<u8>>>()?;
        let mut out = VecStep {
            rewards: vec![1.0; n_envs],
            terminated: vec![false; n_envs],
            truncated: vec![false; n_envs],
            final_states: vec![None; n_envs],
            episodes: Vec::new(),
        };
        let rows = self
            .states
            .iter_mut()
            .zip(self.lengths.iter_mut())
            .zip(self.returns.iter_mut())
            .zip(&pushes)
            .zip(
                out.terminated
                    .iter_mut()
                    .zip(out.truncated.iter_mut())
                    .zip(out.final_states.iter_mut()),
            );
        for (
            env,
            ((((state, length), episodic_return), action), ((terminated, truncated), last)),
        ) in rows.enumerate()
        {
            *state = step_state(*state, *action);
            *length = length.saturating_add(1);
            *episodic_return += 1.0;
            *terminated = is_terminal(state);
            *truncated = *length >= MAX_EPISODE_STEPS;
            if *terminated || *truncated {
                *last = Some(*state);
                out.episodes.push(Episode {
                    env,
                    episodic_return: *episodic_return,
                    length: *length,
                });
                *state = reset_state(&mut self.rng);
                *length = 0;
                *episodic_return = 0.0;
            }
        }
        Ok(out)
    }
}

fn reset_state(rng: &mut SplitMix64) -> State {
    [(); 4].map(|()| rng.uniform(-RESET_BOUND, RESET_BOUND))
}

/// Refuses a state with a value that is not finite or outside the `f32`
/// range.
fn check_state(field: &'static str, state: &State) -> Result<()> {
    match state
        .iter()
        .find(|value| !(value.is_finite() && value.abs() <= f64::from(f32::MAX)))
    {
        Some(bad) => Err(Error::InvalidInput {
            field,
            reason: format!("{bad} in {state:?} is not a finite f32"),
        }),
        None => Ok(()),
    }
}

/// `states` as an `[n, 4]` `f32` tensor on `device`. Every value must be
/// finite and inside the `f32` range ([`Error::InvalidInput`] otherwise).
pub fn states_tensor(states: &[State], device: Device) -> Result<Tensor> {
    for state in states {
        check_state("states_tensor.states", state)?;
    }
    let flat: Vec<f32> = states.iter().flatten().map(|value| *value as f32).collect();
    Tensor::f_from_slice(&flat)
        .op("cartpole observations")?
        .f_view([-1, 4])
        .op("cartpole observations")?
        .f_to_device(device)
        .op("cartpole observations")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_seeded_and_in_range() {
        let mut a = SplitMix64::new(3);
        let mut b = SplitMix64::new(3);
        for _ in 0..100 {
            let x = a.uniform(-0.05, 0.05);
            assert_eq!(x, b.uniform(-0.05, 0.05));
            assert!((-0.05..0.05).contains(&x));
        }
        assert_ne!(SplitMix64::new(4).next_u64(), SplitMix64::new(3).next_u64());
    }
}
