//! JSONL sink: one telemetry packet per line, in a run directory, with
//! size-based rotation.
//!
//! Files are named `events-0000.jsonl`, `events-0001.jsonl`, ... inside the run
//! directory; a new file starts when the next line would push the current one
//! past `max_file_bytes`. Lines are buffered per batch and written by
//! [`Sink::flush`], so a write error (disk full, broken pipe) fails the batch
//! that could not be written and nothing else.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use leyline::proto::TelemetryPacket;

use crate::sink::Sink;
use crate::{NissaError, Result};

/// Where and how the JSONL sink writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonlConfig {
    /// Run directory (created if missing).
    pub dir: PathBuf,
    /// File name stem (`events` gives `events-0000.jsonl`).
    pub file_stem: String,
    /// Size at which the sink moves on to the next file.
    pub max_file_bytes: u64,
    /// Keep at most this many files, deleting the oldest (`None`: keep all).
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

    /// A fresh run directory under `root`, named like the Python hub's
    /// `telemetry_YYYY-MM-DD_HHMMSS` (with `_NNN` appended if taken).
    pub fn new_run_dir(root: impl AsRef<Path>) -> Result<JsonlConfig> {
        let root = root.as_ref();
        std::fs::create_dir_all(root).map_err(|source| NissaError::Io {
            op: "create directory",
            path: root.to_owned(),
            source,
        })?;
        let stamp = utc_stamp(SystemTime::now());
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
                    return Err(NissaError::Io {
                        op: "create directory",
                        path: dir,
                        source,
                    });
                }
            }
        }
        Err(NissaError::Config {
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
}

/// Where the lines go.
enum Output {
    /// A rotating file in a run directory.
    Rotating {
        config: JsonlConfig,
        file: File,
        index: u64,
        bytes: u64,
    },
    /// Any writer (standard output, a pipe); no rotation.
    Writer(Box<dyn Write + Send>),
}

/// Writes each packet as one JSON line.
pub struct JsonlSink {
    name: String,
    output: Output,
    /// Lines of the current batch.
    buffer: Vec<u8>,
    /// A write error from rotating mid-batch, returned by the next flush.
    deferred_error: Option<std::io::Error>,
}

impl JsonlSink {
    /// Opens the first file of the run directory described by `config`.
    pub fn create(config: JsonlConfig) -> Result<JsonlSink> {
        if config.max_file_bytes == 0 {
            return Err(NissaError::Config {
                field: "max_file_bytes",
                reason: "must be at least 1".to_owned(),
            });
        }
        if config.max_files == Some(0) {
            return Err(NissaError::Config {
                field: "max_files",
                reason: "must be at least 1".to_owned(),
            });
        }
        std::fs::create_dir_all(&config.dir).map_err(|source| NissaError::Io {
            op: "create directory",
            path: config.dir.clone(),
            source,
        })?;
        let (file, index) = open_next(&config, 0)?;
        Ok(JsonlSink {
            name: "jsonl".to_owned(),
            output: Output::Rotating {
                config,
                file,
                index,
                bytes: 0,
            },
            buffer: Vec::with_capacity(64 * 1024),
            deferred_error: None,
        })
    }

    /// Writes lines to `writer` (no rotation), under the sink name `name`.
    pub fn to_writer(name: &str, writer: impl Write + Send + 'static) -> JsonlSink {
        JsonlSink {
            name: name.to_owned(),
            output: Output::Writer(Box::new(writer)),
            buffer: Vec::with_capacity(64 * 1024),
            deferred_error: None,
        }
    }

    /// Renames the sink (statistics and metric label).
    pub fn named(mut self, name: &str) -> JsonlSink {
        self.name = name.to_owned();
        self
    }

    /// The file being written, for a rotating sink.
    pub fn current_path(&self) -> Option<PathBuf> {
        match &self.output {
            Output::Rotating { config, index, .. } => Some(file_path(config, *index)),
            Output::Writer(_) => None,
        }
    }

    /// Writes the buffered lines out; the buffer is emptied even on error.
    fn spill(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let result = match &mut self.output {
            Output::Rotating { file, bytes, .. } => {
                let result = file.write_all(&self.buffer);
                if result.is_ok() {
                    *bytes += self.buffer.len() as u64;
                }
                result
            }
            Output::Writer(writer) => writer.write_all(&self.buffer).and_then(|()| writer.flush()),
        };
        self.buffer.clear();
        result
    }

    /// Closes the current file and opens the next one.
    fn rotate(&mut self) -> Result<()> {
        let Output::Rotating {
            config,
            file,
            index,
            bytes,
        } = &mut self.output
        else {
            return Ok(());
        };
        let (next, next_index) = open_next(config, *index + 1)?;
        *file = next;
        *index = next_index;
        *bytes = 0;
        if let Some(stale) = config
            .max_files
            .and_then(|keep| next_index.checked_sub(keep as u64))
        {
            // Older files were removed by earlier rotations; a missing one is
            // fine.
            let _ = std::fs::remove_file(file_path(config, stale));
        }
        Ok(())
    }
}

impl Sink for JsonlSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn write(&mut self, packet: &TelemetryPacket) -> Result<()> {
        let start = self.buffer.len();
        if let Err(error) = serde_json::to_writer(&mut self.buffer, packet) {
            self.buffer.truncate(start);
            return Err(NissaError::Encode(error));
        }
        self.buffer.push(b'\n');
        if let Output::Rotating {
            config,
            bytes: on_disk,
            ..
        } = &self.output
        {
            let line = (self.buffer.len() - start) as u64;
            let before = *on_disk + start as u64;
            if before > 0 && before + line > config.max_file_bytes {
                // The new line belongs in the next file: write what precedes
                // it to the current one, then rotate.
                let line_bytes = self.buffer.split_off(start);
                if let Err(error) = self.spill() {
                    self.deferred_error.get_or_insert(error);
                }
                self.rotate()?;
                self.buffer = line_bytes;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let spilled = self.spill();
        let deferred = self.deferred_error.take();
        let path = self
            .current_path()
            .unwrap_or_else(|| PathBuf::from(&self.name));
        match (deferred, spilled) {
            (Some(source), _) | (None, Err(source)) => Err(NissaError::Io {
                op: "write",
                path,
                source,
            }),
            (None, Ok(())) => Ok(()),
        }
    }
}

fn file_path(config: &JsonlConfig, index: u64) -> PathBuf {
    config
        .dir
        .join(format!("{}-{index:04}.jsonl", config.file_stem))
}

/// Opens the first file at or after `index` that does not exist yet, so that a
/// reused directory is never overwritten.
fn open_next(config: &JsonlConfig, mut index: u64) -> Result<(File, u64)> {
    loop {
        let path = file_path(config, index);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, index)),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => index += 1,
            Err(source) => {
                return Err(NissaError::Io {
                    op: "create",
                    path,
                    source,
                });
            }
        }
    }
}

/// `YYYY-MM-DD_HHMMSS` in UTC.
fn utc_stamp(now: SystemTime) -> String {
    let seconds = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let days = (seconds / 86_400) as i64;
    let of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}_{:02}{:02}{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn civil_dates_match_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        // 2000-02-29 is day 11016; 2024-12-31 is day 20088.
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_088), (2024, 12, 31));
        let stamp = utc_stamp(UNIX_EPOCH + Duration::from_secs(20_088 * 86_400 + 3_723));
        assert_eq!(stamp, "2024-12-31_010203");
    }
}
