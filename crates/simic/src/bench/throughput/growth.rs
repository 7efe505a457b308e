//! The figures of driven rounds, where seeds live (`simic-growth`):
//! environment-epochs per second by live seeds, and the profiled steps.

use crate::vectorized::{RoundReport, StepProfile};

/// The progress lines of one profiled step: kernels, copies and device
/// time per environment-epoch, in all and by phase (training, then
/// validation with the counterfactual passes), and each phase's kernels
/// with the most device time.
pub(super) fn profile_line(step: &StepProfile) -> String {
    let envs = step.envs.max(1) as f64;
    let mut line = format!(
        "  profiled step at {} live seeds: per environment-epoch {:.0} kernels, {:.0} copies, \
         {:.2} ms GPU-busy",
        step.live_seeds,
        step.kernel_launches() as f64 / envs,
        step.copies() as f64 / envs,
        step.busy_us() / envs / 1000.0,
    );
    for (phase, profile, largest) in [
        ("training", &step.training, 12),
        ("validation", &step.validation, 8),
    ] {
        line.push_str(&format!(
            "\n    {phase}: {:.0} kernels, {:.0} copies, {:.2} ms GPU-busy; largest:",
            profile.kernel_launches() as f64 / envs,
            profile.copies() as f64 / envs,
            profile.busy_us() / envs / 1000.0,
        ));
        for kernel in profile.largest(largest) {
            let name = short_kernel_name(&kernel.name);
            line.push_str(&format!(
                "\n    {:8.1} us {:5} x {name}",
                kernel.total_us / envs,
                kernel.count
            ));
        }
    }
    line
}

/// A kernel's name shortened for a log line: without the namespaces and
/// keywords that every ATen kernel repeats, so the functor that tells two
/// elementwise kernels apart stays in the first 150 characters.
fn short_kernel_name(name: &str) -> String {
    let mut short = name.to_owned();
    for noise in [
        "void ",
        "at::native::",
        "(anonymous namespace)::",
        "at::detail::",
        "c10::",
        "std::",
        "unsigned ",
    ] {
        short = short.replace(noise, "");
    }
    short.chars().take(150).collect()
}

/// The figures of the profiled steps: kernels, copies and GPU-busy ms per
/// environment-epoch, by live seeds (`profiled_kernels_per_env_epoch_live_seeds_N`,
/// `profiled_copies_..._N`, `profiled_gpu_busy_ms_per_env_epoch_live_seeds_N`,
/// both phases together), and the GPU-busy ms of each phase
/// (`profiled_training_gpu_busy_ms_..._N`, `profiled_validation_gpu_busy_ms_..._N`).
pub(super) fn profile_figures(
    profiles: &[StepProfile],
    metrics: &mut std::collections::BTreeMap<String, f64>,
) {
    for step in profiles {
        let envs = step.envs.max(1) as f64;
        let live = step.live_seeds;
        metrics.insert(
            format!("profiled_kernels_per_env_epoch_live_seeds_{live}"),
            step.kernel_launches() as f64 / envs,
        );
        metrics.insert(
            format!("profiled_copies_per_env_epoch_live_seeds_{live}"),
            step.copies() as f64 / envs,
        );
        metrics.insert(
            format!("profiled_gpu_busy_ms_per_env_epoch_live_seeds_{live}"),
            step.busy_us() / envs / 1000.0,
        );
        for (phase, profile) in [
            ("training", &step.training),
            ("validation", &step.validation),
        ] {
            metrics.insert(
                format!("profiled_{phase}_gpu_busy_ms_per_env_epoch_live_seeds_{live}"),
                profile.busy_us() / envs / 1000.0,
            );
        }
    }
}

