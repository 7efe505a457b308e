//! The policy network (reference §3.4): sizes and parameter count at HEAD's
//! defaults, one batched forward equal to per-environment forwards, the
//! LSTM state carried across calls (steps equal a sequence), the
//! initialisation, the null blueprint entry, shape checks before libtorch,
//! bf16 autocast with fp32 outputs (on any CPU: where oneDNN has no bf16
//! LSTM, the LSTM runs in full precision; run with `ONEDNN_MAX_CPU_ISA=AVX2`
//! to see that path on an AVX-512 machine), and the auxiliary heads (shapes,
//! the Q head's detached input, the predictor's gradient reaching the
//! trunk).

use leyline::NUM_ACTION_HEADS;
use tamiyo::Error;
use tamiyo::heads::{BLUEPRINT, OP, head_sizes};
use tamiyo::masks::MaskTensors;
use tamiyo::policy::{
    LstmState, MASKED_LOGIT_VALUE, Policy, PolicyConfig, PolicyNetwork, PolicyPrecision,
    SampleMode, Sampler, SamplingConfig, cpu_bf16_lstm_fallback_reason, cpu_bf16_lstm_supported,
};
use tch::{Device, Kind, Tensor};

fn small() -> PolicyConfig {
    PolicyConfig {
        num_slots: 3,
        feature_dim: 24,
        hidden_dim: 16,
        lstm_layers: 2,
    }
}

/// libtorch's generator is process-wide and the harness runs tests on
/// several threads: whatever draws from it takes this turn, so each test's
/// seeding gives it the same initialisation every time.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn policy(config: PolicyConfig, seed: i64) -> Policy {
    let _turn = turn();
    tch::manual_seed(seed);
    Policy::new(config, Device::Cpu).expect("policy")
}

