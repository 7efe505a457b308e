//! The figures of driven rounds, where seeds live (`simic-growth`):
//! environment-epochs per second by live seeds, and the profiled steps.

use crate::vectorized::{RoundReport, StepProfile};

/// The progress lines of one profiled step: kernels, copies and device
/// time per environment-epoch, and the kernels with the most device time.
pub(super) fn profile_line(step: &StepProfile) -> String {
    let envs = step.envs.max(1) as f64;
    let profile = &step.profile;
    let mut line = format!(
        "  profiled step at {} live seeds: per environment-epoch {:.0} kernels, {:.0} copies, \
         {:.2} ms GPU-busy; largest:",
        step.live_seeds,
        profile.kernel_launches() as f64 / envs,
        profile.copies() as f64 / envs,
        profile.busy_us() / envs / 1000.0,
    );
    for kernel in profile.largest(12) {
        let name = short_kernel_name(&kernel.name);
        line.push_str(&format!(
            "\n    {:8.1} us {:5} x {name}",
            kernel.total_us / envs,
            kernel.count
        ));
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
/// `profiled_copies_..._N`, `profiled_gpu_busy_ms_per_env_epoch_live_seeds_N`).
pub(super) fn profile_figures(
    profiles: &[StepProfile],
    metrics: &mut std::collections::BTreeMap<String, f64>,
) {
    for step in profiles {
        let envs = step.envs.max(1) as f64;
        let live = step.live_seeds;
        metrics.insert(
            format!("profiled_kernels_per_env_epoch_live_seeds_{live}"),
            step.profile.kernel_launches() as f64 / envs,
        );
        metrics.insert(
            format!("profiled_copies_per_env_epoch_live_seeds_{live}"),
            step.profile.copies() as f64 / envs,
        );
        metrics.insert(
            format!("profiled_gpu_busy_ms_per_env_epoch_live_seeds_{live}"),
            step.profile.busy_us() / envs / 1000.0,
        );
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
    use super::short_kernel_name;

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
