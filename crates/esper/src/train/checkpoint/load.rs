//! Reading a checkpoint back: listing the checkpoints newest first,
//! verifying one and handing its trainer state over (tolaria restores it),
//! and cutting the telemetry files back (planned without touching them,
//! then carried out).

use super::*;

/// A checkpoint that verified.
pub(crate) struct Loaded {
    /// Its manifest.
    pub(crate) manifest: Manifest,
    /// Its tensors.
    pub(crate) tensors: Vec<(String, Tensor)>,
}

impl Loaded {
    /// The trainer's state it holds, for `ModelTrainer::restore` (the
    /// tensors as shallow handles).
    pub(crate) fn trainer_state(&self) -> TrainerState {
        TrainerState {
            manifest: self.manifest.trainer(),
            tensors: self
                .tensors
                .iter()
                .map(|(name, tensor)| (name.clone(), tensor.shallow_clone()))
                .collect(),
        }
    }
}

/// Reads and checks one checkpoint folder.
pub(crate) fn verify(dir: &Path) -> Result<Loaded> {
    let manifest_path = dir.join(MANIFEST);
    let mut text = Vec::new();
    File::open(&manifest_path)
        .and_then(|mut file| file.read_to_end(&mut text))
        .with_context(|| format!("cannot read {MANIFEST}"))?;
    let file: ManifestFile = serde_json::from_slice(&text)
        .with_context(|| format!("{MANIFEST} is not a complete manifest"))?;
    let compact = serde_json::to_vec(&file.manifest).context("re-encoding the manifest")?;
    let actual = checksum_text(&compact);
    if actual != file.checksum {
        bail!(
            "{MANIFEST} checksum mismatch (recorded {}, computed {actual})",
            file.checksum
        );
    }
    let manifest: Manifest =
        serde_json::from_value(file.manifest).with_context(|| format!("{MANIFEST} body"))?;
    if manifest.format != FORMAT || manifest.version != VERSION {
        bail!(
            "{MANIFEST} is format {:?} version {}; this program reads {FORMAT:?} version \
             {VERSION}",
            manifest.format,
            manifest.version
        );
    }
    if !manifest.files.iter().any(|file| file.name == TENSORS) {
        bail!("{MANIFEST} lists no {TENSORS}");
    }
    for recorded in &manifest.files {
        if recorded.name.contains(['/', '\\']) || recorded.name.starts_with('.') {
            bail!(
                "{MANIFEST} names a file outside the checkpoint: {:?}",
                recorded.name
            );
        }
        let path = dir.join(&recorded.name);
        let bytes =
            std::fs::read(&path).with_context(|| format!("{} is missing", recorded.name))?;
        if bytes.len() as u64 != recorded.bytes {
            bail!(
                "{} is {} bytes, the manifest recorded {} (cut short?)",
                recorded.name,
                bytes.len(),
                recorded.bytes
            );
        }
        let checksum = format!("{:016x}", fnv1a64(&bytes));
        if checksum != recorded.fnv1a64 {
            bail!(
                "{} checksum mismatch (recorded {}, computed {checksum}): the file is corrupted",
                recorded.name,
                recorded.fnv1a64
            );
        }
    }
    let tensors = Tensor::read_safetensors(dir.join(TENSORS))
        .with_context(|| format!("{TENSORS} does not parse"))?;
    let by_name: std::collections::HashMap<&str, &Tensor> = tensors
        .iter()
        .map(|(name, tensor)| (name.as_str(), tensor))
        .collect();
    for entry in &manifest.tensors {
        let Some(tensor) = by_name.get(entry.name.as_str()) else {
            bail!("{TENSORS} lacks the tensor {}", entry.name);
        };
        if tensor.size() != entry.shape || format!("{:?}", tensor.kind()) != entry.dtype {
            bail!(
                "{TENSORS}: {} is {:?} {:?}, the manifest says {} {:?}",
                entry.name,
                tensor.kind(),
                tensor.size(),
                entry.dtype,
                entry.shape
            );
        }
    }
    Ok(Loaded { manifest, tensors })
}

/// Checkpoint folders by epoch, newest first, and the warnings about
/// folders cut short.
pub(crate) type Candidates = (Vec<(usize, PathBuf)>, Vec<String>);

