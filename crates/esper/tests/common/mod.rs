//! Helpers the command-line tests share: running the built `esper`, a run
//! directory's whole tree, to show a refused resume changed nothing on disk,
//! the FNV-1a 64 hash the manifests use, and an edit of a manifest that keeps
//! its checksum valid, a free port no outgoing connection is given, and the
//! provisioned venv's torchrun.

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

/// A free TCP port on the loopback interface, for a process that is only
/// told a port to bind (torchrun and srun ranks, `--metrics-port`): one below the host's ephemeral range, so
/// that no outgoing connection (the other tests make many) is given it
/// before rank 0 binds it. A port from `bind(0)` is in that range and was
/// once taken in between (EADDRINUSE in a CI run). `esper --nproc` has no
/// such gap: it keeps the port bound and hands rank 0 the socket.
pub(crate) fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let span = u32::from(low.saturating_sub(10_000)).max(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    let mut state = nanos ^ std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..1000 {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let port = low - 1 - u16::try_from((state >> 8) % span).expect("below the range");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below {low}");
}

/// The provisioned libtorch venv's torchrun (`ESPER_TORCHRUN` first), or
/// `None` with the reason printed.
pub(crate) fn venv_torchrun() -> Option<std::path::PathBuf> {
    let path = match std::env::var_os("ESPER_TORCHRUN") {
        Some(path) => std::path::PathBuf::from(path),
        None => {
            let Some(site) = std::env::var_os("ESPER_TORCH_SITE") else {
                eprintln!(
                    "skipped: no ESPER_TORCH_SITE (the provisioned venv) and no ESPER_TORCHRUN"
                );
                return None;
            };
            std::path::Path::new(&site).join("../../../bin/torchrun")
        }
    };
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: no torchrun at {}", path.display());
        None
    }
}
