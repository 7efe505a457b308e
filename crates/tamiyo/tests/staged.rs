//! The staged policy step: [`StepStaging`] uploads what the separate
//! uploads gave (observations, blueprint indices, masks as
//! `MaskTensors::from_masks` builds them, noise bases, the step index),
//! refuses bad input without changing what is staged, and
//! `GraphedAct::stage` + `GraphedAct::act_staged` give what the eager
//! `Policy::act` on the normalised observations gives, step after step,
//! with the LSTM state carried inside the graph and a sink given every
//! step's tensors at its step index (on the CPU through the eager fallback,
//! on CUDA replaying the captured graph, captured again when the
//! normaliser's memory moves), the actions read back through the step's
//! page-locked buffer as the plain readback reads them.

mod common;

use leyline::{AlphaMode, SeedStage};
use tamiyo::masks::{ActionMasks, MaskConfig, MaskTensors, SlotMaskInfo, compute_masks};
use tamiyo::normaliser::{NormaliserConfig, RunningMeanStd};
use tamiyo::policy::{
    ActionReadback, GraphedAct, Policy, Sampler, StepRecord, StepSink, StepStaging,
};
use tch::{Device, Kind, Tensor};

const N_ENVS: usize = 4;
const SLOTS: usize = 3;

fn policy(device: Device) -> Policy {
    common::small_policy(device)
}

fn sampler(device: Device) -> Sampler {
    common::floored_sampler(device)
}

/// Masks that differ from environment to environment and step to step.
fn masks(step: usize) -> Vec<ActionMasks> {
    let stages = [
        None,
        Some(SeedStage::Training),
        Some(SeedStage::Blending),
        Some(SeedStage::Holding),
        Some(SeedStage::Fossilized),
    ];
    (0..N_ENVS)
        .map(|env| {
            let slots: Vec<Option<SlotMaskInfo>> = (0..SLOTS)
                .map(|slot| {
                    stages[(env + slot + step) % stages.len()].map(|stage| SlotMaskInfo {
                        stage,
                        epochs_total: u32::try_from(3 * slot + step).unwrap_or(0),
                        alpha_mode: AlphaMode::Hold,
                    })
                })
                .collect();
            compute_masks(&slots, &MaskConfig::default()).expect("masks")
        })
        .collect()
}

fn obs_dim() -> usize {
    tamiyo::features::layout(SLOTS).expect("layout").obs_dim()
}

fn host_obs(step: usize) -> Vec<f32> {
    (0..N_ENVS * obs_dim())
        .map(|i| ((i * 7 + step * 13) % 17) as f32 / 17.0 - 0.5)
        .collect()
}

fn host_blueprints(step: usize) -> Vec<i64> {
    (0..N_ENVS * SLOTS)
        .map(|i| i64::try_from((i + step) % 6).unwrap_or(0) - 1)
        .collect()
}

fn to_cpu(tensor: &Tensor) -> Tensor {
    tensor.to_device(Device::Cpu).contiguous()
}

fn assert_staged(staging: &StepStaging, obs: &[f32], blueprints: &[i64], masks: &[ActionMasks]) {
    let rows = N_ENVS as i64;
    let want_obs = Tensor::from_slice(obs).view([rows, obs_dim() as i64]);
    assert!(
        to_cpu(staging.obs()).equal(&want_obs),
        "observations differ"
    );
    let want_blueprints = Tensor::from_slice(blueprints).view([rows, SLOTS as i64]);
    assert!(
        to_cpu(staging.blueprints()).equal(&want_blueprints),
        "blueprints differ"
    );
    let want = MaskTensors::from_masks(masks, Device::Cpu).expect("masks");
    for (head, (got, want)) in staging.masks().heads.iter().zip(&want.heads).enumerate() {
        assert_eq!(got.kind(), Kind::Bool);
        assert!(to_cpu(got).equal(want), "head {head} differs");
    }
    assert!(to_cpu(&staging.masks().slot_by_op).equal(&want.slot_by_op));
}

