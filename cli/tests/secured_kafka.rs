//! A pipeline against the broker's secured listener only (SASL_SSL,
//! SCRAM-SHA-512, a CA file), every one of its Kafka clients configured by
//! the file's one `kafka:` section: an exactly-once windowed aggregation
//! with a repartition topic, a changelog, a standby and the dead-letter
//! topic, killed once and restarted, writes exact output. The broker's ACLs
//! give the `secure-*` resources to the SCRAM user alone, so a client that
//! went over plaintext would be refused (checked). The password never
//! appears in any output channel; a wrong password or a wrong CA fails fast
//! with an error naming the broker.

mod common;

use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tidemark_connectors::kafka::{ensure_topic, KafkaConnection};
use tidemark_integration_tests::*;

/// The environment variable the pipeline file takes the password from.
const PASSWORD_VAR: &str = "SECURE_TEST_KAFKA_PASSWORD";

fn secured_connection(secured: &Secured) -> KafkaConnection {
    KafkaConnection::new(&secured.bootstrap)
        .property("security.protocol", "SASL_SSL")
        .property("sasl.mechanism", "SCRAM-SHA-512")
        .property("sasl.username", &secured.user)
        .property("sasl.password", &secured.password)
        .property("ssl.ca.location", &secured.ca)
}

/// [`windowed_pipeline`] with a `kafka:` section for the secured listener
/// (password from the environment), a standby, a zstd-compressing sink.
fn secured_pipeline(
    secured: &Secured,
    ca: &str,
    names: (&str, &str, &str),
    trigger: &str,
) -> String {
    let (group, input, output) = names;
    let kafka = format!(
        "kafka:\n  bootstrap: {}\n  properties:\n    security.protocol: SASL_SSL\n    sasl.mechanism: SCRAM-SHA-512\n    sasl.username: {}\n    sasl.password: \"${{{PASSWORD_VAR}}}\"\n    ssl.ca.location: {ca}\n",
        secured.bootstrap, secured.user
    );
    let text = windowed_pipeline(group, input, output, trigger, 150);
    let text = text.replacen("source:\n", &format!("{kafka}source:\n"), 1);
    let text = text.replacen(
        "key: [id]}",
        "key: [id], properties: {compression.type: zstd}}",
        1,
    );
    let secured_text = text.replacen(
        "memory_mb: 32}",
        "memory_mb: 32, num_standby_replicas: 1}",
        1,
    );
    assert_ne!(text, secured_text);
    secured_text
}

fn tidemark(file: &Path, password: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidemark"));
    command
        .args(["run", "--progress", file.to_str().unwrap()])
        // The plaintext listener as the default: nothing may fall back to it.
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .env(PASSWORD_VAR, password)
        .env("RUST_LOG", "debug");
    command
}

