//! Writing a checkpoint: the trainer's exported state (tolaria's
//! `ModelTrainer::export_state`) and the run's values in a manifest, each
//! file synced, the folder renamed.

use super::*;

/// Writes the checkpoint of `trainer` after `trainer.epoch()` epochs into
/// `run_dir/checkpoints/<epoch>/` (see the module docs); returns its folder.
pub(crate) fn save(run_dir: &Path, trainer: &ModelTrainer, extras: Extras<'_>) -> Result<PathBuf> {
    let config = extras.config;
    let epoch = trainer.epoch();
    let fields = RunFields {
        config: config.clone(),
        rng: RngState {
            libtorch: "manual_seed(epoch_seed(seed, epoch)) before every epoch".to_owned(),
            next_epoch_libtorch_seed: tolaria::engine::trainer::epoch_seed(config.seed, epoch),
            shuffle_seed: trainer.config().seed,
            next_shuffle_epoch: trainer.train_data().epoch(),
        },
        controller: extras.controller,
        epoch_log_records: extras.epoch_log_records,
        telemetry: telemetry_lengths(&run_dir.join(super::super::TELEMETRY_DIR))?,
    };
    let serde_json::Value::Object(extra) =
        serde_json::to_value(&fields).context("encoding the run's checkpoint fields")?
    else {
        bail!("the run's checkpoint fields do not encode as a JSON object");
    };
    trainer
        .save_checkpoint(&run_dir.join(DIR), &epoch.to_string(), extra)
        .with_context(|| format!("writing checkpoint {epoch}"))
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
