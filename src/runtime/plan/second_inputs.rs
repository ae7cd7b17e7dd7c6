//! What a plan reads beside its main stream: joined streams and tables,
//! initial states, unions' streams, global tables, and the streams whose
//! progress arrives in markers.

use super::steps::{OperatorFactory, StepShape};
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// A stream whose progress reaches a repartition reader in markers, by the
/// topics its origins name (`topic/partition`).
#[derive(Debug, Clone)]
pub(crate) struct MarkerStream {
    /// Its topics.
    pub(crate) topics: Vec<String>,
    /// Its name in `streamWatermarks`.
    pub(crate) stream: Arc<str>,
    /// Its own watermark delay (microseconds); `None`: it has no
    /// watermark and takes no part in the query's (Spark).
    pub(crate) delay: Option<i64>,
}

/// The second stream of a join: its topics, event-time column, watermark
/// and the stateless steps its rows go through before the join.
#[derive(Clone)]
pub struct JoinInput {
    pub(crate) name: Arc<str>,
    /// A table (compacted topic) for a stream–table join, not a stream.
    pub(crate) table: bool,
    pub(crate) topics: Vec<String>,
    pub(crate) event_time: Option<Arc<str>>,
    pub(crate) watermark: Option<Duration>,
    pub(crate) steps: Vec<OperatorFactory>,
    /// What each of `steps` does to the columns (a union lines rows up by
    /// the columns its streams end with).
    pub(crate) step_shapes: Vec<StepShape>,
    pub(crate) columns: Vec<Arc<str>>,
    /// Its columns' types, when given: the connectors decode its records
    /// by them.
    pub(crate) schema: crate::schema::Schema,
    /// The columns its records are keyed by, when known.
    pub(crate) keyed_by: Option<Vec<String>>,
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

/// A global table of the query: every task looks rows up in its one
/// copy, which the runtime fills from the table's feed.
#[derive(Clone)]
pub(crate) struct GlobalTable {
    pub(crate) name: Arc<str>,
    /// The topic it reads and its columns' types.
    pub(crate) input: SecondInput,
    pub(crate) keys: Vec<Arc<str>>,
    pub(crate) rows: crate::operators::SharedTable,
    /// The index of its join among the steps.
    pub(crate) step: usize,
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
    pub(crate) fn of(input: &JoinInput, kind: SecondInputKind) -> SecondInput {
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
    pub(crate) input: usize,
    /// The index of its join in the steps.
    pub(crate) join_at: usize,
    pub(crate) stream: JoinInput,
    /// The join's key columns on the main side.
    pub(crate) left_keys: Vec<String>,
    /// The join's key columns on this side.
    pub(crate) right_keys: Vec<String>,
    /// A join's stream, a table, an initial state or a union's stream.
    pub(crate) kind: SecondInputKind,
}

impl SideInput {
    /// A union's second stream rather than a join's.
    pub(crate) fn is_union(&self) -> bool {
        self.kind == SecondInputKind::Union
    }

    /// The column sets that partition the rows after this input's join,
    /// each with the step it holds from. A join's left keys do, except for
    /// the right rows of a right or full outer join that found no match:
    /// their left keys are null, and a key named differently on the right
    /// (written as itself, or `<stream>_<name>` when the left has that name
    /// too) is what still partitions them — a grouping must then include
    /// it as well. An initial state or a union partitions nothing.
    pub(crate) fn partitionings(&self) -> Vec<(Vec<String>, usize)> {
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