/// Environment-epochs per second by live seeds per environment (the
/// steps' mean over the environments, rounded: `eps_live_seeds_0` to
/// `_3`, with `steps_live_seeds_N`, the steps they come from), and the
/// decisions the scripted controller refused, over `reports`.
pub(super) fn live_seed_figures(
    reports: &[&RoundReport],
    n_envs: usize,
    metrics: &mut std::collections::BTreeMap<String, f64>,
) {
    let mut buckets = [(0_u64, 0.0_f64); 4];
    for step in reports.iter().flat_map(|r| r.steps.iter()) {
        let live = step.live_seeds.round().clamp(0.0, 3.0) as usize;
        if let Some((count, ms)) = buckets.get_mut(live) {
            *count = count.saturating_add(1);
            *ms += step.ms;
        }
    }
    for (live, (count, ms)) in buckets.iter().enumerate() {
        metrics.insert(format!("steps_live_seeds_{live}"), *count as f64);
        if *count > 0 && *ms > 0.0 {
            metrics.insert(
                format!("eps_live_seeds_{live}"),
                (*count as f64) * n_envs as f64 / (ms / 1000.0),
            );
        }
    }
    metrics.insert(
        "refused_decisions".to_owned(),
        reports.iter().map(|r| r.refused_decisions as f64).sum(),
    );
}

#[cfg(test)]
mod tests {
    use super::{profile_figures, profile_line, short_kernel_name};
    use crate::vectorized::StepProfile;
    use torch_ext::profile::{KernelProfile, KernelStat};

    fn profile(stats: &[(&str, u64, f64)]) -> KernelProfile {
        KernelProfile {
            kernels: stats
                .iter()
                .map(|&(name, count, total_us)| KernelStat {
                    name: name.to_owned(),
                    count,
                    total_us,
                })
                .collect(),
            sample: Vec::new(),
        }
    }

    #[test]
    fn a_profiled_step_is_reported_in_all_and_by_phase_per_environment_epoch() {
        let step = StepProfile {
            live_seeds: 2,
            envs: 4,
            training: profile(&[("esper_conv3_direct", 40, 800.0), ("Memcpy DtoD", 4, 40.0)]),
            validation: profile(&[("convolve_common_engine_float_NHWC", 8, 1200.0)]),
        };
        let mut metrics = std::collections::BTreeMap::new();
        profile_figures(std::slice::from_ref(&step), &mut metrics);
        let figure = |key: &str| metrics.get(key).copied().unwrap_or(f64::NAN);
        // Per environment-epoch: the sums over the four environments / 4.
        assert_eq!(figure("profiled_kernels_per_env_epoch_live_seeds_2"), 12.0);
        assert_eq!(figure("profiled_copies_per_env_epoch_live_seeds_2"), 1.0);
        assert!((figure("profiled_gpu_busy_ms_per_env_epoch_live_seeds_2") - 0.51).abs() < 1e-12);
        assert!(
            (figure("profiled_training_gpu_busy_ms_per_env_epoch_live_seeds_2") - 0.21).abs()
                < 1e-12
        );
        assert!(
            (figure("profiled_validation_gpu_busy_ms_per_env_epoch_live_seeds_2") - 0.3).abs()
                < 1e-12
        );
        let line = profile_line(&step);
        let training = line.find("training: 10 kernels, 1 copies").expect(&line);
        let validation = line.find("validation: 2 kernels, 0 copies").expect(&line);
        assert!(training < validation, "{line}");
        // Each kernel is listed under its own phase.
        assert!(
            line[training..validation].contains("esper_conv3_direct"),
            "{line}"
        );
        assert!(
            line[validation..].contains("convolve_common_engine"),
            "{line}"
        );
    }

    #[test]
    fn kernel_names_lose_their_namespaces_not_their_functors() {
        let name = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<\
                    at::native::(anonymous namespace)::direct_copy_kernel_cuda(at::TensorIteratorBase&)";
        let short = short_kernel_name(name);
        assert!(short.starts_with("elementwise_kernel<128, 2, gpu_kernel_impl_nocast<"));
        assert!(short.contains("direct_copy_kernel_cuda"), "{short}");
        assert!(short_kernel_name(&"x".repeat(400)).chars().count() == 150);
    }
}
