//! Building a query: its steps, inputs, watermarks and checks.

use super::query::{default_query_id, Query, StopHandle};
use super::stages::{Grouping, Step, StepShape};
use super::{Clock, DeadLetter, Decoder, Sink, Trigger};
use crate::error::{Error, Result};
use crate::operators::{Operator, OutputMode};
use crate::progress::ProgressListener;
use crate::row::Row;
use crate::time::TimestampMicros;
use crate::watermark::WatermarkPolicy;
use std::sync::Arc;
use std::time::Duration;

/// Why a union beside a join (or a table, or an initial state) is refused.
const UNION_BESIDE_JOIN: &str = "a union and a join in one pipeline are not supported yet: write the union's output to a topic and join it in a second pipeline";

/// Builds one operator for one task; every task gets its own instances.
pub type OperatorFactory = Arc<dyn Fn(OutputMode) -> Box<dyn Operator> + Send + Sync>;

/// Builds a [`Query`].
///
/// ```
/// use tidemark::prelude::*;
/// use tidemark::runtime::testing::{CollectSink, VecSource};
///
/// let query = Query::builder("demo")
///     .event_time("event_time")
///     .watermark("10 minutes").unwrap()
///     .filter("amount >= 0").unwrap()
///     .window_aggregate(["id"], WindowSpec::tumbling("5 minutes").unwrap(), vec![
///         AggregateSpec::count(),
///     ])
///     .output_mode(OutputMode::Update)
///     .trigger(Trigger::AvailableNow)
///     .build()
///     .unwrap();
/// let mut source = VecSource::json_batches(vec![vec![
///     r#"{"event_time": "2026-01-01T10:01:00Z", "id": "a", "amount": 1}"#,
/// ]]);
/// let mut sink = CollectSink::default();
/// query.run(&mut source, &mut sink).unwrap();
/// assert_eq!(sink.rows[0].get("count"), Some(&Value::Long(1)));
/// ```
pub struct QueryBuilder {
    pub(super) name: String,
    pub(super) id: Option<String>,
    pub(super) event_time: Option<Arc<str>>,
    pub(super) watermark: Option<Duration>,
    pub(super) policy: WatermarkPolicy,
    pub(super) scope: crate::watermark::WatermarkScope,
    pub(super) idle_timeout: Option<Duration>,
    pub(super) steps: Vec<Step>,
    /// The columns the main input's records are partitioned by (its
    /// record key), when known.
    pub(super) keyed_by: Option<Vec<String>>,
    /// Repartition a stream join's inputs even when their record keys are
    /// the join keys (their topics are not co-partitioned).
    pub(super) repartition_joins: bool,
    /// The second streams of joins.
    pub(super) side_inputs: Vec<SideInput>,
    /// Global tables: their shared rows, key columns and feeds.
    pub(super) global_tables: Vec<GlobalTable>,
    /// The name of the main stream, in progress reports of joins.
    pub(super) main_stream: Arc<str>,
    /// The main stream's declared columns (a right outer join's nulls).
    pub(super) main_columns: Vec<Arc<str>>,
    pub(super) output_mode: OutputMode,
    pub(super) trigger: Trigger,
    pub(super) clock: Clock,
    pub(super) max_records_per_batch: usize,
    pub(super) decoder: Option<Box<dyn Decoder>>,
    pub(super) dead_letter: Option<Box<dyn DeadLetter>>,
    pub(super) late_data: Option<Box<dyn Sink>>,
    pub(super) state_backend: Option<Box<dyn super::StateBackend>>,
    pub(super) event_time_extractor: Option<EventTimeExtractor>,
    pub(super) listeners: Vec<Box<dyn ProgressListener>>,
    pub(super) watermark_from_markers: bool,
    /// A repartition writer under the query scope: its markers carry, for
    /// each of its partitions, the stream's largest event time as far as
    /// its task may count it (see `markers`), not the partition's own.
    pub(super) forwards_stream_maxima: bool,
    /// Behind a repartition, the streams whose progress the markers carry
    /// by origin topic: a union's inputs, each with its own watermark.
    pub(super) marker_streams: Vec<MarkerStream>,
    /// Shares partitions' progress with the query's other instances
    /// (`watermark_scope: query`).
    pub(super) watermark_exchange: Option<Box<dyn super::WatermarkExchange>>,
    /// Where interactive queries' requests reach the running query.
    pub(super) state_service: Option<super::StateService>,
}

/// A stream whose progress reaches a repartition reader in markers, by the
/// topics its origins name (`topic/partition`).
#[derive(Debug, Clone)]
pub(crate) struct MarkerStream {
    /// Its topics.
    pub(super) topics: Vec<String>,
    /// Its name in `streamWatermarks`.
    pub(super) stream: Arc<str>,
    /// Its own watermark delay (microseconds); `None`: it has no
    /// watermark and takes no part in the query's (Spark).
    pub(super) delay: Option<i64>,
}

/// Computes a row's event time (microseconds) when no column holds it.
pub type EventTimeExtractor = Arc<dyn Fn(&Row) -> Option<TimestampMicros> + Send + Sync>;

/// The second stream of a join: its topics, event-time column, watermark
/// and the stateless steps its rows go through before the join.
#[derive(Clone)]
pub struct JoinInput {
    pub(super) name: Arc<str>,
    /// A table (compacted topic) for a stream–table join, not a stream.
    pub(super) table: bool,
    pub(super) topics: Vec<String>,
    pub(super) event_time: Option<Arc<str>>,
    pub(super) watermark: Option<Duration>,
    pub(super) steps: Vec<OperatorFactory>,
    /// What each of `steps` does to the columns (a union lines rows up by
    /// the columns its streams end with).
    pub(super) step_shapes: Vec<StepShape>,
    pub(super) columns: Vec<Arc<str>>,
    /// Its columns' types, when given: the connectors decode its records
    /// by them.
    pub(super) schema: crate::schema::Schema,
    /// The columns its records are keyed by, when known.
    pub(super) keyed_by: Option<Vec<String>>,
}

impl JoinInput {
    /// The stream `name`, read from the topic of that name (for the files
    /// source: the sub-directory of that name).
    pub fn new(name: &str) -> Self {
        JoinInput {
            name: Arc::from(name),
            table: false,
            topics: vec![name.to_string()],
            event_time: None,
            watermark: None,
            steps: Vec::new(),
            step_shapes: Vec::new(),
            columns: Vec::new(),
            schema: crate::schema::Schema::default(),
            keyed_by: None,
        }
    }

    /// The table `name` for [`QueryBuilder::join_table`]: a compacted
    /// topic of that name (latest row per key, tombstones delete). A table
    /// has no event time and no watermark.
    pub fn table(name: &str) -> Self {
        JoinInput {
            table: true,
            ..JoinInput::new(name)
        }
    }

    /// Reads the stream from these topics instead (co-partitioned with the
    /// main stream's).
    pub fn topics<S: AsRef<str>>(mut self, topics: &[S]) -> Self {
        self.topics = topics.iter().map(|t| t.as_ref().to_string()).collect();
        self
    }

    /// The columns the stream's records are keyed by (partitioned on):
    /// a join on other columns repartitions the stream.
    pub fn keyed_by<S: AsRef<str>>(mut self, columns: &[S]) -> Self {
        self.keyed_by = Some(columns.iter().map(|c| c.as_ref().to_string()).collect());
        self
    }

    /// The stream's event-time column.
    pub fn event_time(mut self, column: &str) -> Self {
        self.event_time = Some(Arc::from(column));
        self
    }

    /// The stream's own watermark delay, as a Spark duration string.
    pub fn watermark(mut self, delay: &str) -> Result<Self> {
        let d = crate::duration::parse_duration(delay)
            .map_err(|e| Error::config("join.watermark", e.to_string()))?;
        self.watermark = Some(d);
        Ok(self)
    }

    /// The stream's columns, when known: a left outer row writes them as
    /// nulls (otherwise the columns of the rows seen so far are). Their
    /// types are then inferred: it replaces a [`schema`](Self::schema).
    pub fn columns<S: AsRef<str>>(mut self, columns: &[S]) -> Self {
        self.columns = columns.iter().map(|c| Arc::from(c.as_ref())).collect();
        self.schema = crate::schema::Schema::default();
        self
    }

