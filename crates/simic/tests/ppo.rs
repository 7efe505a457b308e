//! The PPO update: the loss against values computed by hand in f64 (two
//! heads, head relevance, a forced step, value clipping, the entropy floor),
//! the auxiliary heads' terms and the contribution coefficient's warm-up,
//! the value normaliser, the KL early stop, minibatch shuffling, that
//! updates reduce the loss on a fixed batch, and the imitation objective.

use simic::Error;
use simic::ppo::{
    AuxiliaryEvaluation, Evaluation, HeadCoefficients, LossScalars, PpoBatch, PpoConfig,
    PpoTrainer, ValueNormaliser, ValueNormaliserConfig, ppo_loss,
};
use tch::{Device, Kind, Tensor, nn};

const R: usize = 2;
const T: usize = 2;
const H: usize = 2;

/// A small hand-made case, `[R][T][H]` and `[R][T]` in f64.
struct Case {
    old_lp: [[[f64; H]; T]; R],
    new_lp: [[[f64; H]; T]; R],
    entropies: [[[f64; H]; T]; R],
    head_weights: [[[f64; H]; T]; R],
    advantages: [[f64; T]; R],
    returns: [[f64; T]; R],
    old_values: [[f64; T]; R],
    values: [[f64; T]; R],
    actor_weight: [[f64; T]; R],
    value_weight: [[f64; T]; R],
}

fn case() -> Case {
    Case {
        old_lp: [[[-0.5, -1.0], [-0.7, -0.2]], [[-1.2, -0.3], [-0.9, -2.0]]],
        // Log-ratios 0.1, −0.3, 0.5, 0.0, −0.05, 0.25, 0.0, 0.4.
        new_lp: [[[-0.4, -1.3], [-0.2, -0.2]], [[-1.25, -0.05], [-0.9, -1.6]]],
        entropies: [[[0.6, 0.2], [0.5, 0.1]], [[0.7, 0.3], [0.4, 0.05]]],
        head_weights: [[[1.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 1.0]]],
        advantages: [[1.0, -2.0], [0.5, 3.0]],
        returns: [[1.0, 2.0], [0.0, -1.0]],
        old_values: [[0.8, 2.5], [0.3, -1.0]],
        values: [[1.5, 1.9], [-0.4, 0.2]],
        // The last step is forced: no actor weight, value weight 0.2.
        actor_weight: [[1.0, 1.0], [1.0, 0.0]],
        value_weight: [[1.0, 1.0], [1.0, 0.2]],
    }
}

fn t3(x: &[[[f64; H]; T]; R]) -> Tensor {
    let flat: Vec<f32> = x.iter().flatten().flatten().map(|v| *v as f32).collect();
    Tensor::from_slice(&flat).view([R as i64, T as i64, H as i64])
}

fn t2(x: &[[f64; T]; R]) -> Tensor {
    let flat: Vec<f32> = x.iter().flatten().map(|v| *v as f32).collect();
    Tensor::from_slice(&flat).view([R as i64, T as i64])
}

fn scalar(t: &Tensor) -> f64 {
    t.double_value(&[])
}

/// The loss of `case` written out in f64, term by term, as the module
/// documents it.
struct Expected {
    policy: f64,
    value: f64,
    head_entropies: [f64; H],
    bonus: f64,
    penalty: f64,
    total: f64,
    kl: f64,
    clip_fraction: f64,
}

// Index loops mirror the formulas' subscripts.
#[allow(clippy::needless_range_loop)]
fn expected(
    c: &Case,
    multipliers: [f64; H],
    floors: [f64; H],
    floor_coefs: [f64; H],
    s: &LossScalars,
) -> Expected {
    let mut policy = 0.0;
    let mut head_entropies = [0.0; H];
    for h in 0..H {
        let (mut num, mut ent, mut den) = (0.0, 0.0, 0.0);
        for r in 0..R {
            for t in 0..T {
                let w = c.head_weights[r][t][h] * c.actor_weight[r][t];
                let ratio = (c.new_lp[r][t][h] - c.old_lp[r][t][h]).exp();
                let a = c.advantages[r][t];
                let clipped = ratio.clamp(1.0 - s.clip, 1.0 + s.clip);
                num += w * (ratio * a).min(clipped * a);
                ent += w * c.entropies[r][t][h];
                den += w;
            }
        }
        policy -= num / den;
        head_entropies[h] = ent / den;
    }
    let (mut err, mut vden) = (0.0, 0.0);
    for r in 0..R {
        for t in 0..T {
            let v = c.values[r][t];
            let ret = c.returns[r][t];
            let mut e = (v - ret).powi(2);
            if let Some(k) = s.value_clip {
                let old = c.old_values[r][t];
                let vc = old + (v - old).clamp(-k, k);
                e = e.max((vc - ret).powi(2));
            }
            err += c.value_weight[r][t] * e;
            vden += c.value_weight[r][t];
        }
    }
    let value = 0.5 * err / vden;
    let bonus: f64 = (0..H).map(|h| multipliers[h] * head_entropies[h]).sum();
    let penalty: f64 = s.floor_scale
        * (0..H)
            .map(|h| floor_coefs[h] * (floors[h] - head_entropies[h]).max(0.0).powi(2))
            .sum::<f64>();
    let total = policy + s.value_coef * value - s.entropy_coef * bonus + penalty;
    let (mut kl, mut clipped, mut aden) = (0.0, 0.0, 0.0);
    for r in 0..R {
        for t in 0..T {
            let joint: f64 = (0..H)
                .map(|h| c.head_weights[r][t][h] * (c.new_lp[r][t][h] - c.old_lp[r][t][h]))
                .sum();
            let a = c.actor_weight[r][t];
            kl += a * ((joint.exp() - 1.0) - joint);
            clipped += a * f64::from(u8::from((joint.exp() - 1.0).abs() > s.clip));
            aden += a;
        }
    }
    Expected {
        policy,
        value,
        head_entropies,
        bonus,
        penalty,
        total,
        kl: kl / aden,
        clip_fraction: clipped / aden,
    }
}

