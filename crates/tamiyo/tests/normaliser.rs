//! The running observation normaliser against a direct computation of the
//! moments (EMA and Welford), its clip and epsilon, its checkpoint form and
//! the shapes it refuses.

use tamiyo::Error;
use tamiyo::normaliser::{NormaliserConfig, NormaliserState, RunningMeanStd};
use tch::{Device, Kind, Tensor};

/// Deterministic batches `[rows, dim]` with per-feature offsets and scales.
fn batch(rows: usize, dim: usize, salt: usize) -> Vec<Vec<f64>> {
    (0..rows)
        .map(|row| {
            (0..dim)
                .map(|feature| {
                    let x = ((row * 37 + feature * 11 + salt * 101) % 97) as f64 / 97.0;
                    (feature as f64 + 1.0) * (x - 0.3) + feature as f64 * 2.0
                })
                .collect()
        })
        .collect()
}

fn tensor(rows: &[Vec<f64>]) -> Tensor {
    let flat: Vec<f32> = rows.iter().flatten().map(|&v| v as f32).collect();
    Tensor::from_slice(&flat).view([rows.len() as i64, rows[0].len() as i64])
}

fn moments(rows: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
    let n = rows.len() as f64;
    let dim = rows[0].len();
    let mean: Vec<f64> = (0..dim)
        .map(|f| rows.iter().map(|r| r[f]).sum::<f64>() / n)
        .collect();
    let var = (0..dim)
        .map(|f| rows.iter().map(|r| (r[f] - mean[f]).powi(2)).sum::<f64>() / n)
        .collect();
    (mean, var)
}

fn host(tensor: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(tensor.to_kind(Kind::Double).flatten(0, -1)).expect("readback")
}

fn assert_close(got: &[f64], want: &[f64], tolerance: f64) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= tolerance * (1.0 + w.abs()),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn ema_moments_match_a_direct_computation() {
    let dim = 5;
    let config = NormaliserConfig::default();
    assert_eq!(
        (config.epsilon, config.clip, config.momentum),
        (1e-4, 10.0, Some(0.99))
    );
    let mut normaliser = RunningMeanStd::new(dim, config, Device::Cpu).expect("normaliser");
    let (mut mean, mut var) = (vec![0.0; dim], vec![1.0; dim]);
    let m = 0.99;
    for salt in 0..6 {
        let rows = batch(8 + salt, dim, salt);
        normaliser.update(&tensor(&rows)).expect("update");
        let (batch_mean, batch_var) = moments(&rows);
        for f in 0..dim {
            let delta = batch_mean[f] - mean[f];
            mean[f] = m * mean[f] + (1.0 - m) * batch_mean[f];
            var[f] = m * var[f] + (1.0 - m) * batch_var[f] + m * (1.0 - m) * delta * delta;
        }
    }
    assert_close(&host(normaliser.mean()), &mean, 1e-5);
    assert_close(&host(normaliser.var()), &var, 1e-5);
    let state = normaliser.state().expect("state");
    assert!((state.count - (1e-4 + (8..14).sum::<usize>() as f64)).abs() < 1e-9);
}

#[test]
fn welford_moments_match_the_moments_of_everything_seen() {
    let dim = 4;
    let config = NormaliserConfig {
        momentum: None,
        ..NormaliserConfig::default()
    };
    let mut normaliser = RunningMeanStd::new(dim, config, Device::Cpu).expect("normaliser");
    let mut all = Vec::new();
    for salt in 0..5 {
        let rows = batch(10 + 3 * salt, dim, salt);
        normaliser.update(&tensor(&rows)).expect("update");
        all.extend(rows);
    }
    // The prior (mean 0, var 1, weight 1e-4) against 80 samples.
    let (mean, var) = moments(&all);
    let n = all.len() as f64;
    let eps = 1e-4;
    let total = n + eps;
    let want_mean: Vec<f64> = mean.iter().map(|m| m * n / total).collect();
    let want_var: Vec<f64> = (0..dim)
        .map(|f| (eps * 1.0 + n * var[f] + mean[f].powi(2) * eps * n / total) / total)
        .collect();
    assert_close(&host(normaliser.mean()), &want_mean, 1e-5);
    assert_close(&host(normaliser.var()), &want_var, 1e-5);
}