    /// The stream's columns and their types: where the pipeline wiring
    /// connects the query (`PipelineRunner`, `KafkaApp`), its records are
    /// decoded by them (a value of another type is a dead letter); a left
    /// outer row writes them as nulls. Sets the columns
    /// [`columns`](Self::columns) would.
    pub fn schema(mut self, schema: crate::schema::Schema) -> Self {
        self.columns = schema.fields().map(|(name, _)| Arc::from(name)).collect();
        self.schema = schema;
        self
    }

    /// Keeps the stream's rows for which `condition` is true.
    pub fn filter(mut self, condition: &str) -> Result<Self> {
        crate::operators::Filter::new(condition)?;
        let condition = condition.to_string();
        self.steps.push(Arc::new(move |_| {
            Box::new(crate::operators::Filter::new(&condition).expect("validated"))
        }));
        self.step_shapes.push(StepShape::Keeps);
        Ok(self)
    }

    /// Keeps `(column, output name)` pairs of the stream's rows.
    pub fn select<S: AsRef<str>>(mut self, columns: &[(S, S)]) -> Self {
        let cols: Vec<(String, String)> = columns
            .iter()
            .map(|(a, b)| (a.as_ref().to_string(), b.as_ref().to_string()))
            .collect();
        self.step_shapes.push(StepShape::Selects(cols.clone()));
        self.steps.push(Arc::new(move |_| {
            Box::new(crate::operators::Select::new(cols.clone()))
        }));
        self
    }

    /// Adds a computed column to the stream's rows.
    pub fn with_column(mut self, name: &str, expression: &str) -> Result<Self> {
        crate::operators::WithColumn::new(name, expression)?;
        let (n, e) = (name.to_string(), expression.to_string());
        self.step_shapes.push(StepShape::Writes(n.clone()));
        self.steps.push(Arc::new(move |_| {
            Box::new(crate::operators::WithColumn::new(&n, &e).expect("validated"))
        }));
        Ok(self)
    }
}

/// The settings of a join of the stream with `table` on `on`.
fn table_join_spec(
    table: &JoinInput,
    keep_unmatched: bool,
    on: &[(&str, &str)],
) -> crate::operators::TableJoinSpec {
    crate::operators::TableJoinSpec {
        keep_unmatched,
        stream_keys: on.iter().map(|(l, _)| Arc::from(*l)).collect(),
        table_keys: on.iter().map(|(_, r)| Arc::from(*r)).collect(),
        table_name: table.name.clone(),
        table_columns: table.columns.clone(),
    }
}

/// A global table of the query.
pub(crate) struct GlobalTable {
    pub(super) name: Arc<str>,
    /// The topic it reads and its columns' types.
    pub(super) input: SecondInput,
    pub(super) keys: Vec<Arc<str>>,
    pub(super) rows: crate::operators::SharedTable,
    pub(super) feed: Option<Box<dyn super::TableFeed>>,
    /// The index of its join among the steps.
    pub(super) step: usize,
}

impl GlobalTable {
    /// Reads what the feed has and applies it: an upsert per record, a
    /// delete per tombstone (by record key). Bad records go to `dead_letter`.
    pub(super) fn catch_up(
        &mut self,
        decoder: &mut dyn Decoder,
        dead_letter: &mut dyn DeadLetter,
    ) -> Result<u64> {
        let Some(feed) = self.feed.as_mut() else {
            return Err(Error::config(
                "table_join.global",
                format!("the global table `{}` has no feed", self.name),
            ));
        };
        let records = feed.catch_up()?;
        let mut bad = 0;
        let mut rows = self.rows.write().unwrap_or_else(|p| p.into_inner());
        for record in &records {
            let applied = match (&record.value, &record.key) {
                (None, Some(key)) => match std::str::from_utf8(key) {
                    Ok(key) => {
                        rows.remove(key);
                        Ok(())
                    }
                    Err(_) => Err("a tombstone whose key is not UTF-8 text".to_string()),
                },
                (None, None) => Err("a tombstone without a key deletes nothing".to_string()),
                (Some(_), _) => match decoder.decode(record) {
                    Ok(row) => match crate::operators::table_record_key(&row, &self.keys) {
                        Some(key) => {
                            rows.insert(key, row);
                            Ok(())
                        }
                        None => Err(format!("the key columns {:?} are missing", self.keys)),
                    },
                    Err(e) if e.is_bad_data() => Err(e.to_string()),
                    // A registry outage is not the record's fault.
                    Err(e) => return Err(e),
                },
            };
            if let Err(reason) = applied {
                bad += 1;
                let error = Error::BadRecord {
                    position: record.position.clone(),
                    field: "<table>".into(),
                    reason,
                };
                dead_letter.send_between_batches(record, &error)?;
            }
        }
        Ok(bad)
    }
}

/// What a second input is to the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecondInputKind {
    /// A stream-stream join's second stream.
    StreamJoin {
        /// A right or full outer join: its unmatched right rows have null
        /// left keys.
        outer_right: bool,
    },
    /// A co-partitioned table (Kafka Streams' `KTable`) joined.
    Table,
    /// A stateful processor's initial state (Spark's `initialState`).
    InitialState,
    /// A union's second stream.
    Union,
    /// A global table: every partition of its topic in every task.
    GlobalTable,
}

/// A second input the query reads beside its main stream: what the
/// connectors subscribe to, decode and feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecondInput {
    /// Its name (in progress reports, and a joined stream's columns).
    pub name: String,
    /// The topics it reads (for the files source: the sub-directory).
    pub topics: Vec<String>,
    /// Its columns' types (empty: every JSON field, types inferred).
    pub schema: crate::schema::Schema,
    /// What it is to the query.
    pub kind: SecondInputKind,
}

impl SecondInput {
    fn of(input: &JoinInput, kind: SecondInputKind) -> SecondInput {
        SecondInput {
            name: input.name.to_string(),
            topics: input.topics.clone(),
            schema: input.schema.clone(),
            kind,
        }
    }
}

/// A join's second stream within the query.
pub(crate) struct SideInput {
    /// The input index its records are routed by.
    pub(super) input: usize,
    /// The index of its join in the steps.
    pub(super) join_at: usize,
    pub(super) stream: JoinInput,
    /// The join's key columns on the main side.
    pub(super) left_keys: Vec<String>,
    /// The join's key columns on this side.
    pub(super) right_keys: Vec<String>,
    /// A join's stream, a table, an initial state or a union's stream.
    pub(super) kind: SecondInputKind,
}

impl SideInput {
    /// A union's second stream rather than a join's.
    pub(super) fn is_union(&self) -> bool {
        self.kind == SecondInputKind::Union
    }

    /// The column sets that partition the rows after this input's join,
    /// each with the step it holds from. A join's left keys do, except for
    /// the right rows of a right or full outer join that found no match:
    /// their left keys are null, and a key named differently on the right
    /// (written as itself, or `<stream>_<name>` when the left has that name
    /// too) is what still partitions them — a grouping must then include
    /// it as well. An initial state or a union partitions nothing.
    fn partitionings(&self) -> Vec<(Vec<String>, usize)> {
        let after = self.join_at + 1;
        let left = self.left_keys.clone();
        match self.kind {
            SecondInputKind::StreamJoin { outer_right: true } => {
                let renamed: Vec<&String> = self
                    .left_keys
                    .iter()
                    .zip(&self.right_keys)
                    .filter(|(l, r)| l != r)
                    .map(|(_, r)| r)
                    .collect();
                if renamed.is_empty() {
                    return vec![(left, after)];
                }
                let stream = &self.stream.name;
                let with = |name: &dyn Fn(&str) -> String| {
                    let mut columns = left.clone();
                    columns.extend(renamed.iter().map(|r| name(r)));
                    (columns, after)
                };
                vec![
                    with(&|right| right.to_string()),
                    with(&|right| format!("{stream}_{right}")),
                ]
            }
            SecondInputKind::StreamJoin { .. } | SecondInputKind::Table => vec![(left, after)],
            _ => Vec::new(),
        }
    }
}

