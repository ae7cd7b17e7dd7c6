//! The `steps:` list: each step's keys, read and checked as they are
//! read; the processors and code steps a program registers by name.

use crate::values::strip_config_prefix;
use crate::{DurationSpec, SchemaSpec, TopicList};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use tidemark::aggregate::AggregateFn;
use tidemark::error::{Error, Result};
use tidemark::operators::{AggregateInput, AggregateSpec};
use tidemark::runtime::QueryBuilder;
use tidemark::window::WindowSpec;

/// An expression, checked on read.
#[derive(Debug, Clone, PartialEq)]
pub struct ExprSpec(pub String);

impl ExprSpec {
    /// `text` once it parses as a Spark SQL expression.
    pub fn parse(text: &str) -> Result<ExprSpec> {
        tidemark::expr::Expr::parse(text)?;
        Ok(ExprSpec(text.to_string()))
    }
}

impl<'de> Deserialize<'de> for ExprSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        ExprSpec::parse(&text).map_err(|e| de::Error::custom(e.to_string()))
    }
}

/// One step.
#[derive(Debug, Clone)]
pub enum StepSpec {
    /// `filter: "amount >= 0 and id != 'x'"`.
    Filter(ExprSpec),
    /// `select: [a, b]` or `select: {a: a, total: amount}` (output: source).
    Select(SelectSpec),
    /// `with_column: {name: cents, expr: "amount * 100"}`.
    WithColumn(WithColumnSpec),
    /// Windowed aggregation.
    WindowAggregate(WindowAggregateSpec),
    /// Rolling window: per-key aggregates over a look-back range ending at
    /// a moving frontier.
    RollingWindow(RollingWindowSpec),
    /// `dedup: {keys: [guid], within_watermark: true}`.
    Dedup(DedupYaml),
    /// `distinct: {}`.
    Distinct(DistinctYaml),
    /// A stream-stream join with a second stream.
    Join(Box<JoinYaml>),
    /// A stream–table join with a compacted topic (Kafka Streams' KTable).
    TableJoin(TableJoinYaml),
    /// Spark's `union` (by name) with a second stream.
    Union(Box<UnionYaml>),
    /// `process: {processor: card_velocity, keys: [card]}`: a stateful
    /// processor the program registered under that name
    /// ([`PipelineFile::with_processor`](crate::PipelineFile::with_processor)).
    Process(ProcessYaml),
    /// `code: features`: steps the program wrote on the query builder and
    /// registered under that name ([`PipelineFile::with_steps`](crate::PipelineFile::with_steps)).
    Code(String),
}

impl StepSpec {
    /// Whether the step reads a co-partitioned input beside the source: a
    /// stream join, a table join (not a global one), a union, or a
    /// processor's initial state.
    pub(crate) fn reads_a_second_input(&self) -> bool {
        match self {
            StepSpec::Join(_) | StepSpec::Union(_) => true,
            StepSpec::TableJoin(t) => !t.global,
            StepSpec::Process(p) => p.initial_state.is_some(),
            _ => false,
        }
    }
}

const STEP_NAMES: &str =
    "filter, select, with_column, window_aggregate, rolling_window, dedup, distinct, join, table_join, union, process, code";

/// `join: {topic, type, on, event_time, watermark, between | bounds | window, ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinYaml {
    /// The second stream's topic(s), co-partitioned with the source's (for
    /// the files source: the sub-directory of `source.path`).
    pub topic: TopicList,
    /// The stream's name in progress reports and in renamed columns
    /// (default: its first topic).
    #[serde(default)]
    pub name: Option<String>,
    /// `inner` (default), `left_outer`, `right_outer`, `full_outer` or
    /// `left_semi`.
    #[serde(default = "default_join_type", rename = "type")]
    pub join_type: tidemark::operators::JoinType,
    /// Key columns: a name present on both sides, or `{left: a, right: b}`.
    pub on: Vec<JoinKeyYaml>,
    /// The second stream's event-time column.
    pub event_time: String,
    /// The second stream's own watermark delay.
    #[serde(default)]
    pub watermark: Option<DurationSpec>,
    /// `[lower, upper]`: `right.event_time BETWEEN left.event_time + lower
    /// AND left.event_time + upper`, inclusive.
    #[serde(default)]
    pub between: Option<[String; 2]>,
    /// Instead of `between`, ends that may be strict: `[">= 0 seconds",
    /// "< 1 hour"]` is `right.event_time >= left.event_time AND
    /// right.event_time < left.event_time + 1 hour`.
    #[serde(default)]
    pub bounds: Option<[String; 2]>,
    /// Instead of `between`: both rows in the same tumbling window.
    #[serde(default)]
    pub window: Option<DurationSpec>,
    /// The second stream's column types (empty: inferred).
    #[serde(default)]
    pub schema: SchemaSpec,
    /// Stateless steps (filter, select, with_column) on the second stream
    /// before the join.
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    /// The columns the second stream's record key is made of. When this or
    /// `source.keyed_by` is set and differs from its side of `on`, both
    /// streams go through repartition topics keyed by the join key.
    #[serde(default)]
    pub keyed_by: Option<Vec<String>>,
}

