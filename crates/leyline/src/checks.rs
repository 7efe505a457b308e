//! Field checks shared by the codec and the baseline record. Each returns a
//! [`Error`] naming the message and the field, with the offending
//! value (long text shown truncated).

use crate::{Error, Result, SCHEMA_VERSION};

/// Characters of caller-supplied text repeated in an error reason.
const SHOWN_CHARS: usize = 64;

/// `text` for an error reason: debug-quoted, cut after [`SHOWN_CHARS`] characters.
pub(crate) fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => {
            let head = text.get(..end).unwrap_or_default();
            format!("{head:?}... ({} bytes)", text.len())
        }
    }
}

/// An `InvalidField` error.
pub(crate) fn invalid(message: &'static str, field: &'static str, reason: String) -> Error {
    Error::InvalidField {
        message,
        field,
        reason,
    }
}

/// The message's `schema_version` is the one this build reads.
pub(crate) fn schema(message: &'static str, got: u32) -> Result<()> {
    if got == SCHEMA_VERSION {
        Ok(())
    } else {
        Err(Error::SchemaVersion {
            message,
            expected: SCHEMA_VERSION,
            got,
        })
    }
}

/// `value` is finite.
pub(crate) fn finite(message: &'static str, field: &'static str, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(invalid(message, field, format!("{value} is not finite")))
    }
}

/// `value` is finite and in `[low, high]`.
pub(crate) fn in_range(
    message: &'static str,
    field: &'static str,
    value: f64,
    low: f64,
    high: f64,
) -> Result<()> {
    finite(message, field, value)?;
    if (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(invalid(
            message,
            field,
            format!("{value} is outside [{low}, {high}]"),
        ))
    }
}

/// `text` is not empty.
pub(crate) fn non_empty(message: &'static str, field: &'static str, text: &str) -> Result<()> {
    if text.is_empty() {
        Err(invalid(message, field, "is empty".to_owned()))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_cuts_long_text_on_a_char_boundary() {
        assert_eq!(shown("ab"), "\"ab\"");
        let long = "漢".repeat(100);
        let text = shown(&long);
        assert!(
            text.starts_with('"') && text.ends_with("(300 bytes)"),
            "{text}"
        );
        assert_eq!(text.matches('漢').count(), SHOWN_CHARS);
    }

    #[test]
    fn range_check_names_non_finite_before_range() {
        let error = in_range("M", "f", f64::NAN, 0.0, 1.0);
        assert!(
            matches!(&error, Err(Error::InvalidField { reason, .. }) if reason.contains("not finite"))
        );
        let error = in_range("M", "f", 2.0, 0.0, 1.0);
        assert!(
            matches!(&error, Err(Error::InvalidField { reason, .. }) if reason.contains("outside"))
        );
        assert_eq!(in_range("M", "f", -0.0, 0.0, 1.0), Ok(()));
    }
}
