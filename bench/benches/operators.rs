//! Operator micro-benchmarks, in memory (no Kafka):
//!
//! - `filter/expr_10k`: `amount >= 0` evaluated over 10k decoded rows;
//! - `decode/json_10k`: `JsonDecoder` with the e2e schema over 10k records;
//!   `decode/avro_10k`: `AvroDecoder` over the same rows as Confluent Avro;
//! - `window_aggregate/tumbling_100k`: a 1-minute tumbling count + sum by id
//!   over 100k rows (`on_row` each, then `on_batch_end`), update mode;
//! - `engine_route/{rows,columns}_100k`: the engine itself (`Query::run`,
//!   in-memory source and sink) over 100k JSON records in batches of 10k,
//!   a 5-minute tumbling count + sum by id: the row route (records decoded
//!   into rows, `on_row` each) against the columnar route (decoded into
//!   Arrow columns, `on_columns` per batch);
//! - `engine_route/filter_{rows,columns}_100k`: the same after the e2e
//!   filter (`amount >= 0`, keeps 90%), on rows or on the columns;
//! - `engine_route/avro_{rows,columns}_100k`: the unfiltered pipeline over
//!   the same rows as Confluent Avro (`decode/avro_typed_10k`: the values
//!   of those records read straight for the columns, no Arrow);
//! - `engine_route/stateless_{rows,columns}_100k`: the e2e stateless
//!   pipeline (the filter, then each kept row encoded as the Kafka sink's
//!   JSON value) on rows, or on columns all the way to the sink, which
//!   writes the JSON straight from them.
//!
//! ```text
//! cargo bench -p tidemark-bench --bench operators
//! ```

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::sync::Arc;
use std::time::Duration;
use tidemark::columns_json::JsonRowWriter;
use tidemark::decode::{JsonColumnsDecoder, JsonDecoder};
use tidemark::expr::Expr;
use tidemark::operators::{
    AggregateInput, AggregateSpec, BatchContext, Operator, OutputMode, TimeColumn, WindowAggregate,
};
use tidemark::prelude::{AggregateFn, Row, WindowSpec};
use tidemark::record::{Record, SourcePosition};
use tidemark::row::Value;
use tidemark::runtime::testing::{CollectSink, VecSource};
use tidemark::runtime::{BatchOutput, Decoder, OutputPart, Query, Sink, Trigger};
use tidemark_bench::RowsOnly;
use tidemark_connectors::avro::{AvroDecoder, AvroEncoder};

const VALUE_BYTES: usize = 100;

fn records(n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            key: Some(tidemark_bench::id(i).into_bytes()),
            value: Some(tidemark_bench::payload(i, VALUE_BYTES)),
            timestamp_ms: Some(tidemark_bench::event_time(i) / 1_000),
            headers: Vec::new(),
            position: SourcePosition::new("bench", 0, i as i64),
        })
        .collect()
}

fn rows(n: u64) -> Vec<Row> {
    let mut decoder = JsonDecoder::new(tidemark_bench::schema());
    records(n)
        .iter()
        .map(|r| decoder.decode(r).expect("valid payload"))
        .collect()
}

fn filter(c: &mut Criterion) {
    let rows = rows(10_000);
    let expr = Expr::parse(tidemark_bench::FILTER).expect("valid expression");
    let mut group = c.benchmark_group("filter");
    group.throughput(Throughput::Elements(rows.len() as u64));
    group.bench_function("expr_10k", |b| {
        b.iter(|| black_box(&rows).iter().filter(|r| expr.matches(r)).count())
    });
    group.finish();
}

fn decode(c: &mut Criterion) {
    let records = records(10_000);
    let mut decoder = JsonDecoder::new(tidemark_bench::schema());
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(records.len() as u64));
    group.bench_function("json_10k", |b| {
        b.iter(|| {
            for r in black_box(&records) {
                black_box(decoder.decode(r).expect("valid payload"));
            }
        })
    });
    // Straight into Arrow columns, as the engine routes records for a
    // window aggregation.
    let mut columns = JsonColumnsDecoder::new(tidemark_bench::schema()).expect("typed schema");
    group.bench_function("json_columns_10k", |b| {
        b.iter(|| {
            for r in black_box(&records) {
                columns.append(r).expect("valid payload");
            }
            black_box(columns.finish().expect("columns"))
        })
    });
    // Confluent-framed Avro of the same rows, by `AvroDecoder`.
    let (mut avro, avro_records) = avro_records(10_000);
    group.bench_function("avro_10k", |b| {
        b.iter(|| {
            for r in black_box(&avro_records) {
                black_box(avro.decode(r).expect("valid datum"));
            }
        })
    });
    // The same rows written back: straight from the values
    // (`AvroEncoder`), and as apache-avro writes them from its value tree
    // with a writer per row (what `AvroEncoder` did before 2026-12-05).
    let avro_schema = avro_schema();
    let encoder = AvroEncoder::new(avro_schema.clone(), 7).expect("record schema");
    let encode_rows = rows(10_000);
    group.bench_function("avro_encode_10k", |b| {
        let mut out = Vec::with_capacity(64);
        b.iter(|| {
            for row in black_box(&encode_rows) {
                out.clear();
                encoder.encode_into(row, &mut out).expect("encodes");
                black_box(&out);
            }
        })
    });
    group.bench_function("avro_encode_tree_10k", |b| {
        b.iter(|| {
            for row in black_box(&encode_rows) {
                black_box(encode_through_tree(&avro_schema, row));
            }
        })
    });
    // The same records read straight into one value per column, as the
    // engine's columnar route reads them (its schema known once a record
    // of it was read).
    avro.decode(&avro_records[0]).expect("valid datum");
    let columns = avro
        .typed_schema(&avro_records[0])
        .expect("a flat record")
        .clone();
    group.bench_function("avro_typed_10k", |b| {
        b.iter(|| {
            for r in black_box(&avro_records) {
                black_box(avro.decode_typed(r, &columns).expect("valid datum"));
            }
        })
    });
    group.finish();
}