fn batch_of(c: &Case) -> PpoBatch {
    PpoBatch {
        log_probs: t3(&c.old_lp),
        advantages: t2(&c.advantages),
        returns: t2(&c.returns),
        old_values: t2(&c.old_values),
        head_weights: t3(&c.head_weights),
        actor_weight: t2(&c.actor_weight),
        value_weight: t2(&c.value_weight),
    }
}

fn check_loss(value_clip: Option<f64>) {
    let c = case();
    let multipliers = [1.0, 1.3];
    let floors = [0.3, 0.25];
    let floor_coefs = [0.3, 0.1];
    let config = PpoConfig {
        head_entropy_multipliers: multipliers.to_vec(),
        entropy_floors: floors.to_vec(),
        entropy_floor_coefs: floor_coefs.to_vec(),
        ..PpoConfig::default()
    };
    let coefficients = HeadCoefficients::new(&config, Device::Cpu).unwrap();
    let scalars = LossScalars {
        clip: 0.2,
        value_coef: 0.5,
        value_clip,
        entropy_coef: 0.05,
        floor_scale: 1.5,
        contribution_coef: 0.0,
        objective: simic::ppo::Objective::Ppo,
    };
    let new_lp = t3(&c.new_lp).set_requires_grad(true);
    let evaluation = Evaluation {
        anchor: None,
        log_probs: new_lp.shallow_clone(),
        entropies: t3(&c.entropies),
        values: t2(&c.values),
        auxiliary: None,
    };
    let terms = ppo_loss(&batch_of(&c), &evaluation, &coefficients, &scalars).unwrap();
    let e = expected(&c, multipliers, floors, floor_coefs, &scalars);
    let close = |got: f64, want: f64, what: &str| {
        assert!((got - want).abs() < 1e-5, "{what}: {got} vs {want}");
    };
    close(scalar(&terms.policy), e.policy, "policy");
    close(scalar(&terms.value), e.value, "value");
    close(scalar(&terms.entropy_bonus), e.bonus, "bonus");
    close(scalar(&terms.floor_penalty), e.penalty, "penalty");
    close(scalar(&terms.total), e.total, "total");
    close(scalar(&terms.approx_kl), e.kl, "kl");
    // Joint log-ratios of the acting samples: −0.2, 0.5, −0.05; the forced
    // step's 0.4 has no actor weight and is left out.
    close(scalar(&terms.log_ratio_max), 0.5, "log ratio max");
    close(scalar(&terms.log_ratio_min), -0.2, "log ratio min");
    close(
        scalar(&terms.clip_fraction),
        e.clip_fraction,
        "clip fraction",
    );
    let heads = Vec::<f64>::try_from(terms.head_entropies.to_kind(Kind::Double)).unwrap();
    close(heads[0], e.head_entropies[0], "entropy head 0");
    close(heads[1], e.head_entropies[1], "entropy head 1");
    // The case exercises what it should: head 1 is below its floor, head 0
    // is not; some ratio is clipped.
    assert!(e.head_entropies[1] < floors[1] && e.head_entropies[0] > floors[0]);
    assert!(e.penalty > 0.0 && e.clip_fraction > 0.0);
    // Only the total carries gradient, and it reaches the log-probs.
    terms.total.backward();
    let grad = new_lp.grad();
    assert!(scalar(&grad.abs().sum(Kind::Float)) > 0.0);
    // Steps and heads without weight get no gradient.
    assert_eq!(scalar(&grad.get(1).get(1).abs().sum(Kind::Float)), 0.0);
    assert_eq!(scalar(&grad.get(0).get(1).get(1)), 0.0);
}

