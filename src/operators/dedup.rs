//! Deduplication with Spark's rules: `distinct()`, `dropDuplicates(keys)`
//! and `dropDuplicatesWithinWatermark(keys)`.
//!
//! A row whose event time is at or before the late-row watermark (the
//! previous batch's) is dropped as late. Otherwise the first row of a key
//! (in input order, within a batch too) is emitted at once and later rows of
//! that key are dropped. A key's state is evicted at the end of a batch
//! whose watermark in effect has reached its eviction time: the event time
//! itself when the event-time column is part of the key (`distinct`,
//! `dropDuplicates` with it), the first occurrence's event time plus the
//! watermark delay (`dropDuplicatesWithinWatermark`), never otherwise (the
//! state grows without bound; a warning says so).

use super::{encode_key_into, BatchContext, Operator};
use crate::error::{Error, Result};
use crate::progress::StateOperatorProgress;
use crate::row::{Row, Value};
use crate::time::TimestampMicros;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tidemark_state::StateStore;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Never evicted.
const FOREVER: TimestampMicros = TimestampMicros::MAX;

/// Which deduplication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupSpec {
    /// `distinct()`: every column is the key.
    Distinct,
    /// `dropDuplicates(keys)`.
    Keys(Vec<Arc<str>>),
    /// `dropDuplicatesWithinWatermark(keys)`, with the watermark delay.
    WithinWatermark {
        /// The key columns.
        keys: Vec<Arc<str>>,
        /// The watermark delay, in microseconds.
        delay_micros: i64,
    },
}

/// The deduplication operator (see the module documentation).
pub struct Deduplicate {
    spec: DedupSpec,
    event_time: Option<Arc<str>>,
    /// Key → eviction time.
    seen: HashMap<Vec<u8>, TimestampMicros>,
    evictions: BTreeSet<(TimestampMicros, Vec<u8>)>,
    /// Keys added (`Some`) or evicted (`None`) since the last checkpoint.
    changed: BTreeMap<Vec<u8>, Option<TimestampMicros>>,
    store: Option<Box<dyn StateStore>>,
    key_buffer: Vec<u8>,
    value_buffer: Vec<u8>,
    dropped_by_watermark: u64,
    dropped_duplicates: u64,
    late_rows: Vec<Row>,
    rows_updated: u64,
    rows_removed: u64,
}

impl Deduplicate {
    /// A deduplication over rows whose event time is `event_time` (the
    /// query's event-time column, if any).
    pub fn new(spec: DedupSpec, event_time: Option<Arc<str>>) -> Result<Self> {
        if let DedupSpec::Keys(keys) | DedupSpec::WithinWatermark { keys, .. } = &spec {
            if keys.is_empty() {
                return Err(Error::config("dedup.keys", "needs at least one column"));
            }
        }
        if matches!(spec, DedupSpec::WithinWatermark { .. }) && event_time.is_none() {
            return Err(Error::config(
                "dedup.within_watermark",
                "dropDuplicatesWithinWatermark needs a watermark: set `event_time` and `watermark`",
            ));
        }
        Ok(Deduplicate {
            spec,
            event_time,
            seen: HashMap::default(),
            evictions: BTreeSet::new(),
            changed: BTreeMap::new(),
            store: None,
            key_buffer: Vec::new(),
            value_buffer: Vec::new(),
            dropped_by_watermark: 0,
            dropped_duplicates: 0,
            late_rows: Vec::new(),
            rows_updated: 0,
            rows_removed: 0,
        })
    }

    /// Whether state is evicted at all (else it grows without bound).
    pub fn evicts(&self) -> bool {
        match &self.spec {
            DedupSpec::WithinWatermark { .. } => true,
            DedupSpec::Distinct => self.event_time.is_some(),
            DedupSpec::Keys(keys) => self
                .event_time
                .as_ref()
                .is_some_and(|t| keys.iter().any(|k| k == t)),
        }
    }

    fn event_time_of(&self, row: &Row) -> Option<TimestampMicros> {
        match row.get(self.event_time.as_deref()?) {
            Some(Value::Timestamp(t)) => Some(*t),
            _ => None,
        }
    }

    fn encode(&mut self, row: &Row) {
        let null = Value::Null;
        match &self.spec {
            DedupSpec::Distinct => {
                // Every column, by name, so that column order does not count.
                let mut columns: Vec<(&str, &Value)> = row.columns().collect();
                columns.sort_by(|a, b| a.0.cmp(b.0));
                self.key_buffer.clear();
                for (name, value) in columns {
                    self.key_buffer.extend_from_slice(name.as_bytes());
                    self.key_buffer.push(0xff);
                    encode_key_into(std::iter::once(value), &mut self.value_buffer);
                    self.key_buffer.extend_from_slice(&self.value_buffer);
                }
            }
            DedupSpec::Keys(keys) | DedupSpec::WithinWatermark { keys, .. } => {
                encode_key_into(
                    keys.iter().map(|k| row.get(k).unwrap_or(&null)),
                    &mut self.key_buffer,
                );
            }
        }
    }

