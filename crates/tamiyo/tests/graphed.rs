//! The graphed policy step gives what the eager step gives: the same actions,
//! log-probabilities, values and LSTM state for the same generator, step
//! after step (on CUDA, replaying the captured graph; on the CPU, through
//! its eager fallback); and the fused sampling kernel samples what the
//! libtorch sampler samples: the same actions, relevance and op-conditioned
//! masks, and log-probabilities and entropies equal to float rounding,
//! greedy and stochastic, with and without probability floors, under random
//! masks (CUDA only; on the CPU the sampler says why it is not fused).
//! The graphed step under bf16 autocast replays what the eager bf16 step
//! computes, too.

mod common;

use tamiyo::masks::MaskTensors;
use tamiyo::policy::sampling::reference_probability_floors;
use tamiyo::policy::{GraphedAct, Policy, PolicyPrecision, SampleMode, Sampler, SamplingConfig};
use tch::{Device, Kind, Tensor};

fn policy(device: Device) -> Policy {
    common::small_policy(device)
}

fn sampler(device: Device) -> Sampler {
    common::floored_sampler(device)
}

fn compare(device: Device, precision: PolicyPrecision) {
    let n_envs = 4;
    let mut policy = policy(device);
    policy.set_precision(precision);
    // Equal kernels either way; bf16 leaves a little room for a different
    // GEMM algorithm inside the capture.
    let (rtol, atol) = match precision {
        PolicyPrecision::Fp32 => (1e-5, 1e-6),
        PolicyPrecision::Bf16 => (1e-3, 1e-4),
    };
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
                .allclose(&b.sample.log_probs, rtol, atol, false),
            "step {step}: log-probs differ"
        );
        assert!(
            a.value.allclose(&b.value, rtol, atol, false),
            "step {step}: values differ"
        );
        assert_eq!(b.value.kind(), Kind::Float);
        assert!(a.hidden.h.allclose(&b.hidden.h, rtol, atol, false));
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
        // Both sides sampled with the fused kernel.
        assert_eq!(eager.fused_fallback(config.num_slots), None);
        assert!(graphed.is_captured(), "fallback: {:?}", graphed.fallback());
    } else {
        assert!(graphed.fallback().is_some());
    }
}

#[test]
fn the_graphed_step_falls_back_to_the_eager_step_on_the_cpu() {
    compare(Device::Cpu, PolicyPrecision::Fp32);
    compare(Device::Cpu, PolicyPrecision::Bf16);
}

#[test]
fn the_graphed_step_replays_what_the_eager_step_computes_on_cuda() {
    if !torch_ext::cuda::is_available() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    compare(Device::Cuda(0), PolicyPrecision::Fp32);
    compare(Device::Cuda(0), PolicyPrecision::Bf16);
}

/// Random logits per head (a wide spread, so floors bind) and random masks
/// with at least one allowed option per head and per op row.
fn inputs(batch: i64, slots: i64, device: Device, seed: i64) -> ([Tensor; 8], MaskTensors) {
    tch::manual_seed(seed);
    let sizes = tamiyo::heads::head_sizes(slots as usize);
    let logits: Vec<Tensor> = sizes
        .iter()
        .map(|&n| Tensor::randn([batch, n as i64], (Kind::Float, device)) * 4.0)
        .collect();
    let allow = |shape: &[i64]| {
        let random = Tensor::rand(shape, (Kind::Float, device)).gt(0.4);
        // Option 0 of a row is forced on where the row would be empty.
        let empty = random.any_dim(-1, true).logical_not();
        let first = Tensor::zeros(shape, (Kind::Bool, device));
        let _ = first.narrow(-1, 0, 1).fill_(1);
        random.logical_or(&first.logical_and(&empty))
    };
    let heads: Vec<Tensor> = sizes.iter().map(|&n| allow(&[batch, n as i64])).collect();
    let ops = tamiyo::heads::head_size(tamiyo::heads::OP, slots as usize).expect("op") as i64;
    let masks = MaskTensors {
        heads: heads.try_into().expect("8 heads"),
        slot_by_op: allow(&[batch, ops, slots]),
    };
    (logits.try_into().expect("8 heads"), masks)
}

fn sampler_with(mode: SampleMode, floors: bool, fused: bool, device: Device) -> Sampler {
    let mut sampler = Sampler::new(
        SamplingConfig {
            mode,
            floors: floors.then(reference_probability_floors),
        },
        23,
        device,
    )
    .expect("sampler");
    sampler.set_fused(fused);
    sampler
}

#[test]
fn on_the_cpu_the_sampler_says_why_it_is_not_fused() {
    let sampler = sampler_with(SampleMode::Stochastic, true, true, Device::Cpu);
    let reason = sampler.fused_fallback(3).expect("a reason");
    assert!(reason.contains("CUDA"), "{reason}");
}

#[test]
fn the_fused_kernel_samples_what_the_libtorch_sampler_samples() {
    if !torch_ext::cuda::is_available() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    let device = Device::Cuda(0);
    for (mode, floors) in [
        (SampleMode::Stochastic, true),
        (SampleMode::Stochastic, false),
        (SampleMode::Greedy, true),
        (SampleMode::Greedy, false),
    ] {
        for (batch, slots) in [(4, 3), (37, 5), (1, 1)] {
            let mut fused = sampler_with(mode, floors, true, device);
            let mut plain = sampler_with(mode, floors, false, device);
            assert_eq!(fused.fused_fallback(slots as usize), None);
            for step in 0..3 {
                let (logits, masks) = inputs(batch, slots, device, 1000 + step);
                let a = fused.sample(&logits, &masks).expect("fused");
                let b = plain.sample(&logits, &masks).expect("libtorch");
                let what =
                    format!("{mode:?} floors {floors} batch {batch} slots {slots} step {step}");
                assert!(a.actions.equal(&b.actions), "{what}: actions differ");
                assert!(a.relevance.equal(&b.relevance), "{what}: relevance differs");
                for (x, y) in a.masks.iter().zip(&b.masks) {
                    assert!(x.equal(y), "{what}: conditioned masks differ");
                }
                assert!(
                    a.log_probs.allclose(&b.log_probs, 1e-4, 1e-5, false),
                    "{what}: log-probs {:?} vs {:?}",
                    Vec::<f32>::try_from(a.log_probs.view(-1).to_device(Device::Cpu)),
                    Vec::<f32>::try_from(b.log_probs.view(-1).to_device(Device::Cpu)),
                );
                assert!(
                    a.entropies.allclose(&b.entropies, 1e-4, 1e-5, false),
                    "{what}: entropies differ"
                );
                // Every chosen option is allowed by its conditioned mask.
                for (head, mask) in a.masks.iter().enumerate() {
                    let chosen = a.actions.select(1, head as i64).unsqueeze(1);
                    let allowed = mask.gather(1, &chosen, false);
                    let any = mask.any_dim(1, true);
                    assert!(
                        allowed
                            .logical_or(&any.logical_not())
                            .all()
                            .int64_value(&[])
                            == 1,
                        "{what}: head {head} chose a masked option"
                    );
                }
            }
            assert_eq!(fused.rng().draws(), plain.rng().draws());
        }
    }
}