#[test]
fn loss_matches_hand_computation() {
    check_loss(None);
}

#[test]
fn loss_matches_hand_computation_with_value_clipping() {
    check_loss(Some(0.2));
}

/// Under the imitation objective the policy term is the negative
/// log-likelihood of the batch's actions, per head over the samples where
/// the head mattered (`w_h = h·a`), summed over heads: by hand, and blind to
/// the advantages and the stored log-probabilities; the other terms are
/// PPO's.
#[test]
fn the_imitation_objective_is_the_weighted_negative_log_likelihood() {
    let c = case();
    let config = PpoConfig {
        head_entropy_multipliers: vec![1.0, 1.3],
        entropy_floors: vec![0.3, 0.25],
        entropy_floor_coefs: vec![0.3, 0.1],
        ..PpoConfig::default()
    };
    let coefficients = HeadCoefficients::new(&config, Device::Cpu).unwrap();
    let scalars = |objective| LossScalars {
        clip: 0.2,
        value_coef: 0.5,
        value_clip: None,
        entropy_coef: 0.05,
        floor_scale: 1.5,
        contribution_coef: 0.0,
        objective,
    };
    let evaluation = Evaluation {
        anchor: None,
        log_probs: t3(&c.new_lp),
        entropies: t3(&c.entropies),
        values: t2(&c.values),
        auxiliary: None,
    };
    let imitation = scalars(simic::ppo::Objective::Imitation { epochs: 1 });
    let terms = ppo_loss(&batch_of(&c), &evaluation, &coefficients, &imitation).unwrap();
    let mut nll = 0.0;
    for head in 0..H {
        let (mut sum, mut weight) = (0.0, 0.0);
        for r in 0..R {
            for t in 0..T {
                let w = c.head_weights[r][t][head] * c.actor_weight[r][t];
                sum += w * c.new_lp[r][t][head];
                weight += w;
            }
        }
        if weight > 0.0 {
            nll -= sum / weight;
        }
    }
    assert!(
        (scalar(&terms.policy) - nll).abs() < 1e-5,
        "{} vs {nll}",
        scalar(&terms.policy)
    );
    // The value, bonus and penalty are PPO's.
    let ppo = ppo_loss(
        &batch_of(&c),
        &evaluation,
        &coefficients,
        &scalars(simic::ppo::Objective::Ppo),
    )
    .unwrap();
    for (got, want) in [
        (&terms.value, &ppo.value),
        (&terms.entropy_bonus, &ppo.entropy_bonus),
        (&terms.floor_penalty, &ppo.floor_penalty),
    ] {
        assert!((scalar(got) - scalar(want)).abs() < 1e-6);
    }
    // Other advantages and stored log-probabilities change nothing.
    let mut other = c;
    other.advantages = [[5.0, -3.0], [0.7, 2.0]];
    other.old_lp = [[[-3.0, -0.1], [-0.2, -2.0]], [[-1.0, -1.0], [-0.5, -4.0]]];
    let moved = ppo_loss(&batch_of(&other), &evaluation, &coefficients, &imitation).unwrap();
    assert!((scalar(&moved.policy) - nll).abs() < 1e-5);
    assert!(
        (scalar(&ppo.policy) - nll).abs() > 1e-3,
        "the case tells the two apart"
    );
}

/// Multipliers 1 and no floors on every head, no entropy bonus, clip 0.2,
/// `c_v` 0.5, the contribution term at `contribution_coef`.
fn plain_loss_setup(contribution_coef: f64) -> (HeadCoefficients, LossScalars) {
    let config = PpoConfig {
        head_entropy_multipliers: vec![1.0; H],
        entropy_floors: vec![0.0; H],
        entropy_floor_coefs: vec![0.0; H],
        ..PpoConfig::default()
    };
    let coefficients = HeadCoefficients::new(&config, Device::Cpu).unwrap();
    let scalars = LossScalars {
        clip: 0.2,
        value_coef: 0.5,
        value_clip: None,
        entropy_coef: 0.0,
        floor_scale: 1.0,
        contribution_coef,
        objective: simic::ppo::Objective::Ppo,
    };
    (coefficients, scalars)
}

#[test]
fn loss_refuses_mismatched_evaluation() {
    let c = case();
    let (coefficients, scalars) = plain_loss_setup(0.0);
    let evaluation = Evaluation {
        anchor: None,
        log_probs: t3(&c.new_lp),
        entropies: t3(&c.entropies),
        values: t2(&c.values).view([-1]),
        auxiliary: None,
    };
    assert!(matches!(
        ppo_loss(&batch_of(&c), &evaluation, &coefficients, &scalars),
        Err(Error::ShapeMismatch {
            what: "Evaluation.values",
            ..
        })
    ));
}

