//! Data-parallel PPO on the CPU: two ranks (two threads, each with its own
//! Gloo membership) run vectorized rounds and end every update with
//! bit-identical policies; their environments differ; the wait for a
//! slower rank's rollout is timed apart (`update_wait_ms`), as is the
//! host time inside the group's calls (`update_collective_ms`).

use std::net::TcpListener;
use std::os::fd::{IntoRawFd, RawFd};
use std::thread;
use std::time::Duration;

use kasmina::host::CnnHostConfig;
use leyline::Telemetry;
use simic::vectorized::{EnvSpec, RoundReport, Simic, SimicConfig};
use tamiyo::policy::PolicyConfig;
use tch::{Device, Tensor};
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use tolaria::engine::trainer::ModelTrainerConfig;
use torch_ext::dist::{DistBackend, ProcessGroup, Rendezvous};

/// A loopback socket bound to a free port and listening: its port and its
/// descriptor, which rank 0 serves the store on (nothing else can take the
/// port meanwhile).
fn meeting_place() -> (u16, RawFd) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("port");
    let port = listener.local_addr().expect("addr").port();
    (port, listener.into_raw_fd())
}

/// Rank `rank` of a two-rank Gloo group on the CPU.
fn gloo_group((port, served): (u16, RawFd), rank: usize) -> ProcessGroup {
    let rendezvous = Rendezvous {
        host: "127.0.0.1".to_owned(),
        port,
        rank,
        world_size: 2,
        timeout: Duration::from_secs(120),
        listen_fd: (rank == 0).then_some(served),
    };
    ProcessGroup::new(&rendezvous, DistBackend::Gloo, Device::Cpu).expect("group")
}

fn spec() -> EnvSpec {
    let train = image_task(&ImageTaskOptions::fashion_like(256, 11)).expect("train data");
    let validation = image_task(&ImageTaskOptions::fashion_like(128, 12)).expect("validation");
    EnvSpec::sharded(
        CnnHostConfig::fashion_mnist(),
        vec!["r0c0".into(), "r0c1".into(), "r0c2".into()],
        &train,
        validation,
        2,
    )
    .expect("spec")
}

fn config() -> SimicConfig {
    let mut config = SimicConfig::reference(3);
    config.n_envs = 2;
    config.seed = 5;
    config.trainer = ModelTrainerConfig {
        batch_size: 64,
        ..ModelTrainerConfig::default()
    };
    config.policy = PolicyConfig {
        feature_dim: 32,
        hidden_dim: 32,
        ..PolicyConfig::default()
    };
    config
}

fn flat(parameters: &[Tensor]) -> Vec<f32> {
    let pieces: Vec<Tensor> = parameters
        .iter()
        .map(|p| p.detach().reshape([-1]))
        .collect();
    Vec::<f32>::try_from(&Tensor::cat(&pieces, 0)).expect("parameters to vec")
}

