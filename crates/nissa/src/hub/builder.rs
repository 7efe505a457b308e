//! [`HubBuilder`]: the configuration, the sinks and the optional metrics
//! endpoint of a [`Hub`], checked, then started all or nothing.

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::jsonl::{Created, JSONL_SINK_NAME, JsonlConfig, JsonlSink};
use crate::prometheus::{PROMETHEUS_SINK_NAME, PrometheusSink};
use crate::sink::Sink;
use crate::tracing_bridge::{TRACING_SINK_NAME, TracingSink};
use crate::validate::check_sink_name;
use crate::worker::{Shared, SinkState, WorkerTiming, run_sink, run_worker};
use crate::{Error, Result};

use super::{Hub, HubConfig, HubInner, MAX_QUEUE_CAPACITY, MAX_SINKS, check_size};

#[cfg(doc)]
use super::MAX_SINK_NAME_BYTES;

/// A sink waiting to be started, with an optional queue capacity of its own.
enum PlannedSink {
    Ready(Box<dyn Sink>, Option<usize>),
    Jsonl(JsonlConfig),
    Tracing,
}

/// Builds a [`Hub`]: configuration, sinks and the optional metrics endpoint.
pub struct HubBuilder {
    config: HubConfig,
    sinks: Vec<PlannedSink>,
    metrics_addr: Option<SocketAddr>,
}

impl Hub {
    /// Starts building a hub with the default configuration and no sinks.
    pub fn builder() -> HubBuilder {
        HubBuilder {
            config: HubConfig::default(),
            sinks: Vec::new(),
            metrics_addr: None,
        }
    }
}

