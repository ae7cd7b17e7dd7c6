//! The fuzz targets' bodies (#44 item 11): each feeds arbitrary bytes to
//! one decoder of bytes that come from outside — a Kafka record, a landed
//! file, a state store or changelog another process wrote, the pipeline
//! file — and returns. An error is the right answer to bytes that are not
//! what the decoder reads; a panic, an abort (an allocation sized from the
//! bytes) or a hang is a defect. The HTTP target sends its bytes as a raw
//! request to the interactive-query service of a query running in this
//! process (its store of a dedup and a window aggregation, behind a
//! token), through hyper's parser, the token check and every route.
//!
//! `cargo test -p tidemark-fuzz` replays `fuzz/corpus/<target>/` (the
//! crashes found so far among them) and mutates seed inputs for a few
//! seconds per target; `scripts/fuzz.sh` runs the same bodies under
//! libFuzzer, coverage-guided (`fuzz/libfuzzer/`).
#![deny(missing_docs)]

use apache_avro::Schema as AvroSchema;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tidemark::record::Record;
use tidemark::runtime::Decoder;
use tidemark::schema::{FieldType, Schema};
use tidemark_files::FileFormat;

/// A fuzz target: its name (its corpus directory) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target.
pub const TARGETS: &[Target] = &[
    ("json", json),
    ("avro", avro),
    ("csv", csv),
    ("csv_gzip", csv_gzip),
    ("parquet", parquet),
    ("pipeline_file", pipeline_file),
    ("window_state", window_state),
    ("rolling_state", rolling_state),
    ("dedup_state", dedup_state),
    ("join_state", join_state),
    ("table_join_state", table_join_state),
    ("http_request", http_request),
];

fn record(bytes: &[u8]) -> Record {
    Record {
        value: Some(bytes.to_vec()),
        ..Default::default()
    }
}

/// The typed schema the JSON and Avro targets read with.
fn typed_schema() -> Schema {
    Schema::new([
        ("id", FieldType::String),
        ("n", FieldType::Long),
        ("x", FieldType::Double),
        ("b", FieldType::Boolean),
        ("ts", FieldType::Timestamp),
    ])
}

/// A JSON record, untyped and typed, into rows and into columns.
pub fn json(bytes: &[u8]) {
    let record = record(bytes);
    let _ = tidemark::decode::JsonDecoder::default().decode(&record);
    let mut typed = tidemark::decode::JsonDecoder::new(typed_schema());
    let _ = typed.decode(&record);
    let _ = typed.decode_typed(&record, &typed_schema());
    if let Ok(mut columns) = tidemark::decode::JsonColumnsDecoder::new(typed_schema()) {
        let _ = columns.append(&record);
        let _ = columns.finish();
    }
}

/// The Avro schema of the Avro target (id 1): every kind of field.
pub const AVRO_SCHEMA: &str = r#"{"type": "record", "name": "event", "fields": [
  {"name": "id", "type": "string"},
  {"name": "n", "type": "long"},
  {"name": "i", "type": "int"},
  {"name": "x", "type": "double"},
  {"name": "f", "type": "float"},
  {"name": "b", "type": "boolean"},
  {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
  {"name": "opt", "type": ["null", "string"], "default": null},
  {"name": "tags", "type": {"type": "array", "items": "string"}},
  {"name": "m", "type": {"type": "map", "values": "long"}},
  {"name": "raw", "type": "bytes"},
  {"name": "kind", "type": {"type": "enum", "name": "kind", "symbols": ["a", "b"]}},
  {"name": "inner", "type": {"type": "record", "name": "inner", "fields": [{"name": "z", "type": "long"}]}}
]}"#;

/// A Confluent-framed Avro record (magic byte, schema id, datum) of the
/// schema [`AVRO_SCHEMA`] (id 1), no registry.
pub fn avro(bytes: &[u8]) {
    let Ok(schema) = AvroSchema::parse_str(AVRO_SCHEMA) else {
        return;
    };
    let mut decoder = tidemark_avro::AvroDecoder::new(HashMap::from([(1, schema)]), None);
    let _ = decoder.decode(&record(bytes));
}

/// A CSV file, its columns inferred.
pub fn csv(bytes: &[u8]) {
    let _ = tidemark_files::read_bytes_for_fuzzing(FileFormat::Csv, "in.csv", bytes);
}

/// A gzip file of CSV (the decompression and its size cap).
pub fn csv_gzip(bytes: &[u8]) {
    let _ = tidemark_files::read_bytes_for_fuzzing(FileFormat::Csv, "in.csv.gz", bytes);
}

