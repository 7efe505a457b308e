//! What the pure-bytes readers ([`super::idx`], [`super::cifar10::parse_records`])
//! refuse, without any file context: the loaders wrap a [`FormatError`] in
//! [`super::DataError::Format`] together with the file's path and a hint.

/// Why bytes are not a valid IDX array or run of CIFAR-10 records.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The byte stream itself failed (for gzipped input: a damaged, cut or
    /// non-gzip stream, or a CRC mismatch).
    #[error("the stream cannot be read: {0}")]
    Read(#[source] std::io::Error),
    /// The first two bytes of an IDX magic number must be zero.
    #[error("{found:#010x} is not an IDX magic number (its first two bytes must be zero)")]
    NotIdx {
        /// The magic number found.
        found: u32,
    },
    /// The magic number is valid IDX but not the one the reader needs.
    #[error("wrong magic number: expected {expected:#010x} ({what}), found {found:#010x}")]
    BadMagic {
        /// The magic number the content should start with.
        expected: u32,
        /// The magic number it starts with.
        found: u32,
        /// What the expected magic number stands for.
        what: &'static str,
    },
    /// An IDX element type other than unsigned bytes (0x08).
    #[error("IDX element type {type_code:#04x} is not supported (only 0x08, unsigned bytes)")]
    UnsupportedType {
        /// The type byte found.
        type_code: u8,
    },
    /// An IDX rank (number of dimensions) outside `1..=max`.
    #[error("IDX rank {rank} is outside 1..={max}")]
    BadRank {
        /// The rank found.
        rank: u8,
        /// The largest rank read ([`super::limits::MAX_IDX_RANK`]).
        max: u8,
    },
    /// An IDX dimension of size 0.
    #[error("IDX dimension {index} has size 0 (every dimension must be at least 1)")]
    EmptyDimension {
        /// Which dimension (0-based).
        index: usize,
    },
    /// The header (or the file size) promises more bytes than the stated
    /// bound; nothing was allocated for them.
    #[error("{what} of {bytes} bytes is above the bound of {limit} bytes")]
    TooLarge {
        /// What is too large, e.g. `IDX payload`.
        what: &'static str,
        /// Bytes promised (saturated at `u128::MAX`).
        bytes: u128,
        /// The bound ([`super::limits`]).
        limit: u64,
    },
    /// The content ends before the header's promise is met.
    #[error(
        "cut short: the header promises {expected_bytes} bytes of (decompressed) content, \
         the stream holds {found_bytes}"
    )]
    Truncated {
        /// Bytes the header promises, header included.
        expected_bytes: u64,
        /// Bytes present.
        found_bytes: u64,
    },
    /// The content goes on after the header's promise is met.
    #[error(
        "trailing data: the header promises {expected_bytes} bytes of (decompressed) content, \
         the stream holds {found_bytes}{}",
        if *at_least { " or more" } else { "" }
    )]
    TrailingData {
        /// Bytes the header promises, header included.
        expected_bytes: u64,
        /// Bytes present; with `at_least`, only this many were read (the
        /// rest of the stream is not inflated, see
        /// [`super::limits::TRAILING_PROBE_BYTES`]).
        found_bytes: u64,
        /// Whether the stream holds more than `found_bytes`.
        at_least: bool,
    },
    /// A CIFAR-10 file with no record.
    #[error("the file is empty (a CIFAR-10 file holds at least one 3073-byte record)")]
    Empty,
    /// A CIFAR-10 file whose size is not a whole number of records.
    #[error(
        "{size} bytes is not a multiple of the {record_size}-byte CIFAR-10 record \
         (1 label byte + 3072 pixel bytes)"
    )]
    BadRecordSize {
        /// The size in bytes.
        size: u64,
        /// Size of one record.
        record_size: u64,
    },
    /// A label byte that is not a class index.
    #[error(
        "label {label} of sample {sample} is out of range (the data set has {n_classes} \
         classes, labels 0..{n_classes})"
    )]
    LabelOutOfRange {
        /// Index of the sample within the file.
        sample: usize,
        /// The label found.
        label: u8,
        /// Number of classes of the data set.
        n_classes: usize,
    },
}
