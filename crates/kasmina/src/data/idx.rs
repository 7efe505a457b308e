//! Gzipped IDX files (the MNIST family's format), decoded in memory.
//!
//! An IDX file is a big-endian header (magic `0x0000 TT DD`: type byte `TT`,
//! 0x08 for unsigned bytes, and the number of dimensions `DD`; then one `u32`
//! size per dimension) followed by the values in row-major order.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

use super::{DataError, Result};

/// Magic number of an unsigned-byte IDX file with one dimension (labels).
pub(crate) const LABELS_MAGIC: u32 = 0x0000_0801;
/// Magic number of an unsigned-byte IDX file with three dimensions (images).
pub(crate) const IMAGES_MAGIC: u32 = 0x0000_0803;

/// Decompressed sizes above this are not trusted as a capacity hint.
const MAX_CAPACITY_HINT: usize = 1 << 30;

/// One decoded IDX file: its dimensions and the whole decompressed content.
#[derive(Debug)]
pub(crate) struct IdxFile {
    /// The file it came from.
    pub(crate) path: PathBuf,
    /// Size of each dimension, as declared by the header.
    pub(crate) dims: Vec<usize>,
    /// Header plus values.
    content: Vec<u8>,
    /// Where the values start in `content`.
    header_len: usize,
}

impl IdxFile {
    /// The values, row-major, exactly as many as the header promises.
    pub(crate) fn values(&self) -> &[u8] {
        &self.content[self.header_len..]
    }
}

/// Reads a whole file; a missing file becomes [`DataError::MissingFile`].
pub(crate) fn read_file(path: &Path, hint: &str) -> Result<Vec<u8>> {
    fs::read(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::MissingFile {
                path: path.to_path_buf(),
                hint: hint.to_string(),
            }
        } else {
            DataError::Io {
                path: path.to_path_buf(),
                source,
                hint: hint.to_string(),
            }
        }
    })
}

/// Decompresses a whole gzip file in one go.
fn gunzip(path: &Path, compressed: &[u8], hint: &str) -> Result<Vec<u8>> {
    // The gzip trailer ends with the decompressed size modulo 2^32; it is only
    // a capacity hint, so a damaged value merely costs a reallocation.
    let capacity = compressed
        .len()
        .checked_sub(4)
        .map(|start| {
            let mut size = [0u8; 4];
            size.copy_from_slice(&compressed[start..]);
            u32::from_le_bytes(size) as usize
        })
        .unwrap_or(0)
        .min(MAX_CAPACITY_HINT);
    let mut content = Vec::with_capacity(capacity);
    MultiGzDecoder::new(compressed)
        .read_to_end(&mut content)
        .map_err(|source| DataError::Decompress {
            path: path.to_path_buf(),
            source,
            hint: hint.to_string(),
        })?;
    Ok(content)
}

/// Reads and checks a gzipped unsigned-byte IDX file whose magic number must
/// be `expected_magic` (which also fixes the number of dimensions).
pub(crate) fn read_gz(
    path: &Path,
    expected_magic: u32,
    what: &'static str,
    hint: &str,
) -> Result<IdxFile> {
    let compressed = read_file(path, hint)?;
    let content = gunzip(path, &compressed, hint)?;
    drop(compressed);
    parse(path, content, expected_magic, what, hint)
}

/// Checks the header of decompressed IDX content against `expected_magic` and
/// the content length against the header.
fn parse(
    path: &Path,
    content: Vec<u8>,
    expected_magic: u32,
    what: &'static str,
    hint: &str,
) -> Result<IdxFile> {
    let truncated = |expected_bytes: u64| DataError::Truncated {
        path: path.to_path_buf(),
        expected_bytes,
        found_bytes: content.len() as u64,
        hint: hint.to_string(),
    };
    let word = |offset: usize| -> Option<u32> {
        let bytes = content.get(offset..offset + 4)?;
        Some(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    };
    let magic = word(0).ok_or_else(|| truncated(4))?;
    if magic != expected_magic {
        return Err(DataError::BadMagic {
            path: path.to_path_buf(),
            expected: expected_magic,
            found: magic,
            what,
            hint: hint.to_string(),
        });
    }
    let n_dims = (expected_magic & 0xFF) as usize;
    let header_len = 4 + 4 * n_dims;
    let dims: Vec<usize> = (0..n_dims)
        .map(|dim| word(4 + 4 * dim).map(|size| size as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| truncated(header_len as u64))?;
    // u32 sizes multiplied in u128 cannot overflow for up to 3 dimensions.
    let n_values: u128 = dims.iter().map(|&size| size as u128).product();
    let expected_bytes = u64::try_from(header_len as u128 + n_values).unwrap_or(u64::MAX);
    let found_bytes = content.len() as u64;
    if found_bytes < expected_bytes {
        return Err(truncated(expected_bytes));
    }
    if found_bytes > expected_bytes {
        return Err(DataError::TrailingData {
            path: path.to_path_buf(),
            expected_bytes,
            found_bytes,
            hint: hint.to_string(),
        });
    }
    Ok(IdxFile {
        path: path.to_path_buf(),
        dims,
        content,
        header_len,
    })
}
