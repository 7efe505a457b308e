//! IDX arrays (the MNIST family's format), read as a stream: header first,
//! then exactly the promised payload.
//!
//! An IDX stream is a big-endian header (magic `0x0000 TT DD`: type byte
//! `TT`, 0x08 for unsigned bytes, and the rank `DD`; then one `u32` size per
//! dimension) followed by the values in row-major order.
//!
//! The readers here are pure (bytes in, [`IdxArray`] or [`FormatError`] out;
//! no file, no tch), so fuzz targets can drive them directly:
//! [`parse_idx_reader`] for decompressed bytes, [`parse_idx_gz`] for a gzip
//! stream. The header is read and checked before anything is allocated:
//! magic, element type, rank (`1..=`[`MAX_IDX_RANK`]), every dimension at
//! least 1, and the payload size (checked product) at most
//! [`MAX_IDX_BYTES`]. Then exactly the promised bytes are read through
//! `take`, with at most [`IDX_RESERVE_BYTES`] reserved up front, and at most
//! [`TRAILING_PROBE_BYTES`] beyond them to detect trailing data, so memory
//! and inflation work are bounded by the header's promise, not by the
//! compression ratio of the input.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::limits::{IDX_RESERVE_BYTES, MAX_IDX_BYTES, MAX_IDX_RANK, TRAILING_PROBE_BYTES};
use super::{DataError, FormatError, Result};

/// Magic number of an unsigned-byte IDX file with one dimension (labels).
pub const LABELS_MAGIC: u32 = 0x0000_0801;
/// Magic number of an unsigned-byte IDX file with three dimensions (images).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// The IDX element type of unsigned bytes, the only one read.
pub const UNSIGNED_BYTE: u8 = 0x08;

/// One decoded IDX array: its magic number, dimensions and values.
///
/// Produced only by the readers of this module, so `values().len()` is
/// always the product of `dims()`, every dimension is at least 1 and the
/// payload is at most [`MAX_IDX_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    magic: u32,
    dims: Vec<usize>,
    values: Vec<u8>,
}

impl IdxArray {
    /// The magic number (`0x0000_08DD`, `DD` the rank).
    pub fn magic(&self) -> u32 {
        self.magic
    }

    /// Size of each dimension, as the header declares them.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The values, row-major, exactly as many as the header promises.
    pub fn values(&self) -> &[u8] {
        &self.values
    }

    /// The values, giving up the array.
    pub fn into_values(self) -> Vec<u8> {
        self.values
    }
}

/// Reads one unsigned-byte IDX array from decompressed bytes.
///
/// # Errors
/// A [`FormatError`]: [`FormatError::NotIdx`], [`FormatError::UnsupportedType`],
/// [`FormatError::BadRank`], [`FormatError::EmptyDimension`],
/// [`FormatError::TooLarge`] (payload above [`MAX_IDX_BYTES`]),
/// [`FormatError::Truncated`], [`FormatError::TrailingData`], or
/// [`FormatError::Read`] when `reader` fails.
pub fn parse_idx_reader<R: Read>(reader: R) -> Result<IdxArray, FormatError> {
    parse(reader, None)
}

/// [`parse_idx_reader`] over a gzip stream (one or more members), inflated
/// only as far as the header's promise plus [`TRAILING_PROBE_BYTES`].
///
/// # Errors
/// As [`parse_idx_reader`]; a damaged gzip stream or a CRC mismatch is
/// [`FormatError::Read`].
pub fn parse_idx_gz<R: Read>(compressed: R) -> Result<IdxArray, FormatError> {
    parse(MultiGzDecoder::new(compressed), None)
}

/// [`parse_idx_gz`] that also requires the magic number `expected` (which
/// fixes the rank); `what` names it in [`FormatError::BadMagic`].
///
/// # Errors
/// As [`parse_idx_gz`], plus [`FormatError::BadMagic`], checked first.
pub fn parse_idx_gz_expecting<R: Read>(
    compressed: R,
    expected: u32,
    what: &'static str,
) -> Result<IdxArray, FormatError> {
    parse(MultiGzDecoder::new(compressed), Some((expected, what)))
}

/// Fills `buf` from `reader` until full or at end of stream; returns the
/// number of bytes read.
fn fill<R: Read>(reader: &mut R, buf: &mut [u8]) -> Result<usize, FormatError> {
    let mut filled = 0;
    while let Some(rest) = buf.get_mut(filled..).filter(|rest| !rest.is_empty()) {
        match reader.read(rest) {
            Ok(0) => break,
            Ok(read) => filled = filled.saturating_add(read),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(FormatError::Read(error)),
        }
    }
    Ok(filled)
}

