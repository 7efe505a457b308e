//! [`LstmState`]: the recurrent state `h`, `c` of a batch.

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
