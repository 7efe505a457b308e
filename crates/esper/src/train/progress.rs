//! What `esper train` prints while it trains: an indicatif progress bar
//! (epoch i/N, train loss, validation accuracy, active seeds, samples/s)
//! with a line above it for every lifecycle operation, when standard output
//! is a terminal; one plain line per epoch otherwise (logs, pipes, CI).
//! PPO runs get the same per round ([`RoundProgress`]).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::epoch_log::{DecisionRecord, EpochRecord};

/// See the module docs.
#[derive(Debug)]
pub(crate) enum Progress {
    /// A terminal: the bar.
    Bar(ProgressBar),
    /// Anything else: one line per epoch.
    Plain {
        /// Epochs of the run.
        epochs: usize,
    },
}

impl Progress {
    /// A bar over `epochs` epochs when stdout is a terminal, plain lines
    /// otherwise.
    pub(crate) fn new(epochs: usize) -> Progress {
        if !std::io::stdout().is_terminal() {
            return Progress::Plain { epochs };
        }
        let bar = ProgressBar::with_draw_target(
            Some(u64::try_from(epochs).unwrap_or(u64::MAX)),
            ProgressDrawTarget::stdout(),
        );
        let style = ProgressStyle::with_template(
            "epoch {pos:>3}/{len} [{bar:28.cyan/blue}] {msg} [{elapsed_precise}, eta {eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message("first epoch...");
        Progress::Bar(bar)
    }

    /// Prints `line` (above the bar, if there is one).
    pub(crate) fn note(&self, line: &str) {
        match self {
            Progress::Bar(bar) => bar.println(line),
            Progress::Plain { .. } => println!("{line}"),
        }
    }

    /// Reports a finished epoch.
    pub(crate) fn epoch(&self, record: &EpochRecord) {
        match self {
            Progress::Bar(bar) => {
                if let Some(decision) = record.acted() {
                    bar.println(format!(
                        "epoch {:>3}: {}",
                        record.epoch.saturating_add(1),
                        describe_decision(decision)
                    ));
                }
                if let Some(rollback) = &record.rollback {
                    bar.println(format!(
                        "epoch {:>3}: governor rollback ({rollback})",
                        record.epoch.saturating_add(1)
                    ));
                }
                bar.set_message(format!(
                    "loss {} | val {:.2}% | seeds {} | {}",
                    loss_text(record.train_loss),
                    record.val_accuracy,
                    record.active_seeds,
                    rate_text(record.samples_per_s)
                ));
                bar.inc(1);
            }
            Progress::Plain { epochs } => println!("{}", plain_line(record, *epochs)),
        }
    }

    /// Ends the bar (leaving it on screen).
    pub(crate) fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.abandon();
        }
    }
}

/// The plain line of `record` out of `epochs`.
pub(crate) fn plain_line(record: &EpochRecord, epochs: usize) -> String {
    let mut line = format!(
        "epoch {}/{epochs}  train loss {} acc {:.2}%  val loss {} acc {:.2}%  seeds {}  {}  {:.1} s",
        record.epoch.saturating_add(1),
        loss_text(record.train_loss),
        record.train_accuracy,
        loss_text(record.val_loss),
        record.val_accuracy,
        record.active_seeds,
        rate_text(record.samples_per_s),
        record.epoch_ms / 1000.0
    );
    if let Some(perplexity) = record.val_perplexity {
        line.push_str(&format!("  val ppl {perplexity:.2}"));
    }
    let live: Vec<String> = record
        .slots
        .iter()
        .filter(|slot| slot.stage != "DORMANT")
        .map(|slot| format!("{} {} a={:.2}", slot.slot, slot.stage, slot.alpha))
        .collect();
    if !live.is_empty() {
        line.push_str(&format!("  [{}]", live.join(", ")));
    }
    if let Some(decision) = record.acted() {
        line.push_str(&format!("  | {}", describe_decision(decision)));
    }
    if let Some(rollback) = &record.rollback {
        line.push_str(&format!("  | governor rollback ({rollback})"));
    }
    line
}

/// `GERMINATE r0c1 conv_light (plateau): germinated`.
pub(crate) fn describe_decision(decision: &DecisionRecord) -> String {
    let mut text = decision.op.clone();
    for part in [&decision.slot, &decision.blueprint].into_iter().flatten() {
        text.push(' ');
        text.push_str(part);
    }
    format!("{text} ({}): {}", decision.reason, decision.outcome)
}

fn loss_text(loss: Option<f64>) -> String {
    loss.map_or_else(|| "n/a".to_owned(), |loss| format!("{loss:.4}"))
}

fn rate_text(samples_per_s: f64) -> String {
    if samples_per_s >= 1000.0 {
        format!("{:.1}k samples/s", samples_per_s / 1000.0)
    } else {
        format!("{samples_per_s:.0} samples/s")
    }
}

/// What a PPO run prints: on a terminal, a bar over the rounds (round i/N,
/// reward, accuracy, live seeds, eps) with a line above it per round; one
/// plain line per round otherwise.
#[derive(Debug)]
pub(crate) enum RoundProgress {
    /// A terminal: the bar.
    Bar(ProgressBar),
    /// Anything else: lines.
    Plain,
}

impl RoundProgress {
    /// A bar over `rounds` rounds, `done` of them already run (a resumed
    /// run), when stdout is a terminal; plain lines otherwise.
    pub(crate) fn new(rounds: usize, done: usize) -> RoundProgress {
        if !std::io::stdout().is_terminal() {
            return RoundProgress::Plain;
        }
        let bar = ProgressBar::with_draw_target(
            Some(u64::try_from(rounds).unwrap_or(u64::MAX)),
            ProgressDrawTarget::stdout(),
        );
        let style = ProgressStyle::with_template(
            "round {pos:>3}/{len} [{bar:28.cyan/blue}] {msg} [{elapsed_precise}, eta {eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_position(u64::try_from(done).unwrap_or(u64::MAX));
        bar.set_message("first round...");
        RoundProgress::Bar(bar)
    }

    /// Prints `line` (above the bar, if there is one).
    pub(crate) fn note(&self, line: &str) {
        match self {
            RoundProgress::Bar(bar) => bar.println(line),
            RoundProgress::Plain => println!("{line}"),
        }
    }

    /// Reports a finished round: `line` is its full summary, `short` the
    /// bar's message.
    pub(crate) fn round(&self, line: &str, short: &str) {
        match self {
            RoundProgress::Bar(bar) => {
                bar.println(line);
                bar.inc(1);
                bar.set_message(short.to_owned());
            }
            RoundProgress::Plain => println!("{line}"),
        }
    }

    /// Leaves the bar where it stopped.
    pub(crate) fn finish(&self) {
        if let RoundProgress::Bar(bar) = self {
            bar.abandon();
        }
    }
}