#[test]
fn the_staging_uploads_what_the_separate_uploads_gave() {
    let mut staging = StepStaging::new(N_ENVS, SLOTS, 5, Device::Cpu).expect("staging");
    for step in 0..3 {
        let (obs, blueprints, masks) = (host_obs(step), host_blueprints(step), masks(step));
        let at = i64::try_from(step).unwrap_or(0) + 7;
        let bases: Vec<i64> = (0..5)
            .map(|i| i * 1000 + i64::try_from(step).unwrap_or(0))
            .collect();
        staging
            .stage(&obs, &blueprints, &masks, &bases, at)
            .expect("stage");
        assert_staged(&staging, &obs, &blueprints, &masks);
        assert!(to_cpu(staging.bases()).equal(&Tensor::from_slice(&bases)));
        assert!(to_cpu(staging.step()).equal(&Tensor::from_slice(&[at])));
        // Without bases, the staged ones stay.
        staging
            .stage(&obs, &blueprints, &masks, &[], at + 1)
            .expect("stage without bases");
        assert!(to_cpu(staging.bases()).equal(&Tensor::from_slice(&bases)));
        assert!(to_cpu(staging.step()).equal(&Tensor::from_slice(&[at + 1])));
    }
}

#[test]
fn a_refused_staging_changes_nothing() {
    let mut staging = StepStaging::new(N_ENVS, SLOTS, 2, Device::Cpu).expect("staging");
    let (obs, blueprints, masks0) = (host_obs(0), host_blueprints(0), masks(0));
    staging
        .stage(&obs, &blueprints, &masks0, &[3, 4], 5)
        .expect("stage");
    let other = masks(1);
    let mut nan = host_obs(1);
    nan[obs_dim() + 2] = f32::NAN;
    let error = staging
        .stage(&nan, &host_blueprints(1), &other, &[5, 6], 6)
        .expect_err("a NaN observation");
    assert!(error.to_string().contains("StepStaging.obs"), "{error}");
    assert!(error.to_string().contains("[1, 2]"), "{error}");
    let short = &host_obs(1)[1..];
    assert!(
        staging
            .stage(short, &host_blueprints(1), &other, &[], 6)
            .is_err()
    );
    assert!(
        staging
            .stage(&host_obs(1), &host_blueprints(1)[1..], &other, &[], 6)
            .is_err()
    );
    assert!(
        staging
            .stage(&host_obs(1), &host_blueprints(1), &other[1..], &[], 6)
            .is_err()
    );
    assert!(
        staging
            .stage(&host_obs(1), &host_blueprints(1), &other, &[1, 2, 3], 6)
            .is_err()
    );
    assert!(
        staging
            .stage(&host_obs(1), &host_blueprints(1), &other, &[], -1)
            .is_err()
    );
    let fewer_slots =
        vec![compute_masks(&[None, None], &MaskConfig::default()).expect("masks"); N_ENVS];
    assert!(
        staging
            .stage(&host_obs(1), &host_blueprints(1), &fewer_slots, &[], 6)
            .is_err()
    );
    assert_staged(&staging, &obs, &blueprints, &masks0);
    assert!(to_cpu(staging.bases()).equal(&Tensor::from_slice(&[3i64, 4])));
    assert!(to_cpu(staging.step()).equal(&Tensor::from_slice(&[5i64])));
    assert!(StepStaging::new(0, SLOTS, 1, Device::Cpu).is_err());
    assert!(StepStaging::new(1, 0, 1, Device::Cpu).is_err());
}

/// A sink that keeps every step's observations, values and actions in
/// `[n_envs, steps, ..]` tensors, written at the device step index.
struct Kept {
    obs: Tensor,
    values: Tensor,
    actions: Tensor,
}

impl Kept {
    fn new(steps: i64, device: Device) -> Kept {
        let rows = N_ENVS as i64;
        Kept {
            obs: Tensor::zeros([rows, steps, obs_dim() as i64], (Kind::Float, device)),
            values: Tensor::zeros([rows, steps], (Kind::Float, device)),
            actions: Tensor::zeros([rows, steps, 8], (Kind::Int64, device)),
        }
    }
}

impl StepSink for Kept {
    fn record(&self, step: &StepRecord<'_>) -> tamiyo::Result<()> {
        for (target, value) in [
            (&self.obs, step.obs),
            (&self.values, step.value),
            (&self.actions, &step.sample.actions),
        ] {
            let _ = target
                .shallow_clone()
                .f_index_copy_(1, step.step, &value.unsqueeze(1))
                .map_err(|error| tamiyo::Error::InvalidInput {
                    field: "Kept",
                    reason: error.to_string(),
                })?;
        }
        Ok(())
    }

