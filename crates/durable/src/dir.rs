//! Checkpoint directories: a folder of files plus `manifest.json`, written
//! whole or not at all, and read back only when every byte checks.
//!
//! [`CheckpointWriter`] writes into `ROOT/.partial-NAME/` (each file written
//! and `fsync`ed, its size and checksum recorded), writes the manifest last
//! (the caller's JSON body with a `files` list added, wrapped as
//! `{"checksum": "fnv1a64:<hex>", "manifest": body}`, the checksum taken
//! over the compact JSON of the body), `fsync`s the folder, renames it to
//! `ROOT/NAME/` (replacing an older folder of that name) and `fsync`s
//! `ROOT`. A crash leaves either the whole directory or a `.partial-`
//! folder that [`list`] reports and [`remove_partial`] clears; a writer
//! dropped without [`CheckpointWriter::commit`] removes its partial folder.
//!
//! [`read_checked`] takes a directory back only when the manifest parses,
//! its checksum holds, and every listed file has its recorded size and
//! checksum.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::checksum::{FileChecksum, fnv1a64_hex};
use crate::error::{Error, Result};
use crate::file::{sync_folder, sync_path, write_synced};

/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST: &str = "manifest.json";
/// Prefix of a directory being written.
pub const PARTIAL_PREFIX: &str = ".partial-";
/// The key of the file list inside a manifest body.
pub const FILES_KEY: &str = "files";

/// `manifest.json`: the body and the checksum of its compact JSON.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    /// `fnv1a64:<16 hex digits>`.
    checksum: String,
    /// The body, `files` included.
    manifest: Value,
}

/// `fnv1a64:<hex>` of the compact JSON of `body`.
fn body_checksum(body: &Value, path: &Path) -> Result<String> {
    let compact = serde_json::to_vec(body).map_err(|error| Error::Manifest {
        path: path.to_owned(),
        reason: format!("the body does not encode: {error}"),
    })?;
    Ok(format!("fnv1a64:{}", fnv1a64_hex(&compact)))
}

