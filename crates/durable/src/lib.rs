//! Durable files for Esper-rs: every checkpoint and every record is written
//! through this crate, so that a crash or a full disk leaves the old file or
//! the new one, never half of either, and a damaged file is found before it
//! is trusted.
//!
//! - [`write_file`]: one file, atomically (temporary file, `fsync`, rename,
//!   `fsync` of the folder). Records, rewritten logs, parity captures.
//! - [`CheckpointWriter`] / [`read_checked`]: a directory of files plus a
//!   `manifest.json` that records each file's size and FNV-1a 64 checksum
//!   and a checksum of its own body; written under a `.partial-` name and
//!   renamed into place; read back only when everything checks. [`list`]
//!   and [`remove_partial`] find and clear the directories a crash cut short.
//! - [`fnv1a64`]: the checksum.
//!
//! The crate has no tch and no other Esper-rs dependency: `tolaria` and
//! `simic` save their trainers' state through it, `esper` and `xtask` their
//! records. Every failure is an [`Error`] naming the path.
//!
//! ```
//! # let root = std::env::temp_dir().join(format!("durable-lib-doc-{}", std::process::id()));
//! let mut writer = durable::CheckpointWriter::begin(&root, "round-3")?;
//! writer.write("state.bin", b"\x00\x01")?;
//! writer.commit(serde_json::json!({ "round": 3 }))?;
//! assert_eq!(durable::list(&root)?.complete, ["round-3"]);
//! // Damage is found on reading.
//! std::fs::write(root.join("round-3").join("state.bin"), b"\x00\x02")?;
//! let error = durable::read_checked(&root.join("round-3")).unwrap_err();
//! assert!(error.to_string().contains("checksum mismatch"));
//! # std::fs::remove_dir_all(&root)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]

mod checksum;
mod dir;
mod error;
mod file;

pub use checksum::{FileChecksum, fnv1a64, fnv1a64_hex};
pub use dir::{
    Checked, CheckpointWriter, FILES_KEY, Listing, MANIFEST, PARTIAL_PREFIX, check_name, list,
    read_checked, remove_partial,
};
pub use error::{Error, Result};
pub use file::{sync_path, write_file};
