//! Helpers the command-line tests share: running the built `esper`, a run
//! directory's whole tree, to show a refused resume changed nothing on disk,
//! the FNV-1a 64 hash the manifests use, and an edit of a manifest that keeps
//! its checksum valid.

#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses a part of the helpers"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file and folder under `root` (relative path -> contents; `None`
/// for a folder).
pub(crate) fn tree(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut entries = BTreeMap::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let relative = path.strip_prefix(root).expect("under root").to_owned();
            if path.is_dir() {
                pending.push(path);
                entries.insert(relative, None);
            } else {
                entries.insert(relative, Some(std::fs::read(&path).expect("read")));
            }
        }
    }
    entries
}

/// Runs the built `esper` with `args` (stdin closed) to its end.
pub(crate) fn esper<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_esper"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("esper runs")
}

/// FNV-1a 64, as the manifests use it (durable's).
pub(crate) use durable::fnv1a64;

/// Edits the body of the checkpoint manifest at `path` and writes it back
/// with a fresh checksum (durable's format: `{"checksum", "manifest"}`), so
/// that it still verifies.
pub(crate) fn rewrite_manifest(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("manifest")).expect("JSON");
    edit(&mut file["manifest"]);
    let compact = serde_json::to_vec(&file["manifest"]).expect("encode");
    file["checksum"] = format!("fnv1a64:{:016x}", fnv1a64(&compact)).into();
    let mut text = serde_json::to_vec_pretty(&file).expect("encode");
    text.push(b'\n');
    std::fs::write(path, text).expect("write");
}