/// Refuses names that are empty, start with `.` (temporary and partial
/// files) or hold a path separator.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\']) {
        return Err(Error::InvalidName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// A checkpoint directory being written (see the module docs).
///
/// ```
/// # let root = std::env::temp_dir().join(format!("durable-writer-doc-{}", std::process::id()));
/// let mut writer = durable::CheckpointWriter::begin(&root, "7")?;
/// writer.write("weights.bin", &[1, 2, 3])?;
/// let dir = writer.commit(serde_json::json!({ "epoch": 7 }))?;
/// let read = durable::read_checked(&dir)?;
/// assert_eq!(read.body["epoch"], 7);
/// assert_eq!(read.files[0].name, "weights.bin");
/// # std::fs::remove_dir_all(&root).unwrap();
/// # Ok::<(), durable::Error>(())
/// ```
#[derive(Debug)]
pub struct CheckpointWriter {
    root: PathBuf,
    name: String,
    partial: PathBuf,
    files: Vec<FileChecksum>,
    committed: bool,
}

impl CheckpointWriter {
    /// Starts `root/name/` (creating `root`): an empty `root/.partial-name/`,
    /// replacing one a crash left behind.
    pub fn begin(root: &Path, name: &str) -> Result<CheckpointWriter> {
        check_name(name)?;
        std::fs::create_dir_all(root).map_err(|source| Error::io("creating", root, source))?;
        let partial = root.join(format!("{PARTIAL_PREFIX}{name}"));
        if partial.exists() {
            std::fs::remove_dir_all(&partial)
                .map_err(|source| Error::io("removing", &partial, source))?;
        }
        std::fs::create_dir(&partial).map_err(|source| Error::io("creating", &partial, source))?;
        Ok(CheckpointWriter {
            root: root.to_owned(),
            name: name.to_owned(),
            partial,
            files: Vec::new(),
            committed: false,
        })
    }

    /// Where file `name` goes, for writers that need a path (a tensor
    /// library's own save function); [`CheckpointWriter::adopt`] records it
    /// afterwards.
    pub fn file_path(&self, name: &str) -> Result<PathBuf> {
        check_name(name)?;
        if name == MANIFEST {
            return Err(Error::InvalidName {
                name: name.to_owned(),
            });
        }
        Ok(self.partial.join(name))
    }

    /// Writes file `name` with `bytes`, `fsync`ed, and records it.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<&FileChecksum> {
        let path = self.file_path(name)?;
        write_synced(&path, bytes)?;
        self.record(name, bytes)
    }

    /// Records file `name` that the caller wrote at
    /// [`CheckpointWriter::file_path`]: `fsync`s it and reads it back for its
    /// size and checksum.
    pub fn adopt(&mut self, name: &str) -> Result<&FileChecksum> {
        let path = self.file_path(name)?;
        sync_path(&path)?;
        let bytes =
            std::fs::read(&path).map_err(|source| Error::io("reading back", &path, source))?;
        self.record(name, &bytes)
    }

    fn record(&mut self, name: &str, bytes: &[u8]) -> Result<&FileChecksum> {
        self.files.retain(|file| file.name != name);
        self.files.push(FileChecksum::of(name, bytes));
        self.files.sort_by(|a, b| a.name.cmp(&b.name));
        self.files
            .iter()
            .find(|file| file.name == name)
            .ok_or_else(|| Error::InvalidName {
                name: name.to_owned(),
            })
    }

    /// The files written so far.
    pub fn files(&self) -> &[FileChecksum] {
        &self.files
    }

    /// Writes the manifest (`body`, a JSON object without a `files` key,
    /// with the file list added), renames the folder into place and returns
    /// `root/name/`.
    pub fn commit(mut self, body: Value) -> Result<PathBuf> {
        let manifest_path = self.partial.join(MANIFEST);
        let Value::Object(mut object) = body else {
            return Err(Error::Manifest {
                path: manifest_path,
                reason: "the body must be a JSON object".to_owned(),
            });
        };
        if object.contains_key(FILES_KEY) {
            return Err(Error::Manifest {
                path: manifest_path,
                reason: format!("the body must not set {FILES_KEY:?}: the writer records it"),
            });
        }
        let files = serde_json::to_value(&self.files).map_err(|error| Error::Manifest {
            path: manifest_path.clone(),
            reason: error.to_string(),
        })?;
        object.insert(FILES_KEY.to_owned(), files);
        let body = Value::Object(object);
        let envelope = Envelope {
            checksum: body_checksum(&body, &manifest_path)?,
            manifest: body,
        };
        let mut text = serde_json::to_vec_pretty(&envelope).map_err(|error| Error::Manifest {
            path: manifest_path.clone(),
            reason: error.to_string(),
        })?;
        text.push(b'\n');
        write_synced(&manifest_path, &text)?;
        sync_folder(&self.partial)?;
        let target = self.root.join(&self.name);
        if target.exists() {
            // A directory of the same name from before (a resumed run writes
            // it again): moved aside, then removed.
            let stale = self
                .root
                .join(format!("{PARTIAL_PREFIX}{}-replaced", self.name));
            if stale.exists() {
                std::fs::remove_dir_all(&stale)
                    .map_err(|source| Error::io("removing", &stale, source))?;
            }
            std::fs::rename(&target, &stale)
                .map_err(|source| Error::io("moving aside", &target, source))?;
            std::fs::remove_dir_all(&stale)
                .map_err(|source| Error::io("removing", &stale, source))?;
        }
        std::fs::rename(&self.partial, &target)
            .map_err(|source| Error::io("renaming into", &target, source))?;
        self.committed = true;
        sync_folder(&self.root)?;
        Ok(target)
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.partial);
        }
    }
}

/// A checkpoint directory that checked: its manifest body (the `files` key
/// taken out) and its files.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The directory.
    pub dir: PathBuf,
    /// The manifest body without `files`.
    pub body: Map<String, Value>,
    /// Every file, with the size and checksum it was verified against.
    pub files: Vec<FileChecksum>,
}

