//! JSONL sink: one telemetry packet per line, in a run directory, with
//! size-based rotation.
//!
//! Files are named `events-0000.jsonl`, `events-0001.jsonl`, ... inside the run
//! directory; a new file starts when the next line would push the current one
//! past `max_file_bytes`. Lines are buffered per batch and written by the
//! flush.
//!
//! Exactness: every line the sink counts delivered reads back with leyline's
//! `TelemetryPacket::from_json`, and every line in a file does. A packet that
//! leyline would refuse to read (non-finite metric value, unknown schema
//! version or level, empty metric or event name) is refused by `write` and
//! counted failed. A write error (disk full, broken pipe) delivers the whole
//! lines that got through and fails the rest; the file is cut back to its
//! last whole line (should even that fail, the next line starts a fresh
//! file). A writer given to [`JsonlSink::to_writer`] cannot be cut back: after
//! a failure the next write starts with a newline, so a fragment stays on a
//! line of its own and is never counted.
//!
//! Configuration is checked by [`JsonlSink::create`]: the file stem must be a
//! plain file-name part (see [`MAX_FILE_STEM_BYTES`]), `max_file_bytes` and
//! `max_files` at least 1.
//!
//! Opening is all or nothing: [`JsonlSink::create`] checks the configuration
//! before touching the disk, and if it cannot create the first file it
//! removes the directories it had created for it. Only what the call itself
//! created is removed (directories it made, never ones that existed or that
//! hold someone else's files); [`JsonlConfig::new_run_dir`] behaves the same
//! way. A hub built with [`crate::HubBuilder::jsonl`] creates these files
//! only after everything else that can fail (the metrics endpoint's bind
//! included) has succeeded.

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

mod created;
mod output;
mod stamp;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use leyline::codec::Contract;
use leyline::proto::TelemetryPacket;

pub(crate) use self::created::Created;
use self::output::{Opener, Output, open_new_file};
use crate::sink::{Flushed, Sink};
use crate::{Error, Result};

/// Name of the JSONL sink built by [`JsonlSink::create`].
pub const JSONL_SINK_NAME: &str = "jsonl";

/// Longest file stem, in bytes. A stem is ASCII letters, digits, `_`, `-`
/// and `.`, not starting with `.`, so it can only name a file inside the run
/// directory.
pub const MAX_FILE_STEM_BYTES: usize = 64;

/// Where and how the JSONL sink writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonlConfig {
    /// Run directory (created if missing).
    pub dir: PathBuf,
    /// File name stem (`events` gives `events-0000.jsonl`); see
    /// [`MAX_FILE_STEM_BYTES`] for what is allowed.
    pub file_stem: String,
    /// Size at which the sink moves on to the next file (at least 1; a line
    /// longer than this gets a file of its own).
    pub max_file_bytes: u64,
    /// Keep at most this many files, deleting the oldest (`None`: keep all;
    /// otherwise at least 1).
    pub max_files: Option<usize>,
}

impl JsonlConfig {
    /// Writes into `dir` with 64 MiB files, keeping all of them.
    pub fn new(dir: impl Into<PathBuf>) -> JsonlConfig {
        JsonlConfig {
            dir: dir.into(),
            file_stem: "events".to_owned(),
            max_file_bytes: 64 * 1024 * 1024,
            max_files: None,
        }
    }

    /// A fresh run directory under `root` (created if missing), named like
    /// the Python hub's `telemetry_YYYY-MM-DD_HHMMSS` (with `_NNN` appended
    /// if taken). All or nothing: on error, the directories of `root` this
    /// call created are removed again.
    pub fn new_run_dir(root: impl AsRef<Path>) -> Result<JsonlConfig> {
        let root = root.as_ref();
        let mut made = Created::default();
        created::create_dir_all(root, &mut made.dirs).map_err(|source| Error::Io {
            op: "create directory",
            path: root.to_owned(),
            source,
        })?;
        let result = JsonlConfig::new_dir_in(root);
        if result.is_err() {
            made.undo();
        }
        result
    }

    /// Creates the first free `telemetry_STAMP[_NNN]` directory in `root`.
    fn new_dir_in(root: &Path) -> Result<JsonlConfig> {
        let stamp = stamp::utc_stamp(SystemTime::now());
        for attempt in 0..1000 {
            let name = if attempt == 0 {
                format!("telemetry_{stamp}")
            } else {
                format!("telemetry_{stamp}_{attempt:03}")
            };
            let dir = root.join(name);
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(JsonlConfig::new(dir)),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(Error::Io {
                        op: "create directory",
                        path: dir,
                        source,
                    });
                }
            }
        }
        Err(Error::Config {
            field: "run directory",
            reason: format!("1000 run directories for {stamp} already exist"),
        })
    }

    /// Sets the rotation size.
    pub fn max_file_bytes(mut self, bytes: u64) -> JsonlConfig {
        self.max_file_bytes = bytes;
        self
    }

    /// Sets how many files to keep.
    pub fn max_files(mut self, files: usize) -> JsonlConfig {
        self.max_files = Some(files);
        self
    }

    /// Sets the file name stem.
    pub fn file_stem(mut self, stem: &str) -> JsonlConfig {
        self.file_stem = stem.to_owned();
        self
    }

    /// Checks every field; the error names the one at fault.
    fn validate(&self) -> Result<()> {
        crate::validate::check_file_stem(&self.file_stem)?;
        if self.max_file_bytes == 0 {
            return Err(Error::Config {
                field: "max_file_bytes",
                reason: "must be at least 1".to_owned(),
            });
        }
        if self.max_files == Some(0) {
            return Err(Error::Config {
                field: "max_files",
                reason: "must be at least 1".to_owned(),
            });
        }
        Ok(())
    }
}