impl Query {
    /// Starts building a query named `name`.
    pub fn builder(name: &str) -> QueryBuilder {
        QueryBuilder {
            name: name.to_string(),
            id: None,
            event_time: None,
            watermark: None,
            policy: WatermarkPolicy::Min,
            scope: Default::default(),
            idle_timeout: None,
            steps: Vec::new(),
            keyed_by: None,
            repartition_joins: false,
            side_inputs: Vec::new(),
            global_tables: Vec::new(),
            main_stream: Arc::from("main"),
            main_columns: Vec::new(),
            output_mode: OutputMode::Append,
            trigger: Trigger::default(),
            clock: Clock::System,
            max_records_per_batch: 100_000,
            decoder: None,
            dead_letter: None,
            late_data: None,
            state_backend: None,
            event_time_extractor: None,
            listeners: Vec::new(),
            watermark_from_markers: false,
            forwards_stream_maxima: false,
            marker_streams: Vec::new(),
            watermark_exchange: None,
            state_service: None,
        }
    }
}

impl QueryBuilder {
    /// A stable id (default: derived from the name), Spark's `id`.
    pub fn id(mut self, id: &str) -> Self {
        self.id = Some(id.to_string());
        self
    }

    /// The event-time column (a timestamp; RFC 3339 or epoch ms on input).
    pub fn event_time(mut self, column: &str) -> Self {
        self.event_time = Some(Arc::from(column));
        self
    }

    /// The event time computed by `extractor` (microseconds since the
    /// epoch) and stored in `column`, which then serves as the event-time
    /// column. A row for which it returns `None` is a bad record.
    pub fn event_time_from(
        mut self,
        column: &str,
        extractor: impl Fn(&Row) -> Option<TimestampMicros> + Send + Sync + 'static,
    ) -> Self {
        self.event_time = Some(Arc::from(column));
        self.event_time_extractor = Some(Arc::new(extractor));
        self
    }

    /// Rows dropped as late by every window they belong to go to this sink
    /// (Flink's late-data side output), written and committed with each
    /// batch.
    pub fn late_data(mut self, sink: impl Sink + 'static) -> Self {
        self.late_data = Some(Box::new(sink));
        self
    }

    /// Keeps stateful operators' state in stores from `backend` (RocksDB
    /// with Kafka changelogs in production), checkpointed after every batch
    /// and restored when a task starts. Without one, state lives in memory.
    pub fn state_backend(mut self, backend: impl super::StateBackend + 'static) -> Self {
        self.state_backend = Some(Box::new(backend));
        self
    }

    /// The watermark delay, as a Spark duration string.
    pub fn watermark(mut self, delay: &str) -> Result<Self> {
        let d = crate::duration::parse_duration(delay)
            .map_err(|e| Error::config("watermark", e.to_string()))?;
        self.watermark = Some(d);
        Ok(self)
    }

    /// Takes the watermark from [`super::WatermarkMarker`] records instead of
    /// from rows: the reading side of a repartition topic, whose rows come
    /// from many input partitions interleaved.
    pub fn watermark_from_markers(mut self) -> Self {
        self.watermark_from_markers = true;
        self
    }