fn inputs(batch: i64, obs_dim: i64, salt: f64) -> (Tensor, Tensor) {
    let obs = (Tensor::arange(batch * obs_dim, (Kind::Float, Device::Cpu)) * 0.37 + salt)
        .sin()
        .view([batch, obs_dim]);
    let blueprints: Vec<i64> = (0..batch * 3).map(|i| (i * 5) % 14 - 1).collect();
    (obs, Tensor::from_slice(&blueprints).view([batch, 3]))
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn heads_default_sizes_and_parameter_count_follow_the_reference() {
    let config = PolicyConfig::default();
    assert_eq!(
        (
            config.num_slots,
            config.feature_dim,
            config.hidden_dim,
            config.lstm_layers
        ),
        (3, 512, 512, 1)
    );
    assert_eq!(config.obs_dim(), 116);
    let policy = policy(config, 0);
    // Blueprint embedding 14 x 4; feature net 128 -> 512 + LayerNorm; one
    // LSTM(512) layer + LayerNorm; seven heads 512 -> 256 -> n; blueprint
    // 512 -> 512 -> 256 -> 13; critic 512 -> 256 -> 128 -> 64 -> 1 with two
    // LayerNorms.
    let linear = |i: usize, o: usize| i * o + o;
    let heads: usize = head_sizes(3)
        .iter()
        .enumerate()
        .map(|(head, &n)| {
            if head == BLUEPRINT {
                linear(512, 512) + linear(512, 256) + linear(256, n)
            } else {
                linear(512, 256) + linear(256, n)
            }
        })
        .sum();
    let expected = 14 * 4
        + linear(128, 512)
        + 2 * 512
        + (2 * 4 * 512 * 512 + 2 * 4 * 512)
        + 2 * 512
        + heads
        + linear(512, 256)
        + 2 * 256
        + linear(256, 128)
        + 2 * 128
        + linear(128, 64)
        + linear(64, 1);
    // The auxiliary heads: Q(s, op) over the trunk and the op one-hot
    // (512 + 6), the critic's shape; the contribution predictor
    // 512 -> 256 (LN) -> 128 -> 3 slots.
    let q_head =
        linear(518, 256) + 2 * 256 + linear(256, 128) + 2 * 128 + linear(128, 64) + linear(64, 1);
    let contribution = linear(512, 256) + 2 * 256 + linear(256, 128) + linear(128, 3);
    assert_eq!(policy.parameter_count(), expected + q_head + contribution);

    let network = policy.network();
    let (obs, blueprints) = inputs(2, 116, 0.0);
    let hidden = network.initial_state(2).expect("hidden");
    assert_eq!(hidden.h.size(), [1, 2, 512]);
    let masks = MaskTensors::allow_all(2, 3, Device::Cpu).expect("masks");
    let output = network
        .forward(&obs, &blueprints, &hidden, &masks)
        .expect("forward");
    let sizes: Vec<i64> = output.logits.iter().map(|l| l.size()[1]).collect();
    assert_eq!(sizes, [3, 13, 4, 3, 3, 4, 5, 6]);
    assert!(output.logits.iter().all(|l| l.kind() == Kind::Float));
    assert_eq!(output.value.size(), [2]);
    assert_eq!(output.hidden.c.size(), [1, 2, 512]);
}

#[test]
fn one_batched_forward_equals_per_environment_forwards() {
    let policy = policy(small(), 1);
    let network = policy.network();
    let batch = 4;
    let (obs, blueprints) = inputs(batch, 116, 0.3);
    let hidden = {
        let _turn = turn();
        LstmState {
            h: Tensor::randn([2, batch, 16], (Kind::Float, Device::Cpu)) * 0.5,
            c: Tensor::randn([2, batch, 16], (Kind::Float, Device::Cpu)) * 0.5,
        }
    };
    let masks = MaskTensors::allow_all(batch as usize, 3, Device::Cpu).expect("masks");
    let together = network
        .forward(&obs, &blueprints, &hidden, &masks)
        .expect("batch");
    for env in 0..batch {
        let one_masks = MaskTensors::allow_all(1, 3, Device::Cpu).expect("masks");
        let alone = network
            .forward(
                &obs.narrow(0, env, 1),
                &blueprints.narrow(0, env, 1),
                &hidden.select(env).expect("select"),
                &one_masks,
            )
            .expect("one");
        for head in 0..NUM_ACTION_HEADS {
            let diff = max_diff(
                &together.logits[head].narrow(0, env, 1),
                &alone.logits[head],
            );
            assert!(diff < 1e-5, "env {env} head {head}: {diff}");
        }
        assert!(max_diff(&together.value.narrow(0, env, 1), &alone.value) < 1e-5);
        assert!(max_diff(&together.hidden.h.narrow(1, env, 1), &alone.hidden.h) < 1e-5);
        assert!(max_diff(&together.hidden.c.narrow(1, env, 1), &alone.hidden.c) < 1e-5);
    }
}

#[test]
fn the_lstm_state_is_carried_across_calls() {
    let policy = policy(small(), 2);
    let network = policy.network();
    let (batch, steps) = (3_i64, 5_i64);
    let (obs, _) = inputs(batch * steps, 116, 1.1);
    let obs = obs.view([batch, steps, 116]);
    let blueprints: Vec<i64> = (0..batch * steps * 3).map(|i| (i * 7) % 14 - 1).collect();
    let blueprints = Tensor::from_slice(&blueprints).view([batch, steps, 3]);
    let start = network.initial_state(batch as usize).expect("hidden");
    let sequence = network
        .forward_sequence(&obs, &blueprints, &start)
        .expect("sequence");
    assert_eq!(sequence.logits[OP].size(), [batch, steps, 6]);
    assert_eq!(sequence.value.size(), [batch, steps]);

    let masks = MaskTensors::allow_all(batch as usize, 3, Device::Cpu).expect("masks");
    let mut hidden = start;
    let mut first_values = None;
    for step in 0..steps {
        let output = network
            .forward(
                &obs.select(1, step),
                &blueprints.select(1, step),
                &hidden,
                &masks,
            )
            .expect("step");
        for head in 0..NUM_ACTION_HEADS {
            let diff = max_diff(&output.logits[head], &sequence.logits[head].select(1, step));
            assert!(diff < 1e-5, "step {step} head {head}: {diff}");
        }
        if step == 0 {
            first_values = Some(output.value.shallow_clone());
        }
        hidden = output.hidden;
    }
    assert!(max_diff(&hidden.h, &sequence.hidden.h) < 1e-5);
    assert!(max_diff(&hidden.c, &sequence.hidden.c) < 1e-5);

    // The state matters: the first step's input again, from the final state.
    let again = network
        .forward(&obs.select(1, 0), &blueprints.select(1, 0), &hidden, &masks)
        .expect("again");
    let first = first_values.expect("first step");
    assert!(
        max_diff(&again.value, &first) > 1e-7,
        "a new state gives new outputs"
    );
}

#[test]
fn initialisation_follows_the_reference() {
    let config = PolicyConfig {
        lstm_layers: 2,
        ..small()
    };
    let policy = policy(config, 3);
    let network: &PolicyNetwork = policy.network();
    let gram_is = |weight: &Tensor, gain: f64| {
        // Orthogonal with gain g: rows (out <= in) satisfy W Wᵀ = g² I.
        let (rows, cols) = (weight.size()[0], weight.size()[1]);
        let gram = if rows <= cols {
            weight.matmul(&weight.tr())
        } else {
            weight.tr().matmul(weight)
        };
        let n = gram.size()[0];
        let eye = Tensor::eye(n, (Kind::Float, Device::Cpu)) * gain * gain;
        max_diff(&gram, &eye) < 1e-4 * gain.max(1e-2)
    };
    for head in 0..NUM_ACTION_HEADS {
        let weight = network.head_output_weight(head).expect("head");
        assert!(gram_is(weight, 0.01), "head {head} output gain 0.01");
    }
    assert!(gram_is(network.value_output_weight().expect("critic"), 0.1));
    let forget = 1.0 + 2.0_f64.ln();
    for layer in 0..2 {
        let [w_ih, w_hh, b_ih, b_hh] = network.lstm_parameters(layer).expect("layer");
        assert!(gram_is(w_ih, 1.0) && gram_is(w_hh, 1.0));
        for bias in [b_ih, b_hh] {
            let values = Vec::<f32>::try_from(bias).expect("bias");
            for (index, value) in values.iter().enumerate() {
                let want = if (16..32).contains(&index) {
                    forget
                } else {
                    0.0
                };
                assert!((f64::from(*value) - want).abs() < 1e-6, "bias {index}");
            }
        }
    }
    let embedding = network.blueprint_embedding();
    assert_eq!(embedding.size(), [14, 4]);
    let std = embedding.std(true).double_value(&[]);
    assert!(std > 0.005 && std < 0.05, "N(0, 0.02): std {std}");
}

#[test]
fn a_blueprint_index_outside_the_table_selects_the_null_entry() {
    let policy = policy(small(), 4);
    let network = policy.network();
    let (obs, _) = inputs(3, 116, 0.7);
    let hidden = network.initial_state(3).expect("hidden");
    let masks = MaskTensors::allow_all(3, 3, Device::Cpu).expect("masks");
    let run = |indices: &[i64]| {
        network
            .forward(
                &obs,
                &Tensor::from_slice(indices).view([3, 3]),
                &hidden,
                &masks,
            )
            .expect("forward")
            .value
    };
    let null = run(&[-1; 9]);
    assert!(max_diff(&run(&[13, -7, 99, -1, -1, -1, 500, -2, 14]), &null) < 1e-7);
    assert!(max_diff(&run(&[2, 2, 2, 2, 2, 2, 2, 2, 2]), &null) > 1e-7);
}

#[test]
fn masked_logits_carry_the_masked_value() {
    let policy = policy(small(), 5);
    let network = policy.network();
    let (obs, blueprints) = inputs(1, 116, 0.0);
    let hidden = network.initial_state(1).expect("hidden");
    let mut masks = MaskTensors::allow_all(1, 3, Device::Cpu).expect("masks");
    masks.heads[OP] = Tensor::from_slice(&[true, false, true, false, false, false]).view([1, 6]);
    let output = network
        .forward(&obs, &blueprints, &hidden, &masks)
        .expect("forward");
    let masked = output.masked_logits.expect("masked");
    let values = Vec::<f32>::try_from(masked[OP].view(-1)).expect("values");
    let raw = Vec::<f32>::try_from(output.logits[OP].view(-1)).expect("raw");
    for (index, (m, r)) in values.iter().zip(&raw).enumerate() {
        if [0, 2].contains(&index) {
            assert_eq!(m, r);
        } else {
            assert_eq!(*m, MASKED_LOGIT_VALUE as f32);
        }
    }

    // act: a batch of one, under the masks, without gradients.
    let mut sampler = Sampler::new(
        SamplingConfig {
            mode: SampleMode::Greedy,
            floors: None,
        },
        0,
        Device::Cpu,
    )
    .expect("sampler");
    let act = policy
        .act(&obs, &blueprints, &hidden, &masks, &mut sampler)
        .expect("act");
    let op = act.sample.actions.int64_value(&[0, OP as i64]);
    assert!([0, 2].contains(&op));
    assert!(!act.value.requires_grad());
}

#[test]
fn shapes_dtypes_and_sizes_are_checked_before_libtorch() {
    let policy = policy(small(), 6);
    let network = policy.network();
    let (obs, blueprints) = inputs(2, 116, 0.0);
    let hidden = network.initial_state(2).expect("hidden");
    let masks = MaskTensors::allow_all(2, 3, Device::Cpu).expect("masks");
    let shape_error =
        |result: tamiyo::Result<_>| matches!(result, Err(Error::ShapeMismatch { .. }));
    assert!(shape_error(network.forward(
        &obs.narrow(1, 0, 115),
        &blueprints,
        &hidden,
        &masks
    )));
    assert!(shape_error(network.forward(
        &obs.to_kind(Kind::Double),
        &blueprints,
        &hidden,
        &masks
    )));
    assert!(shape_error(network.forward(
        &obs,
        &blueprints.to_kind(Kind::Int),
        &hidden,
        &masks
    )));
    assert!(shape_error(network.forward(
        &obs,
        &blueprints.narrow(1, 0, 2),
        &hidden,
        &masks
    )));
    let one = network.initial_state(1).expect("hidden");
    assert!(shape_error(network.forward(
        &obs,
        &blueprints,
        &one,
        &masks
    )));
    let few = MaskTensors::allow_all(1, 3, Device::Cpu).expect("masks");
    assert!(shape_error(network.forward(
        &obs,
        &blueprints,
        &hidden,
        &few
    )));
    assert!(shape_error(network.forward(
        &obs.narrow(0, 0, 0),
        &blueprints.narrow(0, 0, 0),
        &hidden,
        &masks
    )));
    assert!(shape_error(network.forward_sequence(
        &obs,
        &blueprints,
        &hidden
    )));
    for bad in [
        PolicyConfig {
            num_slots: 0,
            ..small()
        },
        PolicyConfig {
            hidden_dim: 4,
            ..small()
        },
        PolicyConfig {
            feature_dim: 0,
            ..small()
        },
        PolicyConfig {
            lstm_layers: 0,
            ..small()
        },
    ] {
        assert!(matches!(
            Policy::new(bad, Device::Cpu),
            Err(Error::InvalidConfig { .. })
        ));
    }
    let json = serde_json::to_string(&small()).expect("json");
    assert_eq!(
        serde_json::from_str::<PolicyConfig>(&json).expect("parse"),
        small()
    );
}

#[test]
fn bf16_precision_runs_in_bf16_and_returns_fp32_close_to_fp32() {
    let config = small();
    let mut policy = policy(config, 11);
    assert_eq!(policy.network().precision(), PolicyPrecision::Fp32);
    let batch = 3;
    let (obs, blueprints) = inputs(batch, config.obs_dim() as i64, 0.2);
    let masks = MaskTensors::allow_all(batch as usize, 3, Device::Cpu).expect("masks");
    let hidden = policy
        .network()
        .initial_state(batch as usize)
        .expect("state");
    let fp32 = policy
        .network()
        .step(&obs, &blueprints, &hidden, &masks)
        .expect("fp32 step");
    policy.set_precision(PolicyPrecision::Bf16);
    assert_eq!(policy.network().precision(), PolicyPrecision::Bf16);
    let bf16 = policy
        .network()
        .step(&obs, &blueprints, &hidden, &masks)
        .expect("bf16 step");
    // Outputs and state leave in fp32, so sampling and the next step accept them.
    for (low, full) in bf16.logits.iter().zip(fp32.logits.iter()) {
        assert_eq!(low.kind(), Kind::Float);
        assert_eq!(low.size(), full.size());
        let diff = max_diff(low, full);
        // bf16 keeps 8 bits of mantissa: close, but not bitwise equal.
        assert!(diff < 0.05, "logits differ by {diff}");
    }
    assert_eq!(bf16.value.kind(), Kind::Float);
    assert_eq!(bf16.hidden.h.kind(), Kind::Float);
    assert_eq!(bf16.hidden.c.kind(), Kind::Float);
    assert!(max_diff(&bf16.value, &fp32.value) < 0.05);
    let differs = bf16
        .logits
        .iter()
        .zip(fp32.logits.iter())
        .any(|(low, full)| max_diff(low, full) > 0.0);
    assert!(differs, "bf16 autocast changed no logit: it did not run");
    // The state feeds the next step unchanged.
    policy
        .network()
        .step(&obs, &blueprints, &bf16.hidden, &masks)
        .expect("second bf16 step");

    // The PPO update's unroll: gradients reach every parameter, finite.
    let steps = 4;
    let seq_obs = obs.unsqueeze(1).repeat([1, steps, 1]);
    let seq_blueprints = blueprints.unsqueeze(1).repeat([1, steps, 1]);
    let unrolled = policy
        .network()
        .forward_sequence(&seq_obs, &seq_blueprints, &hidden)
        .expect("bf16 unroll");
    assert_eq!(unrolled.value.kind(), Kind::Float);
    let loss = unrolled.value.square().mean(Kind::Float)
        + unrolled
            .logits
            .iter()
            .map(|l| l.square().mean(Kind::Float))
            .fold(Tensor::from(0.0f32), |a, b| a + b);
    loss.backward();
    let mut with_grad = 0;
    for variable in policy.var_store().trainable_variables() {
        let grad = variable.grad();
        if grad.defined() {
            assert_eq!(grad.kind(), Kind::Float);
            let finite = grad.isfinite().all().int64_value(&[]);
            assert_eq!(finite, 1, "a non-finite gradient");
            with_grad += 1;
        }
    }
    assert!(with_grad > 10, "only {with_grad} parameters got gradients");
}

#[test]
fn the_cpu_bf16_lstm_probe_is_cached_and_explains_a_fallback() {
    let supported = cpu_bf16_lstm_supported();
    assert_eq!(cpu_bf16_lstm_supported(), supported, "probed once, cached");
    let reason = cpu_bf16_lstm_fallback_reason();
    assert_eq!(reason.is_none(), supported);
    if let Some(reason) = reason {
        eprintln!("this CPU runs the policy's LSTM in full precision under bf16: {reason}");
        assert!(!reason.is_empty());
    }
}

#[test]
fn where_onednn_has_a_bf16_lstm_the_lstm_itself_runs_in_bf16() {
    if !cpu_bf16_lstm_supported() {
        eprintln!(
            "skipped: oneDNN has no bf16 LSTM on this CPU (needs AVX-512): {}",
            cpu_bf16_lstm_fallback_reason().unwrap_or_default()
        );
        return;
    }
    // A raw LSTM under CPU bf16 autocast comes out in bf16: the policy's
    // bf16 forward really runs its LSTM in bf16 on such a CPU.
    let x = Tensor::ones([1, 2, 8], (Kind::Float, Device::Cpu));
    let state = Tensor::zeros([1, 1, 8], (Kind::Float, Device::Cpu));
    let weight = Tensor::full([32, 8], 0.1, (Kind::Float, Device::Cpu));
    let bias = Tensor::zeros([32], (Kind::Float, Device::Cpu));
    let _autocast =
        torch_ext::AutocastGuard::with_cache(torch_ext::AutocastDevice::Cpu, Kind::BFloat16, false)
            .expect("autocast");
    let (output, _, _) = x.lstm(
        &[&state, &state],
        &[&weight, &weight, &bias, &bias],
        true,
        1,
        0.0,
        false,
        false,
        true,
    );
    assert_eq!(output.kind(), Kind::BFloat16);
}

#[test]
fn auxiliary_heads_have_their_shapes_and_gradient_paths() {
    // Wide enough that no random initialisation leaves a head's narrow
    // ReLU layers dead for every input: the Q head's last hidden layer is
    // hidden/8 = 32 units wide (the tests share libtorch's generator across
    // threads, so the draw is not fixed; with 2 units, about a quarter of
    // the draws left Q constant).
    let config = PolicyConfig {
        hidden_dim: 256,
        ..small()
    };
    let policy = policy(config, 13);
    let network = policy.network();
    let (batch, steps) = (2_i64, 5_i64);
    let (obs, blueprints) = inputs(batch * steps, config.obs_dim() as i64, 0.4);
    let obs = obs.view([batch, steps, -1]);
    let blueprints = blueprints.view([batch, steps, 3]);
    let hidden = network.initial_state(batch as usize).expect("state");
    let output = network
        .forward_sequence(&obs, &blueprints, &hidden)
        .expect("unroll");
    let features = output
        .features
        .as_ref()
        .expect("forward_sequence returns the trunk");
    assert_eq!(features.size(), [batch, steps, config.hidden_dim]);
    let step = network
        .step(
            &obs.select(1, 0),
            &blueprints.select(1, 0),
            &hidden,
            &MaskTensors::allow_all(batch as usize, 3, Device::Cpu).expect("masks"),
        )
        .expect("step");
    assert!(
        step.features.is_none(),
        "acting never computes the auxiliary heads"
    );

    let ops = Tensor::from_slice(&[0_i64, 1, 2, 3, 4, 5, 0, 1, 2, 3]).view([batch, steps]);
    let aux = network.auxiliary(features, &ops, false).expect("auxiliary");
    assert_eq!(aux.q.size(), [batch, steps]);
    assert_eq!(aux.contribution.size(), [batch, steps, 3]);
    assert_eq!(aux.q.kind(), Kind::Float);
    // Without dropout the predictor is deterministic; with it, it is not.
    let again = network.auxiliary(features, &ops, false).expect("auxiliary");
    assert!(aux.contribution.equal(&again.contribution));
    // Q depends on the op taken.
    let other = network
        .auxiliary(features, &ops.ones_like(), false)
        .expect("auxiliary");
    assert!(max_diff(&aux.q, &other.q) > 0.0, "Q ignores the op");

    // Q's loss does not reach the trunk; the predictor's does.
    let trunk = network.lstm_parameters(0).expect("lstm layer")[0].shallow_clone();
    aux.q.sum(Kind::Float).backward();
    let q_grad = trunk.grad();
    assert!(
        !q_grad.defined() || q_grad.abs().sum(Kind::Float).double_value(&[]) == 0.0,
        "the Q head's loss reached the LSTM"
    );
    let output = network
        .forward_sequence(&obs, &blueprints, &hidden)
        .expect("unroll");
    let aux = {
        // Dropout draws from the shared generator.
        let _turn = turn();
        network
            .auxiliary(output.features.as_ref().expect("trunk"), &ops, true)
            .expect("auxiliary")
    };
    aux.contribution.sum(Kind::Float).backward();
    let grad = trunk.grad();
    assert!(
        grad.defined(),
        "the predictor's loss did not reach the LSTM"
    );
    assert!(grad.abs().sum(Kind::Float).double_value(&[]) > 0.0);

    // Bad inputs are refused before libtorch.
    assert!(
        network
            .auxiliary(&features.narrow(2, 0, 3), &ops, false)
            .is_err()
    );
    assert!(
        network
            .auxiliary(features, &ops.to_kind(Kind::Float), false)
            .is_err()
    );
}