/// The auxiliary heads' terms against hand-computed values: the Q loss is
/// the value loss's form (`0.5·⟨(Q − R)²⟩_c`, scaled by `c_v` in the
/// total), the contribution loss the masked MSE against targets clipped to
/// ±10 (scaled by its coefficient); both move the total by exactly that.
#[test]
#[allow(clippy::needless_range_loop)] // Indices read as the formula's.
fn auxiliary_terms_match_hand_computation() {
    let c = case();
    let (coefficients, scalars) = plain_loss_setup(0.05);
    let plain = Evaluation {
        anchor: None,
        log_probs: t3(&c.new_lp),
        entropies: t3(&c.entropies),
        values: t2(&c.values),
        auxiliary: None,
    };
    let q = [[0.5, 2.0], [1.0, -1.5]];
    // Two slots; the second step of row 1 measured nothing; one target is
    // beyond the clip.
    let prediction = [[[1.0, 0.0], [2.0, -1.0]], [[0.5, 0.5], [9.0, 9.0]]];
    let target = [[[3.0, 0.0], [2.0, 25.0]], [[0.0, -0.5], [0.0, 0.0]]];
    let mask = [[[1.0, 0.0], [1.0, 1.0]], [[1.0, 1.0], [0.0, 0.0]]];
    let t3s = |x: &[[[f64; 2]; T]; R]| t3(x);
    let q_pred = t2(&q).set_requires_grad(true);
    let contribution = t3s(&prediction).set_requires_grad(true);
    let with_aux = Evaluation {
        anchor: None,
        log_probs: t3(&c.new_lp),
        entropies: t3(&c.entropies),
        values: t2(&c.values),
        auxiliary: Some(AuxiliaryEvaluation {
            q: q_pred.shallow_clone(),
            contribution: contribution.shallow_clone(),
            contribution_target: t3s(&target),
            contribution_mask: t3s(&mask),
        }),
    };
    let batch = batch_of(&c);
    let base = ppo_loss(&batch, &plain, &coefficients, &scalars).unwrap();
    let terms = ppo_loss(&batch, &with_aux, &coefficients, &scalars).unwrap();
    assert_eq!(scalar(&base.q), 0.0);
    assert_eq!(scalar(&base.contribution), 0.0);
    // Q: weights 1, 1, 1, 0.2.
    let mut num = 0.0;
    let mut den = 0.0;
    for r in 0..R {
        for t in 0..T {
            num += c.value_weight[r][t] * (q[r][t] - c.returns[r][t]).powi(2);
            den += c.value_weight[r][t];
        }
    }
    let want_q = 0.5 * num / den;
    // Contributions: the measured cells only, the 25 clipped to 10.
    let mut num = 0.0;
    let mut den = 0.0;
    for r in 0..R {
        for t in 0..T {
            for s in 0..2 {
                let y: f64 = target[r][t][s];
                let y = y.clamp(-10.0, 10.0);
                num += mask[r][t][s] * (prediction[r][t][s] - y).powi(2);
                den += mask[r][t][s];
            }
        }
    }
    let want_contribution = num / den;
    let close = |got: f64, want: f64, what: &str| {
        assert!((got - want).abs() < 1e-5, "{what}: {got} vs {want}");
    };
    close(scalar(&terms.q), want_q, "q");
    close(
        scalar(&terms.contribution),
        want_contribution,
        "contribution",
    );
    close(
        scalar(&terms.total) - scalar(&base.total),
        0.5 * want_q + 0.05 * want_contribution,
        "total",
    );
    terms.total.backward();
    assert!(scalar(&q_pred.grad().abs().sum(Kind::Float)) > 0.0);
    let grad = contribution.grad();
    // Unmeasured cells get no gradient.
    assert_eq!(scalar(&grad.get(1).get(1).abs().sum(Kind::Float)), 0.0);
    assert_eq!(scalar(&grad.get(0).get(0).get(1)), 0.0);
    assert!(scalar(&grad.abs().sum(Kind::Float)) > 0.0);

    // A shape that does not fit is refused.
    let bad = Evaluation {
        anchor: None,
        log_probs: t3(&c.new_lp),
        entropies: t3(&c.entropies),
        values: t2(&c.values),
        auxiliary: Some(AuxiliaryEvaluation {
            q: t2(&q).view([-1]),
            contribution: t3s(&prediction),
            contribution_target: t3s(&target),
            contribution_mask: t3s(&mask),
        }),
    };
    assert!(matches!(
        ppo_loss(&batch, &bad, &coefficients, &scalars),
        Err(Error::ShapeMismatch {
            what: "AuxiliaryEvaluation.q",
            ..
        })
    ));
}

