//! The schema registry as Confluent clients use it, through pipeline files:
//! an Avro sink registers its schema under `<topic>-value` with basic auth
//! and writes the id it gets back; an Avro source whose registry is down
//! holds its batch back until the registry answers, and turns no record
//! into a dead letter.
//!
//! The registry here is `FakeRegistry`, an in-process stand-in speaking the
//! Confluent REST API (no real registry installs from the registries this
//! project reaches without patching; see docs/secured-kafka.md).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark_integration_tests::*;

/// What the fake registry holds and has seen.
#[derive(Default)]
struct RegistryState {
    /// Registered schemas; id = index + 1.
    schemas: Vec<(String, String)>,
    /// Requests still to answer with 503 (an outage).
    down_for: usize,
    /// `METHOD path` of every request, with its Authorization header.
    requests: Vec<(String, Option<String>)>,
}

/// An in-process stand-in for a Confluent schema registry requiring basic
/// auth `user:password`.
struct FakeRegistry {
    url: String,
    state: Arc<Mutex<RegistryState>>,
}

impl FakeRegistry {
    fn start(user_info: &str) -> FakeRegistry {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(RegistryState::default()));
        let expected = format!("Basic {}", base64_encode(user_info.as_bytes()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(stream, &shared, &expected);
            }
        });
        FakeRegistry { url, state }
    }
}

