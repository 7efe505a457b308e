//! Reading a checkpoint back: listing the checkpoints newest first,
//! verifying one, restoring the model and the trainer, and cutting the
//! telemetry files back (planned without touching them, then carried out).

use super::*;

/// A checkpoint that verified.
pub(crate) struct Loaded {
    /// Its folder.
    pub(crate) dir: PathBuf,
    /// Its manifest.
    pub(crate) manifest: Manifest,
    /// Its tensors by name.
    pub(crate) tensors: HashMap<String, Tensor>,
}

impl Loaded {
    /// The tensor called `name`.
    pub(crate) fn tensor(&self, name: &str) -> Result<&Tensor> {
        self.tensors
            .get(name)
            .with_context(|| format!("checkpoint {}: no tensor {name}", self.dir.display()))
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
    let tensors: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join(TENSORS))
        .with_context(|| format!("{TENSORS} does not parse"))?
        .into_iter()
        .collect();
    for entry in &manifest.tensors {
        let Some(tensor) = tensors.get(&entry.name) else {
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
    Ok(Loaded {
        dir: dir.to_owned(),
        manifest,
        tensors,
    })
}

/// Checkpoint folders by epoch, newest first, and the warnings about
/// folders cut short.
pub(crate) type Candidates = (Vec<(usize, PathBuf)>, Vec<String>);

/// The checkpoint folders of `run_dir`, newest first, with one warning per
/// folder cut short while being written (`.partial-<epoch>`, ignored). The
/// caller verifies and restores them in this order and takes the first that
/// does both ([`verify`], [`restore_model`], [`restore_trainer`]). An error
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

/// Copies `source` into `target` (same shape and dtype), without autograd.
fn copy_into(target: &Tensor, source: &Tensor, what: &str) -> Result<()> {
    if target.size() != source.size() || target.kind() != source.kind() {
        bail!(
            "resume: {what} is {:?} {:?} in the checkpoint, {:?} {:?} in the model",
            source.kind(),
            source.size(),
            target.kind(),
            target.size()
        );
    }
    tch::no_grad(|| target.shallow_clone().f_copy_(source))
        .with_context(|| format!("resume: copying {what}"))?;
    Ok(())
}

/// Writes the host's variables of `loaded` into `model` and puts every
/// seed back into its slot (Kasmina's [`MorphogeneticModel::restore_seed`]:
/// its lifecycle state, then its variables). Call it on a freshly built
/// model, before the trainer takes it.
pub(crate) fn restore_model(loaded: &Loaded, model: &mut MorphogeneticModel) -> Result<()> {
    copy_all(
        loaded,
        sorted(model.host().var_store().variables()),
        "model/host/",
        "host",
    )?;
    let ids = model.slot_ids();
    if ids.len() != loaded.manifest.slots.len() {
        bail!(
            "resume: the checkpoint has {} slots, the model {}",
            loaded.manifest.slots.len(),
            ids.len()
        );
    }
    for (id, saved) in ids.into_iter().zip(&loaded.manifest.slots) {
        if id.to_string() != saved.slot {
            bail!(
                "resume: slot {} in the checkpoint is {id} in the model",
                saved.slot
            );
        }
        let Some(state) = &saved.lifecycle else {
            continue;
        };
        model
            .restore_seed(id, state.clone())
            .with_context(|| format!("resume: putting seed {} back into {id}", state.seed_id()))?;
        let variables = model
            .slot(id)
            .context("resume: the restored slot")?
            .seed_module()
            .map(|module| sorted(module.var_store().variables()))
            .unwrap_or_default();
        copy_all(
            loaded,
            variables,
            &format!("model/seed/{id}/"),
            &format!("seed {}", state.seed_id()),
        )?;
    }
    Ok(())
}

/// Copies every tensor of `loaded` named `<prefix><variable>` into the
/// variable of that name; the two sets must be the same.
fn copy_all(
    loaded: &Loaded,
    variables: Vec<(String, Tensor)>,
    prefix: &str,
    owner: &str,
) -> Result<()> {
    let expected = loaded
        .manifest
        .tensors
        .iter()
        .filter(|entry| entry.name.starts_with(prefix))
        .count();
    if expected != variables.len() {
        bail!(
            "resume: the checkpoint holds {expected} variables of the {owner}, the model {}",
            variables.len()
        );
    }
    for (name, variable) in variables {
        let source = loaded.tensor(&format!("{prefix}{name}"))?;
        copy_into(&variable, source, &format!("{owner} variable {name}"))?;
    }
    Ok(())
}

/// Writes the optimizer, governor and counters of `loaded` into `trainer`.
pub(crate) fn restore_trainer(loaded: &Loaded, trainer: &mut ModelTrainer) -> Result<()> {
    let manifest = &loaded.manifest;
    let optim = trainer.step().optimizers();
    // A seed germinated at the checkpoint's boundary has no optimizer state
    // in the checkpoint yet: the original run builds it fresh when the next
    // epoch starts, and the resumed trainer has built it fresh already.
    for key in optim.keys() {
        let name = group_name(key);
        let saved = manifest.optimizers.iter().any(|saved| saved.group == name);
        if !saved && key == GroupKey::Host {
            bail!("resume: the checkpoint holds no optimizer state of the host");
        }
    }
    for saved in &manifest.optimizers {
        let key = match saved.group.strip_prefix("seed/") {
            Some(slot) => GroupKey::Seed(
                SlotId::parse(slot).with_context(|| format!("optimizer group {}", saved.group))?,
            ),
            None if saved.group == "host" => GroupKey::Host,
            None => bail!("resume: unknown optimizer group {:?}", saved.group),
        };
        let Some(group) = optim.group(key) else {
            // A seed pruned at the checkpoint's boundary still had its state
            // (the original run drops it when the next epoch starts); the
            // restored slot has no module and so no group.
            let gone = match key {
                GroupKey::Seed(slot) => trainer
                    .model()
                    .slot(slot)
                    .is_ok_and(|slot| slot.seed_module().is_none()),
                GroupKey::Host => false,
            };
            if gone {
                continue;
            }
            bail!("resume: the trainer has no optimizer group {}", saved.group);
        };
        if group.config() != saved.config {
            bail!(
                "resume: optimizer group {} is {:?} in the checkpoint, {:?} now",
                saved.group,
                saved.config,
                group.config()
            );
        }
        copy_into(
            group.learning_rate_tensor(),
            loaded.tensor(&saved.learning_rate)?,
            &saved.learning_rate,
        )?;
        copy_into(
            group.step_count_tensor(),
            loaded.tensor(&saved.step_count)?,
            &saved.step_count,
        )?;
        let state = group.state_tensors();
        if state.len() != saved.state.len() {
            bail!(
                "resume: optimizer group {} has {} state tensors, the checkpoint {}",
                saved.group,
                state.len(),
                saved.state.len()
            );
        }
        for (target, name) in state.iter().zip(&saved.state) {
            copy_into(target, loaded.tensor(name)?, name)?;
        }
    }
    let device = trainer.model().device();
    match (&manifest.governor, trainer.governor_mut()) {
        (Some(saved), Some(governor)) => {
            let snapshot = match &saved.snapshot {
                Some(snapshot) => Some(SnapshotState {
                    epoch: snapshot.epoch,
                    host: named(loaded, &snapshot.host, "governor/host/")?,
                    fossils: snapshot
                        .fossils
                        .iter()
                        .map(|fossil| {
                            Ok(FossilSnapshot {
                                slot: SlotId::parse(&fossil.slot)
                                    .with_context(|| format!("fossil slot {}", fossil.slot))?,
                                seed_id: fossil.seed_id.clone(),
                                variables: named(
                                    loaded,
                                    &fossil.tensors,
                                    &format!("governor/fossil/{}/", fossil.slot),
                                )?,
                            })
                        })
                        .collect::<Result<_>>()?,
                }),
                None => None,
            };
            governor
                .import_state(
                    GovernorState {
                        history: saved.history.clone(),
                        consecutive_panics: saved.consecutive_panics,
                        last_panic_loss: saved.last_panic_loss,
                        rollbacks: saved.rollbacks,
                        snapshot,
                    },
                    device,
                )
                .context("resume: importing the governor's state")?;
        }
        (None, None) => {}
        _ => bail!("resume: the checkpoint and the trainer disagree on the governor"),
    }
    trainer.resume_at(manifest.epoch, manifest.germinations);
    Ok(())
}

/// `(variable name, tensor)` for tensor names under `prefix`.
fn named(loaded: &Loaded, names: &[String], prefix: &str) -> Result<Vec<(String, Tensor)>> {
    names
        .iter()
        .map(|name| {
            let variable = name
                .strip_prefix(prefix)
                .with_context(|| format!("resume: tensor {name} is not under {prefix}"))?;
            Ok((variable.to_owned(), loaded.tensor(name)?.shallow_clone()))
        })
        .collect()
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