#[test]
fn explained_variance_matches_hand_computation() {
    let c = case();
    let cells: Vec<(f64, f64)> = (0..R)
        .flat_map(|r| (0..T).map(move |t| (r, t)))
        .map(|(r, t)| (c.returns[r][t], c.old_values[r][t]))
        .collect();
    let variance = |xs: &[f64]| {
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64
    };
    let returns: Vec<f64> = cells.iter().map(|(ret, _)| *ret).collect();
    let residual: Vec<f64> = cells.iter().map(|(ret, value)| ret - value).collect();
    let want = 1.0 - variance(&residual) / variance(&returns);
    let got = scalar(&batch_of(&c).explained_variance().unwrap());
    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    assert!(
        got > 0.5 && got < 1.0,
        "the case's values explain most of it: {got}"
    );
}

#[test]
fn the_contribution_coefficient_warms_up_over_transitions() {
    let config = PpoConfig::default();
    assert_eq!(config.contribution_coef_at(0, 100), 0.0);
    assert!((config.contribution_coef_at(5, 100) - 0.025).abs() < 1e-12);
    assert!((config.contribution_coef_at(10, 100) - 0.05).abs() < 1e-12);
    assert!((config.contribution_coef_at(50, 100) - 0.05).abs() < 1e-12);
    let no_warmup = PpoConfig {
        contribution_aux_warmup: 0,
        ..PpoConfig::default()
    };
    assert_eq!(no_warmup.contribution_coef_at(0, 100), 0.05);
    let negative = PpoConfig {
        contribution_aux_coef: -1.0,
        ..PpoConfig::default()
    };
    assert!(negative.validate().is_err());
}

#[test]
fn value_normaliser_first_update_then_ema() {
    let mut normaliser =
        ValueNormaliser::new(ValueNormaliserConfig::default(), Device::Cpu).unwrap();
    // First batch: mean 2, population variance 1 (values 1 and 3); the
    // padded 100 has weight 0.
    let returns = Tensor::from_slice(&[1.0_f32, 3.0, 100.0]);
    let weights = Tensor::from_slice(&[1.0_f32, 1.0, 0.0]);
    normaliser.update(&returns, Some(&weights)).unwrap();
    let state = normaliser.state().unwrap();
    assert!((state.mean - 2.0).abs() < 1e-6 && (state.var - 1.0).abs() < 1e-6);
    // Second batch: mean 4, variance 4 (values 2 and 6):
    // mean' = 0.99·2 + 0.01·4 = 2.02
    // var'  = 0.99·1 + 0.01·4 + 0.99·0.01·(2 − 4)² = 1.0696
    normaliser
        .update(&Tensor::from_slice(&[2.0_f32, 6.0]), None)
        .unwrap();
    let state = normaliser.state().unwrap();
    assert!((state.mean - 2.02).abs() < 1e-6, "{state:?}");
    assert!((state.var - 1.0696).abs() < 1e-6, "{state:?}");
    assert_eq!(state.updates, 2);
    // normalise / denormalise are inverse, and normalise is (x − mean)/std.
    let x = Tensor::from_slice(&[0.0_f32, 2.02, 5.0]);
    let normalised = normaliser.normalise(&x).unwrap();
    let back = normaliser.denormalise(&normalised).unwrap();
    assert!(scalar(&(back - &x).abs().max()) < 1e-5);
    let expected = (5.0 - 2.02) / (1.0696_f64 + 1e-8).sqrt();
    assert!((normalised.double_value(&[2]) - expected).abs() < 1e-5);
    // All-zero weights leave the state as it was.
    normaliser
        .update(&x, Some(&Tensor::zeros([3], (Kind::Float, Device::Cpu))))
        .unwrap();
    let after = normaliser.state().unwrap();
    assert_eq!((after.mean, after.var), (state.mean, state.var));
    // The serde state round-trips.
    let json = serde_json::to_string(&after).unwrap();
    let restored =
        ValueNormaliser::from_state(&serde_json::from_str(&json).unwrap(), Device::Cpu).unwrap();
    assert_eq!(restored.state().unwrap(), after);
    assert!(
        ValueNormaliser::from_state(
            &simic::ppo::ValueNormaliserState { var: -1.0, ..after },
            Device::Cpu
        )
        .is_err()
    );
}

/// A tiny two-head policy over fixed features: logits of head `h` are
/// `x·W_h` (3 options each), the value `x·w`.
struct TinyPolicy {
    vs: nn::VarStore,
    heads: Vec<Tensor>,
    value: Tensor,
    features: Tensor,
    actions: Tensor,
}

/// Runs `draw` right after seeding libtorch's global generator, holding a
/// lock so tests running in parallel do not interleave their draws.
fn seeded<T>(seed: i64, draw: impl FnOnce() -> T) -> T {
    static SEEDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = SEEDING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    tch::manual_seed(seed);
    draw()
}

const FEATURES: i64 = 5;
const OPTIONS: i64 = 3;

impl TinyPolicy {
    fn new(rows: i64, steps: i64, seed: i64) -> TinyPolicy {
        seeded(seed, || TinyPolicy::draw(rows, steps))
    }

