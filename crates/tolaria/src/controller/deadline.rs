//! [`DecisionDeadline`]: a controller on one long-lived worker thread,
//! asked once per epoch and waited for with a deadline.
//!
//! Used by the general trainer at every epoch boundary. On a missed deadline
//! the caller gets WAIT (the safe default) and `tolaria.timeout.*` telemetry
//! (event `tolaria.timeout.decision_missed`; metrics `decisions_total`,
//! `deadline_ms`, `elapsed_ms`); the late answer is discarded when it
//! arrives (every request carries an id). A controller that errors or
//! panics (caught on the worker) yields WAIT and `tolaria.controller.failed`.
//! The worker runs one request at a time: a request sent while a late one
//! still runs waits behind it, inside its own deadline.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leyline::telemetry as names;
use leyline::telemetry::sources::TOLARIA;
use leyline::{Telemetry, TelemetryLevel, metric};

use super::{Controller, Decision, EpochObservation};
use crate::{Error, Result};

/// Longest accepted deadline (one hour): keeps `Instant` arithmetic exact.
pub const MAX_DEADLINE: Duration = Duration::from_secs(3600);

struct Request {
    id: u64,
    observation: EpochObservation,
}

enum Answer {
    Decided(Decision),
    Failed(String),
}

struct Reply {
    id: u64,
    answer: Answer,
}

/// How one [`DecisionDeadline::decide`] call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum DeadlineOutcome {
    /// The controller answered in time.
    Decided(Decision),
    /// The deadline passed; WAIT applies.
    TimedOut {
        /// Time waited, at least the deadline.
        elapsed: Duration,
    },
    /// The controller errored or panicked, or its worker is gone; WAIT
    /// applies.
    Failed {
        /// What happened.
        reason: String,
    },
}

impl DeadlineOutcome {
    /// The decision to carry out: the controller's, or WAIT.
    pub fn decision(&self) -> Decision {
        match self {
            DeadlineOutcome::Decided(decision) => decision.clone(),
            DeadlineOutcome::TimedOut { .. } => Decision::wait().because("timeout", 1.0),
            DeadlineOutcome::Failed { .. } => Decision::wait().because("controller_failed", 1.0),
        }
    }
}

/// Running counts of a [`DecisionDeadline`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadlineStats {
    /// Requests answered in time.
    pub decided: u64,
    /// Requests that missed the deadline.
    pub timeouts: u64,
    /// Requests whose controller errored or panicked.
    pub failures: u64,
    /// Late answers discarded when they arrived.
    pub stale_discarded: u64,
}

/// See the module docs.
pub struct DecisionDeadline {
    deadline: Duration,
    telemetry: Telemetry,
    requests: Option<Sender<Request>>,
    replies: Receiver<Reply>,
    worker: Option<JoinHandle<()>>,
    next_id: u64,
    /// Timed-out requests whose answer has not arrived yet.
    late: u64,
    stats: DeadlineStats,
}

impl std::fmt::Debug for DecisionDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionDeadline")
            .field("deadline", &self.deadline)
            .field("stats", &self.stats)
            .finish()
    }
}

impl DecisionDeadline {
    /// Moves `controller` onto a new worker thread and asks it with
    /// `deadline` (in `(0, MAX_DEADLINE]`, else [`Error::Controller`]),
    /// emitting through `telemetry`.
    pub fn new(
        controller: impl Controller + 'static,
        deadline: Duration,
        telemetry: Telemetry,
    ) -> Result<DecisionDeadline> {
        if deadline.is_zero() || deadline > MAX_DEADLINE {
            return Err(Error::Controller {
                field: "deadline",
                reason: format!("{deadline:?} is not in (0, {MAX_DEADLINE:?}]"),
            });
        }
        let (request_tx, request_rx) = mpsc::channel::<Request>();
        let (reply_tx, reply_rx) = mpsc::channel::<Reply>();
        let worker = std::thread::Builder::new()
            .name("tolaria-controller".to_owned())
            .spawn(move || worker_loop(controller, &request_rx, &reply_tx))
            .map_err(|error| Error::Controller {
                field: "worker",
                reason: format!("cannot spawn the controller thread: {error}"),
            })?;
        Ok(DecisionDeadline {
            deadline,
            telemetry,
            requests: Some(request_tx),
            replies: reply_rx,
            worker: Some(worker),
            next_id: 0,
            late: 0,
            stats: DeadlineStats::default(),
        })
    }

    /// The deadline.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Running counts.
    pub fn stats(&self) -> DeadlineStats {
        self.stats
    }