/// Writes each packet as one JSON line.
pub struct JsonlSink {
    name: String,
    output: Output,
    /// Lines of the current batch.
    buffer: Vec<u8>,
    /// Offset just past each line's newline in `buffer`.
    ends: Vec<usize>,
}

impl JsonlSink {
    /// Checks `config`, creates the run directory and opens its first file
    /// (a new one: existing files are never opened). All or nothing: if the
    /// first file cannot be created, the directories this call created are
    /// removed again before the error returns.
    pub fn create(config: JsonlConfig) -> Result<JsonlSink> {
        JsonlSink::create_with(config, Box::new(open_new_file))
    }

    /// [`JsonlSink::create`] with a file opener of the caller's (tests).
    pub(crate) fn create_with(config: JsonlConfig, opener: Opener) -> Result<JsonlSink> {
        // The sink keeps what it created.
        JsonlSink::create_recorded_with(config, opener).map(|(sink, _kept)| sink)
    }

    /// [`JsonlSink::create`], also returning what it put on disk, so that a
    /// hub whose build fails later can take it back ([`Created::undo`], once
    /// the sink is dropped).
    pub(crate) fn create_recorded(config: JsonlConfig) -> Result<(JsonlSink, Created)> {
        JsonlSink::create_recorded_with(config, Box::new(open_new_file))
    }

    fn create_recorded_with(config: JsonlConfig, opener: Opener) -> Result<(JsonlSink, Created)> {
        config.validate()?;
        let mut made = Created::default();
        created::create_dir_all(&config.dir, &mut made.dirs).map_err(|source| Error::Io {
            op: "create directory",
            path: config.dir.clone(),
            source,
        })?;
        match Output::rotating(config, opener) {
            Ok(output) => {
                let sink = JsonlSink::with_output(JSONL_SINK_NAME, output);
                made.file = sink.current_path();
                Ok((sink, made))
            }
            Err(error) => {
                made.undo();
                Err(error)
            }
        }
    }

    /// Writes lines to `writer` (no rotation), under the sink name `name`
    /// (checked when the hub is built). `writer` should not buffer: the sink
    /// counts what its `write` calls accepted, and a buffering writer that
    /// fails in `flush` makes the whole batch count as failed.
    pub fn to_writer(name: &str, writer: impl Write + Send + 'static) -> JsonlSink {
        JsonlSink::with_output(name, Output::stream(Box::new(writer)))
    }

    fn with_output(name: &str, output: Output) -> JsonlSink {
        JsonlSink {
            name: name.to_owned(),
            output,
            buffer: Vec::with_capacity(64 * 1024),
            ends: Vec::with_capacity(256),
        }
    }

    /// Renames the sink (statistics and metric label; checked when the hub
    /// is built).
    pub fn named(mut self, name: &str) -> JsonlSink {
        self.name = name.to_owned();
        self
    }

    /// The file being written, for a rotating sink.
    pub fn current_path(&self) -> Option<PathBuf> {
        match &self.output {
            Output::Rotating(rotating) => Some(output::file_path(&rotating.config, rotating.index)),
            Output::Stream(_) => None,
        }
    }

    /// Refuses what leyline's reader would refuse (its `validate` includes
    /// [`leyline::codec::check_finite_packet`]).
    fn check(&self, packet: &TelemetryPacket) -> Result<()> {
        packet
            .validate()
            .map_err(|error| Error::sink(&self.name, error))
    }
}

impl Sink for JsonlSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn write(&mut self, packet: &TelemetryPacket) -> Result<()> {
        self.check(packet)?;
        let start = self.buffer.len();
        if let Err(error) = serde_json::to_writer(&mut self.buffer, packet) {
            self.buffer.truncate(start);
            return Err(Error::Encode(error));
        }
        // Compact JSON escapes every control character inside strings, so the
        // newline below is the only one in the line.
        self.buffer.push(b'\n');
        self.ends.push(self.buffer.len());
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        match self.flush_written(u64::MAX).error {
            None => Ok(()),
            Some(error) => Err(error),
        }
    }

    /// Writes the batch's lines; the whole lines that reached the output are
    /// delivered. The buffer is emptied even on error.
    fn flush_written(&mut self, _accepted: u64) -> Flushed {
        let written = self.output.write_lines(&self.buffer, &self.ends);
        self.buffer.clear();
        self.ends.clear();
        Flushed {
            delivered: u64::try_from(written.lines).unwrap_or(u64::MAX),
            error: written.error,
        }
    }
}

#[cfg(test)]
mod tests;
