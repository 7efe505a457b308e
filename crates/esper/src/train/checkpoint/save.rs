//! Writing a checkpoint: the trainer's exported state (tolaria's
//! `ModelTrainer::export_state`) and the run's values in a manifest, each
//! file synced, the folder renamed.

use super::*;

/// Writes the checkpoint of `trainer` after `trainer.epoch()` epochs into
/// `run_dir/checkpoints/<epoch>/` (see the module docs); returns its folder.
pub(crate) fn save(run_dir: &Path, trainer: &ModelTrainer, extras: Extras<'_>) -> Result<PathBuf> {
    let TrainerState {
        manifest: state,
        tensors,
    } = trainer
        .export_state()
        .context("exporting the trainer's state")?;
    let config = extras.config;
    let manifest = Manifest {
        format: FORMAT.to_owned(),
        version: VERSION,
        epoch: state.epoch,
        germinations: state.germinations,
        config: config.clone(),
        rng: RngState {
            libtorch: "manual_seed(epoch_seed(seed, epoch)) before every epoch".to_owned(),
            next_epoch_libtorch_seed: tolaria::engine::trainer::epoch_seed(
                config.seed,
                state.epoch,
            ),
            shuffle_seed: trainer.config().seed,
            next_shuffle_epoch: trainer.train_data().epoch(),
        },
        slots: state.slots,
        controller: extras.controller,
        governor: state.governor,
        optimizers: state.optimizers,
        tensors: state.tensors,
        epoch_log_records: extras.epoch_log_records,
        telemetry: telemetry_lengths(&run_dir.join(super::super::TELEMETRY_DIR))?,
        files: Vec::new(),
    };
    write(run_dir, manifest, &tensors)
}

/// Every file of `dir` (none when it does not exist) with its length.
pub(crate) fn telemetry_lengths(dir: &Path) -> Result<Vec<FileLength>> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(error) => return Err(error).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let metadata = entry.metadata().context("telemetry file metadata")?;
        if metadata.is_file() {
            files.push(FileLength {
                file: entry.file_name().to_string_lossy().into_owned(),
                bytes: metadata.len(),
            });
        }
    }
    files.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(files)
}

/// Opens `path` and `fsync`s it (a file or a folder).
pub(crate) fn sync_path(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|file| file.sync_all())
        .with_context(|| format!("fsync {}", path.display()))
}

/// Writes `bytes` to `path` and `fsync`s it.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

pub(super) fn checksum_text(bytes: &[u8]) -> String {
    format!("fnv1a64:{:016x}", fnv1a64(bytes))
}

/// The atomic write (see the module docs).
fn write(run_dir: &Path, mut manifest: Manifest, tensors: &[(String, Tensor)]) -> Result<PathBuf> {
    let root = run_dir.join(DIR);
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let epoch = manifest.epoch;
    let partial = root.join(format!("{PARTIAL_PREFIX}{epoch}"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)
            .with_context(|| format!("removing {}", partial.display()))?;
    }
    std::fs::create_dir(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let tensors_path = partial.join(TENSORS);
    Tensor::write_safetensors(tensors, &tensors_path)
        .with_context(|| format!("writing {}", tensors_path.display()))?;
    sync_path(&tensors_path)?;
    let bytes = std::fs::read(&tensors_path)
        .with_context(|| format!("reading back {}", tensors_path.display()))?;
    manifest.files = vec![FileChecksum {
        name: TENSORS.to_owned(),
        bytes: bytes.len() as u64,
        fnv1a64: format!("{:016x}", fnv1a64(&bytes)),
    }];
    let body = serde_json::to_value(&manifest).context("encoding the manifest")?;
    let compact = serde_json::to_vec(&body).context("encoding the manifest")?;
    let file = ManifestFile {
        checksum: checksum_text(&compact),
        manifest: body,
    };
    let mut text = serde_json::to_vec_pretty(&file).context("encoding the manifest")?;
    text.push(b'\n');
    write_synced(&partial.join(MANIFEST), &text)?;
    sync_path(&partial)?;
    let target = root.join(epoch.to_string());
    if target.exists() {
        // A checkpoint of the same epoch from before a resume: replaced.
        let stale = root.join(format!("{PARTIAL_PREFIX}{epoch}-replaced"));
        if stale.exists() {
            std::fs::remove_dir_all(&stale)
                .with_context(|| format!("removing {}", stale.display()))?;
        }
        std::fs::rename(&target, &stale)
            .with_context(|| format!("moving {} aside", target.display()))?;
        std::fs::remove_dir_all(&stale).with_context(|| format!("removing {}", stale.display()))?;
    }
    std::fs::rename(&partial, &target)
        .with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    sync_path(&root)?;
    Ok(target)
}
