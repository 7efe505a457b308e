//! simic on a GPU: GAE, one PPO update and a round with the twin-delta term
//! on `cuda:0`, skipped with a printed reason where there is no GPU.
//!
//! These tests have their own binary. libtorch decides once per process whether
//! its CUDA backend is present, the first time anything asks (`manual_seed`
//! does); in a binary shared with CPU tests, one that runs first (the bundle
//! runs its test binaries with one thread) or on another thread can ask before
//! `torch_ext::cuda::is_available` has loaded the backend, and every later CUDA
//! allocation then fails with "Cannot initialize CUDA without ATen_cuda
//! library". Each test here asks `is_available` before any other libtorch call.

mod common;

use common::gae::{GAMMA, LAMBDA, assert_close, read, row};
use simic::gae::compute_gae;
use simic::ppo::{Evaluation, PpoBatch, PpoConfig, PpoTrainer};
use tch::{Device, Kind, Tensor, nn};

/// GAE over one row with a truncated middle step, on the GPU: the values the
/// CPU gives (`gae.rs` works them out by hand).
#[test]
fn gae_runs_on_cuda_when_present() {
    if !torch_ext::cuda::is_available() {
        eprintln!("skipped: CUDA is not available");
        return;
    }
    let device = Device::Cuda(0);
    let on = |t: Tensor| t.to_device(device);
    let (advantages, _) = compute_gae(
        &on(row(&[1.0, 2.0, 3.0])),
        &on(row(&[0.5, 1.0, 1.5])),
        &on(row(&[0.0; 3])),
        &on(row(&[0.0, 1.0, 0.0])),
        &on(row(&[99.0, 10.0, 2.0])),
        GAMMA,
        LAMBDA,
    )
    .unwrap();
    assert_eq!(advantages.device(), device);
    assert_close(&read(&advantages.to_device(Device::Cpu)), &[8.6, 10.0, 3.3]);
}

/// One PPO step of a tiny linear policy, every tensor on the GPU.
#[test]
fn update_runs_on_cuda_when_present() {
    if !torch_ext::cuda::is_available() {
        eprintln!("skipped: CUDA is not available");
        return;
    }
    let device = Device::Cuda(0);
    let vs = nn::VarStore::new(device);
    let weight = vs.root().randn("w", &[3, 2], 0.0, 0.3);
    let x = Tensor::randn([6, 1, 3], (Kind::Float, device));
    let actions = Tensor::zeros([6, 1, 1], (Kind::Int64, device));
    let eval = |rows: &Tensor| -> simic::Result<Evaluation> {
        let logits = x.index_select(0, rows).matmul(&weight);
        let log_softmax = logits.log_softmax(-1, Kind::Float);
        Ok(Evaluation {
            anchor: None,
            log_probs: log_softmax.gather(-1, &actions.index_select(0, rows), false),
            entropies: -(log_softmax.exp() * &log_softmax).sum_dim_intlist(-1, true, Kind::Float),
            values: logits.select(2, 0),
            auxiliary: None,
        })
    };
    let all = Tensor::arange(6, (Kind::Int64, device));
    let now = tch::no_grad(|| eval(&all).unwrap());
    let ones = Tensor::ones([6, 1], (Kind::Float, device));
    let batch = PpoBatch {
        log_probs: now.log_probs.detach(),
        advantages: Tensor::randn([6, 1], (Kind::Float, device)),
        returns: ones.shallow_clone(),
        old_values: now.values.detach(),
        head_weights: Tensor::ones([6, 1, 1], (Kind::Float, device)),
        actor_weight: ones.shallow_clone(),
        value_weight: ones,
    };
    let mut trainer =
        PpoTrainer::new(vs.trainable_variables(), PpoConfig::default(), device).unwrap();
    let stats = trainer.update(&batch, eval).unwrap();
    assert_eq!(stats.steps, 1);
    assert!(stats.total_loss.is_finite());
}

/// The twin-delta term on the GPU: environments grown by no one train their
/// twins beside them, and the term, which pays the host's accuracy change
/// less its twin's, sums to about nothing over the episode (the same model
/// on the same data; CUDA's kernels are not bitwise reproducible, so not to
/// the bit as on the CPU). A twin that did not train, or trained on other
/// data, would make it pay the host's whole progress over the episode.
#[test]
fn the_twin_term_runs_on_cuda_and_a_host_grown_by_no_one_matches_its_twin() {
    if !torch_ext::cuda::is_available() {
        eprintln!("skipped: CUDA is not available");
        return;
    }
    let plain = common::driven(Device::Cuda(0), 0.0, false);
    let twinned = common::driven(Device::Cuda(0), 1.0, false);
    let paid = twinned.mean_episode_reward - plain.mean_episode_reward;
    assert!(paid.is_finite(), "{paid}");
    assert!(
        paid.abs() < 1.0,
        "the term paid {paid} points for hosts grown by no one ({:?} against {:?})",
        twinned.final_accuracies,
        plain.final_accuracies
    );
    // Under max growth the round runs with twins too.
    let grown = common::driven(Device::Cuda(0), 1.0, true);
    assert!(grown.germinations > 0);
    assert!(grown.mean_episode_reward.is_finite());
}
