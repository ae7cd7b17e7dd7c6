//! Lowering: a pipeline file becomes the same `QueryBuilder` a Rust
//! program calls, its topology split at repartition topics.

use crate::{
    FrontierBasisYaml, PipelineFile, ProcessYaml, ProcessorStepBuilder, SeededStepBuilder,
    SourceKind, StepSpec, UnionYaml, WindowAggregateSpec,
};
use std::sync::Arc;
use tidemark::decode::{ByTopicDecoder, JsonDecoder};
use tidemark::error::{Error, Result};
use tidemark::runtime::{Clock, QueryBuilder, Topology};
use tidemark::test_driver::PipelineTestDriver;

/// A union's second stream as the builder takes it.
fn union_input(u: &UnionYaml, main_topics: &[String]) -> Result<tidemark::runtime::JoinInput> {
    if let Some(topic) = u.topic.0.iter().find(|t| main_topics.contains(t)) {
        return Err(Error::config(
            "union.topic",
            format!("`{topic}` is the source's own topic: a union reads a second stream (records are routed by topic, so a topic cannot feed both)"),
        ));
    }
    let mut input = tidemark::runtime::JoinInput::new(&u.stream_name())
        .topics(&u.topic.0)
        .schema(u.schema.0.clone());
    if let Some(column) = &u.event_time {
        input = input.event_time(column);
    }
    if let Some(w) = u.watermark {
        input = input.watermark(&w.to_spark_string())?;
    }
    if let Some(keys) = &u.keyed_by {
        input = input.keyed_by(keys);
    }
    with_stream_steps(input, &u.steps, "union")
}

/// `input` with the stateless `steps` that a `join`'s or `union`'s
/// (`step`) second stream runs before it.
fn with_stream_steps(
    mut input: tidemark::runtime::JoinInput,
    steps: &[StepSpec],
    step: &str,
) -> Result<tidemark::runtime::JoinInput> {
    for spec in steps {
        input = match spec {
            StepSpec::Filter(e) => input.filter(&e.0)?,
            StepSpec::Select(s) => input.select(&s.0),
            StepSpec::WithColumn(w) => input.with_column(&w.name, &w.expr.0)?,
            _ => {
                return Err(Error::config(
                    format!("{step}.steps"),
                    format!("only filter, select and with_column run on the {step}'s second stream before the {step}"),
                ))
            }
        };
    }
    Ok(input)
}

impl PipelineFile {
    /// A test driver ([`PipelineTestDriver`]) for this file, with the
    /// processors and code steps the program registered on it (see
    /// [`test_driver`](crate::test_driver)).
    pub fn test_driver(self) -> Result<PipelineTestDriver> {
        let mut decoder = ByTopicDecoder::new(Box::new(JsonDecoder::new(self.schema())));
        let query = self.query_builder()?;
        let inputs = query.plan().second_inputs().into_iter();
        for joined in inputs.filter(|i| i.kind != tidemark::runtime::SecondInputKind::GlobalTable) {
            for topic in &joined.topics {
                let schema = joined.schema.clone();
                decoder = decoder.topic(topic, Box::new(JsonDecoder::new(schema)));
            }
        }
        Ok(PipelineTestDriver::new(query.decoder(decoder)))
    }

    /// The stages this pipeline runs in (see [`QueryBuilder::into_topology`]):
    /// a Kafka source whose first grouping is not on the record key
    /// (`source.keyed_by`), or whose stream join's topics are keyed by
    /// other columns or not `co_partitioned`, is split at repartition
    /// topics; any other runs as one stage.
    pub fn topology(&self, co_partitioned: bool) -> Result<Topology> {
        let mut query = self.query_builder()?;
        if self.source.kind != SourceKind::Kafka {
            return Ok(Topology {
                stages: vec![query.single_stage()],
            });
        }
        if let Some(keys) = &self.source.keyed_by {
            query = query.keyed_by(keys);
        }
        if !co_partitioned {
            query = query.repartition_joins();
        }
        let join_keys = query.plan().stream_join_keys();
        let topology = query.into_topology();
        if let (true, Some(keys)) = (topology.is_repartitioned(), join_keys) {
            // The join's reader reads rows keyed by the left join keys, not
            // by `source.keyed_by`: its groupings must hold on those.
            self.query_builder()?
                .keyed_by(&keys)
                .plan()
                .check_join_partitioning(true)?;
        }
        Ok(topology)
    }

