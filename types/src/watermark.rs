//! Event-time watermarks with Spark's micro-batch rules.
//!
//! Each input (a Kafka partition, or the file source) tracks the largest event
//! time it has delivered. Its watermark is that maximum minus the delay. The
//! tracker combines its inputs by [`WatermarkPolicy`] and never moves back.
//!
//! As in Spark (SPARK-40925), a micro-batch sees two watermarks: rows are judged
//! late against the watermark in effect in the *previous* batch, while emission
//! and eviction use the watermark in effect in *this* batch — the one computed
//! at the end of the previous batch.

use crate::time::TimestampMicros;
use std::collections::BTreeMap;

/// How the watermarks of several inputs combine
/// (`spark.sql.streaming.multipleWatermarkPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WatermarkPolicy {
    /// The slowest input sets the pace (Spark's default): nothing is dropped
    /// because one input ran ahead.
    #[default]
    Min,
    /// The fastest input sets the pace: lower latency, but the slower inputs'
    /// rows may be dropped as late.
    Max,
}

/// Over which inputs a stream's watermark is taken (`watermark_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WatermarkScope {
    /// Spark's: one maximum event time per stream over all its partitions,
    /// less the stream's delay; streams combined by the policy. A partition
    /// that runs ahead makes a lagging partition's older rows late.
    #[default]
    Query,
    /// Kafka Streams' stream time and Flink's per-split watermarks: every
    /// input partition its own watermark, all combined by the policy (under
    /// `min` the slowest partition sets the pace; nothing is late because
    /// another partition ran ahead).
    Partition,
}

/// One input partition's progress (checkpointed by [`checkpoint_inputs`]).
#[derive(Debug, Clone)]
struct InputProgress {
    max_event_time: TimestampMicros,
    last_active_processing_time: TimestampMicros,
    /// This input's own delay (a join's second stream has its own
    /// `withWatermark`); `None`: the tracker's.
    delay_micros: Option<i64>,
    /// The query input (stream) this partition belongs to, for progress
    /// and for the `min` rule on streams that never delivered.
    stream: Option<String>,
}

impl InputProgress {
    fn watermark(&self, default_delay: i64) -> TimestampMicros {
        self.max_event_time
            .saturating_sub(self.delay_micros.unwrap_or(default_delay))
    }
}

/// Tracks inputs' event times and the watermarks of the current batch.
///
/// ```
/// use tidemark_types::watermark::{WatermarkPolicy, WatermarkTracker};
/// let mut wm = WatermarkTracker::new(10_000_000, WatermarkPolicy::Min, None);
/// wm.observe("in/0", 60_000_000, 0);
/// assert_eq!(wm.in_effect(), 0); // the first batch runs with no watermark
/// wm.finish_batch(0);
/// assert_eq!(wm.in_effect(), 50_000_000);
/// assert_eq!(wm.late_threshold(), 0);
/// ```
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WatermarkTracker {
    delay_micros: i64,
    policy: WatermarkPolicy,
    idle_timeout_micros: Option<i64>,
    /// Not read from a checkpoint: the configuration's applies.
    #[serde(skip)]
    scope: WatermarkScope,
    /// Under the query scope, each input reports its whole stream's
    /// largest event time as far as its reader may count it (a repartition
    /// writer's markers): a stream's maximum is then the smallest of its
    /// inputs', so that a writer with rows still to write holds it back.
    /// Configuration, not read from a checkpoint.
    #[serde(skip)]
    aligned_inputs: bool,
    #[serde(with = "checkpoint_inputs")]
    inputs: BTreeMap<String, InputProgress>,
    /// Streams expected to deliver: under `min`, one that has delivered
    /// nothing yet counts as watermark 0 (Spark) and holds the rest back.
    #[serde(default)]
    expected_streams: Vec<String>,
    in_effect: TimestampMicros,
    previous: TimestampMicros,
}

impl WatermarkTracker {
    /// A tracker with `delay` (microseconds), a combining policy and an
    /// optional idle timeout after which a silent input stops holding the
    /// watermark back (Flink's idleness).
    pub fn new(
        delay_micros: i64,
        policy: WatermarkPolicy,
        idle_timeout_micros: Option<i64>,
    ) -> Self {
        WatermarkTracker {
            delay_micros,
            policy,
            idle_timeout_micros,
            scope: WatermarkScope::Partition,
            aligned_inputs: false,
            inputs: BTreeMap::new(),
            expected_streams: Vec::new(),
            in_effect: 0,
            previous: 0,
        }
    }

