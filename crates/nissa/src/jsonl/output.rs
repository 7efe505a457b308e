//! Where the JSONL sink's lines go, written so that what is counted
//! delivered is exactly what a reader finds.
//!
//! A batch of complete lines is written with plain `write` calls whose byte
//! counts are kept, so that after an error the sink knows how many whole
//! lines got through (those are delivered, the rest failed). A rotating file
//! is then cut back to the end of the last whole line, so every line in it
//! parses; if even that fails, the file is left and the next line starts a
//! fresh file. A plain writer (a pipe) cannot be cut back: the next write
//! starts with a newline, so a fragment is never glued to the next line (and
//! a line that lacked only its newline, which a line reader yields whole, is
//! counted delivered).

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::JsonlConfig;
use crate::Error;

/// An open file the sink appends lines to.
pub(crate) trait LineFile: Write + Send {
    /// Cuts the file back to `len` bytes and puts the cursor there.
    fn truncate_to(&mut self, len: u64) -> std::io::Result<()>;
}

impl LineFile for File {
    fn truncate_to(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)?;
        self.seek(SeekFrom::Start(len)).map(|_| ())
    }
}

/// Creates a new file at a path (failing if it exists). Tests swap in one
/// whose files fail on command.
pub(crate) type Opener = Box<dyn Fn(&Path) -> std::io::Result<Box<dyn LineFile>> + Send>;

/// The file system opener: `create_new`, so that nothing is overwritten.
pub(crate) fn open_new_file(path: &Path) -> std::io::Result<Box<dyn LineFile>> {
    let file = OpenOptions::new().write(true).create_new(true).open(path)?;
    Ok(Box::new(file))
}

/// A rotating file in a run directory.
pub(crate) struct Rotating {
    pub(crate) config: JsonlConfig,
    file: Box<dyn LineFile>,
    pub(crate) index: u64,
    /// Bytes of whole lines in the current file.
    bytes: u64,
    /// A failed write could not be cut back: the file may end in a fragment,
    /// so the next line goes to a fresh file.
    damaged: bool,
    opener: Opener,
}

/// Any writer (standard output, a pipe); no rotation.
pub(crate) struct Stream {
    writer: Box<dyn Write + Send>,
    /// The last write stopped inside a line.
    mid_line: bool,
}

/// Where the lines go.
pub(crate) enum Output {
    /// Files in a run directory.
    Rotating(Rotating),
    /// One writer.
    Stream(Stream),
}

/// How far a write got: whole lines delivered and the error that stopped it.
pub(crate) struct Written {
    pub(crate) lines: usize,
    pub(crate) error: Option<Error>,
}

impl Output {
    /// A rotating output, its first file opened.
    pub(crate) fn rotating(config: JsonlConfig, opener: Opener) -> crate::Result<Output> {
        let (file, index) = open_next(&config, &opener, 0)?;
        Ok(Output::Rotating(Rotating {
            config,
            file,
            index,
            bytes: 0,
            damaged: false,
            opener,
        }))
    }

    /// An output to `writer`.
    pub(crate) fn stream(writer: Box<dyn Write + Send>) -> Output {
        Output::Stream(Stream {
            writer,
            mid_line: false,
        })
    }

    /// Writes the lines of `buffer`, which end at the offsets in `ends`
    /// (each line ends with its newline).
    pub(crate) fn write_lines(&mut self, buffer: &[u8], ends: &[usize]) -> Written {
        match self {
            Output::Rotating(rotating) => rotating.write_lines(buffer, ends),
            Output::Stream(stream) => stream.write_lines(buffer, ends),
        }
    }
}

// Offsets in `ends` come from the sink's own buffer: they rise strictly and
// lie within it. The arithmetic below still saturates and the lookups use
// `get`, so a wrong offset could only miscount, never panic.

/// Offset where line `line` starts.
fn line_start(ends: &[usize], line: usize) -> usize {
    match line.checked_sub(1) {
        Some(previous) => ends.get(previous).copied().unwrap_or(0),
        None => 0,
    }
}

/// Writes all of `data`, returning how many bytes the writer accepted before
/// an error (interruptions are retried; a writer accepting nothing fails).
fn write_counted(writer: &mut dyn Write, data: &[u8]) -> (usize, std::io::Result<()>) {
    let mut done = 0;
    while let Some(rest) = data.get(done..).filter(|rest| !rest.is_empty()) {
        match writer.write(rest) {
            Ok(0) => return (done, Err(std::io::ErrorKind::WriteZero.into())),
            // A writer claiming more than it was given is not believed.
            Ok(accepted) => done = done.saturating_add(accepted.min(rest.len())),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return (done, Err(error)),
        }
    }
    (done, Ok(()))
}

/// How many of the lines ending at `ends` (offsets relative to the start of
/// a write) lie wholly within the first `accepted` bytes.
fn whole_lines(ends: &[usize], base: usize, accepted: usize) -> usize {
    ends.iter()
        .take_while(|&&end| end.saturating_sub(base) <= accepted)
        .count()
}

impl Rotating {
    fn path(&self) -> PathBuf {
        file_path(&self.config, self.index)
    }