    /// A `window_aggregate` step added to `b`: over the event time, or with
    /// `time: window` over an earlier window aggregation's windows.
    fn window_aggregate_step(
        &self,
        b: QueryBuilder,
        w: &WindowAggregateSpec,
    ) -> Result<QueryBuilder> {
        let aggregates = w
            .aggregates
            .iter()
            .map(|a| {
                if a.range.is_some() {
                    return Err(Error::config(
                        "aggregates.range",
                        "`range` belongs to rolling_window measures; window_aggregate takes its window from `window`",
                    ));
                }
                a.spec()
            })
            .collect::<Result<Vec<_>>>()?;
        match w.time.as_deref() {
            Some("window") => {
                b.window_aggregate_of_windows(&w.keys, w.window.0.clone(), aggregates)
            }
            Some(t) if Some(t) != self.event_time.as_deref() => {
                Err(Error::config(
                    "window_aggregate.time",
                    format!(
                        "`{t}` is not a time this step can window: use `window` (an earlier window aggregation's window) or leave it out (the event time{})",
                        self.event_time
                            .as_deref()
                            .map(|c| format!(", `{c}`"))
                            .unwrap_or_default()
                    ),
                ))
            }
            _ => Ok(b.window_aggregate(&w.keys, w.window.0.clone(), aggregates)),
        }
    }

    /// Registers the stateful processor `name` for the file's `process`
    /// steps that name it: `build` makes each task's processor and
    /// declares its states (see [`QueryBuilder::process`]). It replaces a
    /// processor registered before under the same name.
    pub fn with_processor<P, F>(mut self, name: &str, build: F) -> Self
    where
        P: tidemark::operators::StatefulProcessor,
        F: Fn(&mut tidemark::operators::StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        let build = Arc::new(build);
        let step_name = name.to_string();
        let add: ProcessorStepBuilder = Arc::new(move |b: QueryBuilder, keys: &[String]| {
            let build = build.clone();
            b.process(&step_name, keys, move |d| build(d))
        });
        self.processors.processors.insert(name.to_string(), add);
        self
    }

    /// [`PipelineFile::with_processor`] for a processor that also takes an
    /// initial state of type `S`: a file's step names its topic with
    /// `process: {processor, keys, initial_state: {topic, schema}}`
    /// (see [`QueryBuilder::process_with_initial_state`]).
    pub fn with_processor_and_initial_state<P, S, F>(self, name: &str, build: F) -> Self
    where
        P: tidemark::operators::HandleInitialState<S>,
        S: serde::de::DeserializeOwned + Send + 'static,
        F: Fn(&mut tidemark::operators::StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        let build = Arc::new(build);
        let seeded_build = build.clone();
        let step_name = name.to_string();
        let seeded: SeededStepBuilder = Arc::new(
            move |b: QueryBuilder, keys: &[String], initial: tidemark::runtime::JoinInput| {
                let build = seeded_build.clone();
                b.process_with_initial_state::<P, S, _, _>(
                    &step_name,
                    keys,
                    move |d| build(d),
                    initial,
                )
            },
        );
        let mut file = self.with_processor(name, move |d| build(d));
        file.processors.seeded.insert(name.to_string(), seeded);
        file
    }

    /// Registers steps written in Rust on the query builder — any built-in
    /// operator, typed maps, async calls — for the file's `code: <name>`
    /// steps: `add` appends them where the file names them. It replaces
    /// steps registered before under the same name.
    pub fn with_steps(
        mut self,
        name: &str,
        add: impl Fn(QueryBuilder) -> Result<QueryBuilder> + Send + Sync + 'static,
    ) -> Self {
        let add: ProcessorStepBuilder = Arc::new(move |b: QueryBuilder, _: &[String]| add(b));
        self.processors.code_steps.insert(name.to_string(), add);
        self
    }

