//! Masked sampling: a masked option is never chosen (property test over
//! random masks and adversarial logits), log-probabilities equal
//! `log_softmax` of the masked logits, irrelevant heads take their
//! canonical option, sampled frequencies follow the softmax, the generator
//! is seeded, probability floors hold, and stored actions evaluate to the
//! same log-probabilities.

use leyline::{LifecycleOp, NUM_ACTION_HEADS};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use tamiyo::features::NUM_OPS;
use tamiyo::heads::{OP, SLOT, canonical_action, head_sizes, relevance};
use tamiyo::masks::MaskTensors;
use tamiyo::policy::sampling::{
    apply_probability_floor, mask_logits, normalized_entropy, reference_probability_floors,
};
use tamiyo::policy::{MASKED_LOGIT_VALUE, PolicyRng, SampleMode, Sampler, SamplingConfig};
use tch::{Device, Kind, Tensor};

/// One environment's masks and logits, as host values.
#[derive(Debug, Clone)]
struct Case {
    heads: Vec<Vec<bool>>,
    slot_by_op: Vec<Vec<bool>>,
    logits: Vec<Vec<f32>>,
}

fn floats(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(tensor.to_kind(Kind::Float).flatten(0, -1)).expect("floats")
}

fn longs(tensor: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(tensor.flatten(0, -1)).expect("longs")
}

fn bools(tensor: &Tensor) -> Vec<bool> {
    Vec::<bool>::try_from(tensor.flatten(0, -1)).expect("bools")
}

fn non_empty(size: usize) -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(any::<bool>(), size).prop_map(|mut mask| {
        if !mask.iter().any(|&v| v) {
            mask[0] = true;
        }
        mask
    })
}

/// Logits where masked options may be far larger than valid ones.
fn logits_for(mask: Vec<bool>) -> impl Strategy<Value = (Vec<bool>, Vec<f32>)> {
    let size = mask.len();
    (
        Just(mask),
        prop::collection::vec(-30.0_f32..30.0, size),
        any::<bool>(),
    )
        .prop_map(|(mask, mut logits, adversarial)| {
            if adversarial {
                for (logit, &valid) in logits.iter_mut().zip(&mask) {
                    if !valid {
                        *logit = 1e6;
                    }
                }
            }
            (mask, logits)
        })
}

fn case(num_slots: usize) -> impl Strategy<Value = Case> {
    let sizes = head_sizes(num_slots);
    let op_mask = non_empty(NUM_OPS).prop_map(|mut ops| {
        ops[0] = true; // WAIT
        ops
    });
    let rows = prop::collection::vec(non_empty(num_slots), NUM_OPS);
    let heads = sizes
        .iter()
        .map(|&size| non_empty(size).prop_flat_map(logits_for).boxed())
        .collect::<Vec<_>>();
    (op_mask, rows, heads).prop_map(move |(ops, rows, heads)| {
        let mut slot_by_op: Vec<Vec<bool>> = rows;
        for (op, row) in slot_by_op.iter_mut().enumerate() {
            if op == 0 {
                row.fill(true);
            } else if !ops[op] {
                row.fill(false);
            }
        }
        let (mut masks, logits): (Vec<Vec<bool>>, Vec<Vec<f32>>) = heads.into_iter().unzip();
        masks[OP] = ops;
        masks[SLOT] = vec![true; num_slots];
        Case {
            heads: masks,
            slot_by_op,
            logits,
        }
    })
}

fn tensors(cases: &[Case]) -> (MaskTensors, [Tensor; NUM_ACTION_HEADS]) {
    let rows = cases.len() as i64;
    let num_slots = cases[0].heads[SLOT].len() as i64;
    let heads: Vec<Tensor> = (0..NUM_ACTION_HEADS)
        .map(|head| {
            let flat: Vec<bool> = cases.iter().flat_map(|c| c.heads[head].clone()).collect();
            Tensor::from_slice(&flat).view([rows, -1])
        })
        .collect();
    let flat: Vec<bool> = cases
        .iter()
        .flat_map(|c| c.slot_by_op.iter().flatten().copied().collect::<Vec<_>>())
        .collect();
    let slot_by_op = Tensor::from_slice(&flat).view([rows, NUM_OPS as i64, num_slots]);
    let logits: Vec<Tensor> = (0..NUM_ACTION_HEADS)
        .map(|head| {
            let flat: Vec<f32> = cases.iter().flat_map(|c| c.logits[head].clone()).collect();
            Tensor::from_slice(&flat).view([rows, -1])
        })
        .collect();
    (
        MaskTensors {
            heads: heads.try_into().expect("heads"),
            slot_by_op,
        },
        logits.try_into().expect("logits"),
    )
}

