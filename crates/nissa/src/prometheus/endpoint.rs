//! The `/metrics` HTTP endpoint: serves the exposition of a [`MetricSet`]
//! with the hub's own counters refreshed at each scrape.
//!
//! At most [`MAX_CONNECTIONS`] connections are served at once (more are
//! closed on accept) and a client that does not send its request headers
//! within [`HEADER_READ_TIMEOUT`] is disconnected.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};

use super::{CONTENT_TYPE, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MetricSet};
use crate::worker::Shared;
use crate::{Error, Result};

/// A bound listener waiting for the hub's runtime.
pub(crate) struct MetricsEndpoint {
    pub(super) listener: std::net::TcpListener,
    pub(super) addr: SocketAddr,
    pub(super) metrics: Arc<MetricSet>,
}

/// A listener registered with the hub's runtime: starting it cannot fail.
pub(crate) struct AttachedEndpoint {
    listener: tokio::net::TcpListener,
    bound: SocketAddr,
    metrics: Arc<MetricSet>,
}

impl MetricsEndpoint {
    /// Registers the listener with `runtime`. The last step that can fail,
    /// taken before the hub opens any sink (so before any file exists).
    pub(crate) fn attach(self, runtime: &tokio::runtime::Runtime) -> Result<AttachedEndpoint> {
        let addr = self.addr;
        let bound = self
            .listener
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        let _context = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(self.listener)
            .map_err(|source| Error::Bind { addr, source })?;
        Ok(AttachedEndpoint {
            listener,
            bound,
            metrics: self.metrics,
        })
    }
}

impl AttachedEndpoint {
    /// Starts serving on `runtime`; returns the bound address (the real port
    /// when port 0 was asked for).
    pub(crate) fn start(
        self,
        runtime: &tokio::runtime::Runtime,
        shared: Arc<Shared>,
    ) -> SocketAddr {
        runtime.spawn(serve(self.listener, self.metrics, shared));
        self.bound
    }
}

async fn serve(listener: tokio::net::TcpListener, metrics: Arc<MetricSet>, shared: Arc<Shared>) {
    let mut accept_failure_reported = false;
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                if !accept_failure_reported {
                    tracing::warn!(target: "nissa", %error, "metrics endpoint: accept failed");
                    accept_failure_reported = true;
                }
                // Out of descriptors and the like: back off instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over the cap: dropping the stream closes the connection.
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let metrics = Arc::clone(&metrics);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |request: Request<_>| {
                let response = respond(&request, &metrics, &shared);
                async move { Ok::<_, Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            // A client hanging up mid-request is its own business.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(io, service)
                .await;
        });
    }
}

fn respond<B>(
    request: &Request<B>,
    metrics: &MetricSet,
    shared: &Shared,
) -> Response<http_body_util::Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => {
            metrics.refresh_hub_counters(&shared.stats());
            match metrics.exposition() {
                Some(text) => (StatusCode::OK, CONTENT_TYPE, text),
                None => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain; charset=utf-8",
                    "could not encode the metrics\n".to_owned(),
                ),
            }
        }
        (&Method::GET, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "Esper telemetry (nissa): metrics at /metrics\n".to_owned(),
        ),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found; metrics are at /metrics\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET is supported\n".to_owned(),
        ),
    };
    let mut response = Response::new(http_body_util::Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}