    /// The tracker taking each stream's watermark over `scope`.
    pub fn with_scope(mut self, scope: WatermarkScope) -> Self {
        self.scope = scope;
        self
    }

    /// Over which inputs a stream's watermark is taken.
    pub fn scope(&self) -> WatermarkScope {
        self.scope
    }

    /// The tracker of a repartition reader under the query scope, whose
    /// inputs each report their stream's largest event time as far as
    /// their writer counts it: a stream's maximum is the smallest reported,
    /// and an input registered but not reported yet holds its stream back
    /// (its writer has not written yet: every writer task reports, silent
    /// partitions too). With an idle timeout, an input idle that long
    /// takes no part.
    pub fn with_aligned_inputs(mut self) -> Self {
        self.aligned_inputs = true;
        self
    }

    /// The largest event time any input of `stream` (`None`: the unnamed
    /// main stream) delivered: what a repartition writer reports for its
    /// own partitions under the query scope (see
    /// [`WatermarkTracker::with_aligned_inputs`]). `None` before one did.
    pub fn stream_max_event_time(&self, stream: Option<&str>) -> Option<TimestampMicros> {
        self.delivered()
            .filter(|p| p.stream.as_deref() == stream)
            .map(|p| p.max_event_time)
            .max()
    }

    /// The inputs that delivered a row (not only registered).
    fn delivered(&self) -> impl Iterator<Item = &InputProgress> {
        self.inputs
            .values()
            .filter(|p| p.max_event_time != TimestampMicros::MIN)
    }

    /// Records that `input` delivered a row with `event_time` at
    /// `processing_time`.
    pub fn observe(
        &mut self,
        input: &str,
        event_time: TimestampMicros,
        processing_time: TimestampMicros,
    ) {
        self.observe_stream(input, None, None, event_time, processing_time)
    }

    /// Like [`WatermarkTracker::observe`], for an input of stream `stream`
    /// whose watermark delay is `delay_micros` (`None`: the tracker's):
    /// the streams of a join, each with its own `withWatermark`.
    pub fn observe_stream(
        &mut self,
        input: &str,
        stream: Option<&str>,
        delay_micros: Option<i64>,
        event_time: TimestampMicros,
        processing_time: TimestampMicros,
    ) {
        match self.inputs.get_mut(input) {
            Some(p) => {
                p.max_event_time = p.max_event_time.max(event_time);
                p.last_active_processing_time = processing_time;
                p.delay_micros = delay_micros.or(p.delay_micros);
                if p.stream.is_none() {
                    p.stream = stream.map(str::to_string);
                }
            }
            None => {
                self.inputs.insert(
                    input.to_string(),
                    InputProgress {
                        max_event_time: event_time,
                        last_active_processing_time: processing_time,
                        delay_micros,
                        stream: stream.map(str::to_string),
                    },
                );
            }
        }
    }

    /// Declares a stream that must deliver before the `min` policy lets the
    /// watermark move (Spark counts an input without data as watermark 0).
    pub fn expect_stream(&mut self, stream: &str) {
        if !self.expected_streams.iter().any(|s| s == stream) {
            self.expected_streams.push(stream.to_string());
        }
    }

    /// Each stream's watermark now (the `min` over its inputs; 0 for a
    /// stream that has delivered nothing), before the policy combines them.
    pub fn stream_watermarks(&self) -> BTreeMap<String, TimestampMicros> {
        let mut out: BTreeMap<String, TimestampMicros> = self
            .expected_streams
            .iter()
            .map(|s| (s.clone(), 0))
            .collect();
        let mut seen: BTreeMap<String, TimestampMicros> = BTreeMap::new();
        for p in self.inputs.values() {
            let (Some(stream), true) = (&p.stream, p.max_event_time != TimestampMicros::MIN) else {
                continue;
            };
            let w = p.watermark(self.delay_micros).max(0);
            let slot = seen.entry(stream.clone()).or_insert(w);
            *slot = match self.scope {
                WatermarkScope::Query if !self.aligned_inputs => (*slot).max(w),
                _ => (*slot).min(w),
            };
        }
        out.extend(seen);
        out
    }

