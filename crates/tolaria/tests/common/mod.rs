//! Helpers shared by the data-reader tests: byte patterns for the files
//! they write and tensor readbacks for comparing what was loaded.

#![allow(dead_code, unreachable_pub)]

/// Pixel bytes covering the whole 0..=255 range, different per sample.
pub fn pixel_pattern(n_values: usize, salt: usize) -> Vec<u8> {
    (0..n_values)
        .map(|i| ((i * 31 + salt * 7) % 256) as u8)
        .collect()
}

/// A tensor's values as `f32`, flattened.
pub fn floats(tensor: &tch::Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&tensor.flatten(0, -1)).unwrap()
}

/// A tensor's values as `i64`, flattened.
pub fn longs(tensor: &tch::Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(&tensor.flatten(0, -1)).unwrap()
}