    fn write_lines(&mut self, buffer: &[u8], ends: &[usize]) -> Written {
        let max = self.config.max_file_bytes;
        let mut line = 0;
        while line < ends.len() {
            let start = line_start(ends, line);
            let first_len = ends.get(line).map_or(0, |end| end.saturating_sub(start)) as u64;
            let full = self.bytes > 0 && self.bytes.saturating_add(first_len) > max;
            if (self.damaged || full)
                && let Err(error) = self.rotate()
            {
                return Written {
                    lines: line,
                    error: Some(error),
                };
            }
            // As many lines as fit the current file, at least one.
            let mut size = self.bytes.saturating_add(first_len);
            let mut next = line.saturating_add(1);
            while let Some(&end) = ends.get(next) {
                let len = end.saturating_sub(line_start(ends, next)) as u64;
                if size.saturating_add(len) > max {
                    break;
                }
                size = size.saturating_add(len);
                next = next.saturating_add(1);
            }
            let end = ends.get(next.saturating_sub(1)).copied().unwrap_or(start);
            let chunk = buffer.get(start..end).unwrap_or_default();
            let (accepted, result) = write_counted(&mut *self.file, chunk);
            if let Err(source) = result {
                let lines_in = ends.get(line..next).unwrap_or_default();
                let whole = whole_lines(lines_in, start, accepted);
                let good = self.bytes.saturating_add(
                    line_start(ends, line.saturating_add(whole)).saturating_sub(start) as u64,
                );
                // Cut the fragment off; if that fails, leave this file with
                // the fragment as its last line. A fragment that lacks only
                // its newline then reads back whole, so it is delivered.
                let whole = match self.file.truncate_to(good) {
                    Ok(()) => {
                        self.bytes = good;
                        whole
                    }
                    Err(_) => {
                        self.damaged = true;
                        whole_lines(lines_in, start, accepted.saturating_add(1))
                    }
                };
                return Written {
                    lines: line.saturating_add(whole),
                    error: Some(Error::Io {
                        op: "write",
                        path: self.path(),
                        source,
                    }),
                };
            }
            self.bytes = size;
            line = next;
        }
        Written {
            lines: ends.len(),
            error: None,
        }
    }

    /// Moves on to the next file, removing the oldest beyond `max_files`.
    fn rotate(&mut self) -> crate::Result<()> {
        let after = self.index.checked_add(1).ok_or(Error::Config {
            field: "file index",
            reason: "the run directory has used every file index".to_owned(),
        })?;
        let (file, index) = open_next(&self.config, &self.opener, after)?;
        self.file = file;
        self.index = index;
        self.bytes = 0;
        self.damaged = false;
        let keep = self
            .config
            .max_files
            .and_then(|keep| u64::try_from(keep).ok());
        if let Some(stale) = keep.and_then(|keep| index.checked_sub(keep)) {
            // Older files were removed by earlier rotations; a missing one is
            // fine.
            let _ = std::fs::remove_file(file_path(&self.config, stale));
        }
        Ok(())
    }
}

impl Stream {
    fn write_lines(&mut self, buffer: &[u8], ends: &[usize]) -> Written {
        let total = ends.last().copied().unwrap_or(0);
        let data = buffer.get(..total).unwrap_or_default();
        let failed = |lines: usize, source: std::io::Error| Written {
            lines,
            error: Some(Error::Io {
                op: "write",
                path: PathBuf::from("(writer)"),
                source,
            }),
        };
        if data.is_empty() {
            return Written {
                lines: 0,
                error: None,
            };
        }
        if self.mid_line {
            // End the fragment left by the last failure before anything else.
            match write_counted(&mut *self.writer, b"\n") {
                (_, Ok(())) => self.mid_line = false,
                (_, Err(source)) => return failed(0, source),
            }
        }
        let (accepted, result) = write_counted(&mut *self.writer, data);
        if let Err(source) = result {
            // A line that lacks only its newline reads back whole (a line
            // reader yields the last line without one), so it is delivered;
            // the newline comes first in the next write.
            let whole = whole_lines(ends, 0, accepted.saturating_add(1));
            self.mid_line = accepted != line_start(ends, whole);
            return failed(whole, source);
        }
        if let Err(source) = self.writer.flush() {
            // A buffering writer may have lost any part of the lines.
            self.mid_line = true;
            return failed(0, source);
        }
        Written {
            lines: ends.len(),
            error: None,
        }
    }
}

/// `DIR/STEM-NNNN.jsonl`.
pub(crate) fn file_path(config: &JsonlConfig, index: u64) -> PathBuf {
    config
        .dir
        .join(format!("{}-{index:04}.jsonl", config.file_stem))
}

/// Opens the first file at or after `index` that does not exist yet, so that a
/// reused directory is never overwritten.
fn open_next(
    config: &JsonlConfig,
    opener: &Opener,
    mut index: u64,
) -> crate::Result<(Box<dyn LineFile>, u64)> {
    loop {
        let path = file_path(config, index);
        match opener(&path) {
            Ok(file) => return Ok((file, index)),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                index = index.checked_add(1).ok_or(Error::Config {
                    field: "file index",
                    reason: "the run directory has used every file index".to_owned(),
                })?;
            }
            Err(source) => {
                return Err(Error::Io {
                    op: "create",
                    path,
                    source,
                });
            }
        }
    }
}