    /// How inputs' watermarks combine (`min` default, `max`).
    pub fn watermark_policy(mut self, policy: WatermarkPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Over which inputs each stream's watermark is taken: Spark's one per
    /// stream over every partition the query reads (default; the source
    /// then plans batches by offsets, see [`super::BatchRequest::plan_offsets`]),
    /// or one per input partition (see [`crate::watermark::WatermarkScope`]).
    pub fn watermark_scope(mut self, scope: crate::watermark::WatermarkScope) -> Self {
        self.scope = scope;
        self
    }

    /// Shares the input partitions' progress with the query's other
    /// instances through `exchange`, so that under
    /// [`WatermarkScope::Query`](crate::watermark::WatermarkScope) each
    /// instance's watermark counts every partition, not only its own.
    pub fn watermark_exchange(mut self, exchange: impl super::WatermarkExchange + 'static) -> Self {
        self.watermark_exchange = Some(Box::new(exchange));
        self
    }

    /// Whether this is a repartition writer under the query scope, whose
    /// markers carry its stream's maximum as far as it has read (see
    /// [`super::WatermarkMarker`]): with several instances it needs a
    /// [`QueryBuilder::watermark_exchange`] to count the others' progress.
    pub fn forwards_stream_maxima(&self) -> bool {
        self.forwards_stream_maxima
    }

    /// Answers interactive queries through `service`: readers made from it
    /// ([`super::StateService::reader`]) read this query's state while it
    /// runs, and keep working when a supervisor rebuilds the query with
    /// the same service. Without one, [`Query::stores`] gives a reader.
    pub fn state_service(mut self, service: &super::StateService) -> Self {
        self.state_service = Some(service.clone());
        self
    }

    /// The columns the main input's records are keyed by (Kafka: the record
    /// key the producer partitioned on). A grouping that includes them runs
    /// where the records arrive; any other grouping is repartitioned (see
    /// [`QueryBuilder::into_topology`]). Unset: every grouping is.
    pub fn keyed_by<S: AsRef<str>>(mut self, columns: &[S]) -> Self {
        self.keyed_by = Some(columns.iter().map(|c| c.as_ref().to_string()).collect());
        self
    }

    /// Repartitions a stream join's two inputs by the join keys even when
    /// each is keyed by them: their topics have different partition counts.
    pub fn repartition_joins(mut self) -> Self {
        self.repartition_joins = true;
        self
    }

    /// The query's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The inputs read beside the main stream, in step order: joined
    /// streams and tables, initial states, unions' streams, global tables.
    pub fn second_inputs(&self) -> Vec<SecondInput> {
        let mut inputs: Vec<(usize, SecondInput)> = self
            .side_inputs
            .iter()
            .map(|s| (s.join_at, SecondInput::of(&s.stream, s.kind)))
            .collect();
        inputs.extend(self.global_tables.iter().map(|t| (t.step, t.input.clone())));
        inputs.sort_by_key(|(at, _)| *at);
        inputs.into_iter().map(|(_, input)| input).collect()
    }

    /// The columns of the last windowed or rolling grouping: a window
    /// aggregation's keys plus `window_start` and `window_end`, a rolling
    /// window's partition columns — what identifies an output row in update
    /// mode. Empty without such a grouping.
    pub fn output_keys(&self) -> Vec<String> {
        self.steps
            .iter()
            .rev()
            .find_map(|s| match &s.shape {
                StepShape::Groups {
                    keys,
                    kind: Grouping::Aggregation | Grouping::SessionAggregation,
                } => {
                    let mut keys = keys.clone();
                    keys.extend(["window_start".to_string(), "window_end".to_string()]);
                    Some(keys)
                }
                StepShape::Groups {
                    keys,
                    kind: Grouping::Rolling,
                } => Some(keys.clone()),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// Refuses joins whose groupings would spread a key's rows over
    /// tasks: a query that joins runs each task on one partition number of
    /// every topic, so on a `partitioned_source` (Kafka) each grouping after
    /// the first join must include the join's keys, or the record key's
    /// columns ([`keyed_by`](Self::keyed_by)) from the start. Also refuses
    /// a union beside a join, and two stream joins.
    pub fn check_join_partitioning(&self, partitioned_source: bool) -> Result<()> {
        let joined: Vec<&SideInput> = self.side_inputs.iter().filter(|s| !s.is_union()).collect();
        if joined.len() < self.side_inputs.len() && !joined.is_empty() {
            return Err(Error::config("steps", UNION_BESIDE_JOIN));
        }
        let stream_joins = joined
            .iter()
            .filter(|s| matches!(s.kind, SecondInputKind::StreamJoin { .. }))
            .count();
        if stream_joins > 1 {
            return Err(Error::config(
                "steps",
                "one stream-stream join per pipeline: chain a second join in a second pipeline",
            ));
        }
        if joined.is_empty() || !partitioned_source {
            return Ok(());
        }
        // Each partitioning, with the step it holds from: a join's keys
        // after that join, the record key from the start.
        let mut allowed: Vec<(Vec<String>, usize)> =
            joined.iter().flat_map(|s| s.partitionings()).collect();
        allowed.extend(self.keyed_by.clone().map(|k| (k, 0)));
        for (at, step) in self.steps.iter().enumerate() {
            let StepShape::Groups { keys, .. } = &step.shape else {
                continue;
            };
            let partitioned = |(columns, from): &(Vec<String>, usize)| {
                let shapes = self.steps[(*from).min(at)..at].iter().map(|s| &s.shape);
                super::stages::partition_columns_after(columns, shapes)
                    .is_some_and(|p| super::stages::groups_stay_in_partition(keys, &p))
            };
            if allowed.iter().any(partitioned) {
                continue;
            }
            let Some((join_keys, _)) = allowed.first() else {
                return Err(Error::config(
                    "source.keyed_by",
                    format!(
                        "a grouping by {keys:?} beside a table or an initial state runs where the records are: name the record key's columns, which the grouping must include"
                    ),
                ));
            };
            return Err(Error::config(
                "steps",
                format!(
                    "a grouping in a pipeline with a join (or a table, or an initial state) must include the join keys or the record key's columns (`source.keyed_by`), {join_keys:?}: each task holds one partition of the co-partitioned topics, and grouping by {keys:?} would need a repartition, which joins do not support yet"
                ),
            ));
        }
        Ok(())
    }

    /// The main stream's join keys of its stream-stream join, if any.
    pub fn stream_join_keys(&self) -> Option<Vec<String>> {
        self.side_inputs
            .iter()
            .find(|s| matches!(s.kind, SecondInputKind::StreamJoin { .. }))
            .map(|s| s.left_keys.clone())
    }

    /// The topics of the joined streams and tables, by stream name.
    pub fn joined_topics(&self) -> Vec<(String, Vec<String>)> {
        self.side_inputs
            .iter()
            .map(|s| (s.stream.name.to_string(), s.stream.topics.clone()))
            .collect()
    }

    /// Counts the groupings of a kind.
    fn count_groupings(&self, kind: impl Fn(Grouping) -> bool) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s.shape, StepShape::Groups { kind: k, .. } if kind(k)))
            .count()
    }

    /// Whether the query's inputs must be co-partitioned (task `n` reads
    /// partition `n` of every topic): a join's, or a union's followed by a
    /// stateful step. A union whose rows go on statelessly (or to a
    /// repartition topic) reads its topics however they are partitioned.
    pub fn needs_co_partitioned_inputs(&self) -> bool {
        self.side_inputs.iter().any(|s| {
            !s.is_union()
                || self.steps[s.join_at + 1..]
                    .iter()
                    .any(|step| step.shape.is_stateful())
        })
    }

    /// Whether a step keeps state across batches (aggregations, joins,
    /// deduplication, windows).
    pub fn has_stateful_steps(&self) -> bool {
        self.steps.iter().any(|s| s.shape.is_stateful())
    }

    /// The names of the stores its stateful steps keep (`op<index>`), as a
    /// state backend opens them: with the query's name, what names their
    /// changelog topics.
    pub fn store_names(&self) -> Vec<String> {
        self.steps
            .iter()
            .enumerate()
            .filter(|(_, step)| step.shape.is_stateful())
            .map(|(index, _)| format!("op{index}"))
            .collect()
    }

    /// After this long without records, an input stops holding the
    /// watermark back.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// Appends a step built by `factory` once per task.
    pub fn step(self, factory: impl Fn() -> Box<dyn Operator> + Send + Sync + 'static) -> Self {
        // What the step does to the columns is unknown: a grouping after
        // it is repartitioned.
        self.push_step(StepShape::Opaque, Arc::new(move |_| factory()))
    }

    /// Appends a join with the second input `side` on `on`, its records
    /// routed as the next input.
    fn push_join(
        mut self,
        side: JoinInput,
        kind: SecondInputKind,
        on: &[(&str, &str)],
        build: OperatorFactory,
    ) -> Self {
        self.side_inputs.push(SideInput {
            input: self.side_inputs.len() + 1,
            join_at: self.steps.len(),
            stream: side,
            left_keys: on.iter().map(|(l, _)| l.to_string()).collect(),
            right_keys: on.iter().map(|(_, r)| r.to_string()).collect(),
            kind,
        });
        self.push_step(StepShape::Joins, build)
    }

    /// Appends a step whose effect on the partitioning is `shape`.
    fn push_step(mut self, shape: StepShape, build: OperatorFactory) -> Self {
        self.steps.push(Step { build, shape });
        self
    }

    /// Keeps rows for which `condition` is true.
    pub fn filter(self, condition: &str) -> Result<Self> {
        crate::operators::Filter::new(condition)?;
        let condition = condition.to_string();
        Ok(self.push_step(
            StepShape::Keeps,
            Arc::new(move |_| {
                Box::new(crate::operators::Filter::new(&condition).expect("validated"))
            }),
        ))
    }

    /// Keeps `(column, output name)` pairs, in order.
    pub fn select<S: AsRef<str>>(self, columns: &[(S, S)]) -> Self {
        let cols: Vec<(String, String)> = columns
            .iter()
            .map(|(a, b)| (a.as_ref().to_string(), b.as_ref().to_string()))
            .collect();
        self.push_step(
            StepShape::Selects(cols.clone()),
            Arc::new(move |_| Box::new(crate::operators::Select::new(cols.clone()))),
        )
    }

    /// Adds a computed column.
    pub fn with_column(self, name: &str, expression: &str) -> Result<Self> {
        crate::operators::WithColumn::new(name, expression)?;
        let (n, e) = (name.to_string(), expression.to_string());
        Ok(self.push_step(
            StepShape::Writes(name.to_string()),
            Arc::new(move |_| {
                Box::new(crate::operators::WithColumn::new(&n, &e).expect("validated"))
            }),
        ))
    }

    /// A typed filter over the user's serde type; rows that do not
    /// deserialize go to the dead-letter output.
    pub fn filter_typed<T>(self, f: impl Fn(&T) -> bool + Send + Sync + 'static) -> Self
    where
        T: serde::de::DeserializeOwned + serde::Serialize + 'static,
    {
        self.flat_map_typed::<T, T, Option<T>>(move |t| if f(&t) { Some(t) } else { None })
    }

    /// Writes each row as `U` writes itself: read into `U`, then made a row
    /// from `U`'s serialization (its field names, order and formats;
    /// strings stay strings). Put last, the output is `U`'s JSON.
    pub fn as_type<U>(self) -> Self
    where
        U: serde::de::DeserializeOwned + serde::Serialize + 'static,
    {
        let name = format!("AsType [{}]", std::any::type_name::<U>());
        self.step(move || Box::new(crate::operators::AsType::build::<U>(&name)))
    }

    /// A typed map from `In` to `Out`.
    pub fn map_typed<In, Out>(self, f: impl Fn(In) -> Out + Send + Sync + 'static) -> Self
    where
        In: serde::de::DeserializeOwned + 'static,
        Out: serde::Serialize + 'static,
    {
        self.flat_map_typed::<In, Out, Option<Out>>(move |i| Some(f(i)))
    }

    /// An asynchronous call per row (Flink's Async I/O; see
    /// [`crate::async_step`]): `call` answers each `In` with an `Out`, at
    /// most `options.concurrency` calls in flight, each within
    /// `options.timeout`; the batch commits once every call answered, and
    /// a failed call fails the batch.
    ///
    /// ```
    /// use tidemark::async_step::AsyncOptions;
    /// use tidemark::prelude::*;
    /// #[derive(serde::Deserialize)]
    /// struct Tx { card: String, amount: f64 }
    /// #[derive(serde::Serialize)]
    /// struct Scored { card: String, score: f64 }
    /// let query = Query::builder("scoring")
    ///     .map_async("score", AsyncOptions::default(), |tx: Tx| async move {
    ///         // e.g. an HTTP call to a model server
    ///         Ok::<_, std::io::Error>(Scored { card: tx.card, score: tx.amount / 1000.0 })
    ///     })
    ///     .unwrap()
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn map_async<In, Out, F, Fut, E>(
        self,
        name: &str,
        options: crate::async_step::AsyncOptions,
        call: F,
    ) -> Result<Self>
    where
        In: serde::de::DeserializeOwned + Send + 'static,
        Out: serde::Serialize + Send + 'static,
        F: Fn(In) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::result::Result<Out, E>> + Send + 'static,
        E: Into<crate::async_step::CallError> + 'static,
    {
        use crate::async_step::AsyncStep;
        let call = Arc::new(call);
        let probe = call.clone();
        AsyncStep::<In, Out>::new(name, options, move |i| probe(i))?;
        let name = name.to_string();
        Ok(self.step(move || {
            let call = call.clone();
            Box::new(
                AsyncStep::<In, Out>::new(&name, options, move |i| call(i))
                    .expect("checked when the step was added"),
            )
        }))
    }

    /// A typed flat_map: each `In` gives zero or more `Out`.
    pub fn flat_map_typed<In, Out, I>(self, f: impl Fn(In) -> I + Send + Sync + 'static) -> Self
    where
        In: serde::de::DeserializeOwned + 'static,
        Out: serde::Serialize + 'static,
        I: IntoIterator<Item = Out> + 'static,
    {
        let f: Arc<dyn Fn(In) -> I + Send + Sync> = Arc::new(f);
        let name = format!(
            "FlatMap [{} -> {}]",
            std::any::type_name::<In>(),
            std::any::type_name::<Out>()
        );
        self.step(move || {
            Box::new(crate::operators::FlatMapTyped::build::<In, Out, I>(
                &name,
                f.clone(),
            ))
        })
    }

    /// Groups by `keys` and a window over the event-time column (or
    /// processing time when no event time is set) and folds `aggregates`.
    pub fn window_aggregate<K: AsRef<str>>(
        self,
        keys: impl IntoIterator<Item = K>,
        window: crate::window::WindowSpec,
        aggregates: Vec<crate::operators::AggregateSpec>,
    ) -> Self {
        let time = match &self.event_time {
            Some(c) => crate::operators::TimeColumn::EventTime(c.clone()),
            None => crate::operators::TimeColumn::ProcessingTime,
        };
        self.window_aggregate_by(keys, time, window, aggregates)
    }

    /// A window aggregation of the rows an earlier window aggregation
    /// emits: Spark 3.5's chained time windows, `groupBy(window(window,
    /// size), keys)`, each earlier window placed by `window_time(window)`
    /// (its end less one microsecond). Append output mode, as Spark allows
    /// chained aggregations only there; the earlier aggregation's emitted
    /// windows reach this one in the same micro-batch.
    pub fn window_aggregate_of_windows<K: AsRef<str>>(
        self,
        keys: impl IntoIterator<Item = K>,
        window: crate::window::WindowSpec,
        aggregates: Vec<crate::operators::AggregateSpec>,
    ) -> Result<Self> {
        if self
            .count_groupings(|g| matches!(g, Grouping::Aggregation | Grouping::SessionAggregation))
            == 0
        {
            return Err(Error::config(
                "window_aggregate.time",
                "`window` reads the window an earlier window aggregation emits: add one before this step, or leave `time` out to window the event time",
            ));
        }
        Ok(self.window_aggregate_by(
            keys,
            crate::operators::TimeColumn::EarlierWindow,
            window,
            aggregates,
        ))
    }

    fn window_aggregate_by<K: AsRef<str>>(
        self,
        keys: impl IntoIterator<Item = K>,
        time: crate::operators::TimeColumn,
        window: crate::window::WindowSpec,
        aggregates: Vec<crate::operators::AggregateSpec>,
    ) -> Self {
        let keys: Vec<Arc<str>> = keys.into_iter().map(|k| Arc::from(k.as_ref())).collect();
        let shape = StepShape::Groups {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            kind: if window.is_session() {
                Grouping::SessionAggregation
            } else {
                Grouping::Aggregation
            },
        };
        self.push_step(
            shape,
            Arc::new(move |mode| {
                Box::new(crate::operators::WindowAggregate::new(
                    keys.clone(),
                    time.clone(),
                    window.clone(),
                    aggregates.clone(),
                    mode,
                ))
            }),
        )
    }

    /// A rolling window (Databricks' `rollingWindow`) grouped by
    /// `partition_by` over the timestamp column `order_by` (default: the
    /// event-time column). Update output mode only.
    pub fn rolling_window<K: AsRef<str>>(
        self,
        partition_by: &[K],
        order_by: Option<&str>,
        frontier: crate::operators::FrontierSpec,
        measures: Vec<crate::operators::RollingMeasure>,
    ) -> Result<Self> {
        let order_by: Arc<str> = match (order_by, &self.event_time) {
            (Some(c), _) => Arc::from(c),
            (None, Some(c)) => c.clone(),
            (None, None) => {
                return Err(Error::config(
                    "rolling_window.order_by",
                    "a rolling window needs a timestamp column: set `order_by` or `event_time`",
                ))
            }
        };
        if frontier.basis == crate::operators::FrontierBasis::EventTime && self.watermark.is_none()
        {
            return Err(Error::config(
                "rolling_window.frontier.basis",
                "an event-time frontier follows the watermark: set `watermark`",
            ));
        }
        let keys: Vec<Arc<str>> = partition_by.iter().map(|k| Arc::from(k.as_ref())).collect();
        // Checked once here so that the step factory cannot fail.
        crate::operators::RollingWindow::new(&keys, &order_by, frontier.clone(), measures.clone())?;
        let shape = StepShape::Groups {
            keys: partition_by
                .iter()
                .map(|k| k.as_ref().to_string())
                .collect(),
            kind: Grouping::Rolling,
        };
        Ok(self.push_step(
            shape,
            Arc::new(move |_| {
                Box::new(
                    crate::operators::RollingWindow::new(
                        &keys,
                        &order_by,
                        frontier.clone(),
                        measures.clone(),
                    )
                    .expect("checked when the step was added"),
                )
            }),
        ))
    }

    /// Spark's `dropDuplicates(keys)`: the first row of each key passes.
    /// With the event-time column among the keys and a watermark, a key's
    /// state is evicted once the watermark passes its event time; otherwise
    /// it is kept for ever (a warning says so).
    pub fn drop_duplicates<K: AsRef<str>>(self, keys: &[K]) -> Result<Self> {
        let keys = keys.iter().map(|k| Arc::from(k.as_ref())).collect();
        self.deduplicate(crate::operators::DedupSpec::Keys(keys))
    }

    /// Spark's `distinct()`: every column is the key.
    pub fn distinct(self) -> Result<Self> {
        self.deduplicate(crate::operators::DedupSpec::Distinct)
    }

    /// Spark's `dropDuplicatesWithinWatermark(keys)`: the first row of each
    /// key passes, later ones are dropped even when other columns (the
    /// event time) differ, until the watermark reaches the first one's
    /// event time plus the delay. Needs a watermark.
    pub fn drop_duplicates_within_watermark<K: AsRef<str>>(self, keys: &[K]) -> Result<Self> {
        let Some(delay) = self.watermark else {
            return Err(Error::config(
                "dedup.within_watermark",
                "dropDuplicatesWithinWatermark needs a watermark: set `watermark` (and `event_time`)",
            ));
        };
        let keys = keys.iter().map(|k| Arc::from(k.as_ref())).collect();
        self.deduplicate(crate::operators::DedupSpec::WithinWatermark {
            keys,
            delay_micros: tidemark_types::duration::micros(delay),
        })
    }

    fn deduplicate(self, spec: crate::operators::DedupSpec) -> Result<Self> {
        let event_time = self.event_time.clone().filter(|_| self.watermark.is_some());
        let probe = crate::operators::Deduplicate::new(spec.clone(), event_time.clone())?;
        if !probe.evicts() {
            tracing::warn!(
                step = %crate::operators::Operator::describe(&probe),
                "deduplication without the event-time column in its key (or without a watermark) keeps every key for ever: its state grows without bound"
            );
        }
        let shape = match &spec {
            crate::operators::DedupSpec::Distinct => StepShape::Distinct,
            crate::operators::DedupSpec::Keys(keys)
            | crate::operators::DedupSpec::WithinWatermark { keys, .. } => StepShape::Groups {
                keys: keys.iter().map(|k| k.to_string()).collect(),
                kind: Grouping::Dedup,
            },
        };
        Ok(self.push_step(
            shape,
            Arc::new(move |_| {
                Box::new(
                    crate::operators::Deduplicate::new(spec.clone(), event_time.clone())
                        .expect("checked when the step was added"),
                )
            }),
        ))
    }

    /// Runs a user's stateful processor per key of the `keys` columns
    /// (Spark 4's `transformWithState`; see
    /// [`crate::operators::processor`]). `build` makes each task's
    /// processor and declares its states. Keyed by the record key's
    /// columns it runs where the records are; otherwise its rows go
    /// through the repartition topic, as a grouping's do. Append or update
    /// output mode.
    ///
    /// ```
    /// use tidemark::operators::processor::*;
    /// use tidemark::prelude::*;
    ///
    /// /// Counts each user's clicks and emits the running count.
    /// struct Clicks {
    ///     count: ValueState<u64>,
    /// }
    /// #[derive(serde::Deserialize)]
    /// struct Click {}
    /// #[derive(serde::Serialize)]
    /// struct Count {
    ///     user: String,
    ///     clicks: u64,
    /// }
    /// impl StatefulProcessor for Clicks {
    ///     type Input = Click;
    ///     type Output = Count;
    ///     fn handle_inputs(
    ///         &mut self,
    ///         key: &GroupKey,
    ///         rows: Vec<Click>,
    ///         ctx: &mut ProcessorContext<'_, Count>,
    ///     ) -> ProcessorResult {
    ///         let clicks = self.count.get(ctx)?.unwrap_or(0) + rows.len() as u64;
    ///         self.count.set(ctx, &clicks)?;
    ///         ctx.emit(Count { user: key.as_str().unwrap_or_default().into(), clicks });
    ///         Ok(())
    ///     }
    /// }
    /// let query = Query::builder("clicks")
    ///     .process("clicks", &["user"], |states| Ok(Clicks { count: states.value("count")? }))
    ///     .unwrap()
    ///     .output_mode(OutputMode::Update)
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn process<P, K, F>(self, name: &str, keys: &[K], build: F) -> Result<Self>
    where
        P: crate::operators::StatefulProcessor,
        K: AsRef<str>,
        F: Fn(&mut crate::operators::StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        use crate::operators::ProcessorStep;
        // Declared once here, so that a bad declaration fails the build.
        ProcessorStep::check(keys, &build)?;
        let keys: Vec<String> = keys.iter().map(|k| k.as_ref().to_string()).collect();
        let name = name.to_string();
        let shape = StepShape::Groups {
            keys: keys.clone(),
            kind: Grouping::Processor,
        };
        Ok(self.push_step(
            shape,
            Arc::new(move |_| match ProcessorStep::new(&name, &keys, &build) {
                Ok(step) => Box::new(step),
                Err(e) => Box::new(crate::operators::processor::Unbuildable::new(&name, e)),
            }),
        ))
    }

    /// [`QueryBuilder::process`] with its state seeded from `initial`
    /// (Spark's `transformWithState` with an `initialState`): a table
    /// input ([`JoinInput::table`]) whose rows carry the `keys` columns and
    /// read as `S`. Each is handed to
    /// [`HandleInitialState::handle_initial_state`](crate::operators::HandleInitialState)
    /// in the batch that reads it, before the key's input rows; a record
    /// without a value seeds nothing. Its topic must be co-partitioned with
    /// the input (keyed alike, as many partitions), and the processor must
    /// run where the records are (its keys among the input's `keyed_by`
    /// columns): initial rows are not sent through a repartition topic.
    pub fn process_with_initial_state<P, S, K, F>(
        self,
        name: &str,
        keys: &[K],
        build: F,
        initial: JoinInput,
    ) -> Result<Self>
    where
        P: crate::operators::HandleInitialState<S>,
        S: serde::de::DeserializeOwned + Send + 'static,
        K: AsRef<str>,
        F: Fn(&mut crate::operators::StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        use crate::operators::ProcessorStep;
        ProcessorStep::check(keys, &build)?;
        let keys: Vec<String> = keys.iter().map(|k| k.as_ref().to_string()).collect();
        if !initial.table {
            return Err(Error::config(
                "process.initial_state",
                format!(
                    "`{}` is a stream: build the initial state with JoinInput::table",
                    initial.name
                ),
            ));
        }
        if let Some(stream) = self.side_inputs.iter().find(|s| !s.stream.table) {
            // A stream join or union before may be repartitioned by other
            // keys, which the initial state's topic is not.
            return Err(Error::config(
                "process.initial_state",
                format!(
                    "the processor `{name}` comes after the stream `{}` is joined or united: \
                     an initial state seeds a processor that reads the source alone (or with tables)",
                    stream.stream.name
                ),
            ));
        }
        let in_place = self
            .keyed_by
            .as_ref()
            .and_then(|k| {
                super::stages::partition_columns_after(k, self.steps.iter().map(|s| &s.shape))
            })
            .is_some_and(|k| super::stages::groups_stay_in_partition(&keys, &k));
        if !in_place {
            return Err(Error::config(
                "process.initial_state",
                format!(
                    "the processor `{name}` would read its input behind a repartition topic, \
                     where its initial state does not go: key the input by its keys \
                     ([{}]) with `keyed_by`",
                    keys.join(", ")
                ),
            ));
        }
        let on: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), k.clone())).collect();
        let reader = crate::operators::processor::initial_state_reader::<P, S>();
        let step_name = name.to_string();
        let step_keys = keys.clone();
        let factory: OperatorFactory =
            Arc::new(
                move |_| match ProcessorStep::new(&step_name, &step_keys, &build) {
                    Ok(step) => Box::new(step.with_initial_state(reader.clone())),
                    Err(e) => {
                        Box::new(crate::operators::processor::Unbuildable::new(&step_name, e))
                    }
                },
            );
        let mut b = self;
        b.side_inputs.push(SideInput {
            input: b.side_inputs.len() + 1,
            join_at: b.steps.len(),
            stream: initial,
            left_keys: on.iter().map(|(l, _)| l.clone()).collect(),
            right_keys: on.iter().map(|(_, r)| r.clone()).collect(),
            kind: SecondInputKind::InitialState,
        });
        Ok(b.push_step(
            StepShape::Groups {
                keys,
                kind: Grouping::Processor,
            },
            factory,
        ))
    }

    /// Names the main stream (the query's own input) in progress reports
    /// of a join's per-stream watermarks (default `main`).
    pub fn main_stream(mut self, name: &str) -> Self {
        self.main_stream = Arc::from(name);
        self
    }

    /// The main stream's columns, when declared: a right outer join writes
    /// them as nulls in an unmatched right row (otherwise the columns of
    /// the rows seen so far).
    pub fn main_columns<S: AsRef<str>>(mut self, columns: &[S]) -> Self {
        self.main_columns = columns.iter().map(|c| Arc::from(c.as_ref())).collect();
        self
    }

    /// Joins the rows so far (the left side) with a second stream (the
    /// right side), Spark's stream-stream join: `on` pairs left and right
    /// key columns, `time` bounds how far apart matching rows' event times
    /// are, which is what lets the watermarks evict state. Append output
    /// mode only. The second stream's records are those of `right`'s
    /// topics; each stream keeps its own watermark and the query combines
    /// them by the policy ([`QueryBuilder::watermark_policy`]).
    ///
    /// ```
    /// use tidemark::prelude::*;
    /// use tidemark::operators::{JoinTimeCondition, JoinType};
    /// use tidemark::runtime::JoinInput;
    ///
    /// let query = Query::builder("ad-clicks")
    ///     .event_time("impressionTime")
    ///     .watermark("2 hours").unwrap()
    ///     .join(
    ///         JoinInput::new("clicks").event_time("clickTime").watermark("3 hours").unwrap(),
    ///         JoinType::LeftOuter,
    ///         &[("adId", "adId")],
    ///         JoinTimeCondition::between("0 seconds", "1 hour").unwrap(),
    ///     )
    ///     .unwrap()
    ///     .build()
    ///     .unwrap();
    /// assert!(query.describe()[0].contains("LeftOuter"));
    /// ```
    pub fn join(
        self,
        right: JoinInput,
        join_type: crate::operators::JoinType,
        on: &[(&str, &str)],
        time: crate::operators::JoinTimeCondition,
    ) -> Result<Self> {
        let Some(left_time) = self.event_time.clone() else {
            return Err(Error::config(
                "event_time",
                "a stream-stream join compares event times: set the main stream's `event_time`",
            ));
        };
        let Some(right_time) = right.event_time.clone() else {
            return Err(Error::config(
                "join.event_time",
                format!(
                    "set the event-time column of the joined stream `{}`",
                    right.name
                ),
            ));
        };
        if right.watermark.is_some() && self.watermark.is_none() {
            return Err(Error::config(
                "watermark",
                "the joined stream has a watermark but the main stream has none: set `watermark`",
            ));
        }
        let needs_watermarks = join_type != crate::operators::JoinType::Inner;
        if needs_watermarks && (self.watermark.is_none() || right.watermark.is_none()) {
            return Err(Error::config(
                "join.watermark",
                "outer and semi joins need a watermark on both streams (as in Spark): set `watermark` and the join's `watermark`",
            ));
        }
        let spec = crate::operators::JoinSpec {
            join_type,
            left_keys: on.iter().map(|(l, _)| Arc::from(*l)).collect(),
            right_keys: on.iter().map(|(_, r)| Arc::from(*r)).collect(),
            left_time,
            right_time,
            time,
            right_name: right.name.clone(),
            right_columns: right.columns.clone(),
            left_columns: self.main_columns.clone(),
        };
        // Checked once here so that the step factory cannot fail.
        let probe = crate::operators::StreamJoin::new(spec.clone())?;
        if time == crate::operators::JoinTimeCondition::None || self.watermark.is_none() {
            tracing::warn!(
                step = %crate::operators::Operator::describe(&probe),
                "a join without a time condition and watermarks keeps every row of both streams for ever: its state grows without bound"
            );
        }
        let outer_right = matches!(
            join_type,
            crate::operators::JoinType::RightOuter | crate::operators::JoinType::FullOuter
        );
        Ok(self.push_join(
            right,
            SecondInputKind::StreamJoin { outer_right },
            on,
            Arc::new(move |_| {
                Box::new(
                    crate::operators::StreamJoin::new(spec.clone())
                        .expect("checked when the step was added"),
                )
            }),
        ))
    }

    /// Spark's `union` of the rows so far with a second stream, columns
    /// matched by name (`unionByName` with missing columns null): each
    /// stream keeps its own watermark (`other`'s `watermark`, its
    /// `event_time` defaulting to the main stream's column) and the query
    /// combines them by the policy ([`QueryBuilder::watermark_policy`]), so
    /// a later window judges every row against that one watermark. A
    /// stream without a watermark of its own does not move it, as in
    /// Spark. `other`'s records come from its topics (for the files
    /// source: the sub-directory of that name).
    ///
    /// ```
    /// use tidemark::prelude::*;
    /// use tidemark::runtime::JoinInput;
    ///
    /// let query = Query::builder("sales")
    ///     .event_time("event_time")
    ///     .watermark("10 minutes").unwrap()
    ///     .main_columns(&["event_time", "id", "amount"])
    ///     .union(JoinInput::new("sales-eu").watermark("1 hour").unwrap().columns(&["event_time", "id"]))
    ///     .unwrap()
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(query.describe()[0], "Union [sales-eu] by name");
    /// ```
    pub fn union(mut self, mut other: JoinInput) -> Result<Self> {
        if self.side_inputs.iter().any(|s| !s.is_union()) {
            return Err(Error::config("steps", UNION_BESIDE_JOIN));
        }
        if other.table {
            return Err(Error::config(
                "union",
                format!("`{}` is a table: a union's second input is a stream (join a table with `table_join`)", other.name),
            ));
        }
        if other.watermark.is_some() && self.watermark.is_none() {
            return Err(Error::config(
                "watermark",
                format!("the union's stream `{}` has a watermark but the main stream has none: set `watermark`", other.name),
            ));
        }
        if self.steps.iter().any(|s| s.shape.is_stateful()) {
            return Err(Error::config(
                "union",
                format!("a union after a stateful step (`{}`) is not supported yet: put the union before the aggregation, deduplication or join", other.name),
            ));
        }
        match (&other.event_time, &self.event_time) {
            (None, _) => other.event_time = self.event_time.clone(),
            (Some(theirs), Some(ours)) if theirs != ours => {
                return Err(Error::config(
                    "union.event_time",
                    format!("the union's stream `{}` keeps its event time in `{theirs}` but the query's later steps read `{ours}`: columns are matched by name and each row's event time is read where it is decoded, so both streams must name the column alike", other.name),
                ));
            }
            _ => {}
        }
        if other.watermark.is_some() && other.event_time.is_none() {
            return Err(Error::config(
                "union.event_time",
                format!(
                    "set the event-time column of the union's stream `{}`",
                    other.name
                ),
            ));
        }
        let columns = self.union_columns(&other);
        let name = other.name.to_string();
        let shape = StepShape::Unions {
            keyed_by: other.keyed_by.clone(),
        };
        self.side_inputs.push(SideInput {
            input: self.side_inputs.len() + 1,
            join_at: self.steps.len(),
            stream: other,
            left_keys: Vec::new(),
            right_keys: Vec::new(),
            kind: SecondInputKind::Union,
        });
        Ok(self.push_step(
            shape,
            Arc::new(move |_| Box::new(crate::operators::Union::new(&name, &columns))),
        ))
    }

    /// A union's output columns: the main stream's as its steps leave them,
    /// then `other`'s that the main stream lacks; none (rows pass as they
    /// are) when either side's columns are unknown.
    fn union_columns(&self, other: &JoinInput) -> Vec<String> {
        let main =
            super::stages::columns_after(&self.main_columns, self.steps.iter().map(|s| &s.shape));
        let side = super::stages::columns_after(&other.columns, &other.step_shapes);
        match (main, side) {
            (Some(mut columns), Some(side)) => {
                for c in side {
                    if !columns.contains(&c) {
                        columns.push(c);
                    }
                }
                columns
            }
            _ => Vec::new(),
        }
    }

    /// Kafka Streams' stream–table join (`KStream#join(KTable)`, or
    /// `leftJoin` with `keep_unmatched`): each row looks up the latest row
    /// of `table` (a [`JoinInput::table`], co-partitioned, keyed by the
    /// `on` columns) and gains its columns. The table's updates within a
    /// batch are applied before the batch's rows look it up; updates emit
    /// nothing. The table is operator state: checkpointed, restored, and
    /// in the changelog like any other.
    pub fn join_table(
        self,
        table: JoinInput,
        keep_unmatched: bool,
        on: &[(&str, &str)],
    ) -> Result<Self> {
        if !table.table {
            return Err(Error::config(
                "table_join",
                format!(
                    "`{}` is a stream: build it with JoinInput::table",
                    table.name
                ),
            ));
        }
        let spec = table_join_spec(&table, keep_unmatched, on);
        crate::operators::TableJoin::new(spec.clone())?;
        Ok(self.push_join(
            table,
            SecondInputKind::Table,
            on,
            Arc::new(move |_| {
                Box::new(
                    crate::operators::TableJoin::new(spec.clone())
                        .expect("checked when the step was added"),
                )
            }),
        ))
    }

    /// Kafka Streams' `KStream#join(GlobalKTable)` (`leftJoin` with
    /// `keep_unmatched`): like [`QueryBuilder::join_table`], but every task
    /// looks rows up in one table holding every partition of its topic, so
    /// the stream need not be co-partitioned with it nor keyed by `on`. The
    /// table is read whole before the first batch and caught up between
    /// batches from `feed` (see [`QueryBuilder::table_feed`]); it lives in
    /// memory and is read again from its topic at each start.
    pub fn join_global_table(
        mut self,
        table: JoinInput,
        keep_unmatched: bool,
        on: &[(&str, &str)],
    ) -> Result<Self> {
        let spec = table_join_spec(&table, keep_unmatched, on);
        let rows: crate::operators::SharedTable = Default::default();
        crate::operators::TableJoin::global(spec.clone(), rows.clone())?;
        self.global_tables.push(GlobalTable {
            name: table.name.clone(),
            input: SecondInput::of(&table, SecondInputKind::GlobalTable),
            keys: spec.table_keys.clone(),
            rows: rows.clone(),
            feed: None,
            step: self.steps.len(),
        });
        // Rows keep their columns and gain the table's.
        Ok(self.push_step(
            StepShape::Keeps,
            Arc::new(move |_| {
                Box::new(
                    crate::operators::TableJoin::global(spec.clone(), rows.clone())
                        .expect("checked when the step was added"),
                )
            }),
        ))
    }

    /// Where the global table `name` reads its topic from.
    pub fn table_feed(mut self, name: &str, feed: impl super::TableFeed + 'static) -> Self {
        if let Some(t) = self.global_tables.iter_mut().find(|t| &*t.name == name) {
            t.feed = Some(Box::new(feed));
        }
        self
    }

    /// The names of the global tables, which need a [`QueryBuilder::table_feed`].
    pub fn global_table_names(&self) -> Vec<String> {
        self.global_tables
            .iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    /// Spark's output mode (default append).
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        self.output_mode = mode;
        self
    }

    /// When batches run.
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.trigger = trigger;
        self
    }