    /// Makes `input` known before it delivers anything: under the `min`
    /// policy it then holds the watermark back until it reports.
    pub fn register(&mut self, input: &str, processing_time: TimestampMicros) {
        if !self.inputs.contains_key(input) {
            self.inputs.insert(
                input.to_string(),
                InputProgress {
                    max_event_time: TimestampMicros::MIN,
                    last_active_processing_time: processing_time,
                    delay_micros: None,
                    stream: None,
                },
            );
        }
    }

    /// Like [`WatermarkTracker::register`], for an input of stream
    /// `stream` with its own delay (a repartitioned join's origins).
    pub fn register_stream(
        &mut self,
        input: &str,
        stream: Option<&str>,
        delay_micros: Option<i64>,
        processing_time: TimestampMicros,
    ) {
        self.register(input, processing_time);
        if let Some(p) = self.inputs.get_mut(input) {
            p.delay_micros = delay_micros.or(p.delay_micros);
            if p.stream.is_none() {
                p.stream = stream.map(str::to_string);
            }
        }
    }

    /// The watermark in effect in this batch: emission and eviction use it.
    pub fn in_effect(&self) -> TimestampMicros {
        self.in_effect
    }

    /// The watermark in effect in the previous batch: rows whose window
    /// ends at or before it are late.
    pub fn late_threshold(&self) -> TimestampMicros {
        self.previous
    }

    /// The watermark the inputs support now, before it takes effect.
    pub fn candidate(&self, processing_time: TimestampMicros) -> Option<TimestampMicros> {
        let active = self
            .inputs
            .values()
            .filter(|p| match self.idle_timeout_micros {
                Some(timeout) => processing_time - p.last_active_processing_time < timeout,
                None => true,
            });
        if self.scope == WatermarkScope::Query {
            return self.query_candidate(processing_time);
        }
        let per_input = active.map(|p| p.watermark(self.delay_micros));
        match self.policy {
            WatermarkPolicy::Min => {
                let silent_stream = self.expected_streams.iter().any(|s| {
                    !self
                        .inputs
                        .values()
                        .any(|p| p.stream.as_deref() == Some(s.as_str()))
                });
                if silent_stream {
                    // A stream without data counts as watermark 0.
                    return Some(0);
                }
                per_input.min()
            }
            WatermarkPolicy::Max => per_input.max(),
        }
    }

    /// Spark's global watermark: each stream's maximum over the partitions
    /// that delivered, less its delay, combined across streams by the
    /// policy (under `min` an expected stream without data counts as 0;
    /// with an idle timeout, a stream whose partitions are all idle takes
    /// no part).
    fn query_candidate(&self, processing_time: TimestampMicros) -> Option<TimestampMicros> {
        let is_active = |p: &InputProgress| match self.idle_timeout_micros {
            Some(timeout) => processing_time - p.last_active_processing_time < timeout,
            None => true,
        };
        // Per stream: the maximum over every partition that delivered, any
        // still active; with aligned inputs, the minimum over the active,
        // one not reported yet (`MIN`) holding it.
        let mut per_stream: BTreeMap<Option<&str>, (Option<TimestampMicros>, bool)> =
            BTreeMap::new();
        let counted = self
            .inputs
            .values()
            .filter(|p| self.aligned_inputs || p.max_event_time != TimestampMicros::MIN);
        for p in counted {
            let (w, active) = (p.watermark(self.delay_micros), is_active(p));
            let slot = per_stream.entry(p.stream.as_deref()).or_default();
            slot.1 |= active;
            slot.0 = match (slot.0, self.aligned_inputs) {
                (kept, true) if !active => kept,
                (None, _) => Some(w),
                (Some(s), true) => Some(s.min(w)),
                (Some(s), false) => Some(s.max(w)),
            };
        }
        let per_stream: BTreeMap<Option<&str>, TimestampMicros> = per_stream
            .into_iter()
            .filter(|(_, (_, active))| *active)
            .filter_map(|(stream, (w, _))| Some((stream, w?)))
            .collect();
        // Never delivered (an idle stream that did is left out instead).
        let silent_stream = self.expected_streams.iter().any(|s| {
            !self.inputs.values().any(|p| {
                p.stream.as_deref() == Some(s.as_str()) && p.max_event_time != TimestampMicros::MIN
            })
        });
        match self.policy {
            WatermarkPolicy::Min if silent_stream => Some(0),
            WatermarkPolicy::Min => per_stream.values().copied().min(),
            WatermarkPolicy::Max => per_stream.values().copied().max(),
        }
    }

