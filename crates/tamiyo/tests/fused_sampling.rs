//! The fused sampling kernel samples what the libtorch sampler samples: the
//! same actions, relevance and op-conditioned masks, and log-probabilities
//! and entropies equal to float rounding, greedy and stochastic, with and
//! without probability floors, under random masks (GPU only; it skips on a
//! machine without CUDA). On the CPU the sampler says why it is not fused.

use tamiyo::masks::MaskTensors;
use tamiyo::policy::sampling::reference_probability_floors;
use tamiyo::policy::{SampleMode, Sampler, SamplingConfig};
use tch::{Device, Kind, Tensor};

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

fn sampler(mode: SampleMode, floors: bool, fused: bool, device: Device) -> Sampler {
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
    let sampler = sampler(SampleMode::Stochastic, true, true, Device::Cpu);
    let reason = sampler.fused_fallback(3).expect("a reason");
    assert!(reason.contains("CUDA"), "{reason}");
}

#[test]
fn the_fused_kernel_samples_what_the_libtorch_sampler_samples() {
    if !tch::Cuda::is_available() {
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
            let mut fused = sampler(mode, floors, true, device);
            let mut plain = sampler(mode, floors, false, device);
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