    /// The processing-time clock (virtual for deterministic replays).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Caps the records of one batch (Spark's `maxOffsetsPerTrigger`).
    pub fn max_records_per_batch(mut self, max: usize) -> Self {
        self.max_records_per_batch = max.max(1);
        self
    }

    /// How records become rows (default: JSON objects, types inferred).
    pub fn decoder(mut self, decoder: impl Decoder + 'static) -> Self {
        self.decoder = Some(Box::new(decoder));
        self
    }

    /// Where records that fail go (default: logged and counted).
    pub fn dead_letter(mut self, dead_letter: impl DeadLetter + 'static) -> Self {
        self.dead_letter = Some(Box::new(dead_letter));
        self
    }

    /// Receives each batch's [`QueryProgress`](crate::progress::QueryProgress).
    pub fn on_progress(mut self, listener: impl ProgressListener + 'static) -> Self {
        self.listeners.push(Box::new(listener));
        self
    }

    /// Checks the query as Spark's analyzer would and builds it.
    pub fn build(self) -> Result<Query> {
        if self.count_groupings(|g| g == Grouping::Rolling) > 0
            && self.output_mode != OutputMode::Update
        {
            return Err(Error::config(
                "output_mode",
                "rolling windows emit each key's current values as they change: only update output mode is supported (as in Databricks); set `output_mode: update`",
            ));
        }
        if matches!(self.trigger, Trigger::RealTime { .. })
            && self.output_mode != OutputMode::Update
        {
            return Err(Error::config(
                "output_mode",
                "the real-time trigger supports update output mode only (as in Databricks); set `output_mode: update`",
            ));
        }
        let aggregations = self
            .count_groupings(|g| matches!(g, Grouping::Aggregation | Grouping::SessionAggregation));
        if aggregations > 1 && self.output_mode != OutputMode::Append {
            return Err(Error::config(
                "output_mode",
                "multiple streaming aggregations are supported in append output mode only (as in Spark 3.4 and later): set `output_mode: append`",
            ));
        }
        if aggregations == 0 && self.output_mode == OutputMode::Complete {
            return Err(Error::config(
                "output_mode",
                "complete mode needs an aggregation (as in Spark); use append or update",
            ));
        }
        if aggregations > 0 && self.output_mode == OutputMode::Append && self.watermark.is_none() {
            return Err(Error::config(
                "output_mode",
                "append mode with an aggregation needs a watermark (as in Spark): set `watermark`, or use update or complete",
            ));
        }
        if self.count_groupings(|g| g == Grouping::SessionAggregation) > 0
            && self.output_mode == OutputMode::Update
        {
            return Err(Error::config(
                "output_mode",
                "update output mode is not supported for session windows (as in Spark); use append or complete",
            ));
        }
        if self
            .side_inputs
            .iter()
            .any(|s| !s.stream.table && !s.is_union())
            && self.output_mode != OutputMode::Append
        {
            return Err(Error::config(
                "output_mode",
                "stream-stream joins support append output mode only (as in Spark): set `output_mode: append`",
            ));
        }
        if self.watermark.is_some() && self.event_time.is_none() {
            return Err(Error::config(
                "watermark",
                "a watermark needs an `event_time` column",
            ));
        }
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| default_query_id(&self.name));
        let mut builder = self;
        Ok(Query {
            id,
            run_id: uuid::Uuid::new_v4().to_string(),
            state: builder.state_service.take().unwrap_or_default(),
            builder,
            stop: StopHandle::default(),
            status: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::{JoinTimeCondition, JoinType};

    fn impressions() -> QueryBuilder {
        Query::builder("q")
            .event_time("it")
            .watermark("1 hour")
            .unwrap()
    }

    fn clicks() -> JoinInput {
        JoinInput::new("clicks").event_time("ct")
    }

    fn hour() -> JoinTimeCondition {
        JoinTimeCondition::between("0 seconds", "1 hour").unwrap()
    }

    fn refusal(result: Result<QueryBuilder>) -> String {
        match result.and_then(QueryBuilder::build) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn joins_that_spark_refuses_are_refused_with_the_key_and_the_reason() {
        let e = refusal(impressions().join(clicks(), JoinType::LeftOuter, &[("a", "a")], hour()));
        assert!(
            e.contains("join.watermark") && e.contains("both streams"),
            "{e}"
        );
        let e = refusal(
            impressions()
                .join(
                    clicks().watermark("2 hours").unwrap(),
                    JoinType::FullOuter,
                    &[("a", "a")],
                    JoinTimeCondition::None,
                )
                .map(|b| b.output_mode(OutputMode::Append)),
        );
        assert!(
            e.contains("join.between") && e.contains("time condition"),
            "{e}"
        );
        let e = refusal(
            impressions()
                .join(clicks(), JoinType::Inner, &[("a", "a")], hour())
                .map(|b| b.output_mode(OutputMode::Update)),
        );
        assert!(
            e.contains("output_mode") && e.contains("append output mode only"),
            "{e}"
        );
        let e = refusal(Query::builder("q").join(clicks(), JoinType::Inner, &[("a", "a")], hour()));
        assert!(e.contains("event_time"), "{e}");
        let e = refusal(impressions().join(
            clicks(),
            JoinType::Inner,
            &[("a", "a")],
            JoinTimeCondition::between("1 hour", "0 seconds").unwrap(),
        ));
        assert!(e.contains("lower bound is after the upper bound"), "{e}");
        let e = refusal(impressions().join(
            JoinInput::new("clicks"),
            JoinType::Inner,
            &[("a", "a")],
            hour(),
        ));
        assert!(e.contains("join.event_time"), "{e}");
        let e = refusal(impressions().join_table(clicks(), false, &[("c", "id")]));
        assert!(e.contains("JoinInput::table"), "{e}");
        // A global table builds (describe needs no broker) but does not run
        // without its feed.
        let query = impressions()
            .join_global_table(JoinInput::table("customers"), true, &[("c", "id")])
            .and_then(QueryBuilder::build)
            .unwrap();
        let mut source = crate::runtime::testing::VecSource::json_batches(vec![vec!["{}"]]);
        let e = query
            .run(
                &mut source,
                &mut crate::runtime::testing::CollectSink::default(),
            )
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("has no feed"), "{e}");
    }

    #[test]
    fn chained_aggregations_are_refused_where_spark_refuses_them() {
        use crate::operators::AggregateSpec;
        use crate::window::WindowSpec;
        let tumbling = |size: &str| WindowSpec::tumbling(size).unwrap();
        let e = refusal(impressions().window_aggregate_of_windows(
            ["a"],
            tumbling("1 hour"),
            vec![AggregateSpec::count()],
        ));
        assert!(
            e.contains("window_aggregate.time") && e.contains("earlier window aggregation"),
            "{e}"
        );
        let chained = |mode| {
            impressions()
                .window_aggregate(["a"], tumbling("10 minutes"), vec![AggregateSpec::count()])
                .window_aggregate_of_windows(
                    ["a"],
                    tumbling("1 hour"),
                    vec![AggregateSpec::count()],
                )
                .map(|b| b.output_mode(mode))
        };
        for mode in [OutputMode::Update, OutputMode::Complete] {
            let e = refusal(chained(mode));
            assert!(
                e.contains("output_mode") && e.contains("append output mode only"),
                "{e}"
            );
        }
        assert!(chained(OutputMode::Append)
            .and_then(QueryBuilder::build)
            .is_ok());
    }
}
