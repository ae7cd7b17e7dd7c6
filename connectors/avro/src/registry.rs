//! A Confluent-compatible schema-registry client, as Confluent's own
//! serializers use one: HTTPS (the system's roots, or a CA file), basic
//! auth (`basic.auth.user.info: user:password`) or a bearer token, schemas
//! fetched by id (`GET /schemas/ids/{id}`) and cached by the caller, and a
//! writer's schema registered under its subject
//! (`POST /subjects/{subject}/versions`) for the id to write.
//!
//! A registry that cannot be reached, or answers with a server error, is an
//! infrastructure failure (the batch waits and is retried); credentials it
//! refuses are a configuration error; only an id it answers "not found"
//! (40403) for is the record's fault.

use apache_avro::schema::Schema as AvroSchema;
use base64::Engine;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::secrets::{mask_url, Properties};

/// How a registry is reached: its URL and client properties
/// (`basic.auth.user.info`, `bearer.auth.token`, `ssl.ca.location`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryConfig {
    /// The registry's base URL (`https://registry:8081`; Apicurio's
    /// Confluent API: `.../apis/ccompat/v7`).
    pub url: String,
    /// Client properties; secrets are masked wherever shown.
    pub properties: Properties,
}

impl fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("url", &mask_url(&self.url))
            .field("properties", &self.properties)
            .finish()
    }
}

/// The properties a [`RegistryConfig`] understands.
const KNOWN_PROPERTIES: [&str; 4] = [
    "basic.auth.user.info",
    "bearer.auth.token",
    "ssl.ca.location",
    "request.timeout.ms",
];

/// How a sink names the subject it registers its schema under (Confluent's
/// `subject.name.strategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SubjectNameStrategy {
    /// `<topic>-value` (Confluent's default).
    #[default]
    Topic,
    /// The record's full name (`com.acme.Order`): one subject per record
    /// type, across topics.
    Record,
    /// `<topic>-<record full name>`.
    TopicRecord,
}

impl SubjectNameStrategy {
    /// The subject of `schema` written to `topic`.
    pub fn subject(self, topic: &str, schema: &AvroSchema) -> String {
        let record = match schema {
            AvroSchema::Record(record) => record.name.fullname(None),
            _ => String::new(),
        };
        match self {
            SubjectNameStrategy::Topic => format!("{topic}-value"),
            SubjectNameStrategy::Record => record,
            SubjectNameStrategy::TopicRecord => format!("{topic}-{record}"),
        }
    }
}

/// Why a schema could not be had by id.
#[derive(Debug)]
pub enum SchemaLookup {
    /// The registry does not know the id: the record is bad.
    Unknown(String),
    /// The registry did not answer: the batch waits for it.
    Unavailable(String),
    /// The registry refused the client (credentials): a configuration error.
    Refused(String),
    /// The registry answered with something that is not a usable schema
    /// (not JSON, no `schema`, a schema that does not parse, schema
    /// references): the registry or its address is wrong, not the record,
    /// and asking again answers the same — a configuration error.
    Unusable(String),
}

/// Tries of an id the registry answers "not found" (40403) for before the
/// record is called bad: a schema registered a moment ago may not have
/// reached the registry node asked yet.
const UNKNOWN_ID_ATTEMPTS: u32 = 3;
/// The wait after the first "not found"; doubled after each.
const UNKNOWN_ID_BACKOFF: Duration = Duration::from_millis(200);
/// How long an id found unknown is answered unknown without asking again:
/// a stream of records with a bad id must not cost a round of requests
/// (and their waits) each.
const UNKNOWN_ID_TTL: Duration = Duration::from_secs(60);

/// A client of one registry.
pub struct RegistryClient {
    url: String,
    agent: ureq::Agent,
    authorization: Option<String>,
    /// Ids found unknown, when, and why (see [`UNKNOWN_ID_TTL`]).
    unknown: std::sync::Mutex<std::collections::HashMap<u32, (std::time::Instant, String)>>,
}

impl fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryClient")
            .field("url", &mask_url(&self.url))
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "*****"),
            )
            .finish()
    }
}

