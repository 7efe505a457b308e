//! What opening a JSONL sink put on disk, so that a set-up that fails
//! afterwards can take exactly that back, and nothing else.
//!
//! Directories are created one level at a time (the way
//! [`std::fs::create_dir_all`] does) and each one this call created is
//! recorded; a directory that already existed, or that someone else created
//! meanwhile, is never recorded. Undoing removes the recorded file and then
//! the recorded directories, innermost first, with [`std::fs::remove_dir`],
//! which refuses a directory that is not empty: whatever someone else put
//! there in the meantime stays, and so does the directory holding it.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Paths one set-up created: directories (outermost first) and the first
/// file of a rotating sink.
#[derive(Debug, Default)]
#[must_use = "dropping a Created keeps the files; call undo to remove them"]
pub(crate) struct Created {
    pub(crate) dirs: Vec<PathBuf>,
    pub(crate) file: Option<PathBuf>,
}

impl Created {
    /// Removes what was created: the file, then the directories, innermost
    /// first. Best effort: a failure is logged and the rest still tried (the
    /// caller is already returning the error that made it undo). Any handle
    /// on the file must be closed first.
    pub(crate) fn undo(self) {
        if let Some(file) = self.file {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::NotFound => {}
                Err(error) => warn_left(&file, &error),
            }
        }
        for dir in self.dirs.iter().rev() {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::NotFound => {}
                Err(error) => warn_left(dir, &error),
            }
        }
    }
}

#[cold]
fn warn_left(path: &Path, error: &std::io::Error) {
    tracing::warn!(
        target: "nissa",
        path = %path.display(),
        %error,
        "telemetry set-up failed and could not remove what it had created"
    );
}

/// [`std::fs::create_dir_all`] that records, outermost first, each directory
/// it created itself. On error, the directories it created are removed again
/// (and `created` is left as it was).
pub(crate) fn create_dir_all(dir: &Path, created: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let before = created.len();
    let result = create_dir_recursive(dir, created);
    if result.is_err() {
        let ours = Created {
            dirs: created.split_off(before),
            file: None,
        };
        ours.undo();
    }
    result
}

fn create_dir_recursive(dir: &Path, created: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if dir.as_os_str().is_empty() {
        return Ok(());
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {
            created.push(dir.to_owned());
            return Ok(());
        }
        Err(error) if error.kind() == ErrorKind::NotFound => {}
        Err(_) if dir.is_dir() => return Ok(()),
        Err(error) => return Err(error),
    }
    match dir.parent() {
        Some(parent) => create_dir_recursive(parent, created)?,
        None => {
            return Err(std::io::Error::other(
                "the path has no parent that could be created",
            ));
        }
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {
            created.push(dir.to_owned());
            Ok(())
        }
        Err(_) if dir.is_dir() => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_the_directories_it_made_and_undoes_them_innermost_first() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        let deep = root.path().join("a/b/c");
        let mut made = Vec::new();
        create_dir_all(&deep, &mut made).unwrap();
        assert_eq!(made, [root.path().join("a/b"), deep.clone()]);
        // Again: everything exists, nothing is recorded.
        let mut again = Vec::new();
        create_dir_all(&deep, &mut again).unwrap();
        assert!(again.is_empty());

        Created {
            dirs: made,
            file: None,
        }
        .undo();
        assert!(root.path().join("a").is_dir());
        assert!(!root.path().join("a/b").exists());
    }

    #[test]
    fn undo_leaves_a_directory_someone_else_filled() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("run");
        let mut made = Vec::new();
        create_dir_all(&dir, &mut made).unwrap();
        std::fs::write(dir.join("theirs.txt"), b"keep").unwrap();
        Created {
            dirs: made,
            file: None,
        }
        .undo();
        assert_eq!(std::fs::read(dir.join("theirs.txt")).unwrap(), b"keep");
    }

    #[test]
    fn a_failure_midway_removes_what_it_created() {
        let root = tempfile::tempdir().unwrap();
        // `a` and `a/b` are created, then the last name is too long for any
        // file system (NAME_MAX is 255 bytes on the usual ones).
        let target = root.path().join("a/b").join("x".repeat(300));
        let mut created = vec![PathBuf::from("earlier")];
        assert!(create_dir_all(&target, &mut created).is_err());
        assert_eq!(created, [PathBuf::from("earlier")]);
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);

        // A path through a plain file fails before creating anything.
        std::fs::write(root.path().join("file"), b"x").unwrap();
        let mut created = Vec::new();
        assert!(create_dir_all(&root.path().join("file/below"), &mut created).is_err());
        assert!(created.is_empty());
        assert_eq!(std::fs::read(root.path().join("file")).unwrap(), b"x");
    }
}
