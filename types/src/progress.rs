//! Progress reports with Spark's `StreamingQueryProgress` field names, and
//! their mirror in `metrics`.

use serde::Serialize;
use std::collections::BTreeMap;

/// One batch's report, serialized with Spark's field names.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QueryProgress {
    /// Stable query id (survives restarts of the same pipeline).
    pub id: String,
    /// Id of this run.
    pub run_id: String,
    /// The query's name.
    pub name: String,
    /// When the batch started (RFC 3339, UTC).
    pub timestamp: String,
    /// The batch id, from 0.
    pub batch_id: u64,
    /// Rows read in the batch (bad records included).
    pub num_input_rows: u64,
    /// Input rate over the interval since the previous batch started.
    pub input_rows_per_second: f64,
    /// Rows per second of this batch's processing.
    pub processed_rows_per_second: f64,
    /// The batch's whole processing time in milliseconds (Spark's
    /// `batchDuration`; `durationMs.triggerExecution`).
    pub batch_duration: u64,
    /// Phase durations in milliseconds, under Spark's names:
    /// `triggerExecution` (the whole batch), `latestOffset` (asking the
    /// source how far its input goes), `getBatch` (reading and decoding),
    /// `addBatch` (operators and sink writes), `commitOffsets` (the commit
    /// protocol: state, sink, offsets), and `walCommit` and `queryPlanning`,
    /// always 0: tidemark writes no offsets log ahead of a batch (the files
    /// source's log write is part of `getBatch`, Kafka offsets commit with
    /// the output) and plans a query once, at start.
    pub duration_ms: BTreeMap<String, u64>,
    /// Event-time statistics of the batch and the watermark used in it
    /// (`min`, `max`, `avg`, `watermark`, RFC 3339).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub event_time: BTreeMap<String, String>,
    /// One entry per stateful operator.
    pub state_operators: Vec<StateOperatorProgress>,
    /// One entry per source.
    pub sources: Vec<SourceProgress>,
    /// The sink.
    pub sink: SinkProgress,
    /// Real-time mode: processing latency of the batch's records in
    /// milliseconds, from the record's timestamp to its output handed to
    /// the sink (`p50`, `p99`, `p99.9`, `max`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub latency_ms: BTreeMap<String, u64>,
    /// Queries with a join: each stream's own watermark at the end of the
    /// batch (its maximum event time minus its delay, RFC 3339), which the
    /// `multiple_watermark_policy` combines into the next batch's global
    /// watermark (`eventTime.watermark`). A stream that has delivered
    /// nothing shows the epoch.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub stream_watermarks: BTreeMap<String, String>,
}

/// Spark's `StateOperatorProgress`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StateOperatorProgress {
    /// e.g. `stateStoreSave`.
    pub operator_name: String,
    /// State rows after the batch.
    pub num_rows_total: u64,
    /// State rows written in the batch.
    pub num_rows_updated: u64,
    /// State rows evicted in the batch.
    pub num_rows_removed: u64,
    /// Late (key, window) groups dropped, counted after per-batch
    /// aggregation, as Spark counts them.
    pub num_rows_dropped_by_watermark: u64,
    /// Estimated bytes of state.
    pub memory_used_bytes: u64,
    /// Extra counters; `numLateInputRows` counts raw late input rows.
    pub custom_metrics: BTreeMap<String, u64>,
}

/// Spark's `SourceProgress`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceProgress {
    /// What the source reads.
    pub description: String,
    /// Offsets before the batch (`{"topic":{"0":12}}` for Kafka).
    pub start_offset: serde_json::Value,
    /// Offsets after the batch.
    pub end_offset: serde_json::Value,
    /// How far the input went when the batch ended (Kafka: each assigned
    /// partition's end offset as last fetched, `{"topic":{"0":42}}`, as
    /// Spark writes it); null for a source that does not know.
    pub latest_offset: serde_json::Value,
    /// Rows read in the batch.
    pub num_input_rows: u64,
    /// Input rate.
    pub input_rows_per_second: f64,
    /// Processing rate.
    pub processed_rows_per_second: f64,
    /// Records sent to the dead-letter output in the batch (tidemark).
    pub num_bad_records: u64,
    /// Source-specific metrics, e.g. `offsetsBehindLatest` (consumer lag).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, String>,
}

