//! The inputs of a query as the router sees them: which input a topic's
//! records belong to, and each input's event-time column, stream name and
//! watermark delay. Worked out once per run, not once per record.

use super::builder::QueryBuilder;
use crate::time::TimestampMicros;
use std::sync::Arc;

/// One input of a query: the main stream (0) or a join's second stream or
/// table (1, 2, ...).
#[derive(Debug, Clone, Default)]
pub(super) struct Input {
    /// The column holding each row's event time (none for tables).
    pub(super) event_time: Option<Arc<str>>,
    /// The stream its watermark counts for (none without a stream join).
    pub(super) stream: Option<Arc<str>>,
    /// Its own watermark delay, when it differs from the query's.
    pub(super) delay: Option<TimestampMicros>,
    /// Whether it is a table (upserts and tombstones, no watermark).
    pub(super) table: bool,
}

/// Every input of a query, and the topics routed to each.
#[derive(Debug, Clone)]
pub(super) struct Inputs {
    inputs: Vec<Input>,
    /// Topics of the inputs other than the main stream.
    topics: Vec<(String, usize)>,
}

impl Inputs {
    /// The inputs `builder` declares.
    pub(super) fn of(builder: &QueryBuilder) -> Self {
        let only_tables = builder.side_inputs.iter().all(|s| s.stream.table);
        let mut inputs = vec![Input {
            event_time: builder.event_time.clone(),
            stream: (!only_tables).then(|| builder.main_stream.clone()),
            delay: None,
            table: false,
        }];
        let mut topics = Vec::new();
        for side in &builder.side_inputs {
            let stream = &side.stream;
            inputs.push(if stream.table {
                Input {
                    table: true,
                    ..Input::default()
                }
            } else {
                Input {
                    event_time: stream.event_time.clone(),
                    stream: Some(stream.name.clone()),
                    delay: stream.watermark.map(|d| d.as_micros() as i64),
                    table: false,
                }
            });
            topics.extend(stream.topics.iter().map(|t| (t.clone(), side.input)));
        }
        Inputs { inputs, topics }
    }

    /// Which input a record of `topic` belongs to: 0 for the main stream,
    /// else the join input reading that topic.
    pub(super) fn input_of(&self, topic: &str) -> usize {
        self.topics
            .iter()
            .find(|(t, _)| t == topic)
            .map_or(0, |(_, input)| *input)
    }

    /// Input number `input` (0 is the main stream).
    pub(super) fn get(&self, input: usize) -> &Input {
        &self.inputs[input]
    }

    /// Whether any input is a table.
    pub(super) fn has_tables(&self) -> bool {
        self.inputs.iter().any(|i| i.table)
    }

    /// Whether the query joins a second input (a stream or a table).
    pub(super) fn joins(&self) -> bool {
        self.inputs.len() > 1
    }
}
