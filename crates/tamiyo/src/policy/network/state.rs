//! [`LstmState`]: the recurrent state `h`, `c` of a batch, and
//! [`LstmHealth`], what it looks like (reference §6.3's LSTM health).

use tch::{Device, Kind, Tensor};

use crate::Result;
use crate::error::{TorchResultExt, shape_mismatch};

/// The LSTM state of a batch: `h` and `c`, each `[layers, B, hidden]`.
#[derive(Debug)]
pub struct LstmState {
    /// Hidden state.
    pub h: Tensor,
    /// Cell state.
    pub c: Tensor,
}

impl LstmState {
    /// Zeros for `batch` environments.
    pub fn zeros(layers: usize, batch: usize, hidden: i64, device: Device) -> Result<LstmState> {
        let shape = [
            i64::try_from(layers).unwrap_or(i64::MAX),
            i64::try_from(batch).unwrap_or(i64::MAX),
            hidden,
        ];
        Ok(LstmState {
            h: Tensor::f_zeros(shape, (Kind::Float, device)).op("lstm state")?,
            c: Tensor::f_zeros(shape, (Kind::Float, device)).op("lstm state")?,
        })
    }

    /// Environments in the batch.
    pub fn batch_size(&self) -> i64 {
        self.h.size().get(1).copied().unwrap_or(0)
    }

    /// The same state cut from the autograd graph (between episodes).
    pub fn detach(&self) -> LstmState {
        LstmState {
            h: self.h.detach(),
            c: self.c.detach(),
        }
    }

    /// A second handle on the same tensors.
    pub fn shallow_clone(&self) -> LstmState {
        LstmState {
            h: self.h.shallow_clone(),
            c: self.c.shallow_clone(),
        }
    }

    /// The state's health in one readback: mean over the batch's rows
    /// (layer × environment) of the L2 norms of `h` and `c`, the largest
    /// magnitude of either, and whether every value is finite. A call
    /// synchronises with the device: for round boundaries, not the step.
    pub fn health(&self) -> Result<LstmHealth> {
        let stats = |t: &Tensor| -> Result<[Tensor; 3]> {
            let t = t.f_to_kind(Kind::Float).op("lstm health")?;
            let rows = t
                .f_flatten(0, 1)
                .op("lstm health")?
                .f_square()
                .op("lstm health")?
                .f_sum_dim_intlist([1i64].as_slice(), false, Kind::Float)
                .op("lstm health")?
                .f_sqrt()
                .op("lstm health")?;
            Ok([
                rows.f_mean(None::<Kind>).op("lstm health")?,
                t.f_abs()
                    .op("lstm health")?
                    .f_nan_to_num(None, None, None)
                    .op("lstm health")?
                    .f_max()
                    .op("lstm health")?,
                t.f_isfinite()
                    .op("lstm health")?
                    .f_all()
                    .op("lstm health")?
                    .f_to_kind(Kind::Float)
                    .op("lstm health")?,
            ])
        };
        if self.h.numel() == 0 {
            return Ok(LstmHealth {
                h_norm: 0.0,
                c_norm: 0.0,
                max_abs: 0.0,
                finite: true,
            });
        }
        let [h_norm, h_max, h_finite] = stats(&self.h)?;
        let [c_norm, c_max, c_finite] = stats(&self.c)?;
        let values = Tensor::f_stack(&[h_norm, c_norm, h_max, c_max, h_finite, c_finite], 0)
            .op("lstm health")?
            .f_to_device(Device::Cpu)
            .op("lstm health")?;
        let values: Vec<f32> = Vec::<f32>::try_from(&values).op("lstm health")?;
        let [h_norm, c_norm, h_max, c_max, h_finite, c_finite] = values[..] else {
            return Err(shape_mismatch("LstmState.health", 6, values.len() as i64));
        };
        Ok(LstmHealth {
            h_norm: f64::from(h_norm),
            c_norm: f64::from(c_norm),
            max_abs: f64::from(h_max.max(c_max)),
            finite: h_finite > 0.5 && c_finite > 0.5,
        })
    }

    /// Environment `env`'s state, `[layers, 1, hidden]` each.
    pub fn select(&self, env: i64) -> Result<LstmState> {
        if !(0..self.batch_size()).contains(&env) {
            return Err(shape_mismatch("LstmState.select", self.batch_size(), env));
        }
        Ok(LstmState {
            h: self.h.f_narrow(1, env, 1).op("lstm state select")?,
            c: self.c.f_narrow(1, env, 1).op("lstm state select")?,
        })
    }
}

/// What an LSTM state looks like ([`LstmState::health`]): a saturated or
/// exploding recurrent state shows here before it shows in the losses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LstmHealth {
    /// Mean L2 norm of `h` per layer and environment.
    pub h_norm: f64,
    /// Mean L2 norm of `c` per layer and environment.
    pub c_norm: f64,
    /// Largest magnitude in `h` or `c` (non-finite values left out).
    pub max_abs: f64,
    /// Every value of `h` and `c` is finite.
    pub finite: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_reports_norms_the_largest_magnitude_and_finiteness() {
        let state = LstmState {
            h: Tensor::from_slice(&[3.0f32, 4.0, 0.0, 0.0]).view([1, 2, 2]),
            c: Tensor::from_slice(&[0.0f32, 1.0, 0.0, -2.0]).view([1, 2, 2]),
        };
        let health = state.health().expect("health");
        // Rows: h (5, 0), c (1, 2).
        assert!((health.h_norm - 2.5).abs() < 1e-6, "{health:?}");
        assert!((health.c_norm - 1.5).abs() < 1e-6, "{health:?}");
        assert!((health.max_abs - 4.0).abs() < 1e-6, "{health:?}");
        assert!(health.finite);

        let broken = LstmState {
            h: Tensor::from_slice(&[f32::NAN, 1.0]).view([1, 1, 2]),
            c: Tensor::from_slice(&[0.5f32, 7.0]).view([1, 1, 2]),
        };
        let health = broken.health().expect("health");
        assert!(!health.finite);
        assert!((health.max_abs - 7.0).abs() < 1e-6, "{health:?}");
    }
}