    /// Ends a batch: the watermark computed now takes effect in the next
    /// batch. Returns whether it moved (Spark then runs a no-data batch so
    /// that windows can close).
    pub fn finish_batch(&mut self, processing_time: TimestampMicros) -> bool {
        self.previous = self.in_effect;
        if let Some(candidate) = self.candidate(processing_time) {
            self.in_effect = self.in_effect.max(candidate);
        }
        self.in_effect != self.previous
    }

    /// Whether the next batch would move the watermark even with no data.
    pub fn would_advance(&self, processing_time: TimestampMicros) -> bool {
        self.candidate(processing_time)
            .is_some_and(|c| c > self.in_effect)
            || self.in_effect != self.previous
    }

    /// Takes the inputs' progress and watermarks from a checkpoint, keeping
    /// this tracker's delay, policy, idle timeout and expected streams (the
    /// configuration may have changed since: a checkpoint that waited for a
    /// stream the query no longer has would hold its watermark for ever).
    /// The watermark never moves back.
    pub fn restore(&mut self, saved: &WatermarkTracker) {
        for (input, p) in &saved.inputs {
            let entry = self
                .inputs
                .entry(input.clone())
                .or_insert_with(|| p.clone());
            entry.max_event_time = entry.max_event_time.max(p.max_event_time);
        }
        self.in_effect = self.in_effect.max(saved.in_effect);
        self.previous = self.previous.max(saved.previous);
    }

    /// Forgets every input's progress, keeping the watermarks: a
    /// checkpoint that must stay small. Restored, the tracker holds its
    /// watermark until its inputs report again.
    pub fn forget_inputs(&mut self) {
        self.inputs.clear();
    }

    /// The delay in microseconds.
    pub fn delay_micros(&self) -> i64 {
        self.delay_micros
    }
}

/// The inputs' progress as checkpointed: grouped by topic, each partition
/// an array `[max event time, last active, delay, stream]` with absent
/// trailing values left out, about 40 bytes a partition where named fields
/// per `topic/partition` took 115. The checkpoint rides in Kafka's
/// offset-commit metadata, which brokers cap at 4 KiB by default
/// (`offset.metadata.max.bytes`), and a repartition reader's watermark
/// holds every input partition upstream: about 75 fit in the runtime's
/// 3 KiB budget, beyond which it checkpoints without them
/// ([`WatermarkTracker::forget_inputs`]). Checkpoints written with named
/// fields per input still read.
mod checkpoint_inputs {
    use super::InputProgress;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