/// `n` of the e2e rows as Confluent-framed Avro (schema id 7), and a
/// decoder that knows the schema.
/// The e2e schema as an Avro record.
fn avro_schema() -> apache_avro::Schema {
    apache_avro::Schema::parse_str(
        r#"{"type": "record", "name": "event", "fields": [
            {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "id", "type": "string"},
            {"name": "amount", "type": "double"}]}"#,
    )
    .expect("valid schema")
}

/// One e2e row as apache-avro writes it: a value tree, then a writer.
fn encode_through_tree(schema: &apache_avro::Schema, row: &Row) -> Vec<u8> {
    use apache_avro::types::Value as Avro;
    let field = |name: &str| row.get(name).cloned().unwrap_or(Value::Null);
    let fields = vec![
        (
            "event_time".to_string(),
            match field("event_time") {
                Value::Timestamp(t) => Avro::TimestampMicros(t),
                _ => Avro::Null,
            },
        ),
        ("id".to_string(), Avro::String(field("id").to_string())),
        (
            "amount".to_string(),
            Avro::Double(field("amount").as_f64().unwrap_or_default()),
        ),
    ];
    let writer = apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .expect("a writer");
    writer
        .write_value_to_vec(Avro::Record(fields))
        .expect("encodes")
}

fn avro_records(n: u64) -> (AvroDecoder, Vec<Record>) {
    let schema = avro_schema();
    let encoder = AvroEncoder::new(schema.clone(), 7).expect("record schema");
    let records = rows(n)
        .iter()
        .enumerate()
        .map(|(i, row)| Record {
            value: Some(encoder.encode(row).expect("encodes")),
            position: SourcePosition::new("bench", 0, i as i64),
            ..Default::default()
        })
        .collect();
    let decoder = AvroDecoder::new([(7, schema)].into_iter().collect(), None);
    (decoder, records)
}

