//! The columnar route: a task whose chain reads columns (a window
//! aggregation, after any filters, projections and computed columns,
//! which run on the columns) gets its records (JSON of a typed schema,
//! Avro of a flat record schema) decoded straight into
//! Apache Arrow columns, and the columns of a poll are handed to the chain
//! at once instead of one row per record. Each record is parsed and checked (its
//! fields, its event time) before it is appended: a bad one goes to the
//! dead-letter output, named, and the others go on. The columns of a task
//! run before any later row, marker or batch end of that task, so the
//! order the step sees is the order records arrived in.

use super::inputs::Inputs;
use super::output::{mark_task, ColumnsOutput};
use super::routed::{in_spark_range, BatchScope, RoutedBatch, MISSING_EVENT_TIME};
use super::task::Task;
use super::Decoder;
use crate::error::{Error, Result};
use crate::json_columns::JsonColumns;
use crate::json_row::Slot;
use crate::record::Record;
use crate::schema::{FieldType, Schema};
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The columns a task's records are being decoded into.
pub(super) struct TaskColumns {
    /// The topic whose schema the columns have.
    topic: Arc<str>,
    /// Where that schema lives in the decoder: a decoder may give records
    /// of one topic different schemas, and each needs its own columns.
    schema_at: usize,
    /// The schema slot of the event-time column, when the input has one.
    event_time_slot: Option<usize>,
    columns: JsonColumns,
}

/// The columns of each task in a poll, not yet handed to its chain.
#[derive(Default)]
pub(super) struct PendingColumns {
    by_partition: BTreeMap<i32, TaskColumns>,
}

impl PendingColumns {
    /// Hands the columns pending for `partition` to its task's chain.
    pub(super) fn flush(
        &mut self,
        partition: i32,
        task: &mut Task,
        scope: &BatchScope,
        routed: &mut RoutedBatch,
    ) -> Result<()> {
        let Some(pending) = self.by_partition.get_mut(&partition) else {
            return Ok(());
        };
        if pending.columns.len() == 0 {
            return Ok(());
        }
        let batch = pending.columns.finish()?;
        let contexts = routed
            .contexts
            .entry(partition)
            .or_insert_with(|| scope.contexts(task));
        let to_sink = task.push_columns(&batch, contexts, &mut routed.outputs)?;
        mark_task(&routed.outputs, &mut routed.output_tasks, partition);
        if let Some(batch) = to_sink.filter(|b| b.num_rows() > 0) {
            routed.output_columns.push(ColumnsOutput {
                before_row: routed.outputs.len(),
                partition,
                batch,
            });
        }
        Ok(())
    }

    /// Hands every task its pending columns (the end of a poll).
    pub(super) fn flush_all(
        &mut self,
        tasks: &mut BTreeMap<i32, Task>,
        scope: &BatchScope,
        routed: &mut RoutedBatch,
    ) -> Result<()> {
        let partitions: Vec<i32> = self.by_partition.keys().copied().collect();
        for partition in partitions {
            if let Some(task) = tasks.get_mut(&partition) {
                self.flush(partition, task, scope, routed)?;
            }
        }
        Ok(())
    }
}

/// What the columnar route reads of the router: the decoder (its typed
/// schemas) and the inputs (which topic is the main one, its event time).
pub(super) struct ColumnarRoute<'a> {
    /// The query's decoder.
    pub(super) decoder: &'a dyn Decoder,
    /// The query's inputs.
    pub(super) inputs: &'a Inputs,
}

