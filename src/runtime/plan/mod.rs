//! A query's plan: what it is — its steps, inputs, side inputs, tables,
//! watermark and settings — apart from the live resources (decoder, dead
//! letters, state backend, exchange, listeners) it runs with. The builder
//! makes it, the planner splits it into the plans of its stages, and
//! `describe`, the checks and the runtime read it without changing it.

mod second_inputs;
mod steps;

pub(crate) use second_inputs::{GlobalTable, MarkerStream, SideInput};
pub use second_inputs::{JoinInput, SecondInput, SecondInputKind};
pub use steps::OperatorFactory;
pub(crate) use steps::{columns_after, groups_stay_in_partition, partition_columns_after};
pub(crate) use steps::{Grouping, Step, StepShape};

use super::{Clock, Trigger};
use crate::error::{Error, Result};
use crate::operators::OutputMode;
use crate::row::Row;
use crate::time::TimestampMicros;
use crate::watermark::{WatermarkPolicy, WatermarkScope};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Why a union beside a join (or a table, or an initial state) is refused.
pub(crate) const UNION_BESIDE_JOIN: &str = "a union and a join in one pipeline are not supported yet: write the union's output to a topic and join it in a second pipeline";

/// Computes a row's event time (microseconds) when no column holds it.
pub type EventTimeExtractor = Arc<dyn Fn(&Row) -> Option<TimestampMicros> + Send + Sync>;

/// What a query is, as [`QueryBuilder`](super::QueryBuilder) made it (or
/// the planner, for one stage of it): read by `describe`, the checks and
/// the runtime, which never change it.
pub struct QueryPlan {
    pub(super) name: String,
    pub(super) id: Option<String>,
    pub(super) event_time: Option<Arc<str>>,
    pub(super) watermark: Option<Duration>,
    pub(super) policy: WatermarkPolicy,
    pub(super) scope: WatermarkScope,
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
    /// Global tables: their shared rows and key columns (their feeds are
    /// resources).
    pub(super) global_tables: Vec<GlobalTable>,
    /// The name of the main stream, in progress reports of joins.
    pub(super) main_stream: Arc<str>,
    /// The main stream's declared columns (a right outer join's nulls).
    pub(super) main_columns: Vec<Arc<str>>,
    pub(super) output_mode: OutputMode,
    pub(super) trigger: Trigger,
    pub(super) clock: Clock,
    pub(super) max_records_per_batch: usize,
    pub(super) event_time_extractor: Option<EventTimeExtractor>,
    pub(super) watermark_from_markers: bool,
    /// A repartition writer under the query scope: its markers carry, for
    /// each of its partitions, the stream's largest event time as far as
    /// its task may count it (see `markers`), not the partition's own.
    pub(super) forwards_stream_maxima: bool,
    /// Behind a repartition, the streams whose progress the markers carry
    /// by origin topic: a union's inputs, each with its own watermark.
    pub(super) marker_streams: Vec<MarkerStream>,
}

impl QueryPlan {
    /// A plan named `name` with no steps and the defaults Spark has:
    /// append mode, the default trigger, batches of at most 100 000
    /// records.
    pub(crate) fn new(name: &str) -> Self {
        QueryPlan {
            name: name.to_string(),
            id: None,
            event_time: None,
            watermark: None,
            policy: WatermarkPolicy::Min,
            scope: WatermarkScope::default(),
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
            event_time_extractor: None,
            watermark_from_markers: false,
            forwards_stream_maxima: false,
            marker_streams: Vec::new(),
        }
    }

    /// Spark's output mode.
    pub fn output_mode(&self) -> OutputMode {
        self.output_mode
    }

    /// When batches run.
    pub fn trigger(&self) -> Trigger {
        self.trigger
    }

    /// Whether this is a repartition writer under the query scope, whose
    /// markers carry its stream's maximum as far as it has read (see
    /// [`super::WatermarkMarker`]): with several instances it needs a
    /// [`QueryBuilder::watermark_exchange`](super::QueryBuilder::watermark_exchange) to count the others' progress.
    pub fn forwards_stream_maxima(&self) -> bool {
        self.forwards_stream_maxima
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
    /// columns ([`keyed_by`](super::QueryBuilder::keyed_by)) from the start. Also refuses
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
                partition_columns_after(columns, shapes)
                    .is_some_and(|p| groups_stay_in_partition(keys, &p))
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
    pub(crate) fn count_groupings(&self, kind: impl Fn(Grouping) -> bool) -> usize {
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

    /// Each store its stateful steps keep (`op<index>`) with what keeps it
    /// (see `StepShape::store_identity`): recorded with every task
    /// checkpoint, so that a changed chain is not restored into the wrong
    /// step.
    pub(crate) fn store_identities(&self) -> BTreeMap<String, String> {
        self.steps
            .iter()
            .enumerate()
            .filter_map(|(index, step)| {
                let identity = step.shape.store_identity()?;
                Some((format!("op{index}"), identity))
            })
            .collect()
    }

    /// The names of the global tables, which need a [`QueryBuilder::table_feed`](super::QueryBuilder::table_feed).
    pub fn global_table_names(&self) -> Vec<String> {
        self.global_tables
            .iter()
            .map(|t| t.name.to_string())
            .collect()
    }
}
