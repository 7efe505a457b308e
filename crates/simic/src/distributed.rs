//! Data-parallel PPO across processes: one [`DataParallel`] per rank, over a
//! c10d group from [`torch_ext::dist`] (Gloo on the CPU, NCCL on CUDA).
//!
//! Every rank runs its own environments (their seeds are distinct per rank)
//! and its own rollouts; the ranks agree on one policy:
//!
//! - at the start the policy's parameters are broadcast from rank 0;
//! - in every PPO minibatch the gradients are flattened into one pooled
//!   buffer (allocated once), all-reduced and averaged before clipping, so
//!   each rank's AdamW takes the same step;
//! - the KL early-stop reading is averaged, so every rank stops at the same
//!   minibatch (a rank that stopped alone would leave the others waiting);
//! - the running statistics that shape what the policy sees and learns (the
//!   observation normaliser, the value normaliser, the reward normaliser)
//!   are pooled after each round: means averaged and variances combined as
//!   `mean(var_i + mean_i²) − mean²`, which is the pooled variance when every
//!   rank saw as many samples (each rank runs the same number of
//!   environments and steps);
//! - after every update the parameters are checked, not assumed, to be
//!   identical: an element-wise all-reduce of the maximum and of the minimum
//!   must agree bit for bit, otherwise [`Error::Diverged`].
//!
//! A rank that dies makes the others' next collective fail with the group's
//! timeout (Gloo reports the closed connection at once; NCCL's watchdog ends
//! the process), never hang.
//!
//! The host time spent inside these calls (the barrier apart) is summed
//! until [`DataParallel::take_collective_ms`] reads it: what the group adds
//! to an update. A call that reads back also waits there for the device
//! work queued before it (an all-reduce enqueued by
//! [`DataParallel::average_gradients`] is paid at the next readback).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use torch_ext::dist::{ProcessGroup, ReduceOp};

use crate::error::TorchResultExt;
use crate::{Error, Result};

/// One rank's membership of a data-parallel PPO group.
#[derive(Debug)]
pub struct DataParallel {
    group: ProcessGroup,
    /// The pooled gradient buffer, sized at the first use.
    flat: Option<Tensor>,
    /// Per-gradient views of `flat` for the gradient shapes they were made
    /// for (rebuilt when the shapes change).
    views: Option<(Vec<Vec<i64>>, Vec<Tensor>)>,
    /// Nanoseconds of host time inside the collective calls since the last
    /// [`DataParallel::take_collective_ms`].
    spent_ns: AtomicU64,
}

impl DataParallel {
    /// Wraps a joined group. The group's device must be the policy's.
    pub fn new(group: ProcessGroup) -> DataParallel {
        DataParallel {
            group,
            flat: None,
            views: None,
            spent_ns: AtomicU64::new(0),
        }
    }

    /// Milliseconds of host time spent in this group's collective calls
    /// (the barrier apart) since the last call, and starts the count anew.
    pub fn take_collective_ms(&self) -> f64 {
        self.spent_ns.swap(0, Ordering::Relaxed) as f64 / 1e6
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// How many ranks train together.
    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// Where the group's tensors live.
    pub fn device(&self) -> Device {
        self.group.device()
    }

    /// Returns once every rank has arrived (or fails at the timeout).
    pub fn barrier(&self) -> Result<()> {
        Ok(self.group.barrier()?)
    }

    fn check_device(&self, what: &'static str, tensor: &Tensor) -> Result<()> {
        if tensor.device() == self.group.device() {
            Ok(())
        } else {
            Err(Error::ShapeMismatch {
                what,
                expected: format!("tensors on the group's device {:?}", self.group.device()),
                got: format!("{:?}", tensor.device()),
            })
        }
    }

    /// Overwrites `parameters` with rank 0's (without recording gradients).
    pub fn broadcast_parameters(&self, parameters: &[Tensor]) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for parameter in parameters {
            self.check_device("DataParallel.parameters", parameter)?;
            let contiguous = parameter.f_contiguous().op("broadcast contiguous")?;
            self.group.broadcast_(&contiguous, 0)?;
            if contiguous.data_ptr() != parameter.data_ptr() {
                let mut target = parameter.shallow_clone();
                target.f_copy_(&contiguous).op("broadcast copy")?;
            }
        }
        Ok(())
    }