impl<'a> ColumnarRoute<'a> {
    /// The columns `record` is decoded into, when it takes the columnar
    /// route: a record of the main input (not a table), decoded as JSON of
    /// a typed schema with its event time (if any) a timestamp column, and
    /// a task whose chain reads columns (`Task::reads_columns`); the router
    /// asks only without a custom event-time extractor. A record of another
    /// topic or schema than the task's pending columns takes the row route
    /// (after them: the caller hands them on first).
    pub(super) fn columns_for<'p>(
        &self,
        record: &Record,
        task: &Task,
        pending: &'p mut PendingColumns,
    ) -> Option<(&'a Schema, &'p mut TaskColumns)> {
        if !task.reads_columns() {
            return None;
        }
        // Asked per record: a decoder may refuse one before parsing it.
        let schema = self.decoder.typed_schema(record)?;
        if schema.is_empty() {
            // Types inferred per record: rows only.
            return None;
        }
        let topic = &record.position.topic;
        let schema_at = std::ptr::from_ref(schema) as usize;
        match pending.by_partition.entry(record.position.partition) {
            Entry::Occupied(columns) => {
                let same = columns.get().topic == *topic && columns.get().schema_at == schema_at;
                same.then(|| (schema, columns.into_mut()))
            }
            Entry::Vacant(slot) => {
                // What the topic is, looked up once per task and poll.
                let input = self.inputs.get(0);
                if self.inputs.input_of(topic) != 0 || input.table {
                    return None;
                }
                let event_time_slot = match &input.event_time {
                    Some(column) => Some(timestamp_slot(schema, column)?),
                    None => None,
                };
                let columns = slot.insert(TaskColumns {
                    topic: topic.clone(),
                    schema_at,
                    event_time_slot,
                    columns: JsonColumns::new(schema),
                });
                Some((schema, columns))
            }
        }
    }

    /// Parses `record` by `schema` and appends it to `columns`, or says
    /// why it is bad.
    pub(super) fn take_into_columns(
        &self,
        record: &Record,
        schema: &Schema,
        columns: &mut TaskColumns,
        task: &Task,
        scope: &BatchScope,
        routed: &mut RoutedBatch,
    ) -> Result<()> {
        routed
            .contexts
            .entry(record.position.partition)
            .or_insert_with(|| scope.contexts(task));
        let bad = |field: &str, reason: String| Error::BadRecord {
            position: record.position.clone(),
            field: field.to_string(),
            reason,
        };
        let slots = self.decoder.decode_typed(record, schema)?;
        let input = self.inputs.get(0);
        if let (Some(slot), Some(column)) = (columns.event_time_slot, &input.event_time) {
            let t = match slots.get(slot) {
                Slot::Timestamp(t) => in_spark_range(*t),
                _ => Err(MISSING_EVENT_TIME.to_string()),
            }
            .map_err(|reason| bad(column, reason))?;
            if input.watermarked {
                routed.observe_event_time(record, t);
            }
        }
        columns.columns.append(slots);
        Ok(())
    }
}

/// The slot of `column` in `schema` when it is a timestamp column (other
/// event-time types are normalised on the row path).
fn timestamp_slot(schema: &Schema, column: &str) -> Option<usize> {
    schema
        .columns()
        .iter()
        .position(|(name, ty)| name.as_ref() == column && *ty == FieldType::Timestamp)
}

#[cfg(test)]
mod tests {
    use crate::decode::JsonDecoder;
    use crate::error::Result;
    use crate::operators::{AggregateSpec, OutputMode};
    use crate::record::Record;
    use crate::row::Row;
    use crate::runtime::{Decoder, Query};
    use crate::schema::{FieldType, Schema};
    use crate::test_driver::{PipelineTestDriver, TestRun};
    use crate::window::WindowSpec;
    use proptest::prelude::*;

    /// The same decoder with the columnar route closed: the row path.
    struct RowsOnly<D>(D);

    impl<D: Decoder> Decoder for RowsOnly<D> {
        fn decode(&mut self, record: &Record) -> Result<Row> {
            self.0.decode(record)
        }
    }

    fn schema() -> Schema {
        Schema::new([
            ("event_time", FieldType::Timestamp),
            ("user", FieldType::String),
            ("amount", FieldType::Double),
            ("n", FieldType::Long),
        ])
    }

    /// One input record: good data, or one of the ways a record is bad.
    #[derive(Debug, Clone)]
    enum Input {
        Good { minute: i64, user: u8, amount: i32 },
        Malformed,
        BadField,
        NullTime,
        OutOfRange,
        NotAnObject,
    }

    impl Input {
        fn json(&self) -> String {
            match self {
                Input::Good {
                    minute,
                    user,
                    amount,
                } => {
                    let t = crate::time::format_rfc3339((1_767_261_600 + minute * 60) * 1_000_000);
                    format!(
                        r#"{{"event_time":"{t}","user":"u\u00{user:02}","amount":{amount},"n":"{minute}","x":[1]}}"#
                    )
                }
                Input::Malformed => r#"{"event_time":"#.into(),
                Input::BadField => r#"{"event_time":1767261600000,"amount":"lots"}"#.into(),
                Input::NullTime => r#"{"event_time":null,"user":"a"}"#.into(),
                Input::OutOfRange => r#"{"event_time":300000000000000,"user":"a"}"#.into(),
                Input::NotAnObject => "[1]".into(),
            }
        }
    }