    /// Adds a `process` or `code` step: what the program registered under
    /// the name the file gives.
    fn add_registered_step(&self, b: QueryBuilder, step: &StepSpec) -> Result<QueryBuilder> {
        Ok(match step {
            StepSpec::Process(ProcessYaml {
                processor,
                keys,
                initial_state: Some(initial),
            }) => match self.processors.seeded.get(processor) {
                _ if self.source.kind != SourceKind::Kafka => {
                    return Err(Error::config(
                        "steps[].process.initial_state",
                        "an initial state is a Kafka topic read beside a Kafka source",
                    ))
                }
                _ if initial.topic.0.iter().any(|t| {
                    self.source.topic.as_ref().is_some_and(|s| s.0.contains(t))
                }) =>
                {
                    return Err(Error::config(
                        "steps[].process.initial_state.topic",
                        "the initial state's topic is the source's own: give it a topic of its own",
                    ))
                }
                Some(add) => {
                    let input = tidemark::runtime::JoinInput::table(&initial.input_name())
                        .topics(&initial.topic.0)
                        .schema(initial.schema.0.clone());
                    add(b, keys, input)?
                }
                None => {
                    return Err(Error::config(
                        "steps[].process.initial_state",
                        format!(
                            "the processor `{processor}` takes no initial state: a program \
                             registers one that does with \
                             PipelineFile::with_processor_and_initial_state"
                        ),
                    ))
                }
            },
            StepSpec::Process(p) => match self.processors.processors.get(&p.processor) {
                Some(add) => add(b, &p.keys)?,
                None => {
                    return Err(Error::config(
                        "steps[].process.processor",
                        format!(
                            "no processor `{}` is registered; registered: {:?} (a program registers one with PipelineFile::with_processor)",
                            p.processor, self.processors
                        ),
                    ))
                }
            },
            StepSpec::Code(name) => match self.processors.code_steps.get(name) {
                Some(add) => add(b, &[])?,
                None => {
                    return Err(Error::config(
                        "steps[].code",
                        format!(
                            "no steps `{name}` are registered (a program registers them with PipelineFile::with_steps)"
                        ),
                    ))
                }
            },
            _ => b,
        })
    }

