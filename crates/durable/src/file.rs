//! One file written whole or not at all: the bytes go to a temporary file in
//! the same folder, which is `fsync`ed, renamed over the target, and the
//! folder `fsync`ed. A reader (or a crash) sees the old file or the new one,
//! never a mix; a failed write removes its temporary file and leaves the old
//! file as it was.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Distinguishes the temporary files of concurrent writes in one process.
static NEXT_TEMPORARY: AtomicU64 = AtomicU64::new(0);

/// Opens `path` (a file or a folder) and `fsync`s it.
pub fn sync_path(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(|source| Error::io("fsync", path, source))
}

/// `fsync`s a folder so that a rename inside it is durable. Only Unix can
/// open a folder for this; elsewhere the rename's own guarantee is all there
/// is.
pub(crate) fn sync_folder(path: &Path) -> Result<()> {
    if cfg!(unix) { sync_path(path) } else { Ok(()) }
}

/// Creates `path` (truncating it), writes `bytes` and `fsync`s it. Not
/// atomic on its own: [`write_file`] and [`crate::CheckpointWriter`] use it
/// on files no reader sees yet.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = File::create(path).map_err(|source| Error::io("creating", path, source))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|source| Error::io("writing", path, source))
}

/// The folder of `path` (`None` for a bare file name: the current folder).
fn parent_of(path: &Path) -> Option<&Path> {
    path.parent()
        .filter(|parent| !parent.as_os_str().is_empty())
}

/// Writes `bytes` to `path` atomically and durably (see the module docs),
/// creating the folder when needed.
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("durable-doc-{}", std::process::id()));
/// let path = dir.join("record.json");
/// durable::write_file(&path, b"{\"ok\": true}\n")?;
/// assert_eq!(std::fs::read(&path).unwrap(), b"{\"ok\": true}\n");
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), durable::Error>(())
/// ```
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let file_name = path.file_name().ok_or_else(|| Error::NoFileName {
        path: path.to_owned(),
    })?;
    let parent = parent_of(path);
    if let Some(parent) = parent {
        std::fs::create_dir_all(parent).map_err(|source| Error::io("creating", parent, source))?;
    }
    let mut temporary_name = OsString::from(".");
    temporary_name.push(file_name);
    temporary_name.push(format!(
        ".{}-{}.tmp",
        std::process::id(),
        NEXT_TEMPORARY.fetch_add(1, Ordering::Relaxed)
    ));
    let temporary = match parent {
        Some(parent) => parent.join(&temporary_name),
        None => PathBuf::from(&temporary_name),
    };
    let written = write_synced(&temporary, bytes).and_then(|()| {
        std::fs::rename(&temporary, path).map_err(|source| Error::io("renaming into", path, source))
    });
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    sync_folder(parent.unwrap_or(Path::new(".")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("durable-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary() {
        let dir = scratch("replace");
        let path = dir.join("deep").join("a.json");
        write_file(&path, b"first").unwrap();
        write_file(&path, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        let names: Vec<_> = std::fs::read_dir(dir.join("deep"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = scratch("fail");
        let path = dir.join("a.json");
        write_file(&path, b"old").unwrap();
        // A folder in the way of the rename: the write fails, the old file
        // at the other path is untouched and no temporary is left.
        let blocked = dir.join("blocked");
        std::fs::create_dir_all(blocked.join("inside")).unwrap();
        let error = write_file(&blocked, b"new").unwrap_err();
        assert!(matches!(error, Error::Io { .. }), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["a.json", "blocked"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_without_a_file_name_is_refused() {
        assert!(matches!(
            write_file(Path::new("/"), b"x"),
            Err(Error::NoFileName { .. })
        ));
    }
}
