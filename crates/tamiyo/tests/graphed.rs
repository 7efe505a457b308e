//! The graphed policy step gives what the eager step gives: the same actions,
//! log-probabilities, values and LSTM state for the same generator, step
//! after step (on CUDA, replaying the captured graph; on the CPU, through
//! its eager fallback).

use tamiyo::masks::MaskTensors;
use tamiyo::policy::{GraphedAct, Policy, PolicyConfig, SampleMode, Sampler, SamplingConfig};
use tch::{Device, Kind, Tensor};

fn policy(device: Device) -> Policy {
    tch::manual_seed(7);
    Policy::new(
        PolicyConfig {
            feature_dim: 32,
            hidden_dim: 32,
            ..PolicyConfig::default()
        },
        device,
    )
    .expect("policy")
}

fn sampler(device: Device) -> Sampler {
    Sampler::new(
        SamplingConfig {
            mode: SampleMode::Stochastic,
            floors: Some(tamiyo::policy::sampling::reference_probability_floors()),
        },
        11,
        device,
    )
    .expect("sampler")
}

fn compare(device: Device) {
    let n_envs = 4;
    let policy = policy(device);
    let config = policy.network().config();
    let mut eager = sampler(device);
    let mut graphed_sampler = sampler(device);
    let mut graphed = GraphedAct::new(&policy, &graphed_sampler, n_envs).expect("graphed");
    let masks = MaskTensors::allow_all(n_envs, config.num_slots, device).expect("masks");
    let mut eager_hidden = policy.network().initial_state(n_envs).expect("hidden");
    let mut graph_hidden = policy.network().initial_state(n_envs).expect("hidden");
    for step in 0..4 {
        tch::manual_seed(100 + step);
        let obs = Tensor::randn(
            [n_envs as i64, config.obs_dim() as i64],
            (Kind::Float, device),
        );
        let blueprints = Tensor::zeros(
            [n_envs as i64, config.num_slots as i64],
            (Kind::Int64, device),
        );
        let a = policy
            .act(&obs, &blueprints, &eager_hidden, &masks, &mut eager)
            .expect("eager act");
        let b = graphed
            .act(
                &policy,
                &mut graphed_sampler,
                &obs,
                &blueprints,
                &graph_hidden,
                &masks,
            )
            .expect("graphed act");
        assert!(
            a.sample.actions.equal(&b.sample.actions),
            "step {step}: actions differ"
        );
        assert!(
            a.sample
                .log_probs
                .allclose(&b.sample.log_probs, 1e-5, 1e-6, false),
            "step {step}: log-probs differ"
        );
        assert!(
            a.value.allclose(&b.value, 1e-5, 1e-6, false),
            "step {step}: values differ"
        );
        assert!(a.hidden.h.allclose(&b.hidden.h, 1e-5, 1e-6, false));
        eager_hidden = a.hidden;
        graph_hidden = b.hidden.shallow_clone();
        // The graph's outputs are views of static buffers: keep a copy.
        graph_hidden = tamiyo::policy::LstmState {
            h: graph_hidden.h.copy(),
            c: graph_hidden.c.copy(),
        };
    }
    assert_eq!(eager.rng().draws(), graphed_sampler.rng().draws());
    if device.is_cuda() {
        assert!(graphed.is_captured(), "fallback: {:?}", graphed.fallback());
    } else {
        assert!(graphed.fallback().is_some());
    }
}

#[test]
fn the_graphed_step_falls_back_to_the_eager_step_on_the_cpu() {
    compare(Device::Cpu);
}

#[test]
fn the_graphed_step_replays_what_the_eager_step_computes_on_cuda() {
    if !tch::Cuda::is_available() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    compare(Device::Cuda(0));
}
