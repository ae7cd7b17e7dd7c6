//! The fuzz targets' bodies (#44 item 11): each feeds arbitrary bytes to
//! one decoder of bytes that come from outside — a Kafka record, a landed
//! file, a state store or changelog another process wrote, the pipeline
//! file — and returns. An error is the right answer to bytes that are not
//! what the decoder reads; a panic, an abort (an allocation sized from the
//! bytes) or a hang is a defect.
//!
//! `cargo test -p tidemark-fuzz` replays `fuzz/corpus/<target>/` (the
//! crashes found so far among them) and mutates seed inputs for a few
//! seconds per target; `scripts/fuzz.sh` runs the same bodies under
//! libFuzzer, coverage-guided (`fuzz/libfuzzer/`).
#![deny(missing_docs)]

use apache_avro::Schema as AvroSchema;
use std::collections::HashMap;
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
    if let Ok(file) = tidemark::pipeline::PipelineFile::parse(text) {
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
