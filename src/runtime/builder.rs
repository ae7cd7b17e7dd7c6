//! Building a query: its steps, inputs, watermarks and checks.

use super::plan::{
    columns_after, groups_stay_in_partition, partition_columns_after, GlobalTable, Grouping,
    JoinInput, OperatorFactory, QueryPlan, SecondInput, SecondInputKind, SideInput, Step,
    StepShape, UNION_BESIDE_JOIN,
};
use super::query::{default_query_id, Query, StopHandle};
use super::resources::QueryResources;
use super::{Clock, DeadLetter, Decoder, Sink, Trigger};
use crate::error::{Error, Result};
use crate::operators::{Operator, OutputMode};
use crate::progress::ProgressListener;
use crate::watermark::WatermarkPolicy;
use std::sync::Arc;
use std::time::Duration;

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
    /// What the query is.
    pub(super) plan: QueryPlan,
    /// What it runs with.
    pub(super) resources: QueryResources,
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

impl Query {
    /// Starts building a query named `name`.
    pub fn builder(name: &str) -> QueryBuilder {
        QueryBuilder {
            plan: QueryPlan::new(name),
            resources: QueryResources::default(),
        }
    }
}

impl QueryBuilder {
    /// A stable id (default: derived from the name), Spark's `id`.
    pub fn id(mut self, id: &str) -> Self {
        self.plan.id = Some(id.to_string());
        self
    }

    /// The event-time column (a timestamp; RFC 3339 or epoch ms on input).
    pub fn event_time(mut self, column: &str) -> Self {
        self.plan.event_time = Some(Arc::from(column));
        self
    }

    /// The event time computed by `extractor` (microseconds since the
    /// epoch) and stored in `column`, which then serves as the event-time
    /// column. A row for which it returns `None` is a bad record.
    pub fn event_time_from(
        mut self,
        column: &str,
        extractor: impl Fn(&crate::row::Row) -> Option<crate::time::TimestampMicros>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.plan.event_time = Some(Arc::from(column));
        self.plan.event_time_extractor = Some(Arc::new(extractor));
        self
    }

    /// Rows dropped as late by every window they belong to go to this sink
    /// (Flink's late-data side output), written and committed with each
    /// batch.
    pub fn late_data(mut self, sink: impl Sink + 'static) -> Self {
        self.resources.late_data = Some(Box::new(sink));
        self
    }

    /// Keeps stateful operators' state in stores from `backend` (RocksDB
    /// with Kafka changelogs in production), checkpointed after every batch
    /// and restored when a task starts. Without one, state lives in memory.
    pub fn state_backend(mut self, backend: impl super::StateBackend + 'static) -> Self {
        self.resources.state_backend = Some(Box::new(backend));
        self
    }

    /// The watermark delay, as a Spark duration string.
    pub fn watermark(mut self, delay: &str) -> Result<Self> {
        let d = crate::duration::parse_duration(delay)
            .map_err(|e| Error::config("watermark", e.to_string()))?;
        self.plan.watermark = Some(d);
        Ok(self)
    }

    /// Takes the watermark from [`super::WatermarkMarker`] records instead of
    /// from rows: the reading side of a repartition topic, whose rows come
    /// from many input partitions interleaved.
    pub fn watermark_from_markers(mut self) -> Self {
        self.plan.watermark_from_markers = true;
        self
    }

    /// How inputs' watermarks combine (`min` default, `max`).
    pub fn watermark_policy(mut self, policy: WatermarkPolicy) -> Self {
        self.plan.policy = policy;
        self
    }

    /// Over which inputs each stream's watermark is taken: Spark's one per
    /// stream over every partition the query reads (default; the source
    /// then plans batches by offsets, see [`super::BatchRequest::plan_offsets`]),
    /// or one per input partition (see [`crate::watermark::WatermarkScope`]).
    pub fn watermark_scope(mut self, scope: crate::watermark::WatermarkScope) -> Self {
        self.plan.scope = scope;
        self
    }