impl JoinYaml {
    /// The time condition from `between`, `bounds` or `window` (at most one).
    pub(crate) fn time_condition(&self) -> Result<tidemark::operators::JoinTimeCondition> {
        use tidemark::operators::JoinTimeCondition;
        match (&self.between, &self.bounds, self.window) {
            (Some([lower, upper]), None, None) => JoinTimeCondition::between(lower, upper),
            (None, Some([lower, upper]), None) => JoinTimeCondition::bounds(lower, upper),
            (None, None, Some(w)) => Ok(JoinTimeCondition::Window {
                size_micros: tidemark::duration::micros(w.0),
            }),
            (None, None, None) => Ok(JoinTimeCondition::None),
            _ => Err(Error::config(
                "join.between",
                "set one of `between`, `bounds` or `window`, not several",
            )),
        }
    }
}

/// `union: {topic, name, event_time, watermark, schema, steps, keyed_by}`:
/// Spark's `union` of the rows so far with a second stream, columns matched
/// by name (`unionByName`, missing ones null), each stream with its own
/// watermark, combined by `multiple_watermark_policy`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnionYaml {
    /// The second stream's topic(s) (for the files source: the
    /// sub-directory of `source.path`).
    pub topic: TopicList,
    /// The stream's name in progress reports (default: its first topic).
    #[serde(default)]
    pub name: Option<String>,
    /// The second stream's event-time column (default: the main stream's).
    #[serde(default)]
    pub event_time: Option<String>,
    /// The second stream's own watermark delay; without one the stream
    /// takes no part in the query's watermark (as in Spark).
    #[serde(default)]
    pub watermark: Option<DurationSpec>,
    /// The second stream's column types (empty: inferred).
    #[serde(default)]
    pub schema: SchemaSpec,
    /// Stateless steps (filter, select, with_column) on the second stream
    /// before the union.
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    /// The columns the second stream's record key is made of: a later
    /// grouping on them (and on `source.keyed_by`) needs no repartition.
    #[serde(default)]
    pub keyed_by: Option<Vec<String>>,
}

impl UnionYaml {
    /// The stream's name.
    pub fn stream_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.topic.0.first().cloned())
            .unwrap_or_else(|| "union".into())
    }
}

/// `table_join: {topic, type, on, schema}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableJoinYaml {
    /// The table's compacted topic, co-partitioned with the source (for
    /// the files source: the sub-directory of `source.path`).
    pub topic: TopicList,
    /// The table's name in renamed columns (default: its first topic).
    #[serde(default)]
    pub name: Option<String>,
    /// `inner` (default: rows without a table row are dropped) or
    /// `left_outer` (kept with nulls).
    #[serde(default = "default_join_type", rename = "type")]
    pub join_type: tidemark::operators::JoinType,
    /// Key columns: a name present on both sides, or `{left: a, right: b}`.
    pub on: Vec<JoinKeyYaml>,
    /// The table's column types (empty: inferred).
    #[serde(default)]
    pub schema: SchemaSpec,
    /// `true`: a global table (Kafka Streams' GlobalKTable): every instance
    /// reads every partition of the topic, so it need not be co-partitioned
    /// with the source nor share its key.
    #[serde(default)]
    pub global: bool,
}

impl TableJoinYaml {
    /// The table's name.
    pub fn table_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.topic.0.first().cloned())
            .unwrap_or_else(|| "table".into())
    }
}

