//! The accept loop of tidemark's HTTP services, with the limits axum's own
//! `serve` does not set: a deadline to send a request's headers (which also
//! closes a connection idle between requests), a cap on open connections,
//! and an optional bearer token. Without them a client that opens sockets
//! and sends half a request holds each one, and the file descriptors the
//! process shares with RocksDB and librdkafka, for ever.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// The limits and access rule of one HTTP service.
#[derive(Clone)]
pub struct HttpOptions {
    /// A client must send a request's headers within this time of opening
    /// the connection or of the previous response, or it is closed.
    pub header_read_timeout: Duration,
    /// Connections open at once; one more is closed as soon as accepted.
    pub max_connections: usize,
    /// Requests waiting for the query's state at once; one more is
    /// answered `503` with `Retry-After` at once.
    pub max_concurrent_reads: usize,
    /// When set, every route but the health probes asks for
    /// `Authorization: Bearer <token>` and answers `401` without it.
    pub auth_token: Option<String>,
    /// When set, the socket speaks TLS only (the handshake within
    /// `header_read_timeout`), and forwarded reads go over `https`.
    pub tls: Option<crate::TlsConfig>,
    /// When set, `/readyz` answers `200` while this run is ready (every
    /// stage running on restored state) and `503` otherwise, with the
    /// state's name, without the token (orchestrators' readiness probes).
    pub readiness: Option<tidemark::runtime::RunStatus>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_concurrent_reads: 64,
            auth_token: None,
            tls: None,
            readiness: None,
        }
    }
}

impl std::fmt::Debug for HttpOptions {
    // The token is a secret: never in a log line or an error.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("header_read_timeout", &self.header_read_timeout)
            .field("max_connections", &self.max_connections)
            .field("max_concurrent_reads", &self.max_concurrent_reads)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "***"))
            .field("tls", &self.tls.is_some())
            .field("readiness", &self.readiness.is_some())
            .finish()
    }
}

/// `/healthz`: the service answers (liveness; no token asked).
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// `/readyz`: `200` while `status` is ready, `503` otherwise; the body
/// names the state (never a failure's text: the probe asks no token).
pub(crate) fn readyz(status: &tidemark::runtime::RunStatus) -> axum::response::Response {
    let state = status.state();
    let code = match state.is_ready() {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, axum::Json(serde_json::json!({"state": state.name()}))).into_response()
}

/// Paths answered without the token: orchestrators' probes carry none.
const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// `app` behind the token check of `options`, when it has a token.
pub(crate) fn with_auth(app: Router, options: &HttpOptions) -> Router {
    let Some(token) = options.auth_token.clone() else {
        return app;
    };
    let expected: Arc<[u8]> = format!("Bearer {token}").into_bytes().into();
    app.layer(axum::middleware::from_fn(move |request: Request, next: Next| {
        let expected = expected.clone();
        async move {
            let open = OPEN_PATHS.contains(&request.uri().path());
            let given = request
                .headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            if open || given.is_some_and(|given| same_secret(given, &expected)) {
                next.run(request).await
            } else {
                let mut response = (
                    StatusCode::UNAUTHORIZED,
                    axum::Json(serde_json::json!({
                        "error": "this service asks for `Authorization: Bearer <token>` (the `auth_token` it was started with)",
                        "retryable": false
                    })),
                )
                    .into_response();
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                response
            }
        }
    }))
}

/// `app` answering only requests whose `Host` names the loopback
/// interface (`localhost`, `127.0.0.1`, `[::1]`, any port): a page served
/// on 127.0.0.1 is then out of reach of a browser led there by a DNS name
/// rebound to it (DNS rebinding), which sends that name as its `Host`.
pub(crate) fn with_loopback_host(app: Router) -> Router {
    app.layer(axum::middleware::from_fn(|request: Request, next: Next| async move {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string);
        match host {
            Some(host) if !is_loopback_host(&host) => (
                StatusCode::FORBIDDEN,
                format!("`Host: {host}` is not this machine's loopback name: open the page at http://127.0.0.1 or http://localhost"),
            )
                .into_response(),
            _ => next.run(request).await,
        }
    }))
}

/// Whether a `Host` header value names the loopback interface.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1" || name == "::1"
}

/// Compares a presented credential with the expected one in time that does
/// not depend on where they first differ.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Serves `app` on `listener` until `stopped` fires, within `options`'
/// limits; connections still open then are closed gracefully.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    options: HttpOptions,
    key: &'static str,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let open = Arc::new(Semaphore::new(options.max_connections));
    let (closing, close_signal) = tokio::sync::watch::channel(false);
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of file descriptors, for one: wait rather than spin.
                tracing::warn!(error = %e, key, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            metrics::counter!("tidemark_http_connections_refused_total", "service" => key)
                .increment(1);
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(
            app.clone()
                .map_request(|request: hyper::Request<Incoming>| request.map(Body::new)),
        );
        let header_read_timeout = options.header_read_timeout;
        let close_signal = close_signal.clone();
        let tls = options
            .tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(t.server.clone()));
        tokio::spawn(async move {
            match tls {
                None => answer(stream, service, header_read_timeout, close_signal).await,
                Some(acceptor) => {
                    // A client that opens the socket and never finishes the
                    // handshake is closed like one that sends no headers.
                    let handshake =
                        tokio::time::timeout(header_read_timeout, acceptor.accept(stream)).await;
                    match handshake {
                        Ok(Ok(stream)) => {
                            answer(stream, service, header_read_timeout, close_signal).await
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, key, "a TLS handshake failed"),
                        Err(_) => tracing::debug!(key, "a TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
    // Open connections finish what they are answering, for a while.
    let _ = closing.send(true);
    let all = u32::try_from(options.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(5), open.acquire_many(all)).await;
}

/// Answers the requests of one connection until it closes, or closes it
/// gracefully when the service stops.
async fn answer<S, A>(
    stream: S,
    service: TowerToHyperService<A>,
    header_read_timeout: Duration,
    mut close_signal: tokio::sync::watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    TowerToHyperService<A>: hyper::service::Service<
            hyper::Request<Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Send
        + 'static,
    <TowerToHyperService<A> as hyper::service::Service<hyper::Request<Incoming>>>::Future:
        Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        // A client may shut its writing side once its request is sent
        // (`nc -N`, some HTTP/1.0 clients): it still gets its answer, which
        // a state read sends a moment later, from the query's thread.
        .half_close(true)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = close_signal.changed() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
        }
    }
}

/// A request limiter: at most `max` requests wait for the query's state at
/// once.
#[derive(Clone)]
pub(crate) struct ReadSlots(Arc<Semaphore>);

impl ReadSlots {
    /// Room for `max` requests.
    pub(crate) fn new(max: usize) -> Self {
        ReadSlots(Arc::new(Semaphore::new(max.max(1))))
    }

    /// A slot, or `None` when all are taken.
    pub(crate) fn try_take(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn loopback_names_only() {
        use super::is_loopback_host;
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:9",
            "[::1]:80",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "10.0.0.1",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"Bearer abc", b"Bearer abc"));
        assert!(!same_secret(b"Bearer abd", b"Bearer abc"));
        assert!(!same_secret(b"Bearer ab", b"Bearer abc"));
        assert!(!same_secret(b"", b"Bearer abc"));
    }
}