impl SourceProgress {
    /// Each partition's lag at the end of the batch: its latest offset as
    /// last fetched less the batch's end offset, never below 0 — `(topic,
    /// partition, records)`, for the partitions both offsets name (a source
    /// that knows no latest offset has none).
    pub fn partition_lags(&self) -> Vec<(String, String, i64)> {
        let mut lags = Vec::new();
        let (Some(latest), Some(end)) =
            (self.latest_offset.as_object(), self.end_offset.as_object())
        else {
            return lags;
        };
        for (topic, partitions) in latest {
            let Some(partitions) = partitions.as_object() else {
                continue;
            };
            for (partition, latest) in partitions {
                let ended = end
                    .get(topic)
                    .and_then(|p| p.get(partition))
                    .and_then(|o| o.as_i64());
                if let (Some(latest), Some(ended)) = (latest.as_i64(), ended) {
                    lags.push((topic.clone(), partition.clone(), (latest - ended).max(0)));
                }
            }
        }
        lags
    }
}

/// Spark's `SinkProgress`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SinkProgress {
    /// What the sink writes.
    pub description: String,
    /// Rows written in the batch.
    pub num_output_rows: u64,
}

impl QueryProgress {
    /// The report as JSON, as Spark's `progress.json` prints it.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Mirrors the report in `metrics` counters, gauges and histograms.
    pub fn record_metrics(&self) {
        let name = self.name.clone();
        metrics::counter!("tidemark_input_rows_total", "query" => name.clone())
            .increment(self.num_input_rows);
        metrics::counter!("tidemark_output_rows_total", "query" => name.clone())
            .increment(self.sink.num_output_rows);
        metrics::counter!("tidemark_batches_total", "query" => name.clone()).increment(1);
        let bad: u64 = self.sources.iter().map(|s| s.num_bad_records).sum();
        metrics::counter!("tidemark_bad_records_total", "query" => name.clone()).increment(bad);
        metrics::gauge!("tidemark_input_rows_per_second", "query" => name.clone())
            .set(self.input_rows_per_second);
        if let Some(ms) = self.duration_ms.get("triggerExecution") {
            metrics::histogram!("tidemark_batch_duration_seconds", "query" => name.clone())
                .record(*ms as f64 / 1000.0);
        }
        if let Some(wm) = self
            .event_time
            .get("watermark")
            .and_then(|w| crate::time::parse_rfc3339(w))
        {
            metrics::gauge!("tidemark_watermark_seconds", "query" => name.clone())
                .set(wm as f64 / 1e6);
        }
        for source in &self.sources {
            for (topic, partition, lag) in source.partition_lags() {
                let labels = [
                    ("query", name.clone()),
                    ("topic", topic),
                    ("partition", partition),
                ];
                metrics::gauge!("tidemark_consumer_lag", &labels).set(lag as f64);
            }
        }
        for op in &self.state_operators {
            let labels = [
                ("query", name.clone()),
                ("operator", op.operator_name.clone()),
            ];
            metrics::gauge!("tidemark_state_rows", &labels).set(op.num_rows_total as f64);
            metrics::counter!("tidemark_rows_dropped_by_watermark_total", &labels)
                .increment(op.num_rows_dropped_by_watermark);
        }
    }
}

/// Receives each batch's progress (Spark's `StreamingQueryListener`).
pub trait ProgressListener: Send {
    /// Called after each batch commits.
    fn on_progress(&mut self, progress: &QueryProgress);
}

impl<F: FnMut(&QueryProgress) + Send> ProgressListener for F {
    fn on_progress(&mut self, progress: &QueryProgress) {
        self(progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partitions_lag_is_its_latest_offset_less_the_batchs_end() {
        let source = SourceProgress {
            end_offset: serde_json::json!({"in": {"0": 40, "1": 7}, "other": {"0": 3}}),
            latest_offset: serde_json::json!({"in": {"0": 42, "1": 7, "2": 9}, "other": {"0": 1}}),
            ..Default::default()
        };
        let mut lags = source.partition_lags();
        lags.sort();
        let lags: Vec<(&str, &str, i64)> = lags
            .iter()
            .map(|(t, p, l)| (t.as_str(), p.as_str(), *l))
            .collect();
        // Partition 2 has no end offset yet; a latest behind the end (a
        // fetch older than the batch) is no lag, not a negative one.
        assert_eq!(lags, [("in", "0", 2), ("in", "1", 0), ("other", "0", 0)]);
        let files = SourceProgress {
            end_offset: serde_json::json!({"files": 3}),
            latest_offset: serde_json::Value::Null,
            ..Default::default()
        };
        assert!(files.partition_lags().is_empty());
    }
}
