//! Checks on what enters the hub from callers: sink names, file stems and
//! timeouts. (A packet's values are checked by leyline's
//! `codec::check_finite_packet`, the one finiteness check, where a sink takes
//! the packet.)
//!
//! Everything here runs where a value enters (building a hub, opening a sink,
//! a flush or close deadline), never on the emit path.

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::time::{Duration, Instant};

use crate::hub::MAX_SINK_NAME_BYTES;
use crate::jsonl::MAX_FILE_STEM_BYTES;
use crate::{Error, Result};

/// A sink name is 1 to [`MAX_SINK_NAME_BYTES`] bytes without control
/// characters (it becomes a log field and a Prometheus label value).
pub(crate) fn check_sink_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("is empty".to_owned())
    } else if name.len() > MAX_SINK_NAME_BYTES {
        Some(format!(
            "has {} bytes, more than {MAX_SINK_NAME_BYTES}",
            name.len()
        ))
    } else if name.chars().any(char::is_control) {
        Some(format!("{name:?} contains a control character"))
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(Error::Config {
            field: "sink name",
            reason,
        }),
    }
}

/// A file stem names a file inside the run directory and nothing else: 1 to
/// [`MAX_FILE_STEM_BYTES`] bytes of ASCII letters, digits, `_`, `-` and `.`,
/// not starting with `.` (which rules out `.`, `..` and hidden files). Path
/// separators, absolute paths, NUL and every other character are refused.
pub(crate) fn check_file_stem(stem: &str) -> Result<()> {
    let shown: String = stem.chars().take(80).collect();
    let reason = if stem.is_empty() {
        Some("is empty".to_owned())
    } else if stem.len() > MAX_FILE_STEM_BYTES {
        Some(format!(
            "has {} bytes, more than {MAX_FILE_STEM_BYTES}",
            stem.len()
        ))
    } else if stem.starts_with('.') {
        Some(format!("{shown:?} starts with '.'"))
    } else {
        stem.chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
            .map(|bad| {
                format!(
                    "{shown:?} contains {bad:?}; only ASCII letters, digits, '_', '-' and '.' \
                     are allowed"
                )
            })
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(Error::Config {
            field: "file_stem",
            reason,
        }),
    }
}

/// The instant `timeout` from now, or `None` when that lies beyond what
/// [`Instant`] can represent (wait without a deadline).
pub(crate) fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_are_plain_file_name_parts() {
        for good in [
            "events",
            "a",
            "run-1_v2.x",
            &"e".repeat(MAX_FILE_STEM_BYTES),
        ] {
            assert!(check_file_stem(good).is_ok(), "{good:?}");
        }
        for bad in [
            "", ".", "..", "../x", "/x", "a/b", "a\\b", "a\0", "é", "a b",
        ] {
            assert!(check_file_stem(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn far_deadlines_mean_no_deadline() {
        assert!(deadline(Duration::MAX).is_none());
        assert!(deadline(Duration::from_secs(1)).is_some());
    }
}