#[test]
fn normalize_centres_scales_and_clips() {
    let state = NormaliserState {
        config: NormaliserConfig::default(),
        mean: vec![1.0, -2.0, 0.0],
        var: vec![4.0, 0.25, 0.0],
        count: 10.0,
    };
    let normaliser = RunningMeanStd::from_state(&state, Device::Cpu).expect("normaliser");
    let x = Tensor::from_slice(&[3.0_f32, -2.5, 0.5, 1.0, 100.0, -0.5]).view([2, 3]);
    let got = host(&normaliser.normalize(&x).expect("normalize"));
    let want = [
        2.0 / (4.0_f64 + 1e-4).sqrt(),
        -0.5 / (0.25_f64 + 1e-4).sqrt(),
        10.0, // 0.5 / 0.01 = 50, clipped
        0.0,
        10.0,  // clipped
        -10.0, // -0.5 / 0.01 = -50, clipped
    ];
    assert_close(&got, &want, 1e-5);
}

#[test]
fn the_state_round_trips_and_bad_states_are_refused() {
    let mut normaliser =
        RunningMeanStd::new(3, NormaliserConfig::default(), Device::Cpu).expect("normaliser");
    normaliser.update(&tensor(&batch(6, 3, 1))).expect("update");
    let state = normaliser.state().expect("state");
    let json = serde_json::to_string(&state).expect("json");
    let back: NormaliserState = serde_json::from_str(&json).expect("parse");
    assert_eq!(back, state);
    let restored = RunningMeanStd::from_state(&back, Device::Cpu).expect("restore");
    let x = tensor(&batch(4, 3, 9));
    assert_eq!(
        host(&restored.normalize(&x).expect("a")),
        host(&normaliser.normalize(&x).expect("b"))
    );

    let mut bad = state.clone();
    bad.var[1] = -1.0;
    assert!(matches!(
        RunningMeanStd::from_state(&bad, Device::Cpu),
        Err(Error::InvalidInput {
            field: "NormaliserState.var",
            ..
        })
    ));
    let mut bad = state.clone();
    bad.mean[0] = f64::NAN;
    assert!(RunningMeanStd::from_state(&bad, Device::Cpu).is_err());
    let mut bad = state.clone();
    bad.var.pop();
    assert!(RunningMeanStd::from_state(&bad, Device::Cpu).is_err());
    let mut bad = state.clone();
    bad.count = 0.0;
    assert!(RunningMeanStd::from_state(&bad, Device::Cpu).is_err());
    let mut bad = state.clone();
    bad.config.momentum = Some(1.0);
    assert!(RunningMeanStd::from_state(&bad, Device::Cpu).is_err());
    let misspelt = json.replace("\"clip\"", "\"clipp\"");
    assert!(serde_json::from_str::<NormaliserState>(&misspelt).is_err());

    normaliser.reset().expect("reset");
    assert_eq!(host(normaliser.mean()), [0.0; 3]);
    assert_eq!(host(normaliser.var()), [1.0; 3]);
}

#[test]
fn batches_of_the_wrong_shape_are_refused_before_libtorch() {
    let mut normaliser =
        RunningMeanStd::new(3, NormaliserConfig::default(), Device::Cpu).expect("normaliser");
    for bad in [
        Tensor::zeros([2, 4], (Kind::Float, Device::Cpu)),
        Tensor::zeros([3], (Kind::Float, Device::Cpu)),
        Tensor::zeros([0, 3], (Kind::Float, Device::Cpu)),
        Tensor::zeros([2, 3], (Kind::Int64, Device::Cpu)),
    ] {
        assert!(matches!(
            normaliser.update(&bad),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(normaliser.normalize(&bad).is_err());
    }
    assert!(RunningMeanStd::new(0, NormaliserConfig::default(), Device::Cpu).is_err());
    for config in [
        NormaliserConfig {
            epsilon: 0.0,
            ..NormaliserConfig::default()
        },
        NormaliserConfig {
            clip: f64::INFINITY,
            ..NormaliserConfig::default()
        },
        NormaliserConfig {
            momentum: Some(f64::NAN),
            ..NormaliserConfig::default()
        },
    ] {
        assert!(RunningMeanStd::new(3, config, Device::Cpu).is_err());
    }
    // A refused batch changed nothing.
    assert_eq!(host(normaliser.mean()), [0.0; 3]);
}
