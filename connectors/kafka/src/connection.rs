//! How a query's Kafka clients reach their cluster: one value — bootstrap
//! servers and librdkafka properties (TLS, SASL, timeouts) — that every
//! client the query creates starts from, so that a secured cluster needs
//! its settings once, not per client. A client's own properties go on top
//! ([`KafkaConnection::with_overrides`]).

use rdkafka::client::ClientContext;
use rdkafka::config::{FromClientConfig, FromClientConfigAndContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientConfig;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::secrets::{redact, Properties};

/// The broker to use when none is configured: `KAFKA_BOOTSTRAP`, else
/// `127.0.0.1:9092`.
pub fn default_bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

/// Bootstrap servers and the librdkafka properties every client of a query
/// gets. `Debug` and [`KafkaConnection::describe`] mask secret values.
///
/// ```
/// use tidemark_kafka::KafkaConnection;
/// let cluster = KafkaConnection::new("broker-1:9093")
///     .property("security.protocol", "SASL_SSL")
///     .property("sasl.mechanism", "SCRAM-SHA-512")
///     .property("sasl.username", "app")
///     .property("sasl.password", "not-shown");
/// assert!(!format!("{cluster:?}").contains("not-shown"));
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaConnection {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// Every other librdkafka property.
    pub properties: Properties,
}

impl KafkaConnection {
    /// A connection to `bootstrap` with no other properties (plaintext).
    pub fn new(bootstrap: impl Into<String>) -> Self {
        KafkaConnection {
            bootstrap: bootstrap.into(),
            properties: Properties::default(),
        }
    }

    /// `KAFKA_BOOTSTRAP`, else `127.0.0.1:9092`.
    pub fn local() -> Self {
        KafkaConnection::new(default_bootstrap())
    }

    /// With librdkafka property `name` set to `value`.
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(name.into(), value.into());
        self
    }

    /// This connection with a client's own `overrides` on top.
    pub fn with_overrides(&self, overrides: &BTreeMap<String, String>) -> Self {
        KafkaConnection {
            bootstrap: self.bootstrap.clone(),
            properties: self.properties.merged(overrides),
        }
    }

    /// This connection's properties on another cluster (`bootstrap`).
    pub fn on_cluster(&self, bootstrap: &str) -> Self {
        KafkaConnection {
            bootstrap: bootstrap.to_string(),
            properties: self.properties.clone(),
        }
    }

    /// One line for `describe` and logs: the bootstrap servers and each
    /// property, secrets masked.
    pub fn describe(&self) -> String {
        let mut line = format!("bootstrap.servers={}", self.bootstrap);
        for (name, value) in self.properties.masked() {
            line.push_str(&format!(", {name}={value}"));
        }
        line
    }

    /// A librdkafka configuration: `defaults` (tunings a user may
    /// override), then this connection. The caller sets what must hold
    /// whatever the user wrote (a transactional id, an isolation level)
    /// after this.
    pub(crate) fn client_config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for (name, value) in defaults {
            config.set(*name, *value);
        }
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config
    }

    /// `config` created as a client with `context`; an error names `what`
    /// and never echoes a secret (librdkafka quotes a value it refuses).
    pub(crate) fn create<T, C>(&self, config: &ClientConfig, context: C, what: &str) -> Result<T>
    where
        T: FromClientConfigAndContext<C>,
        C: ClientContext,
    {
        config
            .create_with_context(context)
            .map_err(|e| self.creation_error(what, e))
    }

    /// `config` created as a client with librdkafka's default context.
    pub(crate) fn create_plain<T: FromClientConfig>(
        &self,
        config: &ClientConfig,
        what: &str,
    ) -> Result<T> {
        config.create().map_err(|e| self.creation_error(what, e))
    }

    fn creation_error(&self, what: &str, error: KafkaError) -> Error {
        let reason = redact(&error.to_string(), self.properties.secret_values());
        Error::config(
            "kafka.properties",
            format!("{what} for {}: {reason}", self.bootstrap),
        )
    }

    /// Connects once and fails fast when the cluster refuses this
    /// connection's credentials or TLS settings (a wrong password, an
    /// untrusted certificate): librdkafka would otherwise retry them for
    /// ever. The error names the broker and, for SASL, the mechanism. A
    /// cluster that does not answer is not refused: that is left to the
    /// clients' own retries.
    pub fn check(&self) -> Result<()> {
        let context = FirstError::default();
        let consumer: BaseConsumer<FirstError> = self.create(
            &self.client_config(&[]),
            context.clone(),
            "connection check client",
        )?;
        // Short metadata requests, serving the event queue between them
        // (refusals reach the context only then): a refusal shows within a
        // second or two, an answer ends the check at once.
        let mut refusal = None;
        for _ in 0..10 {
            if consumer
                .fetch_metadata(None, Duration::from_secs(1))
                .is_ok()
            {
                return Ok(());
            }
            let _ = consumer.poll(Duration::from_millis(50));
            refusal = context.take();
            if refusal.is_some() {
                break;
            }
        }
        drop(consumer);
        match refusal {
            Some(refusal) => {
                let reason = redact(&refusal, self.properties.secret_values());
                let mechanism = self
                    .properties
                    .get("sasl.mechanism")
                    .map(|m| format!(" (sasl.mechanism {m})"))
                    .unwrap_or_default();
                Err(Error::config(
                    "kafka.properties",
                    format!(
                        "{} refused the connection{mechanism}: {reason}",
                        self.bootstrap
                    ),
                ))
            }
            None => Ok(()),
        }
    }
}

impl fmt::Debug for KafkaConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConnection")
            .field("bootstrap", &self.bootstrap)
            .field("properties", &self.properties)
            .finish()
    }
}

impl From<&str> for KafkaConnection {
    fn from(bootstrap: &str) -> Self {
        KafkaConnection::new(bootstrap)
    }
}

impl From<String> for KafkaConnection {
    fn from(bootstrap: String) -> Self {
        KafkaConnection::new(bootstrap)
    }
}

/// A client context keeping the first authentication or TLS error
/// librdkafka reports (it reports them as events, not as call results).
#[derive(Clone, Default)]
struct FirstError(Arc<Mutex<Option<String>>>);

impl FirstError {
    fn take(&self) -> Option<String> {
        self.0.lock().ok().and_then(|mut first| first.take())
    }
}

impl ClientContext for FirstError {
    fn error(&self, error: KafkaError, reason: &str) {
        let refused = matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Authentication)
                | Some(RDKafkaErrorCode::SSL)
                | Some(RDKafkaErrorCode::SaslAuthenticationFailed)
        );
        if refused {
            if let Ok(mut first) = self.0.lock() {
                first.get_or_insert_with(|| reason.to_string());
            }
        }
    }
}

impl ConsumerContext for FirstError {}