    pub(super) fn serialize<S: Serializer>(
        inputs: &BTreeMap<String, InputProgress>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut topics: BTreeMap<&str, serde_json::Map<String, Value>> = BTreeMap::new();
        for (origin, p) in inputs {
            // `topic/partition`; any other origin is kept whole.
            let (topic, partition) = match origin.rsplit_once('/') {
                Some((topic, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                    (topic, p)
                }
                _ => (origin.as_str(), ""),
            };
            let mut fields = vec![
                json!(p.max_event_time),
                json!(p.last_active_processing_time),
            ];
            if p.delay_micros.is_some() || p.stream.is_some() {
                fields.push(json!(p.delay_micros));
            }
            if let Some(stream) = &p.stream {
                fields.push(json!(stream));
            }
            topics
                .entry(topic)
                .or_default()
                .insert(partition.to_string(), Value::Array(fields));
        }
        topics.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, InputProgress>, D::Error> {
        let Value::Object(entries) = Value::deserialize(d)? else {
            return Err(serde::de::Error::custom("inputs: expected a map"));
        };
        let mut inputs = BTreeMap::new();
        for (key, value) in entries {
            if value.get("max_event_time").is_some() {
                // Named fields per `topic/partition`, as first written.
                inputs.insert(key, named(&value).map_err(serde::de::Error::custom)?);
                continue;
            }
            let Value::Object(partitions) = value else {
                return Err(serde::de::Error::custom(format!(
                    "inputs of `{key}`: expected a map"
                )));
            };
            for (partition, fields) in partitions {
                let origin = match partition.as_str() {
                    "" => key.clone(),
                    p => format!("{key}/{p}"),
                };
                let progress = compact(&fields).map_err(serde::de::Error::custom)?;
                inputs.insert(origin, progress);
            }
        }
        Ok(inputs)
    }

    fn named(v: &Value) -> Result<InputProgress, String> {
        let time = |name: &str| v.get(name).and_then(Value::as_i64);
        Ok(InputProgress {
            max_event_time: time("max_event_time").ok_or("max_event_time")?,
            last_active_processing_time: time("last_active_processing_time")
                .ok_or("last_active_processing_time")?,
            delay_micros: time("delay_micros"),
            stream: v.get("stream").and_then(Value::as_str).map(str::to_string),
        })
    }

    fn compact(v: &Value) -> Result<InputProgress, String> {
        let time = |i: usize| v.get(i).and_then(Value::as_i64);
        let (Some(max_event_time), Some(last_active_processing_time)) = (time(0), time(1)) else {
            return Err(format!("an input's progress needs two times, got {v}"));
        };
        Ok(InputProgress {
            max_event_time,
            last_active_processing_time,
            delay_micros: time(2),
            stream: v.get(3).and_then(Value::as_str).map(str::to_string),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000_000;

    /// Spark's watermark is one per stream, over all its partitions: a
    /// partition that runs ahead moves it; per partition, the slowest does.
    #[test]
    fn query_scope_takes_each_streams_maximum_and_partition_scope_the_slowest_partition() {
        let run = |scope| {
            let mut wm =
                WatermarkTracker::new(10 * MIN, WatermarkPolicy::Min, None).with_scope(scope);
            wm.observe("in/0", 60 * MIN, 0);
            wm.observe("in/1", 20 * MIN, 0);
            wm.register("in/2", 0); // no data: counts for neither
            wm.finish_batch(0);
            wm.in_effect()
        };
        assert_eq!(run(WatermarkScope::Query), 50 * MIN);
        assert_eq!(run(WatermarkScope::Partition), 0, "in/2 holds it");

        // Two streams: each its own maximum less its own delay, then `min`.
        let mut wm = WatermarkTracker::new(10 * MIN, WatermarkPolicy::Min, None)
            .with_scope(WatermarkScope::Query);
        wm.expect_stream("us");
        wm.expect_stream("eu");
        wm.observe_stream("us/0", Some("us"), None, 60 * MIN, 0);
        wm.observe_stream("us/1", Some("us"), None, 30 * MIN, 0);
        wm.finish_batch(0);
        assert_eq!(wm.in_effect(), 0, "eu has sent nothing: it counts as 0");
        wm.observe_stream("eu/0", Some("eu"), Some(30 * MIN), 70 * MIN, 0);
        wm.observe_stream("eu/1", Some("eu"), Some(30 * MIN), 45 * MIN, 0);
        wm.finish_batch(0);
        assert_eq!(wm.in_effect(), 40 * MIN);
        let streams = wm.stream_watermarks();
        assert_eq!((streams["us"], streams["eu"]), (50 * MIN, 40 * MIN));
        // A checkpoint carries progress, not the scope: the restoring
        // tracker's configuration applies.
        let saved: WatermarkTracker =
            serde_json::from_str(&serde_json::to_string(&wm).unwrap()).unwrap();
        assert_eq!(saved.scope(), WatermarkScope::default());
        let mut restored = WatermarkTracker::new(10 * MIN, WatermarkPolicy::Min, None)
            .with_scope(WatermarkScope::Partition);
        restored.restore(&saved);
        assert_eq!(restored.scope(), WatermarkScope::Partition);
        assert_eq!(restored.in_effect(), 40 * MIN);
    }

    /// A checkpoint that waited for a stream (one saved by a query that
    /// expected its main stream beside tables, which never report) does not
    /// make the restoring tracker wait for it: the configuration decides.
    #[test]
    fn restoring_keeps_the_configured_expected_streams() {
        let mut old = WatermarkTracker::new(0, WatermarkPolicy::Min, None);
        old.expect_stream("main");
        old.observe_stream("t/0", None, None, 10 * MIN, 0);
        old.finish_batch(0);
        assert_eq!(old.in_effect(), 0, "waits for `main`, which never reports");
        let saved: WatermarkTracker =
            serde_json::from_str(&serde_json::to_string(&old).unwrap()).unwrap();
        let mut restored = WatermarkTracker::new(0, WatermarkPolicy::Min, None);
        restored.restore(&saved);
        restored.observe_stream("t/0", None, None, 20 * MIN, 0);
        restored.finish_batch(0);
        assert_eq!(restored.in_effect(), 20 * MIN);
    }

    /// Behind a repartition under the query scope each writer reports its
    /// stream's maximum as far as it may count it: the stream's is the
    /// smallest report, so a writer with rows still to write (its report
    /// behind, or none yet) holds the watermark; an input idle past the
    /// timeout takes no part. A writer's tracker gives each stream's
    /// maximum.
    #[test]
    fn aligned_inputs_take_the_smallest_report_of_their_stream() {
        let aligned = |idle| {
            WatermarkTracker::new(10 * MIN, WatermarkPolicy::Min, idle)
                .with_scope(WatermarkScope::Query)
                .with_aligned_inputs()
        };
        let mut wm = aligned(None);
        wm.register("in/2", 0);
        wm.observe("in/0", 60 * MIN, 0);
        wm.observe("in/1", 20 * MIN, 0);
        wm.finish_batch(0);
        assert_eq!(wm.in_effect(), 0, "in/2's writer has not reported");
        wm.observe("in/2", 70 * MIN, 0);
        wm.finish_batch(0);
        assert_eq!(wm.in_effect(), 10 * MIN, "in/1's writer holds it");
        wm.observe("in/1", 60 * MIN, 0);
        wm.finish_batch(0);
        assert_eq!(wm.in_effect(), 50 * MIN);

        let mut idle = aligned(Some(5 * MIN));
        idle.observe("in/0", 20 * MIN, 0);
        idle.observe("in/1", 60 * MIN, 10 * MIN);
        idle.finish_batch(10 * MIN);
        assert_eq!(idle.in_effect(), 50 * MIN, "in/0 is idle");

        let mut writer = WatermarkTracker::new(10 * MIN, WatermarkPolicy::Min, None)
            .with_scope(WatermarkScope::Query);
        writer.observe_stream("a/0", Some("a"), None, 20 * MIN, 0);
        writer.observe_stream("a/1", Some("a"), None, 30 * MIN, 0);
        writer.observe_stream("b/0", Some("b"), None, 5 * MIN, 0);
        writer.observe("main/0", 7 * MIN, 0);
        writer.register("main/1", 0);
        let maxima = [Some("a"), Some("b"), None, Some("c")]
            .map(|stream| writer.stream_max_event_time(stream));
        assert_eq!(maxima, [Some(30 * MIN), Some(5 * MIN), Some(7 * MIN), None]);
    }

    /// A repartition reader's tracker holds every input partition upstream:
    /// 64 of them, with a 20-character topic name and real times, fit in
    /// Kafka's default 4 KiB of commit metadata with room to spare, and a
    /// checkpoint written with named fields still restores.
    #[test]
    fn a_checkpoint_of_many_inputs_fits_kafkas_commit_metadata_and_old_ones_read() {
        let now = 1_767_225_600_000_000;
        let mut wm = WatermarkTracker::new(10 * MIN, WatermarkPolicy::Min, None);
        for p in 0..64 {
            wm.observe(&format!("orders-events-2026/{p}"), now + p * 1_000_123, now);
        }
        wm.finish_batch(now);
        let text = serde_json::to_string(&wm).unwrap();
        assert!(text.len() < 3 * 1024, "{} bytes", text.len());
        let back: WatermarkTracker = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        // Origins of other shapes come back as they were.
        for origin in ["plain", "ends-with/", "a/b/c", "a/b/7", "x/01"] {
            wm.observe(origin, now, now);
        }
        let text = serde_json::to_string(&wm).unwrap();
        let back: WatermarkTracker = serde_json::from_str(&text).unwrap();
        let origins = |w: &WatermarkTracker| w.inputs.keys().cloned().collect::<Vec<_>>();
        assert_eq!(origins(&back), origins(&wm));

        let named = r#"{"delay_micros":600000000,"policy":"min","idle_timeout_micros":null,
            "inputs":{"in/0":{"max_event_time":1800000000,"last_active_processing_time":5,
                              "delay_micros":60000000,"stream":"clicks"}},
            "in_effect":1200000000,"previous":0}"#;
        let old: WatermarkTracker = serde_json::from_str(named).unwrap();
        let input = &old.inputs["in/0"];
        assert_eq!(
            (input.max_event_time, input.last_active_processing_time),
            (1_800_000_000, 5)
        );
        assert_eq!(
            (input.delay_micros, input.stream.as_deref()),
            (Some(60_000_000), Some("clicks"))
        );
        let again: WatermarkTracker =
            serde_json::from_str(&serde_json::to_string(&old).unwrap()).unwrap();
        assert_eq!(again.inputs["in/0"].stream.as_deref(), Some("clicks"));
    }

    #[test]
    fn lags_one_batch_and_never_moves_back() {
        let mut wm = WatermarkTracker::new(10 * MIN, WatermarkPolicy::Min, None);
        wm.observe("p0", 30 * MIN, 0);
        assert_eq!((wm.late_threshold(), wm.in_effect()), (0, 0));
        assert!(wm.finish_batch(0));
        assert_eq!((wm.late_threshold(), wm.in_effect()), (0, 20 * MIN));
        wm.observe("p0", 25 * MIN, 0);
        assert!(!wm.finish_batch(0) || wm.in_effect() == 20 * MIN);
        assert_eq!((wm.late_threshold(), wm.in_effect()), (20 * MIN, 20 * MIN));
    }

    #[test]
    fn policies_combine_inputs() {
        let mut min = WatermarkTracker::new(0, WatermarkPolicy::Min, None);
        let mut max = WatermarkTracker::new(0, WatermarkPolicy::Max, None);
        for wm in [&mut min, &mut max] {
            wm.observe("a", 10, 0);
            wm.observe("b", 50, 0);
            wm.finish_batch(0);
        }
        assert_eq!(min.in_effect(), 10);
        assert_eq!(max.in_effect(), 50);
    }

    #[test]
    fn a_registered_silent_input_holds_the_min_back() {
        let mut wm = WatermarkTracker::new(0, WatermarkPolicy::Min, None);
        wm.register("late-starter", 0);
        wm.observe("early", 50, 0);
        wm.finish_batch(0);
        assert_eq!(wm.in_effect(), 0);
        wm.observe("late-starter", 30, 0);
        wm.register("late-starter", 0);
        wm.finish_batch(0);
        assert_eq!(wm.in_effect(), 30);
    }

    #[test]
    fn streams_keep_their_own_delays_and_a_silent_stream_holds_min_at_zero() {
        let hour = 60 * MIN;
        let mut min = WatermarkTracker::new(hour, WatermarkPolicy::Min, None);
        min.expect_stream("impressions");
        min.expect_stream("clicks");
        min.observe_stream("imp/0", Some("impressions"), None, 13 * hour, 0);
        min.finish_batch(0);
        assert_eq!(min.in_effect(), 0, "clicks has delivered nothing");
        min.observe_stream("clk/0", Some("clicks"), Some(2 * hour), 13 * hour, 0);
        min.finish_batch(0);
        assert_eq!(min.in_effect(), 11 * hour, "min(13h - 1h, 13h - 2h)");
        assert_eq!(
            min.stream_watermarks(),
            BTreeMap::from([
                ("clicks".into(), 11 * hour),
                ("impressions".into(), 12 * hour)
            ])
        );
        let mut max = WatermarkTracker::new(hour, WatermarkPolicy::Max, None);
        max.observe_stream("imp/0", Some("impressions"), None, 13 * hour, 0);
        max.observe_stream("clk/0", Some("clicks"), Some(2 * hour), 13 * hour, 0);
        max.finish_batch(0);
        assert_eq!(max.in_effect(), 12 * hour);
    }

    #[test]
    fn idle_input_stops_holding_back() {
        let mut wm = WatermarkTracker::new(0, WatermarkPolicy::Min, Some(5 * MIN));
        wm.observe("quiet", 10, 0);
        wm.observe("busy", 50, 0);
        wm.finish_batch(MIN);
        assert_eq!(wm.in_effect(), 10);
        wm.observe("busy", 90, 10 * MIN);
        wm.finish_batch(10 * MIN);
        assert_eq!(wm.in_effect(), 90);
    }
}