    fn input() -> impl Strategy<Value = Input> {
        prop_oneof![
            8 => (0i64..90, 0u8..4, -5i32..100)
                .prop_map(|(minute, user, amount)| Input::Good { minute, user, amount }),
            1 => Just(Input::Malformed),
            1 => Just(Input::BadField),
            1 => Just(Input::NullTime),
            1 => Just(Input::OutOfRange),
            1 => Just(Input::NotAnObject),
        ]
    }

    /// A step before the window, run on the columns on the columnar route.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Filter(&'static str),
        Select(&'static [(&'static str, &'static str)]),
        WithColumn(&'static str, &'static str),
    }

    /// Filters on numbers, strings, NULLs, a timestamp against a text
    /// literal, arithmetic, a column the schema lacks; projections that
    /// reorder, rename, swap, repeat a name or read a missing column;
    /// computed columns that replace one (with another type too) or add one.
    const STEPS: &[Step] = &[
        Step::Filter("amount >= 10"),
        Step::Filter("user != 'u\u{1}' and n is not null"),
        Step::Filter("event_time >= '2026-01-01T10:30:00Z' or amount < 0"),
        Step::Filter("amount % 3 = 0"),
        Step::Filter("nope = 1 or n > 40"),
        Step::Select(&[
            ("n", "n"),
            ("user", "user"),
            ("event_time", "event_time"),
            ("amount", "amount"),
        ]),
        Step::Select(&[
            ("event_time", "event_time"),
            ("user", "user"),
            ("n", "amount"),
            ("amount", "n"),
        ]),
        Step::Select(&[
            ("event_time", "event_time"),
            ("user", "user"),
            ("nope", "amount"),
            ("n", "n"),
            ("amount", "n"),
        ]),
        Step::WithColumn("amount", "amount * 2 - n"),
        Step::WithColumn("n", "n % 7"),
        Step::WithColumn("ratio", "amount / n"),
        Step::WithColumn("user", "user = 'u\u{2}'"),
        Step::WithColumn("event_time", "nope"),
    ];

    /// `steps`, then the window aggregation `window` (with its output
    /// mode) if any, run on columns where the chain allows (`columnar`) or
    /// on rows.
    fn run(
        batches: &[Vec<(i32, Input)>],
        window: Option<(OutputMode, WindowSpec)>,
        steps: &[Step],
        columnar: bool,
    ) -> TestRun {
        let mut query = Query::builder("columnar-equivalence")
            .event_time("event_time")
            .watermark("5 minutes")
            .unwrap();
        for step in steps {
            query = match step {
                Step::Filter(condition) => query.filter(condition).unwrap(),
                Step::Select(columns) => query.select(columns),
                Step::WithColumn(name, expression) => query.with_column(name, expression).unwrap(),
            };
        }
        if let Some((mode, window)) = window {
            query = query
                .window_aggregate(
                    ["user"],
                    window,
                    vec![
                        AggregateSpec::count(),
                        AggregateSpec::of("sum", "amount").unwrap(),
                        AggregateSpec::of("max", "n").unwrap(),
                    ],
                )
                .output_mode(mode);
        }
        query = match columnar {
            true => query.decoder(JsonDecoder::new(schema())),
            false => query.decoder(RowsOnly(JsonDecoder::new(schema()))),
        };
        let mut driver = PipelineTestDriver::new(query);
        for (i, batch) in batches.iter().enumerate() {
            driver = driver.batch_at(&crate::time::format_rfc3339(i as i64 * 1_000_000));
            for (partition, input) in batch {
                driver = driver.pipe_to("input", *partition, None, &input.json());
            }
        }
        driver.run().unwrap()
    }

    /// Two schemas for one topic, chosen by a record header.
    struct TwoSchemas {
        v1: JsonDecoder,
        v2: JsonDecoder,
    }

    impl TwoSchemas {
        fn of(&self, record: &Record) -> &JsonDecoder {
            match record.headers.is_empty() {
                true => &self.v1,
                false => &self.v2,
            }
        }
    }

