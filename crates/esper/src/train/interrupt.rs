//! Ctrl-C during `esper train`: the first one sets a flag that the epoch
//! loop reads at each epoch boundary (the current epoch finishes, every
//! file is written, the program exits with status 130); a second one ends
//! the program at once with the same status.
//!
//! The handler only stores into an atomic flag (the `ctrlc` crate runs it
//! on a thread of its own, not in signal context), so it never touches the
//! trainer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

/// The exit status of a run stopped by Ctrl-C (128 + SIGINT).
pub(crate) const EXIT_INTERRUPTED: i32 = 130;

/// The flag the handler sets.
#[derive(Debug, Clone)]
pub(crate) struct Interrupt {
    requested: Arc<AtomicBool>,
}

impl Interrupt {
    /// Installs the Ctrl-C handler (once per process).
    pub(crate) fn install() -> Result<Interrupt> {
        let requested = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&requested);
        ctrlc::set_handler(move || {
            if flag.swap(true, Ordering::SeqCst) {
                eprintln!("\nesper: second Ctrl-C, stopping now");
                std::process::exit(EXIT_INTERRUPTED);
            }
            eprintln!(
                "\nesper: Ctrl-C: finishing this epoch, then writing everything (Ctrl-C again \
                 stops at once)"
            );
        })
        .context("installing the Ctrl-C handler")?;
        Ok(Interrupt { requested })
    }

    /// Whether Ctrl-C was pressed.
    pub(crate) fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }
}
