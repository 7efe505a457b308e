//! The anchor after the imitation
//! ([`simic::vectorized::ImitationConfig::anchor_weight`]) on the CPU: the
//! loss term by hand (the labels' negative log-likelihood per head, times
//! its coefficient, and its gradient towards the labels), the refusals of a
//! malformed anchor, and the rounds: a PPO round after the imitation has
//! the demonstrator label every decision the policy took, the update
//! carries the term at the decayed coefficient, and a strong anchor makes
//! the labels likelier update by update; without an anchor nothing of it
//! runs.

mod common;

use common::{TURN, config, spec};
use leyline::Telemetry;
use simic::Error;
use simic::ppo::{
    AnchorEvaluation, Evaluation, HeadCoefficients, LossScalars, PpoBatch, PpoConfig, ppo_loss,
};
use simic::vectorized::{Demonstrator, ImitationConfig, Simic};
use tch::{Device, Kind, Tensor};

/// `[2, 2, 2]` from a flat list.
fn t3(values: [f32; 8]) -> Tensor {
    Tensor::from_slice(&values).view([2, 2, 2])
}

/// `[2, 2]` from a flat list.
fn t2(values: [f32; 4]) -> Tensor {
    Tensor::from_slice(&values).view([2, 2])
}

/// Two rows of two steps, two heads; the last step is forced (no actor
/// weight).
fn batch() -> PpoBatch {
    PpoBatch {
        log_probs: t3([-0.5, -1.0, -0.7, -0.2, -1.2, -0.3, -0.9, -2.0]),
        advantages: t2([1.0, -2.0, 0.5, 3.0]),
        returns: t2([1.0, 2.0, 0.0, -1.0]),
        old_values: t2([0.8, 2.5, 0.3, -1.0]),
        head_weights: t3([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]),
        actor_weight: t2([1.0, 1.0, 1.0, 0.0]),
        value_weight: t2([1.0, 1.0, 1.0, 0.2]),
    }
}

fn evaluation(anchor: Option<AnchorEvaluation>) -> Evaluation {
    Evaluation {
        log_probs: t3([-0.4, -1.3, -0.2, -0.2, -1.25, -0.05, -0.9, -1.6]),
        entropies: t3([0.6, 0.2, 0.5, 0.1, 0.7, 0.3, 0.4, 0.05]),
        values: t2([1.5, 1.9, -0.4, 0.2]),
        auxiliary: None,
        anchor,
    }
}

fn setup() -> (HeadCoefficients, LossScalars) {
    let config = PpoConfig {
        head_entropy_multipliers: vec![1.0, 1.0],
        entropy_floors: vec![0.0, 0.0],
        entropy_floor_coefs: vec![0.0, 0.0],
        ..PpoConfig::default()
    };
    let coefficients = HeadCoefficients::new(&config, Device::Cpu).expect("coefficients");
    let scalars = LossScalars {
        clip: 0.2,
        value_coef: 0.5,
        value_clip: None,
        entropy_coef: 0.01,
        floor_scale: 1.0,
        contribution_coef: 0.0,
        objective: simic::ppo::Objective::Ppo,
    };
    (coefficients, scalars)
}

const LABEL_LOG_PROBS: [f32; 8] = [-2.0, -0.5, -1.0, -3.0, -0.25, -4.0, -0.1, -0.2];
const LABEL_WEIGHTS: [f32; 8] = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0];

/// The term by hand: per head, the weighted mean of the labels'
/// log-probabilities over the acting samples (label weight times actor
/// weight), negated and summed over heads.
fn anchor_by_hand() -> f64 {
    let actor = [1.0, 1.0, 1.0, 0.0];
    let mut nll = 0.0;
    for head in 0..2 {
        let (mut sum, mut weight) = (0.0, 0.0);
        for cell in 0..4 {
            let w = f64::from(LABEL_WEIGHTS[cell * 2 + head]) * actor[cell];
            sum += w * f64::from(LABEL_LOG_PROBS[cell * 2 + head]);
            weight += w;
        }
        if weight > 0.0 {
            nll -= sum / weight;
        }
    }
    nll
}

#[test]
fn the_anchor_term_is_the_labels_weighted_negative_log_likelihood() {
    let (coefficients, scalars) = setup();
    let plain = ppo_loss(&batch(), &evaluation(None), &coefficients, &scalars).expect("loss");
    assert_eq!(plain.anchor.double_value(&[]), 0.0);
    let label_log_probs = t3(LABEL_LOG_PROBS).set_requires_grad(true);
    let coef = 2.5;
    let anchored = ppo_loss(
        &batch(),
        &evaluation(Some(AnchorEvaluation {
            log_probs: label_log_probs.shallow_clone(),
            weights: t3(LABEL_WEIGHTS),
            coef,
        })),
        &coefficients,
        &scalars,
    )
    .expect("anchored loss");
    let want = anchor_by_hand();
    let got = anchored.anchor.double_value(&[]);
    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    let added = anchored.total.double_value(&[]) - plain.total.double_value(&[]);
    assert!(
        (added - coef * want).abs() < 1e-4,
        "{added} vs {}",
        coef * want
    );
    // Its gradient raises every weighted label's log-probability (a
    // negative derivative of the loss) and leaves the others alone: the
    // forced step and the unweighted heads.
    anchored.total.backward();
    let grad = Vec::<f32>::try_from(label_log_probs.grad().view([-1])).expect("grad");
    let actor = [1.0_f32, 1.0, 1.0, 0.0];
    for (index, g) in grad.iter().enumerate() {
        let weighted = LABEL_WEIGHTS[index] * actor[index / 2] > 0.0;
        assert_eq!(*g < 0.0, weighted, "cell {index}: {g}");
        assert_eq!(*g == 0.0, !weighted, "cell {index}: {g}");
    }
}