fn parse<R: Read>(
    mut reader: R,
    expected: Option<(u32, &'static str)>,
) -> Result<IdxArray, FormatError> {
    let mut word = [0u8; 4];
    let got = fill(&mut reader, &mut word)?;
    if got < word.len() {
        return Err(FormatError::Truncated {
            expected_bytes: 4,
            found_bytes: got as u64,
        });
    }
    let magic = u32::from_be_bytes(word);
    if let Some((expected, what)) = expected
        && magic != expected
    {
        return Err(FormatError::BadMagic {
            expected,
            found: magic,
            what,
        });
    }
    let [zero_a, zero_b, type_code, rank] = word;
    if zero_a != 0 || zero_b != 0 {
        return Err(FormatError::NotIdx { found: magic });
    }
    if type_code != UNSIGNED_BYTE {
        return Err(FormatError::UnsupportedType { type_code });
    }
    if rank == 0 || rank > MAX_IDX_RANK {
        return Err(FormatError::BadRank {
            rank,
            max: MAX_IDX_RANK,
        });
    }
    // rank <= 4: the header is at most 20 bytes.
    let header_len = u64::from(rank).saturating_add(1).saturating_mul(4);
    let mut dims = Vec::with_capacity(usize::from(rank));
    let mut payload: u128 = 1;
    for index in 0..usize::from(rank) {
        let got = fill(&mut reader, &mut word)?;
        if got < word.len() {
            return Err(FormatError::Truncated {
                expected_bytes: header_len,
                found_bytes: (index as u64)
                    .saturating_add(1)
                    .saturating_mul(4)
                    .saturating_add(got as u64),
            });
        }
        let size = u32::from_be_bytes(word);
        if size == 0 {
            return Err(FormatError::EmptyDimension { index });
        }
        // At most four factors below 2^32: the product stays below 2^128.
        payload = payload.saturating_mul(u128::from(size));
        dims.push(size as usize);
    }
    let too_large = FormatError::TooLarge {
        what: "IDX payload",
        bytes: payload,
        limit: MAX_IDX_BYTES,
    };
    let payload = match u64::try_from(payload) {
        Ok(payload) if payload <= MAX_IDX_BYTES => payload,
        _ => return Err(too_large),
    };
    // Both bounded (20 bytes, MAX_IDX_BYTES): the sum cannot saturate.
    let expected_bytes = header_len.saturating_add(payload);
    let mut values = Vec::new();
    let reserve = payload.min(IDX_RESERVE_BYTES) as usize;
    if values.try_reserve_exact(reserve).is_err() {
        return Err(too_large);
    }
    let read = (&mut reader)
        .take(payload)
        .read_to_end(&mut values)
        .map_err(FormatError::Read)?;
    if (read as u64) < payload {
        return Err(FormatError::Truncated {
            expected_bytes,
            found_bytes: header_len.saturating_add(read as u64),
        });
    }
    // Drive the stream to its end (a gzip decoder checks its CRC there), but
    // read no more than the probe.
    let mut probe = [0u8; 512];
    let mut trailing = 0u64;
    loop {
        let got = fill(&mut reader, &mut probe)?;
        trailing = trailing.saturating_add(got as u64);
        if got < probe.len() || trailing >= TRAILING_PROBE_BYTES {
            let at_least = got == probe.len();
            if trailing > 0 {
                return Err(FormatError::TrailingData {
                    expected_bytes,
                    found_bytes: expected_bytes.saturating_add(trailing),
                    at_least,
                });
            }
            break;
        }
    }
    Ok(IdxArray {
        magic,
        dims,
        values,
    })
}

/// Opens `path` and reads it whole, refusing files above `limit` bytes; a
/// missing file becomes [`DataError::MissingFile`].
pub(crate) fn read_file(path: &Path, limit: u64, hint: &str) -> Result<Vec<u8>> {
    let io_error = |source: std::io::Error| {
        if source.kind() == ErrorKind::NotFound {
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
    };
    let file = File::open(path).map_err(io_error)?;
    let size = file.metadata().map_err(io_error)?.len();
    let too_large = |bytes: u64| DataError::Format {
        path: path.to_path_buf(),
        source: FormatError::TooLarge {
            what: "file",
            bytes: u128::from(bytes),
            limit,
        },
        hint: hint.to_string(),
    };
    if size > limit {
        return Err(too_large(size));
    }
    let mut content = Vec::new();
    content
        .try_reserve_exact(size as usize)
        .map_err(|_| too_large(size))?;
    // `take` keeps the bound even if the file grows while it is read.
    let read = file
        .take(limit.saturating_add(1))
        .read_to_end(&mut content)
        .map_err(io_error)?;
    if read as u64 > limit {
        return Err(too_large(read as u64));
    }
    Ok(content)
}

/// Reads and checks a gzipped unsigned-byte IDX file whose magic number must
/// be `expected_magic` (which also fixes the rank).
pub(crate) fn read_gz(
    path: &Path,
    expected_magic: u32,
    what: &'static str,
    hint: &str,
) -> Result<IdxArray> {
    let compressed = read_file(path, super::limits::MAX_GZ_FILE_BYTES, hint)?;
    parse_idx_gz_expecting(compressed.as_slice(), expected_magic, what).map_err(|error| match error
    {
        FormatError::Read(source) => DataError::Decompress {
            path: path.to_path_buf(),
            source,
            hint: hint.to_string(),
        },
        source => DataError::Format {
            path: path.to_path_buf(),
            source,
            hint: hint.to_string(),
        },
    })
}