fn answer(mut stream: std::net::TcpStream, state: &Mutex<RegistryState>, expected: &str) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let (mut authorization, mut length) = (None, 0usize);
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        let header = header.trim_end().to_string();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(": ") {
            match name.to_ascii_lowercase().as_str() {
                "authorization" => authorization = Some(value.to_string()),
                "content-length" => length = value.parse().unwrap(),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let parts: Vec<&str> = line.split_whitespace().collect();
    let (method, path) = (parts[0].to_string(), parts[1].to_string());
    let mut state = state.lock().unwrap();
    state
        .requests
        .push((format!("{method} {path}"), authorization.clone()));
    let (status, reply) = if state.down_for > 0 {
        state.down_for -= 1;
        (503, r#"{"error_code":50003,"message":"down"}"#.to_string())
    } else if authorization.as_deref() != Some(expected) {
        (
            401,
            r#"{"error_code":401,"message":"Unauthorized"}"#.to_string(),
        )
    } else if let Some(subject) = path
        .strip_prefix("/subjects/")
        .and_then(|p| p.strip_suffix("/versions"))
    {
        let schema: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let schema = schema["schema"].as_str().unwrap().to_string();
        state.schemas.push((subject.to_string(), schema));
        (200, format!(r#"{{"id":{}}}"#, state.schemas.len()))
    } else if let Some(id) = path.strip_prefix("/schemas/ids/") {
        let id: usize = id.parse().unwrap();
        match state.schemas.get(id.wrapping_sub(1)) {
            Some((_, schema)) => (200, serde_json::json!({ "schema": schema }).to_string()),
            None => (
                404,
                r#"{"error_code":40403,"message":"Schema not found"}"#.into(),
            ),
        }
    } else {
        (404, r#"{"error_code":404}"#.into())
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
        reply.len()
    );
}

fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| n << 8 | *b as u32) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

const SCHEMA: &str = r#"{"type":"record","name":"Reading","namespace":"com.acme","fields":[{"name":"sensor","type":"string"},{"name":"value","type":"double"}]}"#;

fn run(dir: &std::path::Path, yaml: &str, auth: &str) -> std::process::Output {
    let file = dir.join("pipeline.yaml");
    std::fs::write(&file, yaml).unwrap();
    std::fs::write(dir.join("reading.avsc"), SCHEMA).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .env("REGISTRY_AUTH", auth)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn the_sink_registers_its_schema_and_an_outage_holds_the_source_back() {
    let auth = "svc:registry-pw-5150";
    let registry = FakeRegistry::start(auth);
    let (input, avro, output) = (unique("reg-in"), unique("reg-avro"), unique("reg-out"));
    for topic in [&input, &avro, &output] {
        create_topic(topic, 1);
    }
    let records: Vec<_> = (0..20)
        .map(|i| {
            let v = format!(r#"{{"sensor": "s{}", "value": {i}.5}}"#, i % 3);
            (format!("s{}", i % 3), v.into_bytes())
        })
        .collect();
    produce(&input, &records);
    let dir = tempfile::tempdir().unwrap();
    let registry_yaml = format!(
        "schema_registry: {{url: \"{}\", properties: {{basic.auth.user.info: \"${{REGISTRY_AUTH}}\"}}}}\n",
        registry.url
    );
    // JSON in, Avro out: the sink registers `<topic>-value`.
    let writer = format!(
        "name: {input}-w\n{registry_yaml}source: {{kind: kafka, topic: {input}, schema: {{sensor: string, value: double}}}}\ntrigger: available_now\nsink: {{kind: kafka, topic: {avro}, format: avro, avro_schema: reading.avsc, key: [sensor]}}\n"
    );
    let written = run(dir.path(), &writer, auth);
    let avro_records = consume_all(&avro, 20, Duration::from_secs(30));
    assert_eq!(avro_records.len(), 20);
    {
        let state = registry.state.lock().unwrap();
        assert_eq!(state.schemas.len(), 1);
        assert_eq!(state.schemas[0].0, format!("{avro}-value"));
    }
    for record in &avro_records {
        let value = record.value.as_deref().unwrap();
        assert_eq!(
            &value[..5],
            &[0, 0, 0, 0, 1],
            "magic byte and the registered id"
        );
    }

    // Avro in through the registry, which is down for its first answers:
    // the batch waits and is retried; no record becomes a dead letter.
    registry.state.lock().unwrap().down_for = 3;
    let reader = format!(
        "name: {avro}-r\n{registry_yaml}source: {{kind: kafka, topic: {avro}, format: avro}}\ntrigger: available_now\nsink: {{kind: kafka, topic: {output}}}\ndead_letter: {{kind: kafka, topic: {output}-dlq}}\n"
    );
    let read = run(dir.path(), &reader, auth);
    let rows = consume_all(&output, 20, Duration::from_secs(30));
    assert_eq!(rows.len(), 20, "{}", String::from_utf8_lossy(&read.stderr));
    let first: serde_json::Value =
        serde_json::from_slice(rows[0].value.as_deref().unwrap()).unwrap();
    assert_eq!(first["sensor"], "s0");
    assert!(
        consume_all(&format!("{output}-dlq"), 1, Duration::from_secs(3)).is_empty(),
        "an outage made dead letters"
    );
    let state = registry.state.lock().unwrap();
    let fetches = state
        .requests
        .iter()
        .filter(|(r, _)| r == "GET /schemas/ids/1")
        .count();
    assert!(
        fetches >= 4,
        "the lookup was retried after the outage: {:?}",
        state.requests
    );
    // The registry's password never shows.
    for shown in [&written.stderr, &written.stdout, &read.stderr, &read.stdout] {
        assert!(!String::from_utf8_lossy(shown).contains("registry-pw-5150"));
    }
}

/// The HTTPS stand-in (`tests/https_registry/HttpsFakeRegistry.java`),
/// serving with the test broker's certificate; killed on drop.
struct HttpsFakeRegistry {
    child: std::process::Child,
    url: String,
}

impl HttpsFakeRegistry {
    fn start(tls_dir: &std::path::Path, token: &str) -> HttpsFakeRegistry {
        let source = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/https_registry/HttpsFakeRegistry.java"
        );
        let mut child = Command::new("java")
            .arg(source)
            .arg(tls_dir.join("broker.p12"))
            .arg(tls_dir.join("store-password"))
            .arg(token)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("java (scripts/setup.sh installs it)");
        let mut port = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();
        let url = format!("https://localhost:{}", port.trim());
        HttpsFakeRegistry { child, url }
    }
}

impl Drop for HttpsFakeRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn https_with_a_ca_file_and_a_bearer_token_and_refusals_are_configuration_errors() {
    use tidemark_connectors::avro::{RegistryClient, RegistryConfig, SchemaLookup};
    let secured = Secured::from_env();
    let tls_dir = std::path::Path::new(&secured.ca).parent().unwrap();
    let token = "bearer-token-6021";
    let registry = HttpsFakeRegistry::start(tls_dir, token);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("reading.avsc"), SCHEMA).unwrap();
    let schema =
        tidemark_connectors::avro::read_schema_file(&dir.path().join("reading.avsc")).unwrap();
    let client = |ca: &str, token: &str| {
        RegistryClient::new(&RegistryConfig {
            url: registry.url.clone(),
            properties: [("ssl.ca.location", ca), ("bearer.auth.token", token)]
                .into_iter()
                .collect(),
        })
        .unwrap()
    };
    let trusted = client(&secured.ca, token);
    assert_eq!(trusted.register("readings-value", &schema).unwrap(), 1);
    assert!(matches!(trusted.schema_by_id(1), Ok(s) if s == schema));
    assert!(matches!(
        trusted.schema_by_id(2),
        Err(SchemaLookup::Unknown(_))
    ));

    let wrong_ca = client(&secured.other_ca, token).register("readings-value", &schema);
    let err = wrong_ca.unwrap_err();
    assert!(
        matches!(err, tidemark::error::Error::Config { .. })
            && err.to_string().contains("certificate"),
        "{err}"
    );
    let wrong_token = client(&secured.ca, "not-the-token").register("readings-value", &schema);
    let err = wrong_token.unwrap_err();
    assert!(
        matches!(err, tidemark::error::Error::Config { .. }),
        "{err}"
    );
    assert!(!err.to_string().contains("not-the-token"), "{err}");
    assert!(matches!(
        client(&secured.ca, "not-the-token").schema_by_id(1),
        Err(SchemaLookup::Refused(_))
    ));
}
