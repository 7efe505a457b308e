//! CartPole-v1: transitions against values worked out by hand from
//! gymnasium's equations, termination, truncation at 500 steps, auto-reset,
//! the actor-critic's initialisation, and a short training run in which PPO
//! clearly improves the mean return.

use simic::Error;
use simic::cartpole::env::{
    self, CartPoleVec, MAX_EPISODE_STEPS, RESET_BOUND, THETA_THRESHOLD, step_state,
};
use simic::cartpole::{ActorCritic, CartpoleConfig, train_cartpole};
use tch::{Device, Kind, Tensor};

fn assert_state(got: [f64; 4], expected: [f64; 4]) {
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() < 1e-12, "{got:?} vs {expected:?}");
    }
}

#[test]
fn transitions_match_the_equations_by_hand() {
    // s = [x 0.01, ẋ 0.02, θ 0.03, θ̇ 0.04], push right (F = +10):
    // temp = (10 + 0.05·0.04²·sin 0.03) / 1.1                 = 9.090911272400014
    // θ̈ = (9.8·sin 0.03 − cos 0.03·temp) / (0.5·(4/3 − 0.1·cos²0.03/1.1))
    //                                                          = −14.153435898000408
    // ẍ = temp − 0.05·θ̈·cos 0.03 / 1.1                        = 9.733959787377762
    // x' = 0.01 + 0.02·0.02, ẋ' = 0.02 + 0.02·ẍ, θ' = 0.03 + 0.02·0.04, θ̇' = 0.04 + 0.02·θ̈
    let s = [0.01, 0.02, 0.03, 0.04];
    assert_state(
        step_state(s, 1),
        [0.0104, 0.21467919574755523, 0.0308, -0.24306871796000815],
    );
    // Push left (F = −10): temp = −9.090906909418166, θ̈ = 15.099761188801962,
    // ẍ = −9.776950855139468.
    assert_state(
        step_state(s, 0),
        [0.0104, -0.17553901710278938, 0.0308, 0.3419952237760392],
    );
    // A state far from upright: s = [−0.5, −1.2, −0.15, 0.8], push left:
    // temp = −9.095256382035595, θ̈ = 12.099491546772814, ẍ = −9.63905762290744.
    assert_state(
        step_state([-0.5, -1.2, -0.15, 0.8], 0),
        [-0.524, -1.3927811524581488, -0.134, 1.0419898309354563],
    );
}

#[test]
fn the_pole_falling_past_twelve_degrees_terminates_and_resets() {
    let mut envs = CartPoleVec::new(2, 7).unwrap();
    // θ = 0.2 moves to 0.21 > 12° = 0.20944 in one step.
    envs.set_state(0, [0.0, 0.0, 0.2, 0.5]).unwrap();
    let untouched = envs.states()[1];
    let step = envs.step(&[1, 0]).unwrap();
    assert_eq!(step.terminated, [true, false]);
    assert_eq!(step.truncated, [false, false]);
    // Every step pays 1, the terminal one included.
    assert_eq!(step.rewards, [1.0, 1.0]);
    let last = step.final_states[0].unwrap();
    assert!(last[2] > THETA_THRESHOLD);
    assert_state(last, step_state([0.0, 0.0, 0.2, 0.5], 1));
    assert_eq!(step.final_states[1], None);
    assert_state(envs.states()[1], step_state(untouched, 0));
    // Environment 0 was reset at once: a fresh state within ±0.05.
    assert!(envs.states()[0].iter().all(|v| v.abs() <= RESET_BOUND));
    assert_eq!(step.episodes.len(), 1);
    assert_eq!(step.episodes[0].env, 0);
    assert_eq!(step.episodes[0].length, 1);
    assert_eq!(step.episodes[0].episodic_return, 1.0);
}

#[test]
fn the_cart_leaving_the_track_terminates() {
    let mut envs = CartPoleVec::new(1, 3).unwrap();
    envs.set_state(0, [2.39, 1.0, 0.0, 0.0]).unwrap();
    let step = envs.step(&[1]).unwrap();
    assert_eq!(step.terminated, [true]);
    assert!(step.final_states[0].unwrap()[0] > 2.4);
    // Exactly on the threshold is still inside (gymnasium tests `x > 2.4`).
    assert!(!env::is_terminal(&[2.4, 0.0, THETA_THRESHOLD, 0.0]));
    assert!(env::is_terminal(&[-2.4000001, 0.0, 0.0, 0.0]));
}

#[test]
fn a_balanced_pole_is_truncated_at_five_hundred_steps() {
    let mut envs = CartPoleVec::new(3, 11).unwrap();
    // A linear controller that keeps the pole up from every reset state
    // (checked for these seeds): push the way the pole and the cart drift.
    let controller =
        |s: &[f64; 4]| i64::from(0.1 * s[0] + 0.5 * s[1] + 10.0 * s[2] + 2.0 * s[3] > 0.0);
    for t in 1..=MAX_EPISODE_STEPS {
        let actions: Vec<i64> = envs.states().iter().map(controller).collect();
        let step = envs.step(&actions).unwrap();
        assert_eq!(step.terminated, [false; 3], "fell at step {t}");
        let done = t == MAX_EPISODE_STEPS;
        assert_eq!(step.truncated, [done; 3], "step {t}");
        if done {
            assert!(step.final_states.iter().all(Option::is_some));
            assert_eq!(step.episodes.len(), 3);
            assert!(
                step.episodes
                    .iter()
                    .all(|e| e.length == 500 && e.episodic_return == 500.0)
            );
            assert!(
                envs.states()
                    .iter()
                    .flatten()
                    .all(|v| v.abs() <= RESET_BOUND)
            );
        } else {
            assert!(step.episodes.is_empty());
        }
    }
    // The counters restarted: the next step is step 1 of new episodes.
    let actions: Vec<i64> = envs.states().iter().map(controller).collect();
    assert_eq!(envs.step(&actions).unwrap().truncated, [false; 3]);
}

