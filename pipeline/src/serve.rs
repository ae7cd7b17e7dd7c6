//! The `metrics:`, `serve:` and `ui:` sections: the HTTP services and
//! their TLS and tokens.

use serde::Deserialize;
use std::fmt;

/// `metrics: {prometheus: "127.0.0.1:9000"}`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSpec {
    /// Address of the Prometheus scrape endpoint (`/metrics`).
    pub prometheus: String,
    /// When set, a scrape must carry `Authorization: Bearer <token>`
    /// (Prometheus' `authorization` setting). Masked wherever shown.
    #[serde(default)]
    pub auth_token: Option<String>,
    /// TLS on the endpoint.
    #[serde(default)]
    pub tls: Option<TlsSpec>,
}

impl fmt::Debug for MetricsSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsSpec")
            .field("prometheus", &self.prometheus)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

/// `tls: {cert: server.pem, key: server.key, ca: ca.pem}` on an HTTP
/// service: its socket speaks TLS only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// The certificate chain served (PEM).
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
    /// The CA certificates (PEM) a peer's certificate must chain to when
    /// an instance forwards a read to another: required by `serve.tls`,
    /// unused by `ui` and `metrics`.
    #[serde(default)]
    pub ca: Option<String>,
}

/// `serve:`: interactive queries over HTTP.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSpec {
    /// The address to listen on (`host:port`; port 0 picks a free one).
    pub listen: String,
    /// The address the other instances reach this one on (`host:port`),
    /// found by them through the consumer group; default: `listen`.
    #[serde(default)]
    pub advertised: Option<String>,
    /// When set (write `${VAR}` to keep it out of the file), every request
    /// but the health probes must carry `Authorization: Bearer <token>`;
    /// the instances of one query share it. Masked wherever shown.
    #[serde(default)]
    pub auth_token: Option<String>,
    /// TLS on the socket; reads forwarded to the other instances go over
    /// `https` (the instances of one query share the setting).
    #[serde(default)]
    pub tls: Option<TlsSpec>,
}

impl fmt::Debug for ServeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeSpec")
            .field("listen", &self.listen)
            .field("advertised", &self.advertised)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl ServeSpec {
    /// The address other instances reach this one on.
    pub fn advertised(&self) -> &str {
        self.advertised.as_deref().unwrap_or(&self.listen)
    }
}

/// `ui:`: the live web page.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UiSpec {
    /// The address to listen on (`host:port`).
    pub listen: String,
    /// When set, the page and its API ask for `Authorization: Bearer
    /// <token>` (for a page reached through a proxy that adds it). Masked
    /// wherever shown.
    #[serde(default)]
    pub auth_token: Option<String>,
    /// TLS on the socket.
    #[serde(default)]
    pub tls: Option<TlsSpec>,
}

impl fmt::Debug for UiSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UiSpec")
            .field("listen", &self.listen)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}