/// `log_softmax(masked)[action]` on the host, in f64.
fn host_log_prob(logits: &[f32], mask: &[bool], action: usize) -> f64 {
    let masked: Vec<f64> = logits
        .iter()
        .zip(mask)
        .map(|(&l, &m)| if m { f64::from(l) } else { MASKED_LOGIT_VALUE })
        .collect();
    let max = masked.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let log_sum = masked.iter().map(|l| (l - max).exp()).sum::<f64>().ln() + max;
    masked[action] - log_sum
}

fn check_sample(cases: &[Case], mode: SampleMode, seed: u64) -> Result<(), TestCaseError> {
    let num_slots = cases[0].heads[SLOT].len();
    let (masks, logits) = tensors(cases);
    let config = SamplingConfig { mode, floors: None };
    let mut sampler = Sampler::new(config, seed, Device::Cpu).expect("sampler");
    let sample = sampler.sample(&logits, &masks).expect("sample");
    let actions = longs(&sample.actions);
    let log_probs = floats(&sample.log_probs);
    let entropies = floats(&sample.entropies);
    let relevant = bools(&sample.relevance);
    let conditioned: Vec<Vec<bool>> = sample.masks.iter().map(bools).collect();
    let sizes = head_sizes(num_slots);
    for (env, case) in cases.iter().enumerate() {
        let row = &actions[env * NUM_ACTION_HEADS..(env + 1) * NUM_ACTION_HEADS];
        let op_index = row[OP] as usize;
        prop_assert!(case.heads[OP][op_index], "masked op {op_index} chosen");
        let op = LifecycleOp::ALL[op_index];
        let expected_relevance = relevance(op);
        for head in 0..NUM_ACTION_HEADS {
            let action = row[head] as usize;
            let size = sizes[head];
            prop_assert!(action < size);
            prop_assert_eq!(
                relevant[env * NUM_ACTION_HEADS + head],
                expected_relevance[head]
            );
            let mask = &conditioned[head][env * size..(env + 1) * size];
            prop_assert!(
                mask[action],
                "head {} chose a masked option {}",
                head,
                action
            );
            if head == OP {
                continue;
            }
            let base: &[bool] = if head == SLOT {
                &case.slot_by_op[op_index]
            } else {
                &case.heads[head]
            };
            if expected_relevance[head] {
                prop_assert_eq!(mask, base, "a relevant head keeps its mask");
                prop_assert!(base[action], "head {} broke its base mask", head);
            } else {
                let canonical = canonical_action(head).map_or_else(
                    || case.slot_by_op[0].iter().position(|&v| v).unwrap_or(0),
                    |option| option as usize,
                );
                prop_assert_eq!(action, canonical, "irrelevant head {} not canonical", head);
                prop_assert_eq!(mask.iter().filter(|&&v| v).count(), 1);
            }
            // The log-probability is log_softmax of the masked logits.
            let want = host_log_prob(&case.logits[head], mask, action);
            let got = f64::from(log_probs[env * NUM_ACTION_HEADS + head]);
            prop_assert!(
                (got - want).abs() < 1e-4,
                "head {}: {} vs {}",
                head,
                got,
                want
            );
            let entropy = entropies[env * NUM_ACTION_HEADS + head];
            prop_assert!((-1e-5..=1.0 + 1e-5).contains(&entropy));
        }
        let want = host_log_prob(&case.logits[OP], &case.heads[OP], op_index);
        let got = f64::from(log_probs[env * NUM_ACTION_HEADS + OP]);
        prop_assert!((got - want).abs() < 1e-4, "op: {} vs {}", got, want);
        if mode == SampleMode::Greedy {
            // The most likely valid op.
            let best = case.logits[OP]
                .iter()
                .zip(&case.heads[OP])
                .filter(|(_, valid)| **valid)
                .map(|(l, _)| *l)
                .fold(f32::NEG_INFINITY, f32::max);
            prop_assert_eq!(case.logits[OP][op_index], best);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn masked_options_are_never_sampled(
        cases in (1_usize..4).prop_flat_map(|slots| prop::collection::vec(case(slots), 1..5)),
        seed in any::<u64>(),
    ) {
        check_sample(&cases, SampleMode::Stochastic, seed)?;
        check_sample(&cases, SampleMode::Greedy, seed)?;
    }
}

#[test]
fn wait_forces_every_other_head_to_one_option_with_zero_entropy() {
    let num_slots = 3;
    let sizes = head_sizes(num_slots);
    let mut heads: Vec<Vec<bool>> = sizes.iter().map(|&n| vec![true; n]).collect();
    heads[OP] = vec![true, false, false, false, false, false];
    let mut slot_by_op = vec![vec![false; num_slots]; NUM_OPS];
    slot_by_op[0] = vec![false, true, true];
    let logits = sizes.iter().map(|&n| vec![0.5; n]).collect();
    let case = Case {
        heads,
        slot_by_op,
        logits,
    };
    let (masks, logits) = tensors(&[case]);
    let mut sampler = Sampler::new(SamplingConfig::default(), 7, Device::Cpu).expect("sampler");
    let sample = sampler.sample(&logits, &masks).expect("sample");
    let actions = longs(&sample.actions);
    assert_eq!(actions[OP], 0, "WAIT");
    assert_eq!(actions[SLOT], 1, "the first slot WAIT allows");
    for (head, action) in actions.iter().enumerate() {
        if let Some(option) = canonical_action(head) {
            assert_eq!(*action, option);
        }
    }
    assert!(floats(&sample.log_probs).iter().all(|lp| lp.abs() < 1e-6));
    assert!(floats(&sample.entropies).iter().all(|e| e.abs() < 1e-6));
    assert_eq!(
        bools(&sample.relevance),
        [false, false, false, false, false, false, false, true]
    );
}

#[test]
fn sampled_frequencies_follow_the_softmax_and_the_seed_decides() {
    let rows = 8192;
    let op_logits = [0.0_f32, 1.0, 2.0, -1.0, 0.5, -0.5];
    let case = {
        let sizes = head_sizes(1);
        let mut heads: Vec<Vec<bool>> = sizes.iter().map(|&n| vec![true; n]).collect();
        heads[OP] = vec![true; NUM_OPS];
        let mut logits: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
        logits[OP] = op_logits.to_vec();
        Case {
            heads,
            slot_by_op: vec![vec![true]; NUM_OPS],
            logits,
        }
    };
    let cases = vec![case; rows];
    let (masks, logits) = tensors(&cases);
    let draw = |seed| {
        let mut sampler =
            Sampler::new(SamplingConfig::default(), seed, Device::Cpu).expect("sampler");
        let sample = sampler.sample(&logits, &masks).expect("sample");
        longs(&sample.actions.select(1, OP as i64))
    };
    let ops = draw(11);
    let total: f64 = op_logits.iter().map(|l| f64::from(*l).exp()).sum();
    for (op, logit) in op_logits.iter().enumerate() {
        let want = f64::from(*logit).exp() / total;
        let got = ops.iter().filter(|&&o| o == op as i64).count() as f64 / rows as f64;
        assert!((got - want).abs() < 0.02, "op {op}: {got} vs {want}");
    }
    assert_eq!(draw(11), ops, "same seed, same samples");
    assert_ne!(draw(12), ops, "another seed, other samples");
}

#[test]
fn the_generator_is_uniform_in_the_open_unit_interval_and_reproducible() {
    let mut rng = PolicyRng::new(42);
    let u = floats(&rng.uniform(&[100_000], Device::Cpu).expect("uniform"));
    assert!(u.iter().all(|&x| x > 0.0 && x < 1.0));
    let mean = u.iter().map(|&x| f64::from(x)).sum::<f64>() / u.len() as f64;
    let var = u
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / u.len() as f64;
    assert!((mean - 0.5).abs() < 0.005, "{mean}");
    assert!((var - 1.0 / 12.0).abs() < 0.002, "{var}");
    let second = floats(&rng.uniform(&[100_000], Device::Cpu).expect("uniform"));
    assert_ne!(u, second, "each draw is new");
    assert_eq!(rng.draws(), 2);
    let mut again = PolicyRng::new(42);
    assert_eq!(
        floats(&again.uniform(&[100_000], Device::Cpu).expect("uniform")),
        u
    );
    assert!(rng.uniform(&[-1], Device::Cpu).is_err());
}

#[test]
fn probability_floors_hold_and_keep_a_distribution() {
    let logits = Tensor::from_slice(&[8.0_f32, 0.0, -3.0, 5.0, 2.0, -9.0]).view([1, 6]);
    let mask = Tensor::from_slice(&[true, true, true, false, true, false]).view([1, 6]);
    for floor in [0.05, 0.15, 0.4] {
        let masked = mask_logits(&logits, &mask).expect("mask");
        let floored = apply_probability_floor(&masked, &mask, floor).expect("floor");
        let probs = floats(&floored.softmax(-1, Kind::Float));
        let effective = floor.min(0.99 / 4.0);
        let valid = [true, true, true, false, true, false];
        for (p, v) in probs.iter().zip(valid) {
            if v {
                assert!(f64::from(*p) >= effective - 1e-6, "{probs:?} floor {floor}");
            } else {
                assert!(*p < 1e-6);
            }
        }
        assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert_eq!(floats(&floored)[3], MASKED_LOGIT_VALUE as f32);
    }
    let floors = reference_probability_floors();
    assert_eq!(floors[OP], 0.15);
    assert_eq!(floors[SLOT], 0.05);
}

#[test]
fn entropies_are_normalised_by_the_valid_options() {
    let logits = Tensor::zeros([2, 4], (Kind::Float, Device::Cpu));
    let mask =
        Tensor::from_slice(&[true, true, true, false, false, true, false, false]).view([2, 4]);
    let masked = mask_logits(&logits, &mask).expect("mask");
    let entropy = floats(&normalized_entropy(&masked, &mask).expect("entropy"));
    assert!((entropy[0] - 1.0).abs() < 1e-5, "uniform over three: 1");
    assert!(entropy[1].abs() < 1e-6, "one option: 0");
}

#[test]
fn stored_actions_evaluate_to_the_sampled_log_probabilities() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let cases = prop::collection::vec(case(3), 6)
        .new_tree(&mut runner)
        .expect("cases")
        .current();
    let (masks, logits) = tensors(&cases);
    let config = SamplingConfig {
        mode: SampleMode::Stochastic,
        floors: Some(reference_probability_floors()),
    };
    let mut sampler = Sampler::new(config, 3, Device::Cpu).expect("sampler");
    let sample = sampler.sample(&logits, &masks).expect("sample");
    let (log_probs, entropies) = sampler
        .evaluate_actions(&logits, &masks, &sample.actions)
        .expect("evaluate");
    let diff = |a: &Tensor, b: &Tensor| {
        floats(a)
            .iter()
            .zip(floats(b))
            .map(|(x, y)| (x - y).abs())
            .fold(0.0_f32, f32::max)
    };
    assert!(diff(&log_probs, &sample.log_probs) < 1e-6);
    assert!(diff(&entropies, &sample.entropies) < 1e-6);
    assert!(
        floats(&sample.log_probs)
            .iter()
            .all(|lp| *lp <= 1e-6 && lp.is_finite())
    );
    let bad = Tensor::zeros([6, 7], (Kind::Int64, Device::Cpu));
    assert!(sampler.evaluate_actions(&logits, &masks, &bad).is_err());
    let wrong_floor = SamplingConfig {
        mode: SampleMode::Greedy,
        floors: Some([1.5; NUM_ACTION_HEADS]),
    };
    assert!(Sampler::new(wrong_floor, 0, Device::Cpu).is_err());
}