    fn eviction_time(&self, event_time: Option<TimestampMicros>) -> TimestampMicros {
        match (&self.spec, event_time) {
            (DedupSpec::WithinWatermark { delay_micros, .. }, Some(t)) => {
                t.saturating_add(*delay_micros)
            }
            (_, Some(t)) if self.evicts() => t,
            _ => FOREVER,
        }
    }
}

impl Operator for Deduplicate {
    fn describe(&self) -> String {
        match &self.spec {
            DedupSpec::Distinct => "Deduplicate [all columns]".into(),
            DedupSpec::Keys(keys) => format!("Deduplicate {keys:?}"),
            DedupSpec::WithinWatermark { keys, .. } => {
                format!("DeduplicateWithinWatermark {keys:?}")
            }
        }
    }

    fn on_row(&mut self, row: Row, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let event_time = self.event_time_of(&row);
        if let Some(t) = event_time {
            if ctx.late_threshold > 0 && t <= ctx.late_threshold {
                self.dropped_by_watermark += 1;
                if ctx.collect_late_rows {
                    self.late_rows.push(row);
                }
                return Ok(());
            }
        }
        self.encode(&row);
        if self.seen.contains_key(&self.key_buffer) {
            self.dropped_duplicates += 1;
            return Ok(());
        }
        let evict_at = self.eviction_time(event_time);
        let key = self.key_buffer.clone();
        if evict_at != FOREVER {
            self.evictions.insert((evict_at, key.clone()));
        }
        self.changed.insert(key.clone(), Some(evict_at));
        self.seen.insert(key, evict_at);
        self.rows_updated += 1;
        out.push(row);
        Ok(())
    }

    fn on_batch_end(&mut self, ctx: &BatchContext, _out: &mut Vec<Row>) -> Result<()> {
        if self.event_time.is_none() {
            return Ok(());
        }
        while let Some((t, _)) = self.evictions.first() {
            if *t > ctx.watermark || ctx.watermark <= 0 {
                break;
            }
            let (_, key) = self.evictions.pop_first().expect("first exists");
            self.seen.remove(&key);
            self.changed.insert(key, None);
            self.rows_removed += 1;
        }
        Ok(())
    }

    fn take_late_rows(&mut self) -> Vec<Row> {
        std::mem::take(&mut self.late_rows)
    }

    fn is_stateful(&self) -> bool {
        true
    }

    fn open_state(
        &mut self,
        store: Box<dyn StateStore>,
        _cache_bytes: Option<usize>,
    ) -> Result<()> {
        self.seen.clear();
        self.evictions.clear();
        for (key, value) in store.prefix(b"")? {
            let bytes: [u8; 8] = value.as_slice().try_into().map_err(|_| {
                Error::Source("corrupt deduplication state: an 8-byte time expected".into())
            })?;
            let evict_at = i64::from_le_bytes(bytes);
            if evict_at != FOREVER {
                self.evictions.insert((evict_at, key.clone()));
            }
            self.seen.insert(key, evict_at);
        }
        self.store = Some(store);
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<()> {
        let changed = std::mem::take(&mut self.changed);
        match self.store.as_mut() {
            Some(store) => super::state_codec::write_changes(store.as_mut(), changed, |t| {
                t.to_le_bytes().to_vec()
            }),
            None => Ok(()),
        }
    }

    fn state_progress(&mut self) -> Option<StateOperatorProgress> {
        let mut custom_metrics = BTreeMap::new();
        custom_metrics.insert(
            "numDroppedDuplicateRows".to_string(),
            std::mem::take(&mut self.dropped_duplicates),
        );
        Some(StateOperatorProgress {
            operator_name: match self.spec {
                DedupSpec::WithinWatermark { .. } => "dedupeWithinWatermark".into(),
                _ => "dedupe".into(),
            },
            num_rows_total: self.seen.len() as u64,
            num_rows_updated: std::mem::take(&mut self.rows_updated),
            num_rows_removed: std::mem::take(&mut self.rows_removed),
            num_rows_dropped_by_watermark: std::mem::take(&mut self.dropped_by_watermark),
            memory_used_bytes: (self.seen.len() * 64) as u64,
            custom_metrics,
        })
    }
}