    /// Shares the input partitions' progress with the query's other
    /// instances through `exchange`, so that under
    /// [`WatermarkScope::Query`](crate::watermark::WatermarkScope) each
    /// instance's watermark counts every partition, not only its own.
    pub fn watermark_exchange(mut self, exchange: impl super::WatermarkExchange + 'static) -> Self {
        self.resources.watermark_exchange = Some(Box::new(exchange));
        self
    }

    /// Answers interactive queries through `service`: readers made from it
    /// ([`super::StateService::reader`]) read this query's state while it
    /// runs, and keep working when a supervisor rebuilds the query with
    /// the same service. Without one, [`Query::stores`] gives a reader.
    pub fn state_service(mut self, service: &super::StateService) -> Self {
        self.resources.state_service = Some(service.clone());
        self
    }

    /// The columns the main input's records are keyed by (Kafka: the record
    /// key the producer partitioned on). A grouping that includes them runs
    /// where the records arrive; any other grouping is repartitioned (see
    /// [`QueryBuilder::into_topology`]). Unset: every grouping is.
    pub fn keyed_by<S: AsRef<str>>(mut self, columns: &[S]) -> Self {
        self.plan.keyed_by = Some(columns.iter().map(|c| c.as_ref().to_string()).collect());
        self
    }

    /// Repartitions a stream join's two inputs by the join keys even when
    /// each is keyed by them: their topics have different partition counts.
    pub fn repartition_joins(mut self) -> Self {
        self.plan.repartition_joins = true;
        self
    }

    /// What the query is so far: its steps, inputs and settings, which
    /// the planner and the checks read.
    pub fn plan(&self) -> &QueryPlan {
        &self.plan
    }