#[test]
fn resets_are_seeded_and_observations_are_f32() {
    let a = CartPoleVec::new(4, 5).unwrap();
    let b = CartPoleVec::new(4, 5).unwrap();
    let c = CartPoleVec::new(4, 6).unwrap();
    assert_eq!(a.states(), b.states());
    assert_ne!(a.states(), c.states());
    assert!(a.states().iter().flatten().all(|v| v.abs() <= RESET_BOUND));
    let observations = a.observations(Device::Cpu).unwrap();
    assert_eq!(observations.size(), [4, 4]);
    assert_eq!(observations.kind(), Kind::Float);
    assert_eq!(
        observations.double_value(&[2, 3]),
        f64::from(a.states()[2][3] as f32)
    );
}

#[test]
fn bad_actions_are_refused() {
    let mut envs = CartPoleVec::new(2, 1).unwrap();
    assert!(matches!(envs.step(&[0]), Err(Error::InvalidInput { .. })));
    assert!(matches!(
        envs.step(&[0, 2]),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        CartPoleVec::new(0, 1),
        Err(Error::InvalidConfig { .. })
    ));
}

#[test]
fn actor_critic_is_initialised_like_cleanrl() {
    let agent = ActorCritic::new(Device::Cpu, 9).unwrap();
    let variables = agent.var_store().variables();
    let gram = |name: &str| {
        let w = &variables[name];
        let rows = w.size()[0];
        let cols = w.size()[1];
        if rows <= cols {
            w.matmul(&w.transpose(0, 1))
        } else {
            w.transpose(0, 1).matmul(w)
        }
    };
    let off_identity = |m: Tensor, gain: f64| -> f64 {
        let n = m.size()[0];
        let target = Tensor::eye(n, (Kind::Float, Device::Cpu)) * (gain * gain);
        (m - target).abs().max().double_value(&[])
    };
    // Hidden layers gain √2, actor output 0.01, critic output 1.
    assert!(off_identity(gram("actor.0.weight"), 2f64.sqrt()) < 1e-5);
    assert!(off_identity(gram("critic.1.weight"), 2f64.sqrt()) < 1e-5);
    assert!(off_identity(gram("actor.2.weight"), 0.01) < 1e-7);
    assert!(off_identity(gram("critic.2.weight"), 1.0) < 1e-5);
    assert_eq!(
        variables["actor.1.bias"]
            .abs()
            .sum(Kind::Float)
            .double_value(&[]),
        0.0
    );
    assert_eq!(agent.parameters().len(), 12);
    // Same seed, same network.
    let again = ActorCritic::new(Device::Cpu, 9).unwrap();
    assert!(variables["critic.0.weight"].equal(&again.var_store().variables()["critic.0.weight"]));
    let x = Tensor::ones([5, 4], (Kind::Float, Device::Cpu));
    assert_eq!(agent.logits(&x).unwrap().size(), [5, 2]);
    assert_eq!(agent.values(&x).unwrap().size(), [5]);
    // Gain 0.01 on the actor's output: the first policy is close to uniform.
    assert!(agent.logits(&x).unwrap().abs().max().double_value(&[]) < 0.1);
}

#[test]
fn config_validation_names_the_field() {
    CartpoleConfig::default().validate().unwrap();
    let bad = CartpoleConfig {
        total_steps: 100,
        ..CartpoleConfig::default()
    };
    assert!(matches!(
        bad.validate(),
        Err(Error::InvalidConfig {
            field: "CartpoleConfig.total_steps",
            ..
        })
    ));
    assert_eq!(CartpoleConfig::default().updates(), 976);
}

#[test]
fn ppo_clearly_improves_the_mean_return() {
    // 50 updates of CleanRL's recipe (25 600 steps). Measured over seeds
    // 1..=10: the first 100 episodes average 22–26, the last 100 86–120.
    // The network is tiny: libtorch's intra-op threads only spin against
    // each other (and against the other tests) on a busy machine.
    tch::set_num_threads(1);
    for seed in [1, 2] {
        let config = CartpoleConfig {
            total_steps: 25_600,
            seed,
            ..CartpoleConfig::default()
        };
        let report = train_cartpole(config).unwrap();
        assert_eq!(report.steps, 25_600);
        assert_eq!(report.history.len(), 50);
        assert!(
            report.initial_mean_return < 35.0,
            "{}",
            report.initial_mean_return
        );
        assert!(
            report.mean_return > 60.0,
            "seed {seed}: {} (from {})",
            report.mean_return,
            report.initial_mean_return
        );
        assert!(report.history.iter().all(|r| r.approx_kl.is_finite()));
    }
}