    fn draw(rows: i64, steps: i64) -> TinyPolicy {
        let vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let heads = (0..H)
            .map(|h| root.randn(&format!("head{h}"), &[FEATURES, OPTIONS], 0.0, 0.3))
            .collect();
        let value = root.randn("value", &[FEATURES], 0.0, 0.3);
        let features = Tensor::randn([rows, steps, FEATURES], (Kind::Float, Device::Cpu));
        let actions = Tensor::randint(OPTIONS, [rows, steps, H as i64], (Kind::Int64, Device::Cpu));
        TinyPolicy {
            vs,
            heads,
            value,
            features,
            actions,
        }
    }

    fn evaluate(&self, rows: &Tensor) -> simic::Result<Evaluation> {
        let x = self.features.index_select(0, rows);
        let actions = self.actions.index_select(0, rows);
        let mut log_probs = Vec::new();
        let mut entropies = Vec::new();
        for (h, weight) in self.heads.iter().enumerate() {
            let logits = x.matmul(weight);
            let log_softmax = logits.log_softmax(-1, Kind::Float);
            let action = actions.select(2, h as i64).unsqueeze(-1);
            log_probs.push(log_softmax.gather(-1, &action, false).squeeze_dim(-1));
            entropies.push(-(log_softmax.exp() * &log_softmax).sum_dim_intlist(
                -1,
                false,
                Kind::Float,
            ));
        }
        Ok(Evaluation {
            anchor: None,
            log_probs: Tensor::stack(&log_probs, -1),
            entropies: Tensor::stack(&entropies, -1),
            values: x.matmul(&self.value),
            auxiliary: None,
        })
    }

    /// A batch as the rollout would store it: the current log-probs and
    /// values, seeded advantages and returns.
    fn batch(&self) -> PpoBatch {
        seeded(self.features.size()[0], || self.draw_batch())
    }

    fn draw_batch(&self) -> PpoBatch {
        let rows = self.features.size()[0];
        let steps = self.features.size()[1];
        let all = Tensor::arange(rows, (Kind::Int64, Device::Cpu));
        let now = tch::no_grad(|| self.evaluate(&all).unwrap());
        PpoBatch {
            log_probs: now.log_probs.detach(),
            advantages: Tensor::randn([rows, steps], (Kind::Float, Device::Cpu)),
            returns: Tensor::randn([rows, steps], (Kind::Float, Device::Cpu)),
            old_values: now.values.detach(),
            head_weights: Tensor::ones([rows, steps, H as i64], (Kind::Float, Device::Cpu)),
            actor_weight: Tensor::ones([rows, steps], (Kind::Float, Device::Cpu)),
            value_weight: Tensor::ones([rows, steps], (Kind::Float, Device::Cpu)),
        }
    }
}

fn two_head_config() -> PpoConfig {
    PpoConfig {
        head_entropy_multipliers: vec![1.0; H],
        entropy_floors: vec![0.0; H],
        entropy_floor_coefs: vec![0.0; H],
        value_warmup_updates: 0,
        ..PpoConfig::default()
    }
}

fn parameters_snapshot(policy: &TinyPolicy) -> Vec<Tensor> {
    policy
        .vs
        .trainable_variables()
        .iter()
        .map(|p| p.detach().copy())
        .collect()
}

#[test]
fn kl_check_skips_the_step_when_the_policy_already_drifted() {
    let policy = TinyPolicy::new(8, 3, 1);
    let batch = policy.batch();
    let mut trainer = PpoTrainer::new(
        policy.vs.trainable_variables(),
        two_head_config(),
        Device::Cpu,
    )
    .unwrap();
    let before = parameters_snapshot(&policy);
    // The evaluation is shifted by 0.3 nats per head: joint log-ratio 0.6,
    // KL = e^0.6 − 1 − 0.6 ≈ 0.222 > 1.5 · 0.015.
    let stats = trainer
        .update(&batch, |rows| {
            let e = policy.evaluate(rows)?;
            Ok(Evaluation {
                anchor: None,
                log_probs: e.log_probs + 0.3,
                ..e
            })
        })
        .unwrap();
    assert!(stats.early_stopped);
    assert_eq!((stats.epochs_run, stats.steps), (0, 0));
    assert!(
        (stats.approx_kl - (0.6_f64.exp() - 1.6)).abs() < 1e-5,
        "{stats:?}"
    );
    for (a, b) in before.iter().zip(policy.vs.trainable_variables()) {
        assert!(a.equal(&b), "a parameter moved without a step");
    }
}