    /// After this long without records, an input stops holding the
    /// watermark back.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.plan.idle_timeout = Some(timeout);
        self
    }

    /// Appends a step built by `factory` once per task. An operator that
    /// keeps state (`Operator::is_stateful`) gets a store of the query's
    /// state backend, as the built-in stateful steps do; to ask, `factory`
    /// is called once here, when the step is added.
    pub fn step(self, factory: impl Fn() -> Box<dyn Operator> + Send + Sync + 'static) -> Self {
        // What the step does to the columns is unknown: a grouping after
        // it is repartitioned. Whether it keeps state is asked once here:
        // the planner and the trigger loop ask the plan every poll.
        let stateful = factory().is_stateful();
        self.push_step(StepShape::Opaque { stateful }, Arc::new(move |_| factory()))
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
        self.plan.side_inputs.push(SideInput {
            input: self.plan.side_inputs.len() + 1,
            join_at: self.plan.steps.len(),
            stream: side,
            left_keys: on.iter().map(|(l, _)| l.to_string()).collect(),
            right_keys: on.iter().map(|(_, r)| r.to_string()).collect(),
            kind,
        });
        self.push_step(StepShape::Joins, build)
    }

    /// Appends a step whose effect on the partitioning is `shape`.
    fn push_step(mut self, shape: StepShape, build: OperatorFactory) -> Self {
        self.plan.steps.push(Step { build, shape });
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
        let time = match &self.plan.event_time {
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
            .plan
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
        let order_by: Arc<str> = match (order_by, &self.plan.event_time) {
            (Some(c), _) => Arc::from(c),
            (None, Some(c)) => c.clone(),
            (None, None) => {
                return Err(Error::config(
                    "rolling_window.order_by",
                    "a rolling window needs a timestamp column: set `order_by` or `event_time`",
                ))
            }
        };
        if frontier.basis == crate::operators::FrontierBasis::EventTime
            && self.plan.watermark.is_none()
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
        let Some(delay) = self.plan.watermark else {
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
        let event_time = self
            .plan
            .event_time
            .clone()
            .filter(|_| self.plan.watermark.is_some());
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
        if let Some(stream) = self.plan.side_inputs.iter().find(|s| !s.stream.table) {
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
            .plan
            .keyed_by
            .as_ref()
            .and_then(|k| partition_columns_after(k, self.plan.steps.iter().map(|s| &s.shape)))
            .is_some_and(|k| groups_stay_in_partition(&keys, &k));
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
        b.plan.side_inputs.push(SideInput {
            input: b.plan.side_inputs.len() + 1,
            join_at: b.plan.steps.len(),
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
        self.plan.main_stream = Arc::from(name);
        self
    }

    /// The main stream's columns, when declared: a right outer join writes
    /// them as nulls in an unmatched right row (otherwise the columns of
    /// the rows seen so far).
    pub fn main_columns<S: AsRef<str>>(mut self, columns: &[S]) -> Self {
        self.plan.main_columns = columns.iter().map(|c| Arc::from(c.as_ref())).collect();
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
        let Some(left_time) = self.plan.event_time.clone() else {
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
        if right.watermark.is_some() && self.plan.watermark.is_none() {
            return Err(Error::config(
                "watermark",
                "the joined stream has a watermark but the main stream has none: set `watermark`",
            ));
        }
        let needs_watermarks = join_type != crate::operators::JoinType::Inner;
        if needs_watermarks && (self.plan.watermark.is_none() || right.watermark.is_none()) {
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
            left_columns: self.plan.main_columns.clone(),
        };
        // Checked once here so that the step factory cannot fail.
        let probe = crate::operators::StreamJoin::new(spec.clone())?;
        if time == crate::operators::JoinTimeCondition::None || self.plan.watermark.is_none() {
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
        if self.plan.side_inputs.iter().any(|s| !s.is_union()) {
            return Err(Error::config("steps", UNION_BESIDE_JOIN));
        }
        if other.table {
            return Err(Error::config(
                "union",
                format!("`{}` is a table: a union's second input is a stream (join a table with `table_join`)", other.name),
            ));
        }
        if other.watermark.is_some() && self.plan.watermark.is_none() {
            return Err(Error::config(
                "watermark",
                format!("the union's stream `{}` has a watermark but the main stream has none: set `watermark`", other.name),
            ));
        }
        if self.plan.steps.iter().any(|s| s.shape.is_stateful()) {
            return Err(Error::config(
                "union",
                format!("a union after a stateful step (`{}`) is not supported yet: put the union before the aggregation, deduplication, join or stateful custom step", other.name),
            ));
        }
        match (&other.event_time, &self.plan.event_time) {
            (None, _) => other.event_time = self.plan.event_time.clone(),
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
        self.plan.side_inputs.push(SideInput {
            input: self.plan.side_inputs.len() + 1,
            join_at: self.plan.steps.len(),
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
        let main = columns_after(
            &self.plan.main_columns,
            self.plan.steps.iter().map(|s| &s.shape),
        );
        let side = columns_after(&other.columns, &other.step_shapes);
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
        // Its feed is found by name: a second table of the same name would
        // read nothing of it.
        if self.plan.global_tables.iter().any(|t| t.name == table.name) {
            return Err(Error::config(
                "table_join.global",
                format!(
                    "the global table `{}` is joined twice: give each join of a global table a name of its own",
                    table.name
                ),
            ));
        }
        let spec = table_join_spec(&table, keep_unmatched, on);
        let rows: crate::operators::SharedTable = Default::default();
        crate::operators::TableJoin::global(spec.clone(), rows.clone())?;
        self.plan.global_tables.push(GlobalTable {
            name: table.name.clone(),
            input: SecondInput::of(&table, SecondInputKind::GlobalTable),
            keys: spec.table_keys.clone(),
            rows: rows.clone(),
            step: self.plan.steps.len(),
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
        if self.plan.global_tables.iter().any(|t| &*t.name == name) {
            self.resources.table_feeds.retain(|(n, _)| n != name);
            self.resources
                .table_feeds
                .push((name.to_string(), Box::new(feed)));
        }
        self
    }

    /// Spark's output mode (default append).
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        self.plan.output_mode = mode;
        self
    }

    /// When batches run.
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.plan.trigger = trigger;
        self
    }

    /// The processing-time clock (virtual for deterministic replays).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.plan.clock = clock;
        self
    }

    /// Caps the records of one batch (Spark's `maxOffsetsPerTrigger`).
    pub fn max_records_per_batch(mut self, max: usize) -> Self {
        self.plan.max_records_per_batch = max.max(1);
        self
    }

    /// How records become rows (default: JSON objects, types inferred).
    pub fn decoder(mut self, decoder: impl Decoder + 'static) -> Self {
        self.resources.decoder = Some(Box::new(decoder));
        self
    }

    /// Where records that fail go (default: logged and counted).
    pub fn dead_letter(mut self, dead_letter: impl DeadLetter + 'static) -> Self {
        self.resources.dead_letter = Some(Box::new(dead_letter));
        self
    }

    /// Receives each batch's [`QueryProgress`](crate::progress::QueryProgress).
    pub fn on_progress(mut self, listener: impl ProgressListener + 'static) -> Self {
        self.resources.listeners.push(Box::new(listener));
        self
    }

    /// Checks the query as Spark's analyzer would and builds it.
    pub fn build(self) -> Result<Query> {
        if self.plan.count_groupings(|g| g == Grouping::Rolling) > 0
            && self.plan.output_mode != OutputMode::Update
        {
            return Err(Error::config(
                "output_mode",
                "rolling windows emit each key's current values as they change: only update output mode is supported (as in Databricks); set `output_mode: update`",
            ));
        }
        if matches!(self.plan.trigger, Trigger::RealTime { .. })
            && self.plan.output_mode != OutputMode::Update
        {
            return Err(Error::config(
                "output_mode",
                "the real-time trigger supports update output mode only (as in Databricks); set `output_mode: update`",
            ));
        }
        let aggregations = self
            .plan
            .count_groupings(|g| matches!(g, Grouping::Aggregation | Grouping::SessionAggregation));
        if aggregations > 1 && self.plan.output_mode != OutputMode::Append {
            return Err(Error::config(
                "output_mode",
                "multiple streaming aggregations are supported in append output mode only (as in Spark 3.4 and later): set `output_mode: append`",
            ));
        }
        if aggregations == 0 && self.plan.output_mode == OutputMode::Complete {
            return Err(Error::config(
                "output_mode",
                "complete mode needs an aggregation (as in Spark); use append or update",
            ));
        }
        if aggregations > 0
            && self.plan.output_mode == OutputMode::Append
            && self.plan.watermark.is_none()
        {
            return Err(Error::config(
                "output_mode",
                "append mode with an aggregation needs a watermark (as in Spark): set `watermark`, or use update or complete",
            ));
        }
        if self
            .plan
            .count_groupings(|g| g == Grouping::SessionAggregation)
            > 0
            && self.plan.output_mode == OutputMode::Update
        {
            return Err(Error::config(
                "output_mode",
                "update output mode is not supported for session windows (as in Spark); use append or complete",
            ));
        }
        if self
            .plan
            .side_inputs
            .iter()
            .any(|s| !s.stream.table && !s.is_union())
            && self.plan.output_mode != OutputMode::Append
        {
            return Err(Error::config(
                "output_mode",
                "stream-stream joins support append output mode only (as in Spark): set `output_mode: append`",
            ));
        }
        if self.plan.watermark.is_some() && self.plan.event_time.is_none() {
            return Err(Error::config(
                "watermark",
                "a watermark needs an `event_time` column",
            ));
        }
        let id = self
            .plan
            .id
            .clone()
            .unwrap_or_else(|| default_query_id(&self.plan.name));
        let QueryBuilder {
            plan,
            mut resources,
        } = self;
        Ok(Query {
            id,
            run_id: uuid::Uuid::new_v4().to_string(),
            state: resources.state_service.take().unwrap_or_default(),
            plan,
            resources,
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
        let e = refusal(
            impressions()
                .join_global_table(JoinInput::table("customers"), true, &[("c", "id")])
                .and_then(|q| {
                    q.join_global_table(JoinInput::table("customers"), true, &[("s", "id")])
                }),
        );
        assert!(e.contains("`customers` is joined twice"), "{e}");
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