    /// Builds the query from the file's settings and steps. Source, sink,
    /// decoder and dead-letter output are the connectors' part.
    pub fn query_builder(&self) -> Result<QueryBuilder> {
        let mut b = tidemark::runtime::Query::builder(&self.name)
            .watermark_policy(self.multiple_watermark_policy)
            .watermark_scope(self.watermark_scope)
            .output_mode(self.output_mode)
            .trigger(self.trigger.0);
        if let (SourceKind::Kafka, Some(keys)) = (self.source.kind, &self.source.keyed_by) {
            // Known before the steps: a processor seeded from an initial
            // state checks that it runs where the records are.
            b = b.keyed_by(keys);
        }
        if let Some(c) = &self.event_time {
            b = b.event_time(c);
        }
        if let Some(w) = self.watermark {
            b = b.watermark(&w.to_spark_string())?;
        }
        if let Some(t) = self.idle_timeout {
            b = b.idle_timeout(t.0);
        }
        if let Some(clock) = &self.clock {
            b = b.clock(Clock::Virtual(
                clock.batch_times.iter().map(|t| t.0).collect(),
            ));
        }
        if let Some(m) = self.max_records_per_batch {
            b = b.max_records_per_batch(m);
        }
        if self.steps.iter().any(StepSpec::reads_a_second_input) {
            // The main stream's name in progress reports and in the
            // checkpointed watermark (a join or union written in code
            // calls it `main`, as it always has: a stored watermark keeps
            // the name its partitions were checkpointed under).
            let main = match &self.source.topic {
                Some(t) => t.0.join(","),
                None => "main".to_string(),
            };
            b = b
                .main_stream(&main)
                .main_columns(&self.schema().fields().map(|(n, _)| n).collect::<Vec<_>>());
        }
        for step in &self.steps {
            b = match step {
                StepSpec::TableJoin(t) => {
                    let name = t.table_name();
                    let table = tidemark::runtime::JoinInput::table(&name)
                        .topics(&t.topic.0)
                        .schema(t.schema.0.clone());
                    let keep_unmatched = match t.join_type {
                        tidemark::operators::JoinType::Inner => false,
                        tidemark::operators::JoinType::LeftOuter => true,
                        other => {
                            return Err(Error::config(
                                "table_join.type",
                                format!(
                                    "a stream–table join is `inner` or `left_outer` (as in Kafka Streams), not {other:?}"
                                ),
                            ))
                        }
                    };
                    let on: Vec<(&str, &str)> =
                        t.on.iter()
                            .map(|k| (k.left.as_str(), k.right.as_str()))
                            .collect();
                    if t.global {
                        b.join_global_table(table, keep_unmatched, &on)?
                    } else {
                        b.join_table(table, keep_unmatched, &on)?
                    }
                }
                StepSpec::Join(j) => {
                    let mut input = tidemark::runtime::JoinInput::new(&j.stream_name())
                        .topics(&j.topic.0)
                        .event_time(&j.event_time)
                        .schema(j.schema.0.clone());
                    if let Some(w) = j.watermark {
                        input = input.watermark(&w.to_spark_string())?;
                    }
                    if let Some(keys) = &j.keyed_by {
                        input = input.keyed_by(keys);
                    }
                    input = with_stream_steps(input, &j.steps, "join")?;
                    let time = j.time_condition()?;
                    let on: Vec<(&str, &str)> =
                        j.on.iter()
                            .map(|k| (k.left.as_str(), k.right.as_str()))
                            .collect();
                    b.join(input, j.join_type, &on, time)?
                }
                StepSpec::Union(u) => {
                    let main = self.source.topic.clone().map(|t| t.0).unwrap_or_default();
                    b.union(union_input(u, &main)?)?
                }
                StepSpec::Filter(e) => b.filter(&e.0)?,
                StepSpec::Select(s) => b.select(&s.0),
                StepSpec::WithColumn(w) => b.with_column(&w.name, &w.expr.0)?,
                StepSpec::WindowAggregate(w) => self.window_aggregate_step(b, w)?,
                StepSpec::Dedup(d) if d.within_watermark => {
                    b.drop_duplicates_within_watermark(&d.keys)?
                }
                StepSpec::Dedup(d) => b.drop_duplicates(&d.keys)?,
                StepSpec::Distinct(_) => b.distinct()?,
                StepSpec::Process(_) | StepSpec::Code(_) => self.add_registered_step(b, step)?,
                StepSpec::RollingWindow(r) => {
                    let measures = r
                        .measures
                        .iter()
                        .map(|a| {
                            let m = tidemark::operators::RollingMeasure::new(a.spec()?);
                            match a.range {
                                Some(d) => m.over(&d.to_spark_string()),
                                None => Ok(m),
                            }
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let mut frontier = tidemark::operators::FrontierSpec::default();
                    if let Some(f) = &r.frontier {
                        if let Some(d) = f.delay {
                            frontier.delay_micros = tidemark::duration::micros(d.0);
                        }
                        if let Some(a) = &f.alias {
                            frontier.alias = a.as_str().into();
                        }
                        if f.basis == FrontierBasisYaml::EventTime {
                            frontier = frontier.on_event_time();
                        }
                    }
                    b.rolling_window(&r.partition_by, r.order_by.as_deref(), frontier, measures)?
                }
            };
        }
        b.plan()
            .check_join_partitioning(self.source.kind == SourceKind::Kafka)?;
        Ok(b)
    }
}