    fn memory_key(&self) -> Vec<usize> {
        vec![
            self.obs.data_ptr() as usize,
            self.values.data_ptr() as usize,
            self.actions.data_ptr() as usize,
        ]
    }
}

const STEPS: usize = 6;

fn compare(device: Device) {
    let policy = policy(device);
    let mut eager = sampler(device);
    let mut staged_sampler = sampler(device);
    let mut graphed = GraphedAct::new(&policy, &staged_sampler, N_ENVS).expect("graphed");
    let mut readback = ActionReadback::new(N_ENVS, device).expect("readback");
    let mut normaliser =
        RunningMeanStd::new(obs_dim(), NormaliserConfig::default(), device).expect("normaliser");
    // Statistics that are not the identity.
    let warm = Tensor::from_slice(&[host_obs(9), host_obs(10)].concat())
        .view([2 * N_ENVS as i64, obs_dim() as i64])
        .to_device(device)
        * 3.0
        + 0.25;
    normaliser.update(&warm).expect("update");
    let kept = Kept::new(STEPS as i64, device);
    let mut eager_hidden = policy.network().initial_state(N_ENVS).expect("hidden");
    let mut staged_hidden = policy.network().initial_state(N_ENVS).expect("hidden");
    let (mut eager_obs, mut eager_values, mut eager_actions) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..STEPS {
        if step == 3 {
            // The normaliser moves to new memory: the next step captures
            // again, and still normalises with the statistics.
            let state = normaliser.state().expect("state");
            normaliser = RunningMeanStd::from_state(&state, device).expect("restore");
        }
        let (obs, blueprints, masks) = (host_obs(step), host_blueprints(step), masks(step));
        let obs_t = Tensor::from_slice(&obs)
            .view([N_ENVS as i64, obs_dim() as i64])
            .to_device(device);
        let normalised = normaliser.normalize(&obs_t).expect("normalise");
        let blueprints_t = Tensor::from_slice(&blueprints)
            .view([N_ENVS as i64, SLOTS as i64])
            .to_device(device);
        let mask_t = MaskTensors::from_masks(&masks, device).expect("masks");
        let a = policy
            .act(
                &normalised,
                &blueprints_t,
                &eager_hidden,
                &mask_t,
                &mut eager,
            )
            .expect("eager act");
        let at = i64::try_from(step).unwrap_or(0);
        graphed
            .stage(&mut staged_sampler, &obs, &blueprints, &masks, at)
            .expect("stage");
        let b = graphed
            .act_staged(
                &policy,
                &mut staged_sampler,
                Some(&normaliser),
                &staged_hidden,
                Some(&kept),
            )
            .expect("staged act");
        assert!(
            a.sample.actions.equal(&b.sample.actions),
            "step {step}: actions differ"
        );
        assert!(
            a.sample
                .log_probs
                .allclose(&b.sample.log_probs, 1e-5, 1e-6, false),
            "step {step}: log-probs differ"
        );
        assert!(a.value.allclose(&b.value, 1e-5, 1e-6, false));
        assert!(a.hidden.h.allclose(&b.hidden.h, 1e-5, 1e-6, false));
        // The step's own readback (from the page-locked buffer the graph
        // copied into, on CUDA) and a separate page-locked readback read
        // what the plain one reads.
        let plain = b.sample.to_host(SLOTS).expect("to_host");
        assert_eq!(
            graphed
                .read_actions(&b.sample, SLOTS)
                .expect("read_actions"),
            plain,
            "step {step}: the step's readback differs"
        );
        assert_eq!(
            b.sample
                .to_host_via(&mut readback, SLOTS)
                .expect("readback"),
            plain,
            "step {step}: the readbacks differ"
        );
        eager_obs.push(normalised);
        eager_values.push(a.value.shallow_clone());
        eager_actions.push(a.sample.actions.shallow_clone());
        eager_hidden = a.hidden;
        // The state the step returned, as it is (views of the graph's
        // outputs on CUDA): the graph has carried it over already.
        staged_hidden = b.hidden;
        // One step per staging.
        let again = graphed.act_staged(&policy, &mut staged_sampler, None, &staged_hidden, None);
        assert!(again.is_err(), "a second step on one staging");
    }
    assert_eq!(eager.rng().draws(), staged_sampler.rng().draws());
    // The sink got every step at its index.
    assert!(
        kept.obs
            .allclose(&Tensor::stack(&eager_obs, 1), 1e-6, 1e-6, false)
    );
    assert!(
        kept.values
            .allclose(&Tensor::stack(&eager_values, 1), 1e-5, 1e-6, false)
    );
    assert!(kept.actions.equal(&Tensor::stack(&eager_actions, 1)));
    if device.is_cuda() {
        assert!(graphed.is_captured(), "fallback: {:?}", graphed.fallback());
        assert!(graphed.reads_back_in_graph());
    } else {
        assert!(graphed.fallback().is_some());
    }
}