impl RegistryClient {
    /// A client for `config`; fails on an unknown property or an
    /// unreadable CA file, naming the key.
    pub fn new(config: &RegistryConfig) -> Result<Self> {
        if let Some(unknown) = config
            .properties
            .keys()
            .find(|k| !KNOWN_PROPERTIES.contains(&k.as_str()))
        {
            return Err(Error::config(
                "schema_registry.properties",
                format!(
                    "unknown property `{unknown}` (allowed: {})",
                    KNOWN_PROPERTIES.join(", ")
                ),
            ));
        }
        let timeout = match config.properties.get("request.timeout.ms") {
            Some(ms) => Duration::from_millis(ms.parse().map_err(|_| {
                Error::config(
                    "schema_registry.properties.request.timeout.ms",
                    "milliseconds",
                )
            })?),
            None => Duration::from_secs(10),
        };
        let mut agent = ureq::AgentBuilder::new().timeout(timeout);
        if let Some(ca) = config.properties.get("ssl.ca.location") {
            agent = agent.tls_config(Arc::new(tls_with_ca(ca)?));
        }
        let authorization = match (
            config.properties.get("basic.auth.user.info"),
            config.properties.get("bearer.auth.token"),
        ) {
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    "schema_registry.properties",
                    "give `basic.auth.user.info` or `bearer.auth.token`, not both",
                ))
            }
            (Some(user_info), None) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(user_info)
            )),
            (None, Some(token)) => Some(format!("Bearer {token}")),
            (None, None) => None,
        };
        Ok(RegistryClient {
            url: config.url.trim_end_matches('/').to_string(),
            agent: agent.build(),
            authorization,
            unknown: Default::default(),
        })
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let request = self
            .agent
            .request(method, &format!("{}{path}", self.url))
            .set(
                "Accept",
                "application/vnd.schemaregistry.v1+json, application/json",
            );
        match &self.authorization {
            Some(value) => request.set("Authorization", value),
            None => request,
        }
    }

    /// The schema registered with `id`. An id the registry does not know
    /// is asked again ([`UNKNOWN_ID_ATTEMPTS`] times in all, backing off)
    /// before it is called unknown, and then remembered as unknown for
    /// [`UNKNOWN_ID_TTL`].
    pub fn schema_by_id(&self, id: u32) -> std::result::Result<AvroSchema, SchemaLookup> {
        if let Some(reason) = self.known_unknown(id) {
            return Err(SchemaLookup::Unknown(reason));
        }
        let mut wait = UNKNOWN_ID_BACKOFF;
        for attempt in 1.. {
            match self.fetch_schema(id) {
                Err(SchemaLookup::Unknown(_)) if attempt < UNKNOWN_ID_ATTEMPTS => {
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                Err(SchemaLookup::Unknown(reason)) => {
                    self.unknown
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, (std::time::Instant::now(), reason.clone()));
                    return Err(SchemaLookup::Unknown(reason));
                }
                answer => return answer,
            }
        }
        unreachable!("the loop returns by its last attempt")
    }

    /// Why `id` was found unknown, if it was within [`UNKNOWN_ID_TTL`].
    fn known_unknown(&self, id: u32) -> Option<String> {
        let mut unknown = self.unknown.lock().unwrap_or_else(|p| p.into_inner());
        match unknown.get(&id) {
            Some((at, reason)) if at.elapsed() < UNKNOWN_ID_TTL => Some(reason.clone()),
            Some(_) => {
                unknown.remove(&id);
                None
            }
            None => None,
        }
    }

    /// One request for the schema registered with `id`.
    fn fetch_schema(&self, id: u32) -> std::result::Result<AvroSchema, SchemaLookup> {
        let response = match self.request("GET", &format!("/schemas/ids/{id}")).call() {
            Ok(response) => response,
            Err(ureq::Error::Status(404, response)) => {
                let code = response
                    .into_json::<serde_json::Value>()
                    .ok()
                    .and_then(|body| body.get("error_code")?.as_i64());
                return Err(match code {
                    Some(40403) => SchemaLookup::Unknown(format!(
                        "unknown schema id {id}: the schema registry does not have it"
                    )),
                    _ => SchemaLookup::Unavailable(format!(
                        "schema id {id}: the registry URL answered 404 without Confluent's schema-not-found code (40403): is `schema_registry` the registry's address?"
                    )),
                });
            }
            Err(ureq::Error::Status(status @ (401 | 403), _)) => {
                return Err(SchemaLookup::Refused(format!(
                    "the schema registry at {} refused this client ({status}) fetching schema id {id}: check `basic.auth.user.info` / `bearer.auth.token`",
                    mask_url(&self.url)
                )))
            }
            Err(e) if is_certificate_refusal(&e) => {
                return Err(SchemaLookup::Refused(format!(
                    "the schema registry at {} has a certificate this client does not trust (check `ssl.ca.location`): {}",
                    mask_url(&self.url),
                    describe_failure(&e)
                )))
            }
            Err(e) => {
                return Err(SchemaLookup::Unavailable(format!(
                    "schema registry unavailable fetching schema id {id}: {}",
                    describe_failure(&e)
                )))
            }
        };
        let unusable = |what: String| {
            SchemaLookup::Unusable(format!(
                "schema id {id}: {what} (is `schema_registry` a Confluent-compatible registry's address?)"
            ))
        };
        let body: serde_json::Value = response
            .into_json()
            .map_err(|e| unusable(format!("the registry's answer is not JSON: {e}")))?;
        if body["references"].as_array().is_some_and(|r| !r.is_empty()) {
            return Err(SchemaLookup::Unusable(format!(
                "schema id {id} refers to other schemas ({}), which tidemark does not resolve yet: register the writer's schema with its types inlined",
                body["references"]
            )));
        }
        let text = body
            .get("schema")
            .and_then(|s| s.as_str())
            .ok_or_else(|| unusable("the registry's answer has no `schema` text".into()))?;
        AvroSchema::parse_str(text)
            .map_err(|e| unusable(format!("the registry's schema does not parse: {e}")))
    }

    /// Registers `schema` under `subject` (or finds it registered there)
    /// and returns its id. A registry that cannot be reached is an
    /// infrastructure error (the caller retries); refused credentials or an
    /// incompatible schema are configuration errors.
    pub fn register(&self, subject: &str, schema: &AvroSchema) -> Result<u32> {
        let body = serde_json::json!({ "schema": schema.canonical_form() });
        let path = format!("/subjects/{}/versions", encode_path_segment(subject));
        let response = match self
            .request("POST", &path)
            .set("Content-Type", "application/vnd.schemaregistry.v1+json")
            .send_json(body)
        {
            Ok(response) => response,
            Err(ureq::Error::Status(status @ (401 | 403 | 409 | 422), response)) => {
                let detail = response.into_string().unwrap_or_default();
                return Err(Error::config(
                    "schema_registry",
                    format!(
                        "the schema registry at {} refused to register the sink's schema under `{subject}` ({status}): {detail}",
                        mask_url(&self.url)
                    ),
                ));
            }
            Err(e) if is_certificate_refusal(&e) => {
                return Err(Error::config(
                    "schema_registry.properties.ssl.ca.location",
                    format!(
                    "the schema registry at {} has a certificate this client does not trust: {}",
                    mask_url(&self.url),
                    describe_failure(&e)
                ),
                ))
            }
            Err(e) => {
                return Err(Error::Sink(format!(
                    "schema registry unavailable registering `{subject}`: {}",
                    describe_failure(&e)
                )))
            }
        };
        let answer: serde_json::Value = response.into_json().map_err(|e| {
            Error::sink_failed(format!("registering `{subject}`: answer is not JSON"), e)
        })?;
        answer
            .get("id")
            .and_then(|id| id.as_u64())
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| Error::Sink(format!("registering `{subject}`: no `id` in {answer}")))
    }
}