    /// Asks the controller about `observation` and waits at most the
    /// deadline. Never fails: a timeout, an error or a panic gives WAIT
    /// ([`DeadlineOutcome::decision`]) plus telemetry.
    pub fn decide(&mut self, observation: &EpochObservation) -> DeadlineOutcome {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let epoch = observation.epoch;
        let start = Instant::now();
        let sent = self.requests.as_ref().is_some_and(|requests| {
            requests
                .send(Request {
                    id,
                    observation: observation.clone(),
                })
                .is_ok()
        });
        if !sent {
            return self.failed(epoch, id, "the controller worker is gone".to_owned());
        }
        let until = start.checked_add(self.deadline);
        loop {
            let remaining = until.map_or(self.deadline, |until| {
                until.saturating_duration_since(Instant::now())
            });
            match self.replies.recv_timeout(remaining) {
                Ok(reply) if reply.id == id => {
                    return match reply.answer {
                        Answer::Decided(decision) => {
                            self.stats.decided = self.stats.decided.saturating_add(1);
                            DeadlineOutcome::Decided(decision)
                        }
                        Answer::Failed(reason) => self.failed(epoch, id, reason),
                    };
                }
                Ok(_stale) => {
                    self.late = self.late.saturating_sub(1);
                    self.stats.stale_discarded = self.stats.stale_discarded.saturating_add(1);
                }
                Err(RecvTimeoutError::Timeout) => {
                    return self.timed_out(epoch, id, start.elapsed());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return self.failed(epoch, id, "the controller worker is gone".to_owned());
                }
            }
        }
    }

    fn timed_out(&mut self, epoch: u32, id: u64, elapsed: Duration) -> DeadlineOutcome {
        self.late = self.late.saturating_add(1);
        self.stats.timeouts = self.stats.timeouts.saturating_add(1);
        let elapsed_ms = elapsed.as_secs_f64() * 1e3;
        let deadline_ms = self.deadline.as_secs_f64() * 1e3;
        self.telemetry.emit_event(
            TOLARIA,
            names::TOLARIA_TIMEOUT_DECISION_MISSED,
            "controller decision deadline missed; WAIT applied",
            vec![
                ("epoch", epoch.to_string()),
                ("request_id", id.to_string()),
                ("deadline_ms", format!("{deadline_ms:.3}")),
                ("elapsed_ms", format!("{elapsed_ms:.3}")),
                (
                    "late_by_ms",
                    format!("{:.3}", (elapsed_ms - deadline_ms).max(0.0)),
                ),
            ],
        );
        self.telemetry.emit_metrics(
            TOLARIA,
            TelemetryLevel::Warning,
            [
                metric(
                    names::TOLARIA_TIMEOUT_DECISIONS_TOTAL,
                    self.stats.timeouts as f64,
                ),
                metric(names::TOLARIA_TIMEOUT_DEADLINE_MS, deadline_ms),
                metric(names::TOLARIA_TIMEOUT_ELAPSED_MS, elapsed_ms),
            ],
        );
        DeadlineOutcome::TimedOut { elapsed }
    }

    fn failed(&mut self, epoch: u32, id: u64, reason: String) -> DeadlineOutcome {
        self.stats.failures = self.stats.failures.saturating_add(1);
        self.telemetry.emit_event(
            TOLARIA,
            names::TOLARIA_CONTROLLER_FAILED,
            "controller decision failed; WAIT applied",
            vec![
                ("epoch", epoch.to_string()),
                ("request_id", id.to_string()),
                ("reason", reason.clone()),
            ],
        );
        DeadlineOutcome::Failed { reason }
    }
}

impl Drop for DecisionDeadline {
    /// Closes the request channel; joins the worker unless a late request
    /// may still be running (then the worker exits on its own afterwards).
    fn drop(&mut self) {
        drop(self.requests.take());
        if self.late == 0
            && let Some(worker) = self.worker.take()
        {
            // The worker catches controller panics; a join error cannot carry
            // anything the caller could act on.
            let _joined = worker.join();
        }
    }
}

fn worker_loop(
    mut controller: impl Controller,
    requests: &Receiver<Request>,
    replies: &Sender<Reply>,
) {
    while let Ok(request) = requests.recv() {
        let outcome = catch_unwind(AssertUnwindSafe(|| controller.decide(&request.observation)));
        let answer = match outcome {
            Ok(Ok(decision)) => Answer::Decided(decision),
            Ok(Err(error)) => Answer::Failed(format!("controller error: {error}")),
            Err(payload) => {
                Answer::Failed(format!("controller panicked: {}", panic_text(&payload)))
            }
        };
        if replies
            .send(Reply {
                id: request.id,
                answer,
            })
            .is_err()
        {
            return;
        }
    }
}

fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-text panic payload".to_owned()
    }
}