#[test]
fn kl_check_stops_after_the_epoch_that_moved_too_far() {
    let policy = TinyPolicy::new(16, 2, 2);
    let batch = policy.batch();
    let config = PpoConfig {
        learning_rate: 0.05,
        epochs: 6,
        minibatches: 2,
        target_kl: Some(1e-4),
        ..two_head_config()
    };
    let mut trainer =
        PpoTrainer::new(policy.vs.trainable_variables(), config, Device::Cpu).unwrap();
    let stats = trainer
        .update(&batch, |rows| policy.evaluate(rows))
        .unwrap();
    // Epoch 0 starts from the rollout policy (KL 0) and takes both steps;
    // a learning rate of 0.05 moves it well past 1.5e-4 before epoch 1.
    assert!(stats.early_stopped, "{stats:?}");
    assert_eq!((stats.epochs_run, stats.steps), (1, 2));
    assert!(stats.approx_kl > 0.0);

    // Without a target every epoch runs.
    let policy = TinyPolicy::new(16, 2, 2);
    let batch = policy.batch();
    let config = PpoConfig {
        learning_rate: 0.05,
        epochs: 6,
        minibatches: 2,
        target_kl: None,
        ..two_head_config()
    };
    let mut trainer =
        PpoTrainer::new(policy.vs.trainable_variables(), config, Device::Cpu).unwrap();
    let stats = trainer
        .update(&batch, |rows| policy.evaluate(rows))
        .unwrap();
    assert!(!stats.early_stopped);
    assert_eq!((stats.epochs_run, stats.steps), (6, 12));
}

#[test]
fn value_std_matches_hand_computation() {
    let c = case();
    // Every step has a critic weight (the forced one 0.2).
    let values: Vec<f64> = c.old_values.iter().flatten().copied().collect();
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let want =
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64).sqrt();
    let got = scalar(&batch_of(&c).value_std().unwrap());
    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
}

/// A 32-row tiny policy, its batch, and a trainer without the KL check.
fn tiny_trainer(
    learning_rate: f64,
    epochs: usize,
    minibatches: usize,
) -> (TinyPolicy, PpoBatch, PpoTrainer) {
    let policy = TinyPolicy::new(32, 4, 3);
    let batch = policy.batch();
    let config = PpoConfig {
        learning_rate,
        target_kl: None,
        epochs,
        minibatches,
        ..two_head_config()
    };
    let trainer = PpoTrainer::new(policy.vs.trainable_variables(), config, Device::Cpu).unwrap();
    (policy, batch, trainer)
}

#[test]
fn an_update_reports_its_ratio_extremes_around_one() {
    let (policy, batch, mut trainer) = tiny_trainer(0.05, 3, 2);
    let stats = trainer
        .update(&batch, |rows| policy.evaluate(rows))
        .unwrap();
    // The first minibatch is measured before any step: its ratios are 1, so
    // the extremes bracket 1; later minibatches move them apart.
    assert!(
        stats.ratio_min <= 1.0 + 1e-6 && stats.ratio_max >= 1.0 - 1e-6,
        "{stats:?}"
    );
    assert!(stats.ratio_max > stats.ratio_min, "{stats:?}");
    assert!(stats.value_std > 0.0, "{stats:?}");
}

#[test]
fn updates_reduce_the_loss_on_a_fixed_batch() {
    let (policy, batch, mut trainer) = tiny_trainer(0.01, 4, 4);
    let first = trainer
        .update(&batch, |rows| policy.evaluate(rows))
        .unwrap();
    let mut last = first.clone();
    for _ in 0..10 {
        last = trainer
            .update(&batch, |rows| policy.evaluate(rows))
            .unwrap();
    }
    assert!(first.grad_norm > 0.0);
    assert!(
        last.total_loss < first.total_loss - 0.05,
        "first {first:?}\nlast {last:?}"
    );
    assert!(last.value_loss < first.value_loss);
    assert!(last.policy_loss < first.policy_loss);
    assert_eq!(trainer.updates(), 11);
}