    /// Prepares the group for training on `parameters` and checks it: the
    /// pooled gradient buffer is allocated and all-reduced once (NCCL sets
    /// up its transports at a communicator's first collective of each kind,
    /// which would otherwise land in the first update), and the parameters
    /// are checked identical on every rank (after
    /// [`DataParallel::broadcast_parameters`], they must be).
    pub fn warm_up(&mut self, parameters: &[Tensor]) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let total: i64 = parameters.iter().map(Tensor::numel).map(|n| n as i64).sum();
        let flat =
            Tensor::f_zeros([total], (Kind::Float, self.group.device())).op("gradient buffer")?;
        self.group.all_reduce_(&flat, ReduceOp::Sum)?;
        self.flat = Some(flat);
        // Views of an earlier buffer must not be used with this one.
        self.views = None;
        self.check_identical(parameters)
    }

    /// Replaces every gradient with its mean over the ranks: one all-reduce
    /// of a flat buffer that is allocated on the first call and reused, the
    /// gradients packed into it and unpacked from it with one multi-tensor
    /// copy each (through views made once for the gradients' shapes).
    pub fn average_gradients(&mut self, grads: &[Tensor]) -> Result<()> {
        let _timer = Timer::start(&self.spent_ns);
        let _guard = tch::no_grad_guard();
        for grad in grads {
            self.check_device("DataParallel.gradients", grad)?;
        }
        let shapes: Vec<Vec<i64>> = grads.iter().map(Tensor::size).collect();
        let total: i64 = grads.iter().map(Tensor::numel).map(|n| n as i64).sum();
        let device = self.group.device();
        let mut flat = match self.flat.take() {
            Some(flat) if flat.numel() as i64 == total => flat,
            _ => {
                self.views = None;
                Tensor::f_empty([total], (Kind::Float, device)).op("gradient buffer")?
            }
        };
        let views = match self.views.take() {
            Some((known, views)) if known == shapes => views,
            _ => {
                let mut views = Vec::with_capacity(grads.len());
                let mut offset = 0i64;
                for shape in &shapes {
                    let len: i64 = shape.iter().product();
                    views.push(
                        flat.f_narrow(0, offset, len)
                            .op("gradient view")?
                            .f_view(shape.as_slice())
                            .op("gradient view")?,
                    );
                    offset = offset.saturating_add(len);
                }
                views
            }
        };
        torch_ext::fused::foreach_copy_(&views, grads, false)?;
        self.group.all_reduce_(&flat, ReduceOp::Sum)?;
        let scale = 1.0 / self.world_size() as f64;
        let _ = flat.f_mul_scalar_(scale).op("gradient mean")?;
        torch_ext::fused::foreach_copy_(grads, &views, false)?;
        self.views = Some((shapes, views));
        self.flat = Some(flat);
        Ok(())
    }

    /// The mean of `value` over the ranks (a host scalar, for decisions every
    /// rank must take alike).
    pub fn mean_scalar(&self, value: f64) -> Result<f64> {
        let sums = self.all_reduce_host(&[value])?;
        Ok(sums.first().copied().unwrap_or(f64::NAN) / self.world_size() as f64)
    }

    /// Every rank's `mine` (the same length on every rank), in rank order:
    /// each rank fills its own row of a zero `[world, len]` table and the
    /// ranks sum it (exact: every other entry adds zero). 64-bit words, for
    /// generator states.
    pub fn gather_words(&self, mine: &[u64]) -> Result<Vec<Vec<u64>>> {
        let _timer = Timer::start(&self.spent_ns);
        let world = self.world_size();
        let len = mine.len();
        let mut table = vec![0_i64; world.saturating_mul(len)];
        let start = self.rank().saturating_mul(len);
        for (slot, word) in table.iter_mut().skip(start).zip(mine) {
            *slot = i64::from_ne_bytes(word.to_ne_bytes());
        }
        let tensor = Tensor::f_from_slice(&table)
            .op("gathered words")?
            .f_to_device(self.group.device())
            .op("gathered words")?;
        self.group.all_reduce_(&tensor, ReduceOp::Sum)?;
        let summed = Vec::<i64>::try_from(&tensor.f_to_device(Device::Cpu).op("gathered words")?)
            .map_err(|source| Error::Readback {
            what: "data-parallel gather",
            reason: source.to_string(),
        })?;
        Ok(summed
            .chunks(len.max(1))
            .take(world)
            .map(|row| {
                row.iter()
                    .map(|w| u64::from_ne_bytes(w.to_ne_bytes()))
                    .collect()
            })
            .collect())
    }

    /// Sums host values element-wise over the ranks.
    fn all_reduce_host(&self, values: &[f64]) -> Result<Vec<f64>> {
        let _timer = Timer::start(&self.spent_ns);
        let tensor = Tensor::f_from_slice(values)
            .op("host values")?
            .f_to_device(self.group.device())
            .op("host values")?;
        self.group.all_reduce_(&tensor, ReduceOp::Sum)?;
        Vec::<f64>::try_from(&tensor.f_to_device(Device::Cpu).op("host values")?).map_err(
            |source| Error::Readback {
                what: "data-parallel sum",
                reason: source.to_string(),
            },
        )
    }

    /// Pools per-rank means and variances (equal sample counts): returns the
    /// averaged means and `mean(var_i + mean_i²) − mean²` (clamped at 0).
    pub fn pool_moments(&self, mean: &[f64], var: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
        if mean.len() != var.len() {
            return Err(Error::ShapeMismatch {
                what: "DataParallel.pool_moments",
                expected: format!("{} variances", mean.len()),
                got: var.len().to_string(),
            });
        }
        let mut packed: Vec<f64> = mean.to_vec();
        packed.extend(mean.iter().zip(var).map(|(m, v)| v + m * m));
        let sums = self.all_reduce_host(&packed)?;
        let world = self.world_size() as f64;
        let (mean_sums, square_sums) = sums.split_at(mean.len());
        let pooled_mean: Vec<f64> = mean_sums.iter().map(|s| s / world).collect();
        let pooled_var = square_sums
            .iter()
            .zip(&pooled_mean)
            .map(|(s, m)| (s / world - m * m).max(0.0))
            .collect();
        Ok((pooled_mean, pooled_var))
    }

    /// Checks that every rank holds bit-identical `parameters`: element-wise
    /// maxima and minima over the ranks must be equal. One readback.
    pub fn check_identical(&self, parameters: &[Tensor]) -> Result<()> {
        let _timer = Timer::start(&self.spent_ns);
        let _guard = tch::no_grad_guard();
        let pieces: Vec<Tensor> = parameters
            .iter()
            .map(|p| {
                p.f_detach()
                    .and_then(|p| p.f_reshape([-1]))
                    .and_then(|p| p.f_to_kind(Kind::Float))
            })
            .collect::<std::result::Result<_, _>>()
            .op("parameter flatten")?;
        let high = Tensor::f_cat(&pieces, 0).op("parameter flatten")?;
        let mut low = Tensor::f_empty_like(&high).op("parameter flatten")?;
        low.f_copy_(&high).op("parameter flatten")?;
        self.group.all_reduce_(&high, ReduceOp::Max)?;
        self.group.all_reduce_(&low, ReduceOp::Min)?;
        let differing = high
            .f_ne_tensor(&low)
            .op("parameter compare")?
            .f_sum(Kind::Int64)
            .op("parameter compare")?
            .f_int64_value(&[])
            .map_err(|source| Error::Readback {
                what: "data-parallel parameter check",
                reason: source.to_string(),
            })?;
        if differing == 0 {
            Ok(())
        } else {
            Err(Error::Diverged {
                rank: self.rank(),
                differing: u64::try_from(differing).unwrap_or(u64::MAX),
                total: high.numel() as u64,
            })
        }
    }
}

/// Adds the host time from [`Timer::start`] to its drop to a collective
/// count.
struct Timer<'a> {
    spent_ns: &'a AtomicU64,
    started: Instant,
}

impl<'a> Timer<'a> {
    fn start(spent_ns: &'a AtomicU64) -> Timer<'a> {
        Timer {
            spent_ns,
            started: Instant::now(),
        }
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.spent_ns.fetch_add(ns, Ordering::Relaxed);
    }
}
