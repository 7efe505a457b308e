//! The GAE tests' helpers (`gae.rs` on the CPU, `gpu.rs` on a GPU): one
//! row of values, readbacks and a tolerance check.

use tch::{Kind, Tensor};

/// γ of every GAE case.
pub const GAMMA: f64 = 0.9;
/// λ of every GAE case.
pub const LAMBDA: f64 = 0.8;

/// `values` as a `[1, T]` row.
pub fn row(values: &[f64]) -> Tensor {
    Tensor::from_slice(values).view([1, -1])
}

/// A tensor's values as `f64`, flattened.
pub fn read(tensor: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(tensor.to_kind(Kind::Double).flatten(0, -1)).unwrap()
}

/// `got` equals `expected` within 1e-9, element for element.
pub fn assert_close(got: &[f64], expected: &[f64]) {
    assert_eq!(got.len(), expected.len(), "{got:?} vs {expected:?}");
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() < 1e-9, "{got:?} vs {expected:?}");
    }
}
