//! The inputs of a query as the router sees them: which input a topic's
//! records belong to, and each input's event-time column, stream name and
//! watermark delay. Worked out once per run, not once per record.

use super::plan::QueryPlan;
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
    /// Whether its event times move the watermark (a union's stream
    /// without one of its own only has its time column read).
    pub(super) watermarked: bool,
}

/// Every input of a query, and the topics routed to each.
#[derive(Debug, Clone)]
pub(super) struct Inputs {
    inputs: Vec<Input>,
    /// Topics of the inputs other than the main stream.
    topics: Vec<(String, usize)>,
    /// Behind a repartition: the stream each marker origin's topic belongs
    /// to (a union's inputs), and the main stream for the other origins.
    marker_streams: Vec<super::plan::MarkerStream>,
    main_stream: Arc<str>,
}

impl Inputs {
    /// The inputs `plan` declares.
    pub(super) fn of(plan: &QueryPlan) -> Self {
        let only_tables = plan.side_inputs.iter().all(|s| s.stream.table);
        let mut inputs = vec![Input {
            event_time: plan.event_time.clone(),
            stream: (!only_tables).then(|| plan.main_stream.clone()),
            delay: None,
            table: false,
            watermarked: true,
        }];
        let mut topics = Vec::new();
        for side in &plan.side_inputs {
            let stream = &side.stream;
            inputs.push(if stream.table {
                Input {
                    table: true,
                    ..Input::default()
                }
            } else if side.is_union() && stream.watermark.is_none() {
                // Spark: a stream without `withWatermark` does not take part
                // in the global watermark; its times are still timestamps.
                Input {
                    event_time: stream.event_time.clone(),
                    ..Input::default()
                }
            } else {
                Input {
                    event_time: stream.event_time.clone(),
                    stream: Some(stream.name.clone()),
                    delay: stream.watermark.map(tidemark_types::duration::micros),
                    table: false,
                    watermarked: true,
                }
            });
            topics.extend(stream.topics.iter().map(|t| (t.clone(), side.input)));
        }
        Inputs {
            inputs,
            topics,
            marker_streams: plan.marker_streams.clone(),
            main_stream: plan.main_stream.clone(),
        }
    }

    /// The stream and delay a marker's `origin` (`topic/partition`) counts
    /// for, read on `input`: its own input's, unless the markers carry a
    /// union's streams, where the origin's topic tells its stream. `None`:
    /// the origin's stream has no watermark and takes no part.
    pub(super) fn origin_stream<'a>(
        &'a self,
        origin: &str,
        input: &'a Input,
    ) -> Option<(Option<&'a str>, Option<TimestampMicros>)> {
        if self.marker_streams.is_empty() {
            return Some((input.stream.as_deref(), input.delay));
        }
        let topic = origin.rsplit_once('/').map_or(origin, |(topic, _)| topic);
        match self
            .marker_streams
            .iter()
            .find(|m| m.topics.iter().any(|t| t == topic))
        {
            Some(m) => m.delay.map(|delay| (Some(&*m.stream), Some(delay))),
            None => Some((Some(&self.main_stream), None)),
        }
    }

    /// Which input a record of `topic` belongs to: 0 for the main stream,
    /// else the join or union input reading that topic.
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

    /// Whether the query joins or unions a second input (a stream or a
    /// table), or reads several streams' markers.
    pub(super) fn joins(&self) -> bool {
        self.inputs.len() > 1 || !self.marker_streams.is_empty()
    }
}
