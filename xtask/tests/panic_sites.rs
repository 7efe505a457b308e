//! Repository rule: no library crate reaches `panic!`, `unwrap`, `expect`,
//! `unreachable!`, slice indexing or (in the modules that size buffers from
//! caller or file values) unchecked arithmetic without a stated reason.
//!
//! The rule is enforced by clippy, not by text matching: every library crate's
//! `lib.rs` turns the restriction lints of [`PANIC_LINTS`] on for its non-test
//! code, so `cargo clippy -- -D warnings` (part of `cargo xtask test`) fails on
//! any new site. A site that stays must carry
//! `#[expect(clippy::<lint>, reason = "...")]` on the smallest item or
//! statement around it. This test checks that the lints are on in every
//! library crate, that no site is silenced without a reason or by a blanket
//! module-wide allow, and prints the inventory of the sites that remain, each
//! with its reason (`cargo test -p xtask --test panic_sites -- --nocapture`).

use std::path::{Path, PathBuf};

/// Library crates whose non-test code is held to the rule.
const LIBRARY_CRATES: &[&str] = &[
    "leyline",
    "nissa",
    "torch-ext",
    "kasmina",
    "tolaria",
    "tamiyo",
];

/// The clippy restriction lints every library crate turns on.
const PANIC_LINTS: &[&str] = &[
    "unwrap_used",
    "expect_used",
    "panic",
    "unreachable",
    "todo",
    "unimplemented",
    "indexing_slicing",
];

/// Lints that may be silenced site by site (with a reason).
const SILENCEABLE: &[&str] = &[
    "unwrap_used",
    "expect_used",
    "panic",
    "unreachable",
    "indexing_slicing",
    "arithmetic_side_effects",
];

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            // Binaries are separate crates, outside the rule.
            if path.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// One silenced site: where, which lint, why.
struct Site {
    file: String,
    line: usize,
    lint: String,
    reason: Option<String>,
    inner: bool,
}

/// Finds `#[expect(clippy::X, reason = "...")]` / `#[allow(...)]` attributes
/// (possibly spread over several lines) naming one of [`SILENCEABLE`].
fn silenced_sites(root: &Path, file: &Path) -> Vec<Site> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let rel = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    let mut sites = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let is_attr = trimmed.starts_with("#[allow(")
            || trimmed.starts_with("#[expect(")
            || trimmed.starts_with("#![allow(")
            || trimmed.starts_with("#![expect(");
        if !is_attr {
            i += 1;
            continue;
        }
        // Gather the whole attribute up to its closing `)]`.
        let start = i;
        let mut attr = String::from(trimmed);
        while !attr.trim_end().ends_with(")]") && i + 1 < lines.len() {
            i += 1;
            attr.push(' ');
            attr.push_str(lines[i].trim());
        }
        let reason = attr.find("reason").and_then(|at| {
            let rest = &attr[at..];
            let open = rest.find('"')?;
            let close = rest[open + 1..].find('"')?;
            Some(rest[open + 1..open + 1 + close].trim().to_owned())
        });
        for lint in SILENCEABLE {
            if attr.contains(&format!("clippy::{lint}")) {
                sites.push(Site {
                    file: rel.clone(),
                    line: start + 1,
                    lint: (*lint).to_owned(),
                    reason: reason.clone().filter(|r| !r.is_empty()),
                    inner: trimmed.starts_with("#!["),
                });
            }
        }
        i += 1;
    }
    sites
}

#[test]
fn every_library_crate_turns_the_panic_lints_on() {
    let root = workspace_root();
    for name in LIBRARY_CRATES {
        let lib = root.join("crates").join(name).join("src/lib.rs");
        let text = std::fs::read_to_string(&lib).unwrap_or_default();
        // The attribute may wrap; compare without whitespace.
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        assert!(
            compact.contains("#![cfg_attr(not(test),warn("),
            "{name}: lib.rs lacks `#![cfg_attr(not(test), warn(clippy::...))]`"
        );
        for lint in PANIC_LINTS {
            assert!(
                compact.contains(&format!("clippy::{lint}")),
                "{name}: lib.rs does not turn on clippy::{lint}"
            );
        }
    }
}

#[test]
fn every_remaining_site_states_its_reason() {
    let root = workspace_root();
    let mut files = Vec::new();
    for name in LIBRARY_CRATES {
        rust_files(&root.join("crates").join(name).join("src"), &mut files);
    }
    assert!(files.len() > 20, "found only {} library files", files.len());
    let sites: Vec<Site> = files
        .iter()
        .flat_map(|f| silenced_sites(&root, f))
        .collect();
    let mut problems = Vec::new();
    println!("remaining panic and unchecked-arithmetic sites in library code:");
    for site in &sites {
        let reason = site.reason.as_deref().unwrap_or("<no reason>");
        println!("  {}:{} {}: {reason}", site.file, site.line, site.lint);
        if site.reason.is_none() {
            problems.push(format!(
                "{}:{}: clippy::{} silenced without `reason = \"...\"`",
                site.file, site.line, site.lint
            ));
        }
        // A module-wide allow of a panic lint hides every future site; only
        // the arithmetic lint (turned on per module) may be tuned that way.
        if site.inner && site.lint != "arithmetic_side_effects" {
            problems.push(format!(
                "{}:{}: module-wide allow of clippy::{}; silence single sites instead",
                site.file, site.line, site.lint
            ));
        }
    }
    println!("{} site(s)", sites.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_scanner_sees_attributes_with_and_without_reasons() {
    let dir = std::env::temp_dir().join(format!("panic-sites-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("sample.rs");
    std::fs::write(
        &file,
        "#[expect(\n    clippy::indexing_slicing,\n    reason = \"index checked above\"\n)]\nfn a() {}\n\
         #[allow(clippy::unwrap_used)]\nfn b() {}\n#![allow(clippy::panic, reason = \"x\")]\n",
    )
    .expect("write sample");
    let sites = silenced_sites(&dir, &file);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(sites.len(), 3);
    assert_eq!(sites[0].lint, "indexing_slicing");
    assert_eq!(sites[0].reason.as_deref(), Some("index checked above"));
    assert!(!sites[0].inner);
    assert_eq!(sites[1].lint, "unwrap_used");
    assert!(sites[1].reason.is_none());
    assert!(sites[2].inner);
}