#[test]
fn the_staged_step_gives_what_the_eager_step_gives_on_the_cpu() {
    compare(Device::Cpu);
}

#[test]
fn the_staged_step_replays_what_the_eager_step_computes_on_cuda() {
    if !torch_ext::cuda::is_available() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    compare(Device::Cuda(0));
}

#[test]
fn the_readback_refuses_a_batch_of_another_shape_or_kind() {
    let mut readback = ActionReadback::new(N_ENVS, Device::Cpu).expect("readback");
    assert_eq!(readback.rows(), N_ENVS);
    let heads = leyline::NUM_ACTION_HEADS as i64;
    for wrong in [
        Tensor::zeros([N_ENVS as i64 + 1, heads], (Kind::Int64, Device::Cpu)),
        Tensor::zeros([N_ENVS as i64, heads], (Kind::Int, Device::Cpu)),
        Tensor::zeros([N_ENVS as i64 * heads], (Kind::Int64, Device::Cpu)),
    ] {
        let error = readback.read(&wrong).expect_err("refused");
        assert!(error.to_string().contains("ActionReadback"), "{error}");
    }
    let right = Tensor::arange(N_ENVS as i64 * heads, (Kind::Int64, Device::Cpu))
        .view([N_ENVS as i64, heads]);
    let values = readback.read(&right).expect("read").to_vec();
    assert_eq!(values, (0..N_ENVS as i64 * heads).collect::<Vec<_>>());
}

#[test]
fn a_packed_staging_reaches_the_device_at_its_upload() {
    if !torch_ext::cuda::is_available() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    let device = Device::Cuda(0);
    let mut staging = StepStaging::new(N_ENVS, SLOTS, 2, device).expect("staging");
    staging
        .stage(&host_obs(0), &host_blueprints(0), &masks(0), &[5, 6], 0)
        .expect("stage");
    assert_staged(&staging, &host_obs(0), &host_blueprints(0), &masks(0));
    // Packed, not uploaded: the device still holds the last upload.
    staging
        .pack(&host_obs(1), &host_blueprints(1), &masks(1), &[7, 8], 1)
        .expect("pack");
    assert_staged(&staging, &host_obs(0), &host_blueprints(0), &masks(0));
    staging.upload().expect("upload");
    assert_staged(&staging, &host_obs(1), &host_blueprints(1), &masks(1));
    assert_eq!(
        Vec::<i64>::try_from(&to_cpu(staging.bases())).unwrap(),
        vec![7, 8]
    );
    // A second upload has nothing left to send.
    staging.upload().expect("nothing pending");
}

#[test]
fn a_step_without_a_staging_is_refused() {
    let policy = policy(Device::Cpu);
    let mut sampler = sampler(Device::Cpu);
    let mut graphed = GraphedAct::eager(&policy, &sampler, N_ENVS, "a test").expect("graphed");
    assert_eq!(graphed.fallback(), Some("a test"));
    let hidden = policy.network().initial_state(N_ENVS).expect("hidden");
    let error = graphed
        .act_staged(&policy, &mut sampler, None, &hidden, None)
        .expect_err("nothing staged");
    assert!(error.to_string().contains("stage"), "{error}");
    // A refused staging draws nothing from the generator.
    let draws = sampler.rng().draws();
    assert!(
        graphed
            .stage(
                &mut sampler,
                &host_obs(0)[1..],
                &host_blueprints(0),
                &masks(0),
                0
            )
            .is_err()
    );
    assert_eq!(sampler.rng().draws(), draws);
}
