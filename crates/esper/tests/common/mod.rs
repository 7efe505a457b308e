//! Helpers the checkpoint tests share: a run directory's whole tree, to
//! show a refused resume changed nothing on disk, and the FNV-1a 64 hash
//! the manifests use.

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

/// FNV-1a 64, as the manifests use it.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