/// The checkpoint folders of `run_dir`, newest first, with one warning per
/// folder cut short while being written (`.partial-<epoch>`, ignored). The
/// caller verifies and restores them in this order and takes the first that
/// does both ([`verify`], then `ModelTrainer::restore`). An error
/// when there is no checkpoint folder at all.
pub(crate) fn candidates(run_dir: &Path) -> Result<Candidates> {
    let root = run_dir.join(DIR);
    let entries = std::fs::read_dir(&root).with_context(|| {
        format!(
            "no checkpoints in {} (was the run started with checkpoints on?)",
            root.display()
        )
    })?;
    let mut epochs = BTreeMap::new();
    let mut partial = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", root.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Ok(epoch) = name.parse::<usize>() {
            epochs.insert(epoch, entry.path());
        } else if let Some(rest) = name.strip_prefix(PARTIAL_PREFIX) {
            partial.push(rest.to_owned());
        }
    }
    partial.sort();
    let warnings = partial
        .into_iter()
        .map(|rest| {
            format!(
                "checkpoint {rest} was cut short while being written \
                 ({DIR}/{PARTIAL_PREFIX}{rest}); ignored"
            )
        })
        .collect();
    if epochs.is_empty() {
        bail!("no checkpoint in {}", root.display());
    }
    Ok((epochs.into_iter().rev().collect(), warnings))
}

/// [`verify`], and that the folder `epoch` holds the checkpoint of that
/// epoch.
pub(crate) fn verify_epoch(epoch: usize, dir: &Path) -> Result<Loaded> {
    let loaded = verify(dir)?;
    if loaded.manifest.epoch != epoch {
        bail!(
            "it is in folder {epoch} but records epoch {}",
            loaded.manifest.epoch
        );
    }
    Ok(loaded)
}

/// Removes the folders of checkpoints cut short while being written (a
/// resumed run writes them again); returns their names.
pub(crate) fn remove_partial(run_dir: &Path) -> Result<Vec<String>> {
    let root = run_dir.join(DIR);
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))? {
        let entry = entry.with_context(|| format!("reading {}", root.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(PARTIAL_PREFIX) {
            std::fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// What cutting the telemetry files back to a checkpoint does: each file
/// written since is cut to its recorded length, each file begun after it is
/// removed, so that no packet is duplicated when the resumed run emits those
/// epochs again. Planned ([`TelemetryRewind::plan`]) without touching a
/// file, carried out ([`TelemetryRewind::apply`]) once the run is known to
/// resume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TelemetryRewind {
    /// Files to cut, with the length to cut each to.
    cut: Vec<(PathBuf, u64)>,
    /// Files to remove, by name.
    remove: Vec<String>,
    /// The telemetry folder.
    dir: PathBuf,
}

impl TelemetryRewind {
    /// The rewind of `run_dir/telemetry` to the lengths `saved` recorded;
    /// an error (nothing touched) when a file is shorter than recorded.
    pub(crate) fn plan(run_dir: &Path, saved: &[FileLength]) -> Result<TelemetryRewind> {
        let dir = run_dir.join(super::super::TELEMETRY_DIR);
        let mut rewind = TelemetryRewind {
            dir: dir.clone(),
            ..TelemetryRewind::default()
        };
        for current in telemetry_lengths(&dir)? {
            let path = dir.join(&current.file);
            match saved.iter().find(|saved| saved.file == current.file) {
                Some(saved) if saved.bytes == current.bytes => {}
                Some(saved) if saved.bytes < current.bytes => rewind.cut.push((path, saved.bytes)),
                Some(saved) => bail!(
                    "{} is {} bytes, shorter than the {} recorded at the checkpoint",
                    path.display(),
                    current.bytes,
                    saved.bytes
                ),
                None => rewind.remove.push(current.file),
            }
        }
        Ok(rewind)
    }

    /// Cuts and removes the files; returns the names of those removed.
    pub(crate) fn apply(self) -> Result<Vec<String>> {
        for (path, bytes) in &self.cut {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            file.set_len(*bytes)
                .and_then(|()| file.sync_all())
                .with_context(|| format!("truncating {}", path.display()))?;
        }
        for name in &self.remove {
            let path = self.dir.join(name);
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
        Ok(self.remove)
    }
}