impl Checked {
    /// The path of file `name` of the directory, if the manifest lists it.
    pub fn file(&self, name: &str) -> Option<PathBuf> {
        self.files
            .iter()
            .any(|file| file.name == name)
            .then(|| self.dir.join(name))
    }
}

/// Reads `dir/manifest.json` and checks the directory (see the module docs).
pub fn read_checked(dir: &Path) -> Result<Checked> {
    let manifest_path = dir.join(MANIFEST);
    let text = std::fs::read(&manifest_path).map_err(|source| Error::Missing {
        path: manifest_path.clone(),
        source,
    })?;
    let envelope: Envelope = serde_json::from_slice(&text).map_err(|error| Error::Manifest {
        path: manifest_path.clone(),
        reason: format!("not a complete manifest: {error}"),
    })?;
    let computed = body_checksum(&envelope.manifest, &manifest_path)?;
    if computed != envelope.checksum {
        return Err(Error::ManifestChecksum {
            path: manifest_path,
            recorded: envelope.checksum,
            computed,
        });
    }
    let Value::Object(mut body) = envelope.manifest else {
        return Err(Error::Manifest {
            path: manifest_path,
            reason: "the body is not a JSON object".to_owned(),
        });
    };
    let files = body.remove(FILES_KEY).ok_or_else(|| Error::Manifest {
        path: manifest_path.clone(),
        reason: format!("the body has no {FILES_KEY:?} list"),
    })?;
    let files: Vec<FileChecksum> =
        serde_json::from_value(files).map_err(|error| Error::Manifest {
            path: manifest_path.clone(),
            reason: format!("{FILES_KEY:?}: {error}"),
        })?;
    for recorded in &files {
        check_name(&recorded.name)?;
        let path = dir.join(&recorded.name);
        let bytes = std::fs::read(&path).map_err(|source| Error::Missing {
            path: path.clone(),
            source,
        })?;
        let found = bytes.len() as u64;
        if found != recorded.bytes {
            return Err(Error::Size {
                path,
                recorded: recorded.bytes,
                found,
            });
        }
        let computed = fnv1a64_hex(&bytes);
        if computed != recorded.fnv1a64 {
            return Err(Error::FileChecksum {
                path,
                recorded: recorded.fnv1a64.clone(),
                computed,
            });
        }
    }
    Ok(Checked {
        dir: dir.to_owned(),
        body,
        files,
    })
}

/// The directories of a checkpoint root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Names of the complete directories, sorted.
    pub complete: Vec<String>,
    /// Names of the directories cut short while being written (without the
    /// `.partial-` prefix), sorted.
    pub partial: Vec<String>,
}

/// Lists the checkpoint directories under `root` (an [`Error::Io`] when
/// `root` cannot be read, not found included).
pub fn list(root: &Path) -> Result<Listing> {
    let mut listing = Listing::default();
    let entries = std::fs::read_dir(root).map_err(|source| Error::io("reading", root, source))?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::io("reading", root, source))?;
        let is_dir = entry
            .file_type()
            .map_err(|source| Error::io("reading", &entry.path(), source))?
            .is_dir();
        if !is_dir {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix(PARTIAL_PREFIX) {
            listing.partial.push(rest.to_owned());
        } else if !name.starts_with('.') {
            listing.complete.push(name);
        }
    }
    listing.complete.sort();
    listing.partial.sort();
    Ok(listing)
}

/// Removes the directories under `root` cut short while being written;
/// returns their folder names.
pub fn remove_partial(root: &Path) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for rest in list(root)?.partial {
        let name = format!("{PARTIAL_PREFIX}{rest}");
        let path = root.join(&name);
        std::fs::remove_dir_all(&path).map_err(|source| Error::io("removing", &path, source))?;
        removed.push(name);
    }
    Ok(removed)
}
