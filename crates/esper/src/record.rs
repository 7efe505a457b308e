//! Writing a baseline record: validated first (leyline refuses what could
//! not be read back, a non-finite metric included), then written whole or
//! not at all.

use std::path::Path;

use anyhow::{Context, Result};
use leyline::baseline::BaselineRecord;

/// Writes `record` as pretty JSON to `path`, creating its folder. A record
/// [`BaselineRecord::validate`] refuses is not written (the error carries
/// the `leyline::Error`). The write is atomic (`durable::write_file`): a
/// reader never sees a partial record.
pub(crate) fn write(record: &BaselineRecord, path: &Path) -> Result<()> {
    let text = record
        .to_json_pretty()
        .with_context(|| format!("refusing to write {}", path.display()))?;
    durable::write_file(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use leyline::baseline::{BASELINE_SCHEMA, Environment, ResultEntry};

    use super::*;

    fn record() -> BaselineRecord {
        BaselineRecord {
            schema: BASELINE_SCHEMA,
            workload: "nissa-emit".to_owned(),
            label: "cpu-test".to_owned(),
            environment: Environment {
                device: "cpu".into(),
                torch: "n/a".into(),
                cuda: "n/a".into(),
                driver: "n/a".into(),
                cpu: "test cpu".into(),
                git_rev: "abc".into(),
                tf32: false,
                amp: "off".into(),
                extra: BTreeMap::new(),
            },
            params: serde_json::json!({ "events": 10 }),
            results: vec![ResultEntry {
                amp: None,
                implementation: "rust".to_owned(),
                mode: "default".to_owned(),
                metrics: BTreeMap::from([("emit_ns_p99".to_owned(), 120.0)]),
                error: None,
            }],
            telemetry_names: vec!["nissa.dropped_total".to_owned()],
        }
    }

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("esper-record-{}-{name}", std::process::id()))
    }

    #[test]
    fn a_record_is_written_whole_and_reads_back() -> Result<()> {
        let dir = scratch("good");
        let path = dir.join("nested/record.json");
        write(&record(), &path)?;
        let text = std::fs::read_to_string(&path)?;
        assert_eq!(BaselineRecord::from_json(&text)?, record());
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().context("parent")?)?
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name() != "record.json")
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn baseline_record_with_non_finite_metric_is_refused_at_write() {
        for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut bad = record();
            bad.results[0]
                .metrics
                .insert("epoch_ms_p50".to_owned(), value);
            let dir = scratch(&format!("bad-{}", value.is_nan()));
            let path = dir.join("record.json");
            let error = write(&bad, &path).expect_err("refused");
            assert!(
                matches!(
                    error.downcast_ref::<leyline::Error>(),
                    Some(leyline::Error::InvalidField {
                        field: "results.metrics",
                        ..
                    })
                ),
                "{error:#}"
            );
            assert!(!path.exists(), "an unreadable record was written");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn a_path_without_a_file_name_is_refused() {
        assert!(write(&record(), Path::new("/")).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// Moved from leyline with the writing: every valid record written
        /// reads back equal from its file.
        #[test]
        fn a_written_record_always_reads_back_equal(
            record in leyline::testing::valid_baseline_record(),
        ) {
            let dir = scratch("property");
            let path = dir.join(&record.workload).join(format!("{}.json", record.label));
            let written = write(&record, &path);
            proptest::prop_assert!(written.is_ok(), "{:?}", written);
            let read = std::fs::read_to_string(&path)
                .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            let _ = std::fs::remove_dir_all(&dir);
            proptest::prop_assert_eq!(BaselineRecord::from_json(&read), Ok(record));
        }
    }
}
