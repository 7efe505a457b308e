//! `docs/observability/names.md` lists every telemetry name leyline declares,
//! with its kind (or level), unit and meaning, generated from the catalogue
//! (`leyline::telemetry::{METRICS, EVENTS}`). This test fails when the two
//! drift apart and writes the current list where the failure message says,
//! to copy over the committed one.

use std::fmt::Write as _;
use std::path::PathBuf;

use leyline::telemetry::{EVENTS, METRICS};

fn generated() -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Telemetry names\n");
    let _ = writeln!(
        out,
        "Every metric and event name Esper-rs emits, generated from leyline's catalogue \
         (`leyline::telemetry`; the test `crates/leyline/tests/telemetry_names_doc.rs` keeps this \
         file in step with it). Prometheus exposes a metric with the dots replaced by \
         underscores, and counters end in `_total` (see README.md in this folder).\n"
    );
    let _ = writeln!(out, "## Metrics\n");
    let _ = writeln!(out, "| name | kind | unit | meaning |");
    let _ = writeln!(out, "|---|---|---|---|");
    let mut metrics: Vec<_> = METRICS.iter().collect();
    metrics.sort_by_key(|spec| spec.name);
    for spec in metrics {
        let _ = writeln!(
            out,
            "| `{}` | {:?} | {} | {} |",
            spec.name, spec.kind, spec.unit, spec.help
        );
    }
    let _ = writeln!(out, "\n## Events\n");
    let _ = writeln!(out, "| name | level | meaning |");
    let _ = writeln!(out, "|---|---|---|");
    let mut events: Vec<_> = EVENTS.iter().collect();
    events.sort_by_key(|spec| spec.name);
    for spec in events {
        let _ = writeln!(
            out,
            "| `{}` | {:?} | {} |",
            spec.name, spec.level, spec.help
        );
    }
    out
}

#[test]
fn the_names_document_lists_every_name_of_the_catalogue() {
    let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/observability/names.md");
    let expected = generated();
    let committed = std::fs::read_to_string(&doc).unwrap_or_default();
    if committed != expected {
        let fresh = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("names.md");
        std::fs::write(&fresh, &expected).expect("write the generated list");
        panic!(
            "{} is not the catalogue's list of names; the current list is in {} (copy it over)",
            doc.display(),
            fresh.display()
        );
    }
    // Every name appears exactly once.
    for spec in METRICS {
        assert_eq!(
            committed.matches(&format!("| `{}` |", spec.name)).count(),
            1
        );
    }
    for spec in EVENTS {
        assert_eq!(
            committed.matches(&format!("| `{}` |", spec.name)).count(),
            1
        );
    }
}