#[test]
fn two_ranks_keep_one_policy_and_different_environments() {
    let place = meeting_place();
    let ranks: Vec<_> = (0..2usize)
        .map(|rank| {
            thread::spawn(move || -> (Vec<f32>, Vec<f32>, Vec<RoundReport>) {
                let group = gloo_group(place, rank);
                let spec = spec();
                let mut simic =
                    Simic::new(config(), 3, Device::Cpu, Telemetry::disabled()).expect("simic");
                if rank == 1 {
                    // A different initialisation that joining must overwrite.
                    tch::no_grad(|| {
                        for mut p in simic.policy().var_store().trainable_variables() {
                            let _ = p.fill_(0.25);
                        }
                    });
                }
                simic.join(group).expect("join");
                assert_eq!(simic.rank_and_world(), (rank, 2));
                let initial = flat(&simic.policy().var_store().trainable_variables());
                let reports: Vec<RoundReport> = (0..2)
                    .map(|_| {
                        if rank == 1 {
                            // A slower rollout: rank 0 waits for it.
                            thread::sleep(Duration::from_millis(400));
                        }
                        simic.run_round(&spec, true).expect("round")
                    })
                    .collect();
                let last = flat(&simic.policy().var_store().trainable_variables());
                (initial, last, reports)
            })
        })
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|h| h.join().expect("rank")).collect();
    let (initial0, last0, reports0) = &results[0];
    let (initial1, last1, reports1) = &results[1];
    assert!(
        initial0
            .iter()
            .zip(initial1)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "join broadcast"
    );
    assert!(
        last0
            .iter()
            .zip(last1)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "after the updates"
    );
    assert!(
        initial0.iter().zip(last0).any(|(a, b)| a != b),
        "the updates changed the policy"
    );
    for report in reports0.iter().chain(reports1) {
        assert!(report.ppo.is_some(), "every round updated: {report:?}");
        let t = &report.timings;
        assert!(
            (0.0..=t.update_ms).contains(&t.update_wait_ms),
            "the wait is part of the update: {t:?}"
        );
        // The group's calls after the wait are timed too, inside the
        // update and apart from the wait.
        assert!(
            t.update_collective_ms > 0.0
                && t.update_collective_ms + t.update_wait_ms <= t.update_ms,
            "the collectives are part of the update: {t:?}"
        );
    }
    // Rank 1 starts each rollout 400 ms late: rank 0 waits for it before
    // the update, and the wait is timed there.
    for (report0, report1) in reports0.iter().zip(reports1) {
        assert!(
            report0.timings.update_wait_ms >= 200.0
                && report0.timings.update_wait_ms > report1.timings.update_wait_ms,
            "rank 0 waited {} ms, rank 1 {} ms",
            report0.timings.update_wait_ms,
            report1.timings.update_wait_ms
        );
    }
    // Each rank trained its own environments (distinct seeds, in every
    // round). Their accuracies are no test of that: two hosts still at
    // chance can predict the same class and score alike.
    for (report0, report1) in reports0.iter().zip(reports1) {
        assert_eq!(report0.env_seeds.len(), report1.env_seeds.len());
        assert!(
            report0
                .env_seeds
                .iter()
                .all(|seed| !report1.env_seeds.contains(seed)),
            "rank 0 {:?}, rank 1 {:?}",
            report0.env_seeds,
            report1.env_seeds
        );
    }
    assert_ne!(
        reports0[0].env_seeds, reports0[1].env_seeds,
        "rounds differ"
    );
}

#[test]
fn averaged_gradients_are_the_mean_over_the_ranks_for_every_shape() {
    let place = meeting_place();
    let ranks: Vec<_> = (0..2usize)
        .map(|rank| {
            thread::spawn(move || -> Vec<Vec<f32>> {
                let group = gloo_group(place, rank);
                let mut parallel = simic::distributed::DataParallel::new(group);
                let scale = (rank + 1) as f64;
                let mut out = Vec::new();
                // Twice with one layout (the views are reused), then with
                // another (they are made again).
                for shapes in [
                    vec![vec![2i64, 3], vec![4], vec![1, 1, 5]],
                    vec![vec![2i64, 3], vec![4], vec![1, 1, 5]],
                    vec![vec![3i64], vec![2, 2]],
                ] {
                    let grads: Vec<Tensor> = shapes
                        .iter()
                        .enumerate()
                        .map(|(i, shape)| {
                            let n: i64 = shape.iter().product();
                            (Tensor::arange(n, (tch::Kind::Float, Device::Cpu)) + (10 * i) as f64)
                                .view(shape.as_slice())
                                * scale
                        })
                        .collect();
                    parallel.average_gradients(&grads).expect("average");
                    for grad in &grads {
                        out.push(Vec::<f32>::try_from(&grad.reshape([-1])).expect("values"));
                    }
                }
                out
            })
        })
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|h| h.join().expect("rank")).collect();
    assert_eq!(results[0], results[1], "the ranks disagree");
    // The mean of 1x and 2x each gradient: 1.5x.
    let expected: Vec<Vec<f32>> = [vec![6i64, 4, 5], vec![6, 4, 5], vec![3, 4]]
        .iter()
        .flat_map(|sizes| {
            sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|v| (v as f32 + (10 * i) as f32) * 1.5).collect())
                .collect::<Vec<Vec<f32>>>()
        })
        .collect();
    assert_eq!(results[0], expected);
}
