//! GAE against hand-computed values: a plain row, a terminal step, a
//! truncated step with its bootstrap, a terminal last column, both flags at
//! once, and two rows in one call.
//!
//! Every case uses γ = 0.9, λ = 0.8 (γλ = 0.72), rewards `[1, 2, 3]` and
//! values `[0.5, 1.0, 1.5]`; the deltas worked out in each test's comment.

mod common;

use common::gae::{GAMMA, LAMBDA, assert_close, read, row};
use simic::gae::compute_gae;
use tch::{Device, Kind, Tensor};

/// One row of three steps with the given flags and bootstrap values.
fn one_row(terminated: &[f64], truncated: &[f64], bootstrap: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (advantages, returns) = compute_gae(
        &row(&[1.0, 2.0, 3.0]),
        &row(&[0.5, 1.0, 1.5]),
        &row(terminated),
        &row(truncated),
        &row(bootstrap),
        GAMMA,
        LAMBDA,
    )
    .unwrap();
    assert_eq!(advantages.size(), vec![1, 3]);
    assert_eq!(advantages.kind(), Kind::Double);
    (read(&advantages), read(&returns))
}

#[test]
fn plain_row_bootstraps_from_the_last_column() {
    // δ2 = 3 + 0.9·2 − 1.5 = 3.3            A2 = 3.3
    // δ1 = 2 + 0.9·1.5 − 1 = 2.35           A1 = 2.35 + 0.72·3.3 = 4.726
    // δ0 = 1 + 0.9·1 − 0.5 = 1.4            A0 = 1.4 + 0.72·4.726 = 4.80272
    // The bootstrap values of the first two columns are never read.
    let (advantages, returns) = one_row(&[0.0; 3], &[0.0; 3], &[99.0, 99.0, 2.0]);
    assert_close(&advantages, &[4.80272, 4.726, 3.3]);
    assert_close(&returns, &[5.30272, 5.726, 4.8]);
}

#[test]
fn terminal_step_has_no_next_value_and_resets_the_recursion() {
    // t = 1 terminal: δ1 = 2 + 0 − 1 = 1, A1 = 1 (A2 = 3.3 is not carried)
    // δ0 = 1.4, A0 = 1.4 + 0.72·1 = 2.12
    let (advantages, returns) = one_row(&[0.0, 1.0, 0.0], &[0.0; 3], &[99.0, 99.0, 2.0]);
    assert_close(&advantages, &[2.12, 1.0, 3.3]);
    assert_close(&returns, &[2.62, 2.0, 4.8]);
}

#[test]
fn truncated_step_bootstraps_and_cuts_the_recursion() {
    // t = 1 truncated, V(s') = bootstrap[1] = 10:
    // δ1 = 2 + 0.9·10 − 1 = 10, A1 = 10 (A2 = 3.3 is not carried)
    // δ0 = 1 + 0.9·values[1] − 0.5 = 1.4, A0 = 1.4 + 0.72·10 = 8.6
    let (advantages, returns) = one_row(&[0.0; 3], &[0.0, 1.0, 0.0], &[99.0, 10.0, 2.0]);
    assert_close(&advantages, &[8.6, 10.0, 3.3]);
    assert_close(&returns, &[9.1, 11.0, 4.8]);
}

#[test]
fn terminal_last_column_ignores_the_bootstrap() {
    // δ2 = 3 − 1.5 = 1.5; A1 = 2.35 + 0.72·1.5 = 3.43; A0 = 1.4 + 0.72·3.43 = 3.8696
    let (advantages, _) = one_row(&[0.0, 0.0, 1.0], &[0.0; 3], &[99.0, 99.0, 2.0]);
    assert_close(&advantages, &[3.8696, 3.43, 1.5]);
}

#[test]
fn terminal_wins_over_truncated() {
    // Both flags at t = 1: no next value, like the terminal case.
    let (advantages, _) = one_row(&[0.0, 1.0, 0.0], &[0.0, 1.0, 0.0], &[99.0, 10.0, 2.0]);
    assert_close(&advantages, &[2.12, 1.0, 3.3]);
}

#[test]
fn rows_are_independent_and_flags_may_be_bool() {
    // Row 0 is the plain case, row 1 the truncated one; f32 values, bool flags.
    let rewards = Tensor::from_slice(&[1.0_f32, 2.0, 3.0, 1.0, 2.0, 3.0]).view([2, 3]);
    let values = Tensor::from_slice(&[0.5_f32, 1.0, 1.5, 0.5, 1.0, 1.5]).view([2, 3]);
    let terminated = Tensor::zeros([2, 3], (Kind::Bool, Device::Cpu));
    let truncated = Tensor::from_slice(&[false, false, false, false, true, false]).view([2, 3]);
    let bootstrap = Tensor::from_slice(&[99.0_f32, 99.0, 2.0, 99.0, 10.0, 2.0]).view([2, 3]);
    let (advantages, returns) = compute_gae(
        &rewards,
        &values,
        &terminated,
        &truncated,
        &bootstrap,
        GAMMA,
        LAMBDA,
    )
    .unwrap();
    assert_eq!(advantages.kind(), Kind::Float);
    let got = read(&advantages);
    let expected = [4.80272, 4.726, 3.3, 8.6, 10.0, 3.3];
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() < 1e-5, "{got:?}");
    }
    let got = read(&returns);
    let expected = [5.30272, 5.726, 4.8, 9.1, 11.0, 4.8];
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() < 1e-5, "{got:?}");
    }
}

#[test]
fn single_column_is_one_td_error() {
    // T = 1: A = r + γ·bootstrap − v = 1 + 0.9·4 − 0.5 = 4.1.
    let one = |x: f64| Tensor::from_slice(&[x]).view([1, 1]);
    let (advantages, returns) = compute_gae(
        &one(1.0),
        &one(0.5),
        &one(0.0),
        &one(0.0),
        &one(4.0),
        GAMMA,
        LAMBDA,
    )
    .unwrap();
    assert_close(&read(&advantages), &[4.1]);
    assert_close(&read(&returns), &[4.6]);
}
