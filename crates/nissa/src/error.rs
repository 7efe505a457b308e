//! The one error type of the crate.
//!
//! Errors reach callers only from set-up (building a hub, opening a sink,
//! binding the metrics endpoint), and a set-up that returns one has left
//! nothing behind: see [`crate::HubBuilder::build`]. Once a hub runs, sink
//! errors are counted and reported through `tracing`; [`crate::Hub::emit`]
//! never returns one.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong in Nissa.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of range.
    #[error("invalid hub configuration: {field} {reason}")]
    Config {
        /// The offending setting.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("create directory", "open", "write", ...).
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The hub's background runtime could not start.
    #[error("could not start the telemetry runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The metrics endpoint could not bind its address.
    #[error("could not bind the metrics endpoint to {addr}: {source}")]
    Bind {
        /// The requested address.
        addr: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A sink could not write a packet (counted as failed by the hub).
    #[error("sink {sink} failed: {reason}")]
    Sink {
        /// Name of the sink.
        sink: String,
        /// Why it failed.
        reason: String,
    },
    /// A packet could not be encoded.
    #[error("could not encode a telemetry packet as JSON: {0}")]
    Encode(#[from] serde_json::Error),
    /// A global tracing subscriber is already installed.
    #[error("could not install the tracing subscriber: {0}")]
    Subscriber(String),
    /// The `nissa-emit` benchmark ([`crate::bench`]) could not produce its
    /// figures: a parameter out of range, a producer thread that panicked, a
    /// flush that did not finish, or a figure that came out empty or not
    /// finite (a record refuses those).
    #[error("nissa-emit benchmark: {what}: {reason}")]
    Bench {
        /// The parameter or figure concerned.
        what: &'static str,
        /// What is wrong with it, with its value.
        reason: String,
    },
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A sink failure with a reason.
    pub fn sink(sink: &str, reason: impl std::fmt::Display) -> Error {
        Error::Sink {
            sink: sink.to_owned(),
            reason: reason.to_string(),
        }
    }
}
