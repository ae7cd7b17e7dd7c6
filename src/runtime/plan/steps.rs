//! The steps of a plan: how each is built for a task, and what it does to
//! the columns rows are partitioned by (which the planner and the join
//! checks read).

use crate::operators::{Operator, OutputMode};
use std::sync::Arc;

/// Builds one operator for one task; every task gets its own instances.
pub type OperatorFactory = Arc<dyn Fn(OutputMode) -> Box<dyn Operator> + Send + Sync>;

/// A step as the builder keeps it: how to build it for a task, and what it
/// does to the columns a partitioning rests on.
pub(crate) struct Step {
    /// Builds the operator, once per task.
    pub(crate) build: OperatorFactory,
    /// Its effect on the partitioning.
    pub(crate) shape: StepShape,
}

/// What a step does to the columns rows are partitioned by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StepShape {
    /// Keeps every column (a filter, a global-table lookup).
    Keeps,
    /// Adds or overwrites this column.
    Writes(String),
    /// Keeps only these `(input, output)` columns.
    Selects(Vec<(String, String)>),
    /// Unknown (a custom step): a partitioning does not survive it.
    Opaque {
        /// Whether its operator keeps state (asked once, when the step is
        /// added): it then gets a store like any stateful step.
        stateful: bool,
    },
    /// Keeps state per key of `keys`.
    Groups {
        /// The grouping columns.
        keys: Vec<String>,
        /// Which grouping.
        kind: Grouping,
    },
    /// Keeps state per whole row (`distinct`).
    Distinct,
    /// A stream–stream or stream–table join (state per join key).
    Joins,
    /// A union with a second stream whose records are keyed by `keyed_by`
    /// (when known): the rows stay partitioned only by those columns.
    Unions {
        /// The second stream's record-key columns.
        keyed_by: Option<Vec<String>>,
    },
}

/// The stateful groupings, as Spark's output-mode rules tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// A tumbling or sliding window aggregation.
    Aggregation,
    /// A session window aggregation.
    SessionAggregation,
    /// A rolling window.
    Rolling,
    /// `dropDuplicates`.
    Dedup,
    /// A user's stateful processor (`transformWithState`).
    Processor,
}

impl StepShape {
    /// Whether the step keeps state across batches.
    pub(crate) fn is_stateful(&self) -> bool {
        matches!(
            self,
            StepShape::Groups { .. }
                | StepShape::Distinct
                | StepShape::Joins
                | StepShape::Opaque { stateful: true }
        )
    }

    /// What keeps the step's store, as recorded with each task checkpoint
    /// (the kind of step and its key columns); `None` for a stateless
    /// step. Worded once and for good: a checkpoint written by an earlier
    /// release is compared with it.
    pub(crate) fn store_identity(&self) -> Option<String> {
        let grouping = |kind: &Grouping| match kind {
            Grouping::Aggregation => "window aggregation",
            Grouping::SessionAggregation => "session window aggregation",
            Grouping::Rolling => "rolling window",
            Grouping::Dedup => "deduplication",
            Grouping::Processor => "stateful processor",
        };
        match self {
            StepShape::Groups { keys, kind } => {
                Some(format!("{} by [{}]", grouping(kind), keys.join(", ")))
            }
            StepShape::Distinct => Some("distinct".into()),
            StepShape::Joins => Some("join".into()),
            StepShape::Opaque { stateful: true } => Some("custom stateful step".into()),
            _ => None,
        }
    }
}

/// Whether grouping by `group_keys` keeps every group inside one partition
/// of an input partitioned by `partition_keys`: when the grouping includes
/// every partitioning column, rows of one group share those columns and so
/// their partition (Spark's `ClusteredDistribution` is likewise satisfied
/// by hash partitioning on a subset of its keys). No partitioning column, no
/// such guarantee.
pub(crate) fn groups_stay_in_partition(group_keys: &[String], partition_keys: &[String]) -> bool {
    !partition_keys.is_empty() && partition_keys.iter().all(|k| group_keys.contains(k))
}

/// The names the partitioning columns `partition_keys` have after steps of
/// these shapes: a `select` may rename them; `None` when a step drops or
/// rewrites one (a `with_column` of that name, a `select` without it, a
/// step of unknown effect), since the rows are then no longer partitioned
/// by the values those names hold.
pub(crate) fn partition_columns_after<'a>(
    partition_keys: &[String],
    shapes: impl IntoIterator<Item = &'a StepShape>,
) -> Option<Vec<String>> {
    let mut columns = partition_keys.to_vec();
    for shape in shapes {
        match shape {
            StepShape::Writes(name) if columns.contains(name) => return None,
            StepShape::Opaque { .. } => return None,
            StepShape::Unions { keyed_by } => {
                let sorted = |mut k: Vec<String>| {
                    k.sort();
                    k
                };
                if keyed_by.clone().map(sorted) != Some(sorted(columns.clone())) {
                    return None;
                }
            }
            StepShape::Selects(select) => {
                columns = columns
                    .iter()
                    .map(|c| {
                        select
                            .iter()
                            .find(|(source, _)| source == c)
                            .map(|(_, output)| output.clone())
                    })
                    .collect::<Option<Vec<_>>>()?;
            }
            _ => {}
        }
    }
    Some(columns)
}

/// The columns rows have after steps of these shapes, starting from
/// `columns`; `None` when unknown (no columns declared, or a step whose
/// output columns the shapes do not tell).
pub(crate) fn columns_after<'a>(
    columns: &[Arc<str>],
    shapes: impl IntoIterator<Item = &'a StepShape>,
) -> Option<Vec<String>> {
    if columns.is_empty() {
        return None;
    }
    let mut out: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
    for shape in shapes {
        match shape {
            StepShape::Keeps => {}
            StepShape::Writes(name) if !out.contains(name) => out.push(name.clone()),
            StepShape::Writes(_) => {}
            StepShape::Selects(select) => {
                out = select.iter().map(|(_, output)| output.clone()).collect();
            }
            _ => return None,
        }
    }
    Some(out)
}