impl HubBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: HubConfig) -> Self {
        self.config = config;
        self
    }

    /// Capacity of the main queue.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.config.queue_capacity = capacity;
        self
    }

    /// Default capacity of the sinks' queues.
    pub fn sink_queue_capacity(mut self, capacity: usize) -> Self {
        self.config.sink_queue_capacity = capacity;
        self
    }

    /// Adds a sink with the default queue capacity.
    pub fn sink(mut self, sink: impl Sink) -> Self {
        self.sinks.push(PlannedSink::Ready(Box::new(sink), None));
        self
    }

    /// Adds a sink with a queue capacity of its own.
    pub fn sink_with_queue(mut self, sink: impl Sink, capacity: usize) -> Self {
        self.sinks
            .push(PlannedSink::Ready(Box::new(sink), Some(capacity)));
        self
    }

    /// Adds a JSONL sink writing into `config.dir` (created, with the first
    /// file, when the hub is built, after the metrics endpoint is bound; see
    /// [`HubBuilder::build`]).
    pub fn jsonl(mut self, config: JsonlConfig) -> Self {
        self.sinks.push(PlannedSink::Jsonl(config));
        self
    }

    /// Adds the tracing bridge: every event is logged at its level.
    pub fn tracing(mut self) -> Self {
        self.sinks.push(PlannedSink::Tracing);
        self
    }

    /// Serves Prometheus metrics on `http://ADDR/metrics` (port 0 picks a
    /// free port; read it back with [`Hub::metrics_addr`]).
    pub fn prometheus(mut self, addr: SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// Serves Prometheus metrics on 127.0.0.1 at `port`.
    pub fn prometheus_on_port(self, port: u16) -> Self {
        self.prometheus(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Checks the configuration and the sinks (at most [`MAX_SINKS`], names
    /// 1 to [`MAX_SINK_NAME_BYTES`] bytes without control characters and all
    /// different), then, if asked for, binds the metrics endpoint, starts the
    /// runtime and only then opens the sinks (creating the JSONL files).
    ///
    /// All or nothing: nothing is opened or bound when a check fails; a
    /// failed bind ([`Error::Bind`], say the port is taken) or runtime start
    /// comes before any file or directory is created; and if opening a sink
    /// fails, the files and directories this build created are removed again
    /// (never ones that existed before) before the error returns. Sinks
    /// passed in already opened ([`HubBuilder::sink`]) are dropped, their
    /// files left alone.
    pub fn build(self) -> Result<Hub> {
        let config = self.config;
        config.validate()?;
        let planned_sinks = self
            .sinks
            .len()
            .saturating_add(usize::from(self.metrics_addr.is_some()));
        if planned_sinks > MAX_SINKS {
            return Err(Error::Config {
                field: "sinks",
                reason: format!("{planned_sinks} sinks, more than {MAX_SINKS}"),
            });
        }
        // Checked before any sink opens a file or the endpoint binds; read
        // once, in the order the sinks are started below.
        let names: Vec<String> = self
            .sinks
            .iter()
            .map(|planned| match planned {
                PlannedSink::Ready(sink, _) => sink.name(),
                PlannedSink::Jsonl(_) => JSONL_SINK_NAME,
                PlannedSink::Tracing => TRACING_SINK_NAME,
            })
            .chain(self.metrics_addr.map(|_| PROMETHEUS_SINK_NAME))
            .map(str::to_owned)
            .collect();
        check_sink_names(names.iter().map(String::as_str))?;
        for planned in &self.sinks {
            if let PlannedSink::Ready(sink, Some(capacity)) = planned {
                check_size("sink queue capacity", *capacity, MAX_QUEUE_CAPACITY).map_err(
                    |error| match error {
                        Error::Config { field, reason } => Error::Config {
                            field,
                            reason: format!("sink {:?}: {reason}", sink.name()),
                        },
                        other => other,
                    },
                )?;
            }
        }
        // Everything that can fail without leaving anything behind comes
        // first: binding the metrics endpoint (a taken port is the usual
        // failure), starting the runtime, registering the listener with it.
        let endpoint = match self.metrics_addr {
            Some(addr) => Some(PrometheusSink::with_endpoint(addr)?),
            None => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(planned_sinks.saturating_add(1))
            .thread_name("nissa")
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let endpoint = match endpoint.map(|(sink, endpoint)| (sink, endpoint.attach(&runtime))) {
            Some((sink, Ok(attached))) => Some((sink, attached)),
            Some((_, Err(error))) => {
                // `shutdown_background` rather than a drop: building may
                // happen inside an async context, where dropping panics.
                runtime.shutdown_background();
                return Err(error);
            }
            None => None,
        };
        // Only now are files created. Opening the sinks is the last step that
        // can fail, and it removes whatever it created if it does.
        let mut sinks = match open_sinks(self.sinks, config.sink_queue_capacity) {
            Ok(sinks) => sinks,
            Err(error) => {
                drop(endpoint);
                runtime.shutdown_background();
                return Err(error);
            }
        };
        let endpoint = endpoint.map(|(sink, attached)| {
            sinks.push((Box::new(sink) as Box<dyn Sink>, config.sink_queue_capacity));
            attached
        });

        // Nothing below can fail.
        let states: Vec<Arc<SinkState>> = sinks
            .iter()
            .zip(names)
            .map(|((_, capacity), name)| Arc::new(SinkState::new(name, *capacity)))
            .collect();
        let wake_threshold = config
            .wake_threshold
            .unwrap_or((config.queue_capacity / 4).max(1))
            .min(config.queue_capacity);
        let shared = Arc::new(Shared::new(
            config.queue_capacity,
            wake_threshold,
            states.clone(),
        ));
        let timing = WorkerTiming {
            tick_min: config.tick_min,
            tick_max: config.tick_max,
        };
        runtime.spawn(run_worker(Arc::clone(&shared), timing));
        for ((sink, _), state) in sinks.into_iter().zip(states) {
            runtime.spawn(run_sink(state, sink, config.batch_max));
        }
        let metrics_addr = endpoint.map(|attached| attached.start(&runtime, Arc::clone(&shared)));
        Ok(Hub {
            inner: Some(Arc::new(HubInner {
                shared,
                runtime: Mutex::new(Some(runtime)),
                close_timeout: config.close_timeout,
                metrics_addr,
            })),
        })
    }
}

/// Opens the planned sinks in order, each with its queue capacity. All or
/// nothing: if one fails, the sinks opened so far are dropped and the files
/// and directories they created are removed (never anything that existed
/// before) before the error returns.
fn open_sinks(
    planned: Vec<PlannedSink>,
    default_capacity: usize,
) -> Result<Vec<(Box<dyn Sink>, usize)>> {
    let mut sinks: Vec<(Box<dyn Sink>, usize)> = Vec::with_capacity(planned.len());
    let mut created: Vec<Created> = Vec::new();
    for planned in planned {
        let opened: Result<(Box<dyn Sink>, Option<usize>)> = match planned {
            PlannedSink::Ready(sink, capacity) => Ok((sink, capacity)),
            PlannedSink::Jsonl(jsonl) => JsonlSink::create_recorded(jsonl).map(|(sink, made)| {
                created.push(made);
                (Box::new(sink) as Box<dyn Sink>, None)
            }),
            PlannedSink::Tracing => Ok((Box::new(TracingSink::new()), None)),
        };
        match opened {
            Ok((sink, capacity)) => sinks.push((sink, capacity.unwrap_or(default_capacity))),
            Err(error) => {
                // Close the files before removing them, newest first.
                drop(sinks);
                for made in created.into_iter().rev() {
                    made.undo();
                }
                return Err(error);
            }
        }
    }
    Ok(sinks)
}

/// Every name valid (see [`crate::validate`]) and no name twice: the name
/// keys the statistics and the `sink` label of the hub's counters.
fn check_sink_names<'a>(names: impl Iterator<Item = &'a str>) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        check_sink_name(name)?;
        if !seen.insert(name) {
            return Err(Error::Config {
                field: "sink name",
                reason: format!("two sinks are called {name:?}"),
            });
        }
    }
    Ok(())
}