/// A Parquet file.
pub fn parquet(bytes: &[u8]) {
    let _ = tidemark_files::read_bytes_for_fuzzing(FileFormat::Parquet, "in.parquet", bytes);
}

/// A pipeline file: parsed, checked, and its query built.
pub fn pipeline_file(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Ok(file) = tidemark_pipeline::PipelineFile::parse(text) {
        if let Ok(builder) = file.query_builder() {
            let _ = builder.build();
        }
    }
}

/// A window aggregation group's stored state (every built-in aggregate).
pub fn window_state(bytes: &[u8]) {
    let _ = tidemark_operators::fuzzing::window_state(bytes);
}

/// A rolling window key's stored state.
pub fn rolling_state(bytes: &[u8]) {
    let _ = tidemark_operators::fuzzing::rolling_state(bytes);
}

/// A deduplication key's stored time.
pub fn dedup_state(bytes: &[u8]) {
    let _ = tidemark_operators::fuzzing::dedup_state(bytes);
}

/// A stream–stream join's buffered row.
pub fn join_state(bytes: &[u8]) {
    let _ = tidemark_operators::fuzzing::join_state(bytes);
}

/// A stream–table join's table row.
pub fn table_join_state(bytes: &[u8]) {
    let _ = tidemark_operators::fuzzing::table_join_state(bytes);
}

/// The token of the served query.
pub const HTTP_TOKEN: &str = "fuzz-token";

/// Set by the panic hook when any thread panics: a panic in the server's
/// threads does not reach the target's caller by itself.
static PANICKED: AtomicBool = AtomicBool::new(false);

/// The address of the interactive-query service of a query running in
/// this process on a files source (started at the first call).
fn served_query() -> Option<&'static str> {
    static ADDRESS: OnceLock<Option<String>> = OnceLock::new();
    ADDRESS
        .get_or_init(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                // The served query's threads only: another target's
                // decoder may panic inside a `catch_unwind` of its own
                // (the Parquet reader) on a thread of the test harness.
                let name = std::thread::current().name().map(str::to_string);
                let served = name
                    .as_deref()
                    .is_none_or(|n| n.starts_with("tidemark") || n.starts_with("tokio"));
                if served {
                    PANICKED.store(true, Ordering::SeqCst);
                }
                previous(info);
            }));
            let dir = tempfile::tempdir().ok()?.keep();
            std::fs::create_dir_all(dir.join("in")).ok()?;
            std::fs::write(
                dir.join("in/1.jsonl"),
                "{\"ts\": \"2026-01-01T10:00:00Z\", \"id\": \"a\", \"n\": 5}\n",
            )
            .ok()?;
            let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
            let text = format!(
                "name: fuzz-http\nsource: {{kind: files, path: in, schema: {{ts: timestamp, id: string, n: long}}}}\nevent_time: ts\nwatermark: 1 minute\nsteps:\n  - dedup: {{keys: [id, n]}}\n  - window_aggregate: {{keys: [id], window: {{tumbling: 1 hour}}, aggregates: [{{fn: count, as: c}}]}}\noutput_mode: update\ntrigger: {{micro_batch: 50 milliseconds}}\nsink: {{kind: jsonl, path: out.jsonl}}\nserve: {{listen: \"127.0.0.1:{port}\", auth_token: \"{HTTP_TOKEN}\"}}\n"
            );
            let file = tidemark_pipeline::PipelineFile::parse(&text).ok()?;
            let runner = tidemark_connectors::PipelineRunner::new(file, dir);
            std::thread::spawn(move || runner.run());
            let address = format!("127.0.0.1:{port}");
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while std::net::TcpStream::connect(&address).is_err() {
                if std::time::Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Some(address)
        })
        .as_deref()
}

/// A raw HTTP request to the served query's interactive-query service;
/// its answer is read and dropped. Panics when any thread panicked.
pub fn http_request(bytes: &[u8]) {
    let _ = http_exchange(bytes);
}

/// Sends `bytes` to the served query's interactive-query service and
/// returns what it answered. Panics when any thread panicked.
pub fn http_exchange(bytes: &[u8]) -> Vec<u8> {
    let Some(address) = served_query() else {
        panic!("the served query did not start");
    };
    let mut answer = Vec::new();
    if let Ok(mut socket) = std::net::TcpStream::connect(address) {
        let _ = socket.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = socket.write_all(bytes);
        let _ = socket.shutdown(std::net::Shutdown::Write);
        let _ = socket.read_to_end(&mut answer);
    }
    assert!(
        !PANICKED.load(Ordering::SeqCst),
        "a thread of the served query panicked"
    );
    answer
}