fn default_join_type() -> tidemark::operators::JoinType {
    tidemark::operators::JoinType::Inner
}

/// One join key: `adId`, or `{left: impressionAdId, right: clickAdId}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinKeyYaml {
    /// The left (main stream) column.
    pub left: String,
    /// The right (joined stream) column.
    pub right: String,
}

impl<'de> Deserialize<'de> for JoinKeyYaml {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Same(String),
            Pair { left: String, right: String },
        }
        match Raw::deserialize(d).map_err(|_| {
            de::Error::custom("a join key is a column name or `{left: <column>, right: <column>}`")
        })? {
            Raw::Same(c) => Ok(JoinKeyYaml {
                left: c.clone(),
                right: c,
            }),
            Raw::Pair { left, right } => Ok(JoinKeyYaml { left, right }),
        }
    }
}

impl JoinYaml {
    /// The stream's name.
    pub fn stream_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.topic.0.first().cloned())
            .unwrap_or_else(|| "right".into())
    }
}

/// `dedup: {keys, within_watermark}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupYaml {
    /// The columns identifying a duplicate.
    pub keys: Vec<String>,
    /// Spark's `dropDuplicatesWithinWatermark` (needs a watermark) instead
    /// of `dropDuplicates`.
    #[serde(default)]
    pub within_watermark: bool,
}

/// `process: {processor, keys, initial_state}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessYaml {
    /// The name the program registered the processor under.
    pub processor: String,
    /// The grouping columns: each key's rows go to one processor call.
    pub keys: Vec<String>,
    /// A topic seeding the processor's state (Spark's `initialState`).
    #[serde(default)]
    pub initial_state: Option<InitialStateYaml>,
}

/// `initial_state: {topic, name, schema}`: a topic co-partitioned with the
/// source, its records read as the processor's initial-state type.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitialStateYaml {
    /// The topic (a list: several co-partitioned topics).
    pub topic: TopicList,
    /// Its name in progress reports (default: its first topic).
    #[serde(default)]
    pub name: Option<String>,
    /// Its columns and their types.
    #[serde(default)]
    pub schema: SchemaSpec,
}

impl InitialStateYaml {
    /// The input's name: `name`, else the first topic.
    pub fn input_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.topic.0.first().cloned())
            .unwrap_or_else(|| "initial_state".into())
    }
}

/// Adds a registered processor's step (or code steps) to a builder.
pub type ProcessorStepBuilder =
    Arc<dyn Fn(QueryBuilder, &[String]) -> Result<QueryBuilder> + Send + Sync>;

/// Adds a registered processor's step seeded from an initial-state input.
pub type SeededStepBuilder = Arc<
    dyn Fn(QueryBuilder, &[String], tidemark::runtime::JoinInput) -> Result<QueryBuilder>
        + Send
        + Sync,
>;

/// The stateful processors and code steps a program offers its pipeline
/// files, by name (code cannot be written in a file: the file names it).
#[derive(Clone, Default)]
pub struct Processors {
    pub(crate) processors: BTreeMap<String, ProcessorStepBuilder>,
    /// Those that also take an initial state.
    pub(crate) seeded: BTreeMap<String, SeededStepBuilder>,
    pub(crate) code_steps: BTreeMap<String, ProcessorStepBuilder>,
}

impl fmt::Debug for Processors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.processors.keys()).finish()
    }
}

/// `distinct: {}` (no settings).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistinctYaml {}

impl<'de> Deserialize<'de> for StepSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StepSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a step: a map with one key, one of {STEP_NAMES}")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<StepSpec, A::Error> {
                let key: String = map
                    .next_key()?
                    .ok_or_else(|| de::Error::custom(format!("empty step; steps: {STEP_NAMES}")))?;
                let step = match key.as_str() {
                    "filter" => StepSpec::Filter(map.next_value()?),
                    "select" => StepSpec::Select(map.next_value()?),
                    "with_column" => StepSpec::WithColumn(map.next_value()?),
                    "window_aggregate" => StepSpec::WindowAggregate(map.next_value()?),
                    "rolling_window" => StepSpec::RollingWindow(map.next_value()?),
                    "dedup" => StepSpec::Dedup(map.next_value()?),
                    "distinct" => StepSpec::Distinct(map.next_value()?),
                    "join" => StepSpec::Join(map.next_value()?),
                    "table_join" => StepSpec::TableJoin(map.next_value()?),
                    "union" => StepSpec::Union(map.next_value()?),
                    "process" => StepSpec::Process(map.next_value()?),
                    "code" => StepSpec::Code(map.next_value()?),
                    other => {
                        return Err(de::Error::custom(format!(
                            "unknown step `{other}`; steps: {STEP_NAMES}"
                        )))
                    }
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "a step has exactly one key; write `{extra}` as a separate `- {extra}: ...` item"
                    )));
                }
                Ok(step)
            }
        }
        d.deserialize_map(V)
    }
}

