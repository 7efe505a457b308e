//! The one error type of the durable-files crate.

use std::path::PathBuf;

/// Why a durable write or a checked read failed. Every variant names the
/// path it is about.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operating system refused an operation (`what` says which).
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done (`"writing"`, `"renaming"`, `"fsync"`, ...).
        what: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A name that would leave its folder or be taken for a temporary file:
    /// empty, `.`-prefixed, or holding a path separator.
    #[error("{name:?} is not a plain file name (no separators, not empty, not starting with '.')")]
    InvalidName {
        /// The refused name.
        name: String,
    },
    /// The path names no file (it ends in `..` or is a root).
    #[error("{} names no file", path.display())]
    NoFileName {
        /// The refused path.
        path: PathBuf,
    },
    /// A manifest that is not JSON of the expected shape, or a body that
    /// does not encode.
    #[error("{}: {reason}", path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A manifest whose body does not match its recorded checksum (edited or
    /// damaged).
    #[error("{} checksum mismatch (recorded {recorded}, computed {computed})", path.display())]
    ManifestChecksum {
        /// The manifest file.
        path: PathBuf,
        /// The checksum it records.
        recorded: String,
        /// The checksum of its body.
        computed: String,
    },
    /// A file the manifest lists is missing.
    #[error("{} is missing: {source}", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// A listed file has another size than recorded (cut short?).
    #[error("{} is {found} bytes, the manifest recorded {recorded} (cut short?)", path.display())]
    Size {
        /// The file.
        path: PathBuf,
        /// Recorded size.
        recorded: u64,
        /// Size on disk.
        found: u64,
    },
    /// A listed file's contents do not match its recorded checksum.
    #[error(
        "{} checksum mismatch (recorded {recorded}, computed {computed}): the file is corrupted",
        path.display()
    )]
    FileChecksum {
        /// The file.
        path: PathBuf,
        /// Recorded FNV-1a 64, 16 hex digits.
        recorded: String,
        /// Computed FNV-1a 64.
        computed: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`].
    pub(crate) fn io(what: &'static str, path: &std::path::Path, source: std::io::Error) -> Error {
        Error::Io {
            what,
            path: path.to_owned(),
            source,
        }
    }
}
