//! Interactive queries over HTTP: the state a running query keeps, read by
//! key while it runs (Kafka Streams' interactive queries, served).
//!
//! - `GET /v1/stores` lists the stores: name, operator, kind, key columns.
//! - `GET /v1/stores/{store}/keys/{key}` reads a store keyed by one column;
//!   `GET /v1/stores/{store}/keys?id=a&region=eu` one keyed by several.
//!   `from` / `to` (RFC 3339 or epoch milliseconds) bound a window
//!   aggregation's windows.
//!
//! A key no task of this instance holds is asked of the other instances
//! the [`PeerDirectory`] lists (with `local=true`, so they answer from
//! their own tasks only) and their answer is returned. While the group
//! rebalances, a task restores, or an instance does not answer, the answer
//! is `503` with `Retry-After` and `"retryable": true`: asking again later
//! gives the key's state; `404` means no instance holds state for it.
//!
//! The web page ([`HttpServer::start_ui`]): `/` charts a running query's
//! progress over time (Spark UI's Structured Streaming tab), `/api/progress`
//! its recent progress reports, `/api/status` what it is doing.
#![deny(missing_docs)]

mod connections;
mod peers;
mod routes;
mod tls;
mod ui;

pub use connections::HttpOptions;
pub use peers::{Peer, PeerDirectory};
pub use tls::TlsConfig;
pub use ui::ProgressHistory;

use std::net::SocketAddr;
use std::sync::Arc;
use tidemark::runtime::StateReader;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address is taken, not an address, or not allowed.
    #[error("cannot listen on `{listen}`: {reason}")]
    Listen {
        /// The configuration key (`serve.listen`, `ui.listen`).
        key: &'static str,
        /// The address asked for.
        listen: String,
        /// Why.
        reason: String,
    },
    /// The certificate, key or trusted CA cannot be read or used.
    #[error("{key}: {reason}")]
    Tls {
        /// The configuration key (`serve.tls`, `ui.tls`, `metrics.tls`).
        key: &'static str,
        /// Which file, and why.
        reason: String,
    },
}

impl ServeError {
    /// The configuration key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            ServeError::Listen { key, .. } | ServeError::Tls { key, .. } => key,
        }
    }
}

/// What the handlers share.
pub(crate) struct Service {
    pub(crate) reader: StateReader,
    pub(crate) advertised: String,
    pub(crate) peers: Option<Arc<dyn PeerDirectory>>,
    /// Requests waiting for the query's state at once, bounded.
    pub(crate) reads: connections::ReadSlots,
    /// The token this service asks for, sent on with forwarded reads (the
    /// instances of one query share it).
    pub(crate) auth_token: Option<String>,
    /// With TLS, forwarded reads go over `https` with this trust.
    pub(crate) peer_tls: Option<Arc<rustls::ClientConfig>>,
}

/// A running HTTP service (interactive queries or the web page); stops
/// when dropped.
pub struct HttpServer {
    address: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The interactive-query service.
pub type StateServer = HttpServer;

impl HttpServer {
    /// Serves `reader`'s query on `listen`; the other instances reach this
    /// one on `advertised` and are found through `peers` (none: a single
    /// instance answers from its own tasks).
    pub fn start(
        listen: &str,
        advertised: &str,
        reader: StateReader,
        peers: Option<Arc<dyn PeerDirectory>>,
    ) -> Result<Self, ServeError> {
        Self::start_with(listen, advertised, reader, peers, HttpOptions::default())
    }

    /// [`HttpServer::start`] within `options`' limits, behind its token
    /// when it has one.
    pub fn start_with(
        listen: &str,
        advertised: &str,
        reader: StateReader,
        peers: Option<Arc<dyn PeerDirectory>>,
        options: HttpOptions,
    ) -> Result<Self, ServeError> {
        let service = Arc::new(Service {
            reader,
            advertised: advertised.to_string(),
            peers,
            reads: connections::ReadSlots::new(options.max_concurrent_reads),
            auth_token: options.auth_token.clone(),
            peer_tls: options.tls.as_ref().map(|t| t.client.clone()),
        });
        let server = HttpServer::serve("serve.listen", listen, routes::router(service), options)?;
        tracing::info!(address = %server.address, advertised, "serving interactive queries");
        Ok(server)
    }

    /// Serves the live web page of the query whose progress `history`
    /// keeps on `listen`.
    pub fn start_ui(listen: &str, history: ProgressHistory) -> Result<Self, ServeError> {
        Self::start_ui_with(listen, history, HttpOptions::default())
    }

    /// [`HttpServer::start_ui`] within `options`' limits, behind its token
    /// when it has one. On a loopback address the page also refuses a
    /// request whose `Host` is not a loopback name: a web page elsewhere
    /// cannot reach it through a DNS name rebound to 127.0.0.1.
    pub fn start_ui_with(
        listen: &str,
        history: ProgressHistory,
        options: HttpOptions,
    ) -> Result<Self, ServeError> {
        let server = HttpServer::serve("ui.listen", listen, ui::router(history), options)?;
        tracing::info!(address = %server.address, "serving the web page");
        Ok(server)
    }

    /// Serves what `render` returns (Prometheus' text format) at
    /// `/metrics` on `listen`, within `options`' limits and behind its
    /// token when it has one; `/healthz` answers without it.
    pub fn start_metrics_with(
        listen: &str,
        render: Arc<dyn Fn() -> String + Send + Sync>,
        options: HttpOptions,
    ) -> Result<Self, ServeError> {
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let render = render.clone();
                    async move {
                        (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "text/plain; version=0.0.4",
                            )],
                            render(),
                        )
                    }
                }),
            )
            .route("/healthz", axum::routing::get(connections::healthz));
        let server = HttpServer::serve("metrics.prometheus", listen, app, options)?;
        tracing::info!(address = %server.address, "serving Prometheus metrics");
        Ok(server)
    }

    fn serve(
        key: &'static str,
        listen: &str,
        app: axum::Router,
        options: HttpOptions,
    ) -> Result<Self, ServeError> {
        let listen_error = |reason: String| ServeError::Listen {
            key,
            listen: listen.to_string(),
            reason,
        };
        let listener =
            std::net::TcpListener::bind(listen).map_err(|e| listen_error(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| listen_error(e.to_string()))?;
        let address = listener
            .local_addr()
            .map_err(|e| listen_error(e.to_string()))?;
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| listen_error(e.to_string()))?;
        let thread = std::thread::Builder::new()
            .name(format!("tidemark-{key}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(e) => {
                            tracing::error!(error = %e, key, "cannot listen");
                            return;
                        }
                    };
                    let app = match options.readiness.clone() {
                        Some(status) => app.route(
                            "/readyz",
                            axum::routing::get(move || {
                                let status = status.clone();
                                async move { connections::readyz(&status) }
                            }),
                        ),
                        None => app,
                    };
                    let mut app = connections::with_auth(app, &options);
                    if key == "ui.listen" && address.ip().is_loopback() {
                        app = connections::with_loopback_host(app);
                    }
                    connections::serve(listener, app, options, key, stopped).await;
                })
            })
            .map_err(|e| listen_error(e.to_string()))?;
        Ok(HttpServer {
            address,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address it listens on (the port chosen when `listen` asked
    /// for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