/// `select` as a list of columns, or a map of output name to source column.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectSpec(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for SelectSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SelectSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of columns, or a map of output name to source column")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<SelectSpec, A::Error> {
                let mut out = Vec::new();
                while let Some(c) = seq.next_element::<String>()? {
                    out.push((c.clone(), c));
                }
                Ok(SelectSpec(out))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<SelectSpec, A::Error> {
                let mut out = Vec::new();
                while let Some((target, source)) = map.next_entry::<String, String>()? {
                    out.push((source, target));
                }
                Ok(SelectSpec(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `with_column: {name, expr}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WithColumnSpec {
    /// The new column.
    pub name: String,
    /// Its expression.
    pub expr: ExprSpec,
}

/// `window_aggregate: {keys, window, aggregates}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowAggregateSpec {
    /// Grouping columns besides the window.
    #[serde(default)]
    pub keys: Vec<String>,
    /// The window.
    pub window: WindowYaml,
    /// What places rows in windows: absent (or the `event_time` column)
    /// for the event time, `window` for the window an earlier window
    /// aggregation emitted (Spark's `window(window, ...)`, chained).
    #[serde(default)]
    pub time: Option<String>,
    /// The aggregates.
    pub aggregates: Vec<AggregateYaml>,
}

/// `rolling_window: {partition_by, order_by, frontier, measures}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollingWindowSpec {
    /// Grouping columns.
    pub partition_by: Vec<String>,
    /// The timestamp column ordering events (default: `event_time`).
    #[serde(default)]
    pub order_by: Option<String>,
    /// The frontier (default: processing time, no delay, `__frontier`).
    #[serde(default)]
    pub frontier: Option<FrontierYaml>,
    /// The measures: aggregates with a `range` (bounded) or without
    /// (lifetime).
    pub measures: Vec<AggregateYaml>,
}

/// `frontier: {delay: 5 seconds, alias: window_time, basis: processing_time}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontierYaml {
    /// How far the frontier stays behind its basis.
    #[serde(default)]
    pub delay: Option<DurationSpec>,
    /// The output column (default `__frontier`).
    #[serde(default)]
    pub alias: Option<String>,
    /// `processing_time` (default, as Databricks) or `event_time` (the
    /// watermark: deterministic, replayable).
    #[serde(default)]
    pub basis: FrontierBasisYaml,
}

/// What the frontier follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrontierBasisYaml {
    /// Processing time.
    #[default]
    ProcessingTime,
    /// The watermark.
    EventTime,
}

/// `{tumbling: d}`, `{sliding: d, slide: d}` or `{session: d}`, with an
/// optional `start_offset`.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowYaml(pub WindowSpec);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowFields {
    tumbling: Option<DurationSpec>,
    sliding: Option<DurationSpec>,
    slide: Option<DurationSpec>,
    session: Option<DurationSpec>,
    session_gap: Option<ExprSpec>,
    start_offset: Option<DurationSpec>,
}