fn window_aggregate(c: &mut Criterion) {
    let rows = rows(100_000);
    let aggregates = vec![
        AggregateSpec::new(
            AggregateFn::built_in("count").expect("count"),
            AggregateInput::Star,
        ),
        AggregateSpec::new(
            AggregateFn::built_in("sum").expect("sum"),
            AggregateInput::Column("amount".into()),
        ),
    ];
    let window = WindowSpec::tumbling("1 minute").expect("valid window");
    let ctx = BatchContext {
        batch_id: 0,
        processing_time: tidemark_bench::START_MICROS,
        late_threshold: 0,
        watermark: 0,
        collect_late_rows: false,
        real_time: false,
    };
    let mut group = c.benchmark_group("window_aggregate");
    group.throughput(Throughput::Elements(rows.len() as u64));
    group.bench_function("tumbling_100k", |b| {
        b.iter_batched(
            || rows.clone(),
            |rows| {
                let mut op = WindowAggregate::new(
                    vec![Arc::from("id")],
                    TimeColumn::EventTime(Arc::from("event_time")),
                    window.clone(),
                    aggregates.clone(),
                    OutputMode::Update,
                );
                let mut out = Vec::new();
                for row in rows {
                    op.on_row(row, &ctx, &mut out).expect("on_row");
                }
                op.on_batch_end(&ctx, &mut out).expect("on_batch_end");
                out.len()
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// The e2e schema's JSON decoder.
fn json() -> JsonDecoder {
    JsonDecoder::new(tidemark_bench::schema())
}
/// Runs the e2e window pipeline over `batches` through the engine with
/// `decoder`, after the e2e filter when `filtered`.
fn run_engine(batches: Vec<Vec<Record>>, decoder: Box<dyn Decoder>, filtered: bool) -> usize {
    let mut query = Query::builder("engine-route")
        .event_time("event_time")
        .watermark("10 minutes")
        .expect("valid watermark");
    if filtered {
        query = query.filter(tidemark_bench::FILTER).expect("valid filter");
    }
    let query = query
        .window_aggregate(
            ["id"],
            WindowSpec::tumbling("5 minutes").expect("valid window"),
            vec![
                AggregateSpec::count(),
                AggregateSpec::of("sum", "amount").expect("sum"),
            ],
        )
        .output_mode(OutputMode::Update)
        .trigger(Trigger::AvailableNow);
    let query = query.decoder(decoder);
    let mut source = VecSource::record_batches(batches);
    let mut sink = CollectSink::default();
    query
        .build()
        .expect("valid query")
        .run(&mut source, &mut sink)
        .expect("run");
    sink.rows.len()
}

/// Encodes every output row as the Kafka sink's JSON value (from the
/// columns when it is given columns), keeping only the byte count: the
/// sink's per-record work without the broker.
#[derive(Default)]
struct JsonBytesSink {
    value: Vec<u8>,
    bytes: usize,
}

impl Sink for JsonBytesSink {
    fn describe(&self) -> String {
        "JsonBytesSink".into()
    }
    fn write(&mut self, _: u64, rows: &[Row]) -> tidemark::Result<()> {
        for row in rows {
            self.value.clear();
            serde_json::to_writer(&mut self.value, row).expect("a row encodes");
            self.bytes += self.value.len();
        }
        Ok(())
    }
    fn write_output(&mut self, batch_id: u64, output: &BatchOutput<'_>) -> tidemark::Result<()> {
        for part in output.parts() {
            match part {
                OutputPart::Rows { rows, .. } => self.write(batch_id, rows)?,
                OutputPart::Columns { batch, .. } => {
                    let writer = JsonRowWriter::new(batch)?;
                    for i in 0..batch.num_rows() {
                        self.value.clear();
                        writer.write_row(i, &mut self.value);
                        self.bytes += self.value.len();
                    }
                }
            }
        }
        Ok(())
    }
    fn commit(&mut self, _: u64) -> tidemark::Result<()> {
        Ok(())
    }
}

/// Runs the e2e stateless pipeline (filter, then the sink's JSON) over
/// `batches` with `decoder`; returns the bytes encoded.
fn run_stateless(batches: Vec<Vec<Record>>, decoder: Box<dyn Decoder>) -> usize {
    let query = Query::builder("engine-stateless")
        .filter(tidemark_bench::FILTER)
        .expect("valid filter")
        .trigger(Trigger::AvailableNow)
        .decoder(decoder);
    let mut source = VecSource::record_batches(batches);
    let mut sink = JsonBytesSink::default();
    query
        .build()
        .expect("valid query")
        .run(&mut source, &mut sink)
        .expect("run");
    sink.bytes
}

fn engine_route(c: &mut Criterion) {
    let records = records(100_000);
    let batches: Vec<Vec<Record>> = records.chunks(10_000).map(|c| c.to_vec()).collect();
    let mut group = c.benchmark_group("engine_route");
    group.throughput(Throughput::Elements(records.len() as u64));
    type Case = (&'static str, fn() -> Box<dyn Decoder>, bool);
    let cases: [Case; 4] = [
        ("rows_100k", || Box::new(RowsOnly(json())), false),
        ("columns_100k", || Box::new(json()), false),
        ("filter_rows_100k", || Box::new(RowsOnly(json())), true),
        ("filter_columns_100k", || Box::new(json()), true),
    ];
    for (name, decoder, filtered) in cases {
        group.bench_function(name, |b| {
            b.iter_batched(
                || batches.clone(),
                |batches| black_box(run_engine(batches, decoder(), filtered)),
                BatchSize::LargeInput,
            )
        });
    }
    type StatelessCase = (&'static str, fn() -> Box<dyn Decoder>);
    let stateless_cases: [StatelessCase; 2] = [
        ("stateless_rows_100k", || Box::new(RowsOnly(json()))),
        ("stateless_columns_100k", || Box::new(json())),
    ];
    let bytes: Vec<usize> = stateless_cases
        .iter()
        .map(|(_, decoder)| run_stateless(batches.clone(), decoder()))
        .collect();
    assert_eq!(bytes[0], bytes[1], "both routes encode the same bytes");
    for (name, decoder) in stateless_cases {
        group.bench_function(name, |b| {
            b.iter_batched(
                || batches.clone(),
                |batches| black_box(run_stateless(batches, decoder())),
                BatchSize::LargeInput,
            )
        });
    }
    let (_, avro) = avro_records(100_000);
    let avro_batches: Vec<Vec<Record>> = avro.chunks(10_000).map(|c| c.to_vec()).collect();
    type AvroCase = (&'static str, fn() -> Box<dyn Decoder>);
    let avro_cases: [AvroCase; 2] = [
        ("avro_rows_100k", || Box::new(RowsOnly(avro_records(0).0))),
        ("avro_columns_100k", || Box::new(avro_records(0).0)),
    ];
    for (name, decoder) in avro_cases {
        group.bench_function(name, |b| {
            b.iter_batched(
                || avro_batches.clone(),
                |batches| black_box(run_engine(batches, decoder(), false)),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group! {
    name = operators;
    config = config();
    targets = filter, decode, window_aggregate, engine_route
}
criterion_main!(operators);