/// An imitation update makes its own passes (not the PPO epochs), ignores
/// the KL early stop, and raises the log-likelihood of the batch's actions;
/// a pass count out of range is refused with every parameter as it was.
#[test]
fn an_imitation_update_fits_the_batch_actions_in_its_own_passes() {
    use simic::ppo::Objective;
    let policy = TinyPolicy::new(8, 3, 4);
    let batch = policy.batch();
    let config = PpoConfig {
        learning_rate: 0.05,
        epochs: 1,
        minibatches: 2,
        ..two_head_config()
    };
    let mut trainer =
        PpoTrainer::new(policy.vs.trainable_variables(), config, Device::Cpu).unwrap();
    let all = Tensor::arange(8, (Kind::Int64, Device::Cpu));
    let likelihood = |policy: &TinyPolicy| {
        scalar(
            &tch::no_grad(|| policy.evaluate(&all).unwrap())
                .log_probs
                .mean(Kind::Float),
        )
    };
    let before = likelihood(&policy);
    let snapshot = parameters_snapshot(&policy);
    for epochs in [0, simic::ppo::config::MAX_EPOCHS + 1] {
        let refused = trainer.update_with(
            &batch,
            |rows| policy.evaluate(rows),
            None,
            Objective::Imitation { epochs },
        );
        assert!(
            matches!(refused, Err(Error::InvalidInput { field, .. }) if field.contains("epochs")),
            "{refused:?}"
        );
        for (a, b) in snapshot.iter().zip(policy.vs.trainable_variables()) {
            assert!(a.equal(&b), "a refused update moved a parameter");
        }
    }
    // The evaluation is shifted as in the KL test above: PPO would skip
    // every step; the imitation update does not look.
    let stats = trainer
        .update_with(
            &batch,
            |rows| {
                let e = policy.evaluate(rows)?;
                Ok(Evaluation {
                    anchor: None,
                    log_probs: e.log_probs + 0.3,
                    ..e
                })
            },
            None,
            Objective::Imitation { epochs: 6 },
        )
        .unwrap();
    assert!(!stats.early_stopped, "{stats:?}");
    assert_eq!((stats.epochs_run, stats.steps), (6, 12), "{stats:?}");
    let after = likelihood(&policy);
    assert!(after > before + 0.05, "{before} -> {after}");
}

#[test]
fn minibatches_cover_every_row_once_per_epoch_in_a_seeded_order() {
    let run = |seed: u64| -> Vec<Vec<i64>> {
        let policy = TinyPolicy::new(10, 1, 4);
        let batch = policy.batch();
        let config = PpoConfig {
            epochs: 3,
            minibatches: 3,
            target_kl: None,
            shuffle_seed: seed,
            ..two_head_config()
        };
        let mut trainer =
            PpoTrainer::new(policy.vs.trainable_variables(), config, Device::Cpu).unwrap();
        let mut seen = Vec::new();
        trainer
            .update(&batch, |rows| {
                seen.push(Vec::<i64>::try_from(rows).unwrap());
                policy.evaluate(rows)
            })
            .unwrap();
        seen
    };
    let seen = run(7);
    assert_eq!(seen.len(), 9);
    // Sizes 4, 3, 3 (the remainder goes to the first minibatches).
    assert_eq!(
        seen.iter().take(3).map(Vec::len).collect::<Vec<_>>(),
        [4, 3, 3]
    );
    let epochs: Vec<Vec<i64>> = seen.chunks(3).map(|epoch| epoch.concat()).collect();
    for epoch in &epochs {
        let mut sorted = epoch.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    }
    assert_ne!(epochs[0], epochs[1], "the order is reshuffled per epoch");
    assert_eq!(run(7), seen, "same seed, same order");
    assert_ne!(run(8), seen, "another seed, another order");
}

#[test]
fn trainer_refuses_bad_batches() {
    let policy = TinyPolicy::new(4, 1, 5);
    let mut batch = policy.batch();
    let mut trainer = PpoTrainer::new(
        policy.vs.trainable_variables(),
        PpoConfig::default(),
        Device::Cpu,
    )
    .unwrap();
    // Two heads in the batch, one in the configuration.
    assert!(matches!(
        trainer.update(&batch, |rows| policy.evaluate(rows)),
        Err(Error::ShapeMismatch { .. })
    ));
    let mut trainer = PpoTrainer::new(
        policy.vs.trainable_variables(),
        two_head_config(),
        Device::Cpu,
    )
    .unwrap();
    batch.advantages = batch.advantages.to_kind(Kind::Double);
    assert!(matches!(
        trainer.update(&batch, |rows| policy.evaluate(rows)),
        Err(Error::ShapeMismatch {
            what: "PpoBatch.advantages",
            ..
        })
    ));
    assert!(matches!(
        PpoTrainer::new(Vec::new(), two_head_config(), Device::Cpu),
        Err(Error::InvalidInput { .. })
    ));
}

#[test]
fn learning_rate_anneal_reaches_the_optimizer() {
    let policy = TinyPolicy::new(4, 1, 6);
    let batch = policy.batch();
    let config = PpoConfig {
        anneal_learning_rate: true,
        total_updates: Some(4),
        target_kl: None,
        ..two_head_config()
    };
    let mut trainer =
        PpoTrainer::new(policy.vs.trainable_variables(), config, Device::Cpu).unwrap();
    let mut rates = Vec::new();
    for _ in 0..3 {
        let stats = trainer
            .update(&batch, |rows| policy.evaluate(rows))
            .unwrap();
        rates.push(stats.learning_rate);
        let on_device = trainer.optimizer().learning_rate_tensor().double_value(&[]);
        assert!((on_device - stats.learning_rate).abs() < 1e-9);
    }
    let expected = [3e-4, 2.25e-4, 1.5e-4];
    for (got, want) in rates.iter().zip(expected) {
        assert!((got - want).abs() < 1e-12, "{rates:?}");
    }
}