impl<'de> Deserialize<'de> for WindowYaml {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let w = WindowFields::deserialize(d)?;
        let s = |d: DurationSpec| d.to_spark_string();
        let spec = match (w.tumbling, w.sliding, w.slide, w.session) {
            (None, None, None, None) if w.session_gap.is_some() => {
                WindowSpec::dynamic_session(&w.session_gap.as_ref().expect("checked").0)
            }
            _ if w.session_gap.is_some() => {
                return Err(de::Error::custom("`session_gap` (a per-row gap) stands alone in `window`"))
            }
            (Some(size), None, None, None) => WindowSpec::tumbling(&s(size)),
            (None, Some(size), Some(slide), None) => WindowSpec::sliding(&s(size), &s(slide)),
            (None, Some(_), None, None) => {
                return Err(de::Error::custom("a sliding window needs `slide`, e.g. {sliding: 6 hours, slide: 1 hour}"))
            }
            (None, None, None, Some(gap)) => WindowSpec::session(&s(gap)),
            _ => {
                return Err(de::Error::custom(
                    "write exactly one of {tumbling: <size>}, {sliding: <size>, slide: <slide>}, {session: <gap>}, {session_gap: <expression>}",
                ))
            }
        }
        .and_then(|spec| match w.start_offset {
            Some(o) => spec.with_offset(&s(o)),
            None => Ok(spec),
        })
        .map_err(|e| de::Error::custom(strip_config_prefix(&e)))?;
        Ok(WindowYaml(spec))
    }
}

/// `{fn: sum, column: amount, as: total}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AggregateYaml {
    /// The function (checked on read).
    #[serde(rename = "fn")]
    pub function: AggregateName,
    /// Its input column; omitted for `count` = `count(*)`.
    #[serde(default)]
    pub column: Option<String>,
    /// max_by / min_by: the column that decides which row's `column` is
    /// kept.
    #[serde(default)]
    pub by: Option<String>,
    /// The output name (default as Spark: `sum(amount)`).
    #[serde(default, rename = "as")]
    pub alias: Option<String>,
    /// approx_count_distinct: relative standard deviation (default 0.05).
    #[serde(default)]
    pub rsd: Option<Fraction>,
    /// approx_percentile: the percentage in [0, 1] (default 0.5).
    #[serde(default)]
    pub percentage: Option<Fraction>,
    /// approx_percentile: accuracy (default 10000).
    #[serde(default)]
    pub accuracy: Option<u32>,
    /// rolling_window only: the look-back range of a bounded measure;
    /// none is a lifetime measure.
    #[serde(default)]
    pub range: Option<DurationSpec>,
}

impl AggregateYaml {
    /// The aggregate this entry describes.
    pub fn spec(&self) -> Result<AggregateSpec> {
        let f = match self.function.0.as_str() {
            "approx_count_distinct" => {
                AggregateFn::approx_count_distinct(self.rsd.map_or(0.05, |r| r.0))
            }
            "approx_percentile" | "percentile_approx" => AggregateFn::approx_percentile(
                self.percentage.map_or(0.5, |p| p.0),
                self.accuracy.unwrap_or(10_000),
            ),
            name => AggregateFn::built_in(name)?,
        };
        let input = match (&self.column, &self.by) {
            (Some(c), Some(by)) if f.takes_ordering() => AggregateInput::By {
                value: c.as_str().into(),
                ordering: by.as_str().into(),
            },
            (_, None) if f.takes_ordering() => {
                return Err(Error::config(
                    "aggregates.by",
                    format!(
                    "`{}` needs `column` (the value kept) and `by` (the column ordering the rows)",
                    self.function.0
                ),
                ))
            }
            (_, Some(_)) if !f.takes_ordering() => {
                return Err(Error::config(
                    "aggregates.by",
                    format!(
                        "`{}` takes no `by`; `by` is for max_by and min_by",
                        self.function.0
                    ),
                ))
            }
            (Some(c), _) => AggregateInput::Column(c.as_str().into()),
            (None, _) if self.function.0 == "count" => AggregateInput::Star,
            (None, _) => {
                return Err(Error::config(
                    "aggregates.column",
                    format!("`{}` needs `column`", self.function.0),
                ))
            }
        };
        let spec = AggregateSpec::new(f, input);
        Ok(match &self.alias {
            Some(n) => spec.alias(n),
            None => spec,
        })
    }
}

/// A number in [0, 1], checked on read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fraction(pub f64);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if (0.0..=1.0).contains(&v) {
            Ok(Fraction(v))
        } else {
            Err(de::Error::custom(format!("{v} is not between 0 and 1")))
        }
    }
}

/// A built-in aggregate's name, checked on read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregateName(pub String);

impl<'de> Deserialize<'de> for AggregateName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        AggregateFn::built_in(&name).map_err(|e| de::Error::custom(strip_config_prefix(&e)))?;
        Ok(AggregateName(name))
    }
}