    impl Decoder for TwoSchemas {
        fn decode(&mut self, record: &Record) -> Result<Row> {
            match record.headers.is_empty() {
                true => self.v1.decode(record),
                false => self.v2.decode(record),
            }
        }
        fn typed_schema(&self, record: &Record) -> Option<&Schema> {
            self.of(record).typed_schema(record)
        }
        fn decode_typed<'r>(
            &self,
            record: &'r Record,
            schema: &Schema,
        ) -> Result<crate::decode::TypedSlots<'r>> {
            self.of(record).decode_typed(record, schema)
        }
    }

    /// A decoder that gives a typed schema but cannot decode into it.
    struct SchemaOnly(JsonDecoder);

    impl Decoder for SchemaOnly {
        fn decode(&mut self, record: &Record) -> Result<Row> {
            self.0.decode(record)
        }
        fn typed_schema(&self, record: &Record) -> Option<&Schema> {
            self.0.typed_schema(record)
        }
    }

    /// Such a decoder fails the query as misconfigured, naming the record,
    /// instead of failing every batch as if the infrastructure did.
    #[test]
    fn a_typed_schema_without_decode_typed_is_a_configuration_error() {
        use crate::runtime::testing::{CollectSink, VecSource};
        use crate::runtime::Trigger;
        let record = Record {
            value: Some(
                br#"{"event_time":"2026-01-01T00:00:00Z","user":"u","amount":1,"n":2}"#.to_vec(),
            ),
            position: crate::record::SourcePosition::new("in", 0, 5),
            ..Default::default()
        };
        let query = Query::builder("schema-only")
            .event_time("event_time")
            .decoder(SchemaOnly(JsonDecoder::new(schema())))
            .window_aggregate(
                ["user"],
                WindowSpec::tumbling("10 minutes").unwrap(),
                vec![AggregateSpec::count()],
            )
            .output_mode(OutputMode::Update)
            .trigger(Trigger::AvailableNow)
            .build()
            .unwrap();
        let error = query
            .run(
                &mut VecSource::record_batches(vec![vec![record]]),
                &mut CollectSink::default(),
            )
            .expect_err("no way to decode into columns");
        assert!(
            matches!(error, crate::error::Error::Config { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("in/0@5"), "{error}");
    }

    fn run_two_schemas(records: Vec<Record>, columnar: bool) -> Vec<Row> {
        use crate::runtime::testing::{CollectSink, VecSource};
        use crate::runtime::Trigger;
        let decoder = TwoSchemas {
            v1: JsonDecoder::new(schema()),
            v2: JsonDecoder::new(Schema::new([
                ("user", FieldType::String),
                ("event_time", FieldType::Timestamp),
            ])),
        };
        let query = Query::builder("two-schemas")
            .event_time("event_time")
            .window_aggregate(
                ["user"],
                WindowSpec::tumbling("10 minutes").unwrap(),
                vec![
                    AggregateSpec::count(),
                    AggregateSpec::of("sum", "amount").unwrap(),
                ],
            )
            .output_mode(OutputMode::Update)
            .trigger(Trigger::AvailableNow);
        let query = match columnar {
            true => query.decoder(decoder),
            false => query.decoder(RowsOnly(decoder)),
        };
        let mut sink = CollectSink::default();
        query
            .build()
            .unwrap()
            .run(&mut VecSource::record_batches(vec![records]), &mut sink)
            .unwrap();
        sink.rows
    }

    #[test]
    fn records_of_one_topic_with_two_schemas_get_columns_of_their_own() {
        let records: Vec<Record> = (0..6)
            .map(|i| {
                let t = crate::time::format_rfc3339(1_767_261_600_000_000 + i * 1_000_000);
                let v2 = i % 3 == 1;
                let value = match v2 {
                    true => format!(r#"{{"user":"u{}","event_time":"{t}"}}"#, i % 2),
                    false => format!(r#"{{"event_time":"{t}","user":"u{}","amount":{i}}}"#, i % 2),
                };
                Record {
                    value: Some(value.into_bytes()),
                    headers: match v2 {
                        true => vec![("v".into(), b"2".to_vec())],
                        false => Vec::new(),
                    },
                    position: crate::record::SourcePosition::new("input", 0, i),
                    ..Default::default()
                }
            })
            .collect();
        let columns = run_two_schemas(records.clone(), true);
        assert_eq!(columns, run_two_schemas(records, false));
        assert_eq!(columns.len(), 2, "{columns:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Records decoded into columns for the window aggregation (and
        /// filtered, projected and computed as columns before it) give the rows, late rows, dead
        /// letters and progress of the row path.
        #[test]
        fn the_columnar_route_gives_what_the_row_route_gives(
            batches in prop::collection::vec(
                prop::collection::vec((0i32..3, input()), 0..25), 1..5),
            mode in prop_oneof![Just(OutputMode::Update), Just(OutputMode::Append)],
            session in any::<bool>(),
            steps in prop::collection::vec(prop::sample::select(STEPS), 0..3),
        ) {
            // Spark allows no update mode for session windows.
            let (window, mode) = match session {
                true => (WindowSpec::session("7 minutes").unwrap(), OutputMode::Append),
                false => (WindowSpec::tumbling("10 minutes").unwrap(), mode),
            };
            let columns = run(&batches, Some((mode, window.clone())), &steps, true);
            let rows = run(&batches, Some((mode, window)), &steps, false);
            prop_assert_eq!(&columns.output, &rows.output);
            prop_assert_eq!(&columns.late_rows, &rows.late_rows);
            let dead = |r: &TestRun| -> Vec<(String, String)> {
                r.dead_letters.iter().map(|(rec, e)| (rec.position.to_string(), e.clone())).collect()
            };
            prop_assert_eq!(dead(&columns), dead(&rows));
            let progress = |r: &TestRun| -> Vec<String> {
                r.progress.iter().map(|p| format!(
                    "{} {} {:?} {:?} {:?}", p.batch_id, p.num_input_rows, p.event_time,
                    p.stream_watermarks,
                    p.state_operators.iter().map(|s| (s.num_rows_total, s.num_rows_updated,
                        s.num_rows_dropped_by_watermark)).collect::<Vec<_>>()
                )).collect()
            };
            prop_assert_eq!(progress(&columns), progress(&rows));
        }

        /// Filters, projections and computed columns alone run on the
        /// columns to the sink, which gets the rows the row path gives:
        /// in the same order within a partition (one partition here), and
        /// the same rows whatever the partitions (whose outputs may
        /// interleave differently), with the same dead letters and counts.
        #[test]
        fn a_chain_of_column_steps_gives_the_sink_what_the_row_route_gives(
            batches in prop::collection::vec(
                prop::collection::vec((0i32..3, input()), 0..25), 1..5),
            steps in prop::collection::vec(prop::sample::select(STEPS), 0..4),
        ) {
            let one_partition: Vec<Vec<(i32, Input)>> = batches
                .iter()
                .map(|b| b.iter().map(|(_, input)| (0, input.clone())).collect())
                .collect();
            let columns = run(&one_partition, None, &steps, true);
            let rows = run(&one_partition, None, &steps, false);
            prop_assert_eq!(&columns.output, &rows.output);
            // Several partitions, each record's user its partition (and no
            // step rewriting the user): each partition's rows in order.
            let marked: Vec<Vec<(i32, Input)>> = batches
                .iter()
                .map(|b| b.iter().map(|(partition, input)| match input {
                    Input::Good { minute, amount, .. } => (*partition, Input::Good {
                        minute: *minute, user: *partition as u8, amount: *amount,
                    }),
                    other => (*partition, other.clone()),
                }).collect())
                .collect();
            let steps: Vec<Step> = steps
                .into_iter()
                .filter(|step| !matches!(step, Step::WithColumn("user", _)))
                .collect();
            type PerPartition = std::collections::BTreeMap<String, Vec<String>>;
            let per_partition = |r: &TestRun| -> PerPartition {
                let mut out = PerPartition::new();
                for json in r.output_json() {
                    out.entry(json["user"].to_string()).or_default().push(json.to_string());
                }
                out
            };
            let columns = run(&marked, None, &steps, true);
            let rows = run(&marked, None, &steps, false);
            prop_assert_eq!(per_partition(&columns), per_partition(&rows));
            let dead = |r: &TestRun| -> Vec<(String, String)> {
                r.dead_letters.iter().map(|(rec, e)| (rec.position.to_string(), e.clone())).collect()
            };
            prop_assert_eq!(dead(&columns), dead(&rows));
            let counts = |r: &TestRun| -> Vec<(u64, u64, u64)> {
                r.progress.iter().map(|p| (p.batch_id, p.num_input_rows, p.sink.num_output_rows)).collect()
            };
            prop_assert_eq!(counts(&columns), counts(&rows));
        }
    }
}