/// What went wrong reaching the registry, without its URL (which may hold
/// credentials).
fn describe_failure(error: &ureq::Error) -> String {
    match error {
        ureq::Error::Status(status, _) => format!("HTTP {status}"),
        ureq::Error::Transport(transport) => {
            let mut text = match transport.message() {
                Some(message) => format!("{}: {message}", transport.kind()),
                None => transport.kind().to_string(),
            };
            // The cause (a refused certificate, a reset) says what to fix.
            let mut cause = std::error::Error::source(transport);
            while let Some(inner) = cause {
                text.push_str(&format!(": {inner}"));
                cause = inner.source();
            }
            text
        }
    }
}

/// Whether the registry's TLS certificate was refused: a configuration
/// error (the CA file, the host name), not an outage to wait out.
fn is_certificate_refusal(error: &ureq::Error) -> bool {
    match error {
        ureq::Error::Transport(_) => describe_failure(error)
            .to_ascii_lowercase()
            .contains("certificate"),
        ureq::Error::Status(..) => false,
    }
}

/// A subject in a URL path: Confluent's subjects may hold `.` and `-`,
/// record names never `/`; anything outside the unreserved set is escaped.
fn encode_path_segment(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A TLS configuration trusting the CA certificates in the PEM file `ca`.
fn tls_with_ca(ca: &str) -> Result<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let key = "schema_registry.properties.ssl.ca.location";
    let mut roots = rustls::RootCertStore::empty();
    let certificates =
        CertificateDer::pem_file_iter(ca).map_err(|e| Error::config(key, format!("{ca}: {e}")))?;
    for certificate in certificates {
        let certificate = certificate.map_err(|e| Error::config(key, format!("{ca}: {e}")))?;
        roots
            .add(certificate)
            .map_err(|e| Error::config(key, format!("{ca}: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config(key, e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_strategy() {
        let schema = AvroSchema::parse_str(
            r#"{"type":"record","name":"Order","namespace":"com.acme","fields":[{"name":"a","type":"long"}]}"#,
        )
        .unwrap();
        assert_eq!(
            SubjectNameStrategy::Topic.subject("orders", &schema),
            "orders-value"
        );
        assert_eq!(
            SubjectNameStrategy::Record.subject("orders", &schema),
            "com.acme.Order"
        );
        assert_eq!(
            SubjectNameStrategy::TopicRecord.subject("orders", &schema),
            "orders-com.acme.Order"
        );
        assert_eq!(encode_path_segment("a b/c"), "a%20b%2Fc");
    }

    /// An in-process stand-in for a registry (not a real one: see
    /// docs/secured-kafka.md for what runs against what): answers each
    /// request with the next canned `(status, body)` and records the
    /// request line and `Authorization` header it got.
    struct FakeRegistry {
        url: String,
        seen: std::sync::mpsc::Receiver<(String, Option<String>, String)>,
    }

    impl FakeRegistry {
        fn serve(answers: Vec<(u16, &'static str)>) -> FakeRegistry {
            use std::io::{BufRead, BufReader, Read, Write};
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let (tx, seen) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for (status, body) in answers {
                    let (mut stream, _) = listener.accept().unwrap();
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut request_line = String::new();
                    reader.read_line(&mut request_line).unwrap();
                    let (mut authorization, mut length) = (None, 0usize);
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        let (name, value) = header.split_once(": ").unwrap();
                        match name.to_ascii_lowercase().as_str() {
                            "authorization" => authorization = Some(value.to_string()),
                            "content-length" => length = value.parse().unwrap(),
                            _ => {}
                        }
                    }
                    let mut request_body = vec![0; length];
                    reader.read_exact(&mut request_body).unwrap();
                    let request_body = String::from_utf8(request_body).unwrap();
                    tx.send((
                        request_line.trim_end().to_string(),
                        authorization,
                        request_body,
                    ))
                    .unwrap();
                    write!(
                        stream,
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .unwrap();
                }
            });
            FakeRegistry { url, seen }
        }
    }

    #[test]
    fn registers_fetches_and_tells_outages_from_unknown_ids_and_refusals() {
        let schema = AvroSchema::parse_str(
            r#"{"type":"record","name":"Order","fields":[{"name":"a","type":"long"}]}"#,
        )
        .unwrap();
        let fake = FakeRegistry::serve(vec![
            (200, r#"{"id": 42}"#),
            (
                200,
                r#"{"schema": "{\"type\":\"record\",\"name\":\"Order\",\"fields\":[{\"name\":\"a\",\"type\":\"long\"}]}"}"#,
            ),
            (
                404,
                r#"{"error_code": 40403, "message": "Schema not found"}"#,
            ),
            (
                404,
                r#"{"error_code": 40403, "message": "Schema not found"}"#,
            ),
            (
                404,
                r#"{"error_code": 40403, "message": "Schema not found"}"#,
            ),
            (503, r#"{"error_code": 50003}"#),
            (401, r#"{"error_code": 401}"#),
        ]);
        let client = RegistryClient::new(&RegistryConfig {
            url: fake.url.clone(),
            properties: [("basic.auth.user.info", "bob:pw1234")]
                .into_iter()
                .collect(),
        })
        .unwrap();
        assert_eq!(client.register("orders-value", &schema).unwrap(), 42);
        let (line, auth, body) = fake.seen.recv().unwrap();
        assert_eq!(line, "POST /subjects/orders-value/versions HTTP/1.1");
        assert_eq!(auth.as_deref(), Some("Basic Ym9iOnB3MTIzNA=="));
        assert!(
            body.contains("\"schema\"") && body.contains("Order"),
            "{body}"
        );
        assert_eq!(client.schema_by_id(42).ok(), Some(schema));
        assert_eq!(fake.seen.recv().unwrap().0, "GET /schemas/ids/42 HTTP/1.1");
        assert!(matches!(
            client.schema_by_id(7),
            Err(SchemaLookup::Unknown(_))
        ));
        assert!(matches!(
            client.schema_by_id(8),
            Err(SchemaLookup::Unavailable(_))
        ));
        match client.schema_by_id(8) {
            Err(SchemaLookup::Refused(reason)) => assert!(!reason.contains("pw1234"), "{reason}"),
            _ => panic!("a 401 is a refusal"),
        }
    }

    /// Registry faults are never bad records: garbage answers are a
    /// configuration error, a "not found" is asked again before a record is
    /// called bad (and then remembered), schema references are refused
    /// clearly.
    #[test]
    fn garbage_is_a_configuration_error_and_not_found_is_retried_then_cached() {
        let schema_text = r#"{"schema": "{\"type\":\"record\",\"name\":\"Order\",\"fields\":[{\"name\":\"a\",\"type\":\"long\"}]}"}"#;
        let not_found = r#"{"error_code": 40403, "message": "Schema not found"}"#;
        let fake = FakeRegistry::serve(vec![
            (200, "<html>a login page</html>"),
            (200, r#"{"id": 3}"#),
            (200, r#"{"schema": "{\"type\": \"nonsense\"}"}"#),
            (
                200,
                r#"{"schema": "{\"type\":\"record\",\"name\":\"A\",\"fields\":[{\"name\":\"b\",\"type\":\"B\"}]}", "references": [{"name": "B", "subject": "b", "version": 1}]}"#,
            ),
            // Found at the third try: registered a moment ago.
            (404, not_found),
            (404, not_found),
            (200, schema_text),
            // Unknown for good: three tries, then remembered.
            (404, not_found),
            (404, not_found),
            (404, not_found),
        ]);
        let client = RegistryClient::new(&RegistryConfig {
            url: fake.url.clone(),
            properties: Default::default(),
        })
        .unwrap();
        for id in [1, 2, 3, 4] {
            match client.schema_by_id(id) {
                Err(SchemaLookup::Unusable(reason)) => {
                    assert!(reason.contains(&format!("schema id {id}")), "{reason}");
                    if id == 4 {
                        assert!(reason.contains("refers to other schemas"), "{reason}");
                    }
                }
                Err(other) => panic!("id {id}: {other:?}"),
                Ok(_) => panic!("id {id}: a schema from a garbage answer"),
            }
        }
        assert!(client.schema_by_id(5).is_ok(), "found at the third try");
        assert!(matches!(
            client.schema_by_id(6),
            Err(SchemaLookup::Unknown(_))
        ));
        let asked = fake.seen.try_iter().count();
        assert_eq!(asked, 10, "every scripted answer was asked for");
        // Remembered: no request, the same answer.
        assert!(matches!(
            client.schema_by_id(6),
            Err(SchemaLookup::Unknown(_))
        ));
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            fake.seen.try_iter().count(),
            0,
            "an unknown id is not asked again at once"
        );
    }

    #[test]
    fn secrets_stay_out_of_debug_and_bad_properties_fail_fast() {
        let config = RegistryConfig {
            url: "https://bob:pw1234@registry:8081".into(),
            properties: [("basic.auth.user.info", "bob:pw1234")]
                .into_iter()
                .collect(),
        };
        let client = RegistryClient::new(&config).unwrap();
        assert!(!format!("{client:?} {config:?}").contains("pw1234"));
        let wrong = RegistryConfig {
            url: "http://r".into(),
            properties: [("basic.auth.password", "x")].into_iter().collect(),
        };
        let err = RegistryClient::new(&wrong).unwrap_err().to_string();
        assert!(
            err.contains("basic.auth.password") && err.contains("allowed"),
            "{err}"
        );
    }
}