#[test]
fn a_malformed_anchor_is_refused_before_libtorch() {
    let (coefficients, scalars) = setup();
    let anchor = |log_probs: Tensor, coef: f64| {
        evaluation(Some(AnchorEvaluation {
            log_probs,
            weights: t3(LABEL_WEIGHTS),
            coef,
        }))
    };
    let shape = ppo_loss(
        &batch(),
        &anchor(Tensor::zeros([2, 2, 3], (Kind::Float, Device::Cpu)), 1.0),
        &coefficients,
        &scalars,
    )
    .expect_err("a wrong shape");
    assert!(
        matches!(shape, Error::ShapeMismatch { what, .. } if what == "AnchorEvaluation.log_probs"),
        "{shape}"
    );
    for coef in [f64::NAN, -1.0, f64::INFINITY] {
        let error = ppo_loss(
            &batch(),
            &anchor(t3(LABEL_LOG_PROBS), coef),
            &coefficients,
            &scalars,
        )
        .expect_err("a bad coefficient");
        assert!(
            error.to_string().contains("AnchorEvaluation.coef"),
            "{error}"
        );
    }
}

/// One imitation update of max growth, then PPO rounds anchored to it at
/// weight 5, halved after every update.
#[test]
fn ppo_rounds_after_the_imitation_carry_the_anchor_at_its_decayed_coefficient() {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = config(0.0);
    config.imitation = ImitationConfig {
        updates: 1,
        demonstrator: Demonstrator::MaxGrowth,
        anchor_weight: 5.0,
        anchor_decay: 0.5,
        ..ImitationConfig::default()
    };
    let spec = spec();
    let mut simic = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let imitation = simic.run_round(&spec, true).expect("the imitation round");
    assert!(imitation.imitation.is_some() && imitation.anchor.is_none());
    let ppo = imitation.ppo.expect("an update");
    assert_eq!((ppo.anchor_coef, ppo.anchor_loss), (0.0, 0.0));
    for (update, coef) in [5.0, 2.5].into_iter().enumerate() {
        let report = simic.run_round(&spec, true).expect("a PPO round");
        assert!(report.imitation.is_none());
        let labels = report.anchor.expect("the demonstrator labelled the round");
        assert_eq!(labels.demonstrator, Demonstrator::MaxGrowth);
        // Every decision the policy took is labelled, and max growth under
        // the policy's masks asks nothing they forbid.
        assert_eq!(
            labels.imitated, report.env_epochs,
            "update {update}: {labels:?}"
        );
        assert_eq!(labels.not_imitable, 0);
        let ppo = report.ppo.expect("an update");
        assert_eq!(ppo.anchor_coef, coef, "update {update}");
        assert!(
            ppo.anchor_loss.is_finite() && ppo.anchor_loss > 0.0,
            "update {update}: {}",
            ppo.anchor_loss
        );
    }
}

/// From scratch (no imitation), a strong anchor (weight 20, eight PPO
/// passes an update): the labels' negative
/// log-likelihood falls from the first PPO update to the third. Without
/// an anchor the demonstrator labels nothing and the term is 0.
#[test]
fn a_strong_anchor_makes_the_labels_likelier_and_none_costs_nothing() {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = config(0.0);
    config.imitation = ImitationConfig {
        anchor_weight: 20.0,
        ..ImitationConfig::default()
    };
    config.ppo.epochs = 8;
    let spec = spec();
    let mut simic =
        Simic::new(config.clone(), 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let mut nll = Vec::new();
    for _ in 0..3 {
        let report = simic.run_round(&spec, true).expect("a PPO round");
        nll.push(report.ppo.expect("an update").anchor_loss);
    }
    println!("the labels' negative log-likelihood per update: {nll:?}");
    assert!(
        nll[0].is_finite() && nll[2] < nll[0],
        "the labels' negative log-likelihood per update: {nll:?}"
    );

    config.imitation = ImitationConfig::default();
    let mut plain = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let report = plain.run_round(&spec, true).expect("a PPO round");
    assert!(report.anchor.is_none());
    let ppo = report.ppo.expect("an update");
    assert_eq!((ppo.anchor_coef, ppo.anchor_loss), (0.0, 0.0));
}