/// Runs until `batches` progress reports, then SIGKILL; returns stderr.
fn run_and_kill_capturing(file: &Path, password: &str, batches: usize) -> String {
    let mut child = tidemark(file, password)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(180);
    let (mut seen, mut captured) = (0, String::new());
    for line in stderr.lines() {
        let line = line.unwrap();
        if line.starts_with("{\"id\"") {
            seen += 1;
        }
        captured.push_str(&line);
        captured.push('\n');
        if seen >= batches || Instant::now() > deadline {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(seen >= batches, "only {seen} batches:\n{captured}");
    captured
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn every_client_over_sasl_ssl_killed_and_restarted_exact_output_and_no_secret_shown() {
    let secured = Secured::from_env();
    let cluster = secured_connection(&secured);
    let (input, output, group) = (
        unique("secure-in"),
        unique("secure-out"),
        unique("secure-app"),
    );
    ensure_topic(&cluster, &input, 2).unwrap();
    ensure_topic(&cluster, &output, 1).unwrap();
    // zstd, snappy and lz4 batches in the input, and two bad records.
    let mut producer = secured.client_config();
    for (codec, (from, to)) in [
        ("zstd", (0, 200)),
        ("snappy", (200, 400)),
        ("lz4", (400, 600)),
    ] {
        producer.set("compression.type", codec);
        produce_seconds_with(&producer, &input, 2, from, to);
    }
    let bad = vec![
        ("bad".to_string(), b"{not json".to_vec()),
        (
            "bad".to_string(),
            br#"{"event_time": "yesterday", "id": "x"}"#.to_vec(),
        ),
    ];
    produce_with(&secured.client_config(), &input, Some(0), &bad);

    // The ACLs are in force: over plaintext the topic is refused.
    let plaintext: BaseConsumer = plain().create().unwrap();
    let metadata = plaintext
        .fetch_metadata(Some(&input), Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        metadata.topics()[0].error(),
        Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED),
        "the plaintext listener must be refused the secure-* topics"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let names = (group.as_str(), input.as_str(), output.as_str());
    let trigger = "{micro_batch: 200 milliseconds}";
    std::fs::write(
        &file,
        secured_pipeline(&secured, &secured.ca, names, trigger),
    )
    .unwrap();
    let describe = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["describe", file.to_str().unwrap()])
        .env(PASSWORD_VAR, &secured.password)
        .output()
        .unwrap();
    let described = text(&describe);
    assert!(describe.status.success(), "{described}");
    for client in [
        "source consumer",
        "transactional producer",
        "changelog writer",
        "standby consumer",
    ] {
        assert!(
            described.contains(client),
            "{client} not listed:\n{described}"
        );
    }
    assert!(described.contains("sasl.password=*****"), "{described}");

    let killed = run_and_kill_capturing(&file, &secured.password, 4);
    std::fs::write(
        &file,
        secured_pipeline(&secured, &secured.ca, names, "available_now"),
    )
    .unwrap();
    let finished = tidemark(&file, &secured.password).output().unwrap();
    let finished_text = text(&finished);
    assert!(finished.status.success(), "{finished_text}");

    let reader = secured.client_config();
    let out = consume_with(
        &reader,
        &output,
        Duration::from_secs(60),
        "read_committed",
        |o| o.len() >= expected_rows(2),
    );
    assert_exact_windows(&out, 2);
    let dead = consume_with(
        &reader,
        &format!("{group}-dlq"),
        Duration::from_secs(30),
        "read_committed",
        |o| o.len() >= 2,
    );
    assert_eq!(dead.len(), 2, "{dead:?}");

    // No channel shows the password: stdout, stderr (logs at debug and
    // progress JSON) of both runs, describe, dead-letter headers and values.
    let mut channels = vec![
        ("describe", described),
        ("killed run", killed),
        ("restarted run", finished_text),
    ];
    for (i, record) in dead.iter().chain(out.iter()).enumerate() {
        let shown = format!(
            "{:?} {}",
            record.headers,
            String::from_utf8_lossy(record.value.as_deref().unwrap_or_default())
        );
        channels.push(("record", format!("{i}: {shown}")));
    }
    for (channel, shown) in &channels {
        assert!(
            !shown.contains(&secured.password),
            "the password appears in {channel}"
        );
    }
    assert!(
        channels[1].1.contains("\"id\""),
        "the killed run's progress was captured"
    );
}

/// A pipeline on the secured listener with `password` and `ca`: how its
/// run ends, and how long it took.
fn run_refused(secured: &Secured, password: &str, ca: &str) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let names = (
        &unique("secure-refused") as &str,
        &unique("secure-in") as &str,
        &unique("secure-out") as &str,
    );
    std::fs::write(&file, secured_pipeline(secured, ca, names, "available_now")).unwrap();
    let started = Instant::now();
    let output = tidemark(&file, password).output().unwrap();
    (output, started.elapsed())
}

#[test]
fn a_wrong_password_fails_fast_naming_the_mechanism_and_the_broker() {
    let secured = Secured::from_env();
    let wrong = "not-the-password-4711";
    let (output, took) = run_refused(&secured, wrong, &secured.ca);
    let shown = text(&output);
    assert!(!output.status.success(), "{shown}");
    assert!(took < Duration::from_secs(60), "took {took:?}:\n{shown}");
    assert!(shown.contains("SCRAM-SHA-512"), "{shown}");
    assert!(shown.contains(&secured.bootstrap), "{shown}");
    assert!(
        !shown.contains(wrong),
        "the wrong password is shown:\n{shown}"
    );
}

#[test]
fn a_wrong_ca_fails_fast_naming_the_broker() {
    let secured = Secured::from_env();
    let (output, took) = run_refused(&secured, &secured.password, &secured.other_ca);
    let shown = text(&output);
    assert!(!output.status.success(), "{shown}");
    assert!(took < Duration::from_secs(60), "took {took:?}:\n{shown}");
    assert!(shown.contains(&secured.bootstrap), "{shown}");
    assert!(shown.to_lowercase().contains("certificate"), "{shown}");
    assert!(!shown.contains(&secured.password));
}
