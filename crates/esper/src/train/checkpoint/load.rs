//! Reading a checkpoint back: listing the checkpoints newest first,
//! verifying one and handing its trainer state over (tolaria restores it),
//! and cutting the telemetry files back (planned without touching them,
//! then carried out).

use super::*;

/// A checkpoint that verified.
pub(crate) struct Loaded {
    /// Epochs finished at the checkpoint.
    pub(crate) epoch: usize,
    /// The run's fields.
    pub(crate) run: RunFields,
    /// The trainer's state, for `ModelTrainer::restore`.
    pub(crate) state: TrainerState,
}

/// Reads and checks one checkpoint folder: every checksum (tolaria's
/// `read_checkpoint`, through `durable`) and the run's fields.
pub(crate) fn verify(dir: &Path) -> Result<Loaded> {
    let saved = tolaria::engine::trainer::read_checkpoint(dir)?;
    let run: RunFields = serde_json::from_value(serde_json::Value::Object(saved.extra))
        .context("the manifest's run fields")?;
    Ok(Loaded {
        epoch: saved.state.manifest.epoch,
        run,
        state: saved.state,
    })
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
    let listing = durable::list(&root).with_context(|| {
        format!(
            "no checkpoints in {} (was the run started with checkpoints on?)",
            root.display()
        )
    })?;
    let epochs: BTreeMap<usize, PathBuf> = listing
        .complete
        .iter()
        .filter_map(|name| Some((name.parse::<usize>().ok()?, root.join(name))))
        .collect();
    let warnings = listing
        .partial
        .into_iter()
        .map(|rest| {
            format!(
                "checkpoint {rest} was cut short while being written \
                 ({DIR}/{}{rest}); ignored",
                durable::PARTIAL_PREFIX
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
    if loaded.epoch != epoch {
        bail!("it is in folder {epoch} but records epoch {}", loaded.epoch);
    }
    Ok(loaded)
}

/// Removes the folders of checkpoints cut short while being written (a
/// resumed run writes them again); returns their names.
pub(crate) fn remove_partial(run_dir: &Path) -> Result<Vec<String>> {
    let root = run_dir.join(DIR);
    durable::remove_partial(&root).with_context(|| format!("clearing {}", root.display()))
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
