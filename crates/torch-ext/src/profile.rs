//! Which CUDA kernels a stretch of work ran and how long the GPU spent in
//! them, from libtorch's Kineto profiler (CUPTI): kernels per step and
//! GPU-busy time beside a benchmark's wall-clock figures, and the largest
//! kernels by name.
//!
//! [`KernelProfiler::start`] switches the profiler on for the process;
//! [`KernelProfiler::stop`] switches it off and returns every kernel, copy
//! and memset that ran on any CUDA device in between, aggregated by name.
//! Kernels replayed from a captured graph count one by one, like eager
//! launches. One profiler runs at a time. Profiling adds host overhead, so
//! time the work separately and profile it once more.
//!
//! ```ignore
//! use torch_ext::profile::KernelProfiler;
//! let profiler = KernelProfiler::start()?;
//! // ... run one epoch ...
//! let profile = profiler.stop()?;
//! println!("{} kernels, {:.1} us busy", profile.kernel_launches(), profile.busy_us());
//! for kernel in profile.largest(10) {
//!     println!("{:8.1} us {:5} x {}", kernel.total_us, kernel.count, kernel.name);
//! }
//! # Ok::<(), torch_ext::Error>(())
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};
use crate::ffi;

static RUNNING: AtomicBool = AtomicBool::new(false);

/// The profiler, on between [`KernelProfiler::start`] and
/// [`KernelProfiler::stop`] (or drop, which discards the profile).
#[derive(Debug)]
pub struct KernelProfiler {
    stopped: bool,
}

/// One kernel (or copy, or memset) name's launches in a profile.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelStat {
    /// The kernel's (demangled) name, or `Memcpy ...` / `Memset ...`.
    pub name: String,
    /// How many times it ran.
    pub count: u64,
    /// Its summed device time, microseconds.
    pub total_us: f64,
}

impl KernelStat {
    /// Whether this is a copy or memset rather than a kernel.
    pub fn is_copy(&self) -> bool {
        self.name.starts_with("Memcpy") || self.name.starts_with("Memset")
    }
}

/// Consecutive launches [`KernelProfile::sample`] keeps.
pub const SAMPLE_LAUNCHES: usize = 200;

/// What ran between start and stop.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KernelProfile {
    /// Every name, in no particular order.
    pub kernels: Vec<KernelStat>,
    /// Up to [`SAMPLE_LAUNCHES`] consecutive launches from the middle of
    /// the profile, in start order (each with count 1): one step's kernels
    /// in the order it ran them.
    pub sample: Vec<KernelStat>,
}

impl KernelProfile {
    /// Kernel launches (copies and memsets not counted).
    pub fn kernel_launches(&self) -> u64 {
        self.kernels
            .iter()
            .filter(|k| !k.is_copy())
            .map(|k| k.count)
            .sum()
    }

    /// Copies and memsets.
    pub fn copies(&self) -> u64 {
        self.kernels
            .iter()
            .filter(|k| k.is_copy())
            .map(|k| k.count)
            .sum()
    }

    /// Summed device time of everything that ran, microseconds (work on
    /// several streams at once counts once per stream).
    pub fn busy_us(&self) -> f64 {
        self.kernels.iter().map(|k| k.total_us).sum()
    }

    /// The `n` names with the most device time, largest first.
    pub fn largest(&self, n: usize) -> Vec<&KernelStat> {
        let mut sorted: Vec<&KernelStat> = self.kernels.iter().collect();
        sorted.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
        sorted.truncate(n);
        sorted
    }

    fn parse(text: &str) -> Result<KernelProfile> {
        let mut kernels = Vec::new();
        for line in text.lines().filter(|line| !line.is_empty()) {
            let mut fields = line.rsplitn(3, '\t');
            let (Some(ns), Some(count), Some(name)) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(bad_line(line));
            };
            let count = count.parse::<u64>().map_err(|_| bad_line(line))?;
            let ns = ns.parse::<u64>().map_err(|_| bad_line(line))?;
            kernels.push(KernelStat {
                name: name.to_owned(),
                count,
                total_us: ns as f64 / 1000.0,
            });
        }
        Ok(KernelProfile {
            kernels,
            sample: Vec::new(),
        })
    }
}

fn bad_line(line: &str) -> Error {
    Error::Cpp {
        op: "profile::KernelProfiler::stop",
        message: format!("unreadable profile line {line:?}"),
    }
}

impl KernelProfiler {
    /// Switches the profiler on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] while another profiler runs; libtorch's
    /// error when Kineto cannot start.
    pub fn start() -> Result<KernelProfiler> {
        const OP: &str = "profile::KernelProfiler::start";
        if RUNNING.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidArgument {
                op: OP,
                message: "a kernel profiler is already running".to_owned(),
            });
        }
        // SAFETY: no arguments; errors come back as a message.
        let started = unsafe { ffi::check(OP, ffi::esper_kernel_profile_start()) };
        if let Err(error) = started {
            RUNNING.store(false, Ordering::Release);
            return Err(error);
        }
        Ok(KernelProfiler { stopped: false })
    }

    /// Switches the profiler off and returns what ran since
    /// [`KernelProfiler::start`].
    pub fn stop(mut self) -> Result<KernelProfile> {
        self.stopped = true;
        let (text, sample) = stop_raw()?;
        let mut profile = KernelProfile::parse(&text)?;
        profile.sample = KernelProfile::parse(&sample)?.kernels;
        Ok(profile)
    }
}

fn stop_raw() -> Result<(String, String)> {
    let mut raw = std::ptr::null_mut();
    let mut sample = std::ptr::null_mut();
    let len = i64::try_from(SAMPLE_LAUNCHES).unwrap_or(i64::MAX);
    // SAFETY: both out-parameters are live; on success each holds a string
    // the shim allocated, taken over (and freed) by `take_string`.
    let result = unsafe {
        ffi::check(
            "profile::KernelProfiler::stop",
            ffi::esper_kernel_profile_stop(&mut raw, len, &mut sample),
        )
        .map(|()| {
            (
                ffi::take_string(raw).unwrap_or_default(),
                ffi::take_string(sample).unwrap_or_default(),
            )
        })
    };
    RUNNING.store(false, Ordering::Release);
    result
}

impl Drop for KernelProfiler {
    fn drop(&mut self) {
        if !self.stopped {
            // The profile is discarded; switching the profiler off is what
            // matters, and a failure here has nowhere to go.
            let _ = stop_raw();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_tabs_removed_and_counts_copies_apart() {
        let text = "void k<float>(int, float*)\t3\t4500\nMemcpy DtoD (Device -> Device)\t2\t1000\n";
        let profile = KernelProfile::parse(text).unwrap();
        assert_eq!(profile.kernel_launches(), 3);
        assert_eq!(profile.copies(), 2);
        assert!((profile.busy_us() - 5.5).abs() < 1e-9);
        assert_eq!(profile.largest(1)[0].name, "void k<float>(int, float*)");
        assert!(KernelProfile::parse("no fields here\n").is_err());
    }
}
