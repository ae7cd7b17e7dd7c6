//! Avro bytes checked against an independent implementation: Python's
//! fastavro reads what we write, and we read what fastavro writes.

use std::process::Command;
use tidemark::record::{Record, SourcePosition};
use tidemark::row::{Row, Value};
use tidemark::runtime::Decoder;
use tidemark_avro::{AvroDecoder, AvroEncoder};

const SCHEMA: &str = r#"{"type":"record","name":"Order","fields":[
  {"name":"id","type":"string"},
  {"name":"amount","type":"double"},
  {"name":"qty","type":"long"},
  {"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}},
  {"name":"note","type":["null","string"],"default":null}]}"#;

fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 (scripts/test.sh installs fastavro)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn fastavro_reads_our_confluent_framed_bytes_and_we_read_its() {
    let schema = apache_avro::Schema::parse_str(SCHEMA).unwrap();
    let encoder = AvroEncoder::new(schema.clone(), 42).unwrap();
    let row: Row = [
        ("id", Value::from("order-7")),
        ("amount", Value::Double(12.5)),
        ("qty", Value::Long(-3)),
        ("event_time", Value::Timestamp(1_767_261_600_123_000)),
        ("note", Value::from("rush")),
    ]
    .into_iter()
    .collect();
    let bytes = encoder.encode(&row).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.bin");
    std::fs::write(&ours, &bytes).unwrap();
    let read = python(
        r#"
import io, json, struct, sys, fastavro
schema = fastavro.parse_schema(json.loads(sys.argv[1]))
data = open(sys.argv[2], 'rb').read()
magic, schema_id = struct.unpack('>bI', data[:5])
rec = fastavro.schemaless_reader(io.BytesIO(data[5:]), schema)
rec['event_time'] = int(rec['event_time'].timestamp() * 1000)
print(json.dumps({'magic': magic, 'id': schema_id, 'record': rec}, sort_keys=True))
"#,
        &[SCHEMA, ours.to_str().unwrap()],
    );
    let v: serde_json::Value = serde_json::from_str(read.trim()).unwrap();
    assert_eq!(v["magic"], 0);
    assert_eq!(v["id"], 42);
    assert_eq!(v["record"]["id"], "order-7");
    assert_eq!(v["record"]["amount"], 12.5);
    assert_eq!(v["record"]["qty"], -3);
    assert_eq!(v["record"]["event_time"], 1_767_261_600_123i64);
    assert_eq!(v["record"]["note"], "rush");

    // And the other way round: fastavro writes, with a null union branch.
    let theirs = dir.path().join("theirs.bin");
    python(
        r#"
import io, json, struct, sys, datetime, fastavro
schema = fastavro.parse_schema(json.loads(sys.argv[1]))
buf = io.BytesIO()
buf.write(struct.pack('>bI', 0, 5))
fastavro.schemaless_writer(buf, schema, {'id': 'x', 'amount': 1.25, 'qty': 9,
    'event_time': datetime.datetime(2026, 1, 1, 10, 0, 0, tzinfo=datetime.timezone.utc), 'note': None})
open(sys.argv[2], 'wb').write(buf.getvalue())
"#,
        &[SCHEMA, theirs.to_str().unwrap()],
    );
    let mut decoder = AvroDecoder::new([(5, schema)].into_iter().collect(), None);
    let decoded = decoder
        .decode(&Record {
            value: Some(std::fs::read(&theirs).unwrap()),
            position: SourcePosition::new("t", 0, 0),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(decoded.get("id"), Some(&Value::from("x")));
    assert_eq!(decoded.get("qty"), Some(&Value::Long(9)));
    assert_eq!(decoded.get("note"), Some(&Value::Null));
    assert_eq!(
        decoded.get("event_time"),
        Some(&Value::Timestamp(
            tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap()
        ))
    );
}
