//! Stream–table joins: Kafka Streams' `KStream#join(KTable)` and
//! `leftJoin(KTable)`.
//!
//! The table is a compacted topic, co-partitioned with the stream: its
//! records are upserts of the latest row per key and its tombstones (records
//! without a value) deletes. Each stream row looks its key up in the table
//! as it stands and leaves with the table row's columns added (inner: rows
//! without a table row are dropped; left: kept with nulls). Table updates do
//! not emit anything, as in Kafka Streams, where only the stream side
//! triggers a join. The table lives in the task's store like any operator
//! state, so it is checkpointed and restored with it.
//!
//! Keys are compared in their record-key form (the text of a single key
//! column, a JSON array for several, as tidemark's Kafka sink writes them),
//! so that a tombstone's record key finds the row it deletes.

use super::state_codec::{corrupt, put_row, Reader};
use super::{BatchContext, Operator};
use crate::error::{Error, Result};
use crate::progress::StateOperatorProgress;
use crate::row::{Row, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use tidemark_state::StateStore;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A stream–table join's settings.
#[derive(Debug, Clone)]
pub struct TableJoinSpec {
    /// `false`: rows without a table row are dropped (`join`); `true`:
    /// kept with the table's columns null (`leftJoin`).
    pub keep_unmatched: bool,
    /// Key columns of the stream rows.
    pub stream_keys: Vec<Arc<str>>,
    /// Key columns of the table rows, pairwise equal to `stream_keys`.
    pub table_keys: Vec<Arc<str>>,
    /// The table's name: a table column whose name the stream row already
    /// has is written as `<name>_<column>`.
    pub table_name: Arc<str>,
    /// The table's columns when declared (the nulls of an unmatched row).
    pub table_columns: Vec<Arc<str>>,
}

/// A global table (Kafka Streams' GlobalKTable): every partition of its
/// topic, shared by all tasks, fed by the query between batches.
pub type SharedTable = Arc<std::sync::RwLock<std::collections::HashMap<String, Row>>>;

/// The stream–table join operator (see the module documentation).
pub struct TableJoin {
    spec: TableJoinSpec,
    /// A global table instead of the task's own.
    global: Option<SharedTable>,
    table: HashMap<String, Row>,
    /// Keys written (`Some`) or deleted (`None`) since the last checkpoint.
    changed: BTreeMap<String, Option<Row>>,
    store: Option<Box<dyn StateStore>>,
    columns: Vec<Arc<str>>,
    bytes: usize,
    rows_updated: u64,
    rows_removed: u64,
    unmatched: u64,
}

const STATE_VERSION: u8 = 1;

/// The record-key form of `columns` of `row`: the text of one column, a
/// JSON array of several (what the Kafka sink writes as the key).
pub fn record_key(row: &Row, columns: &[Arc<str>]) -> Option<String> {
    match columns {
        [one] => match row.get(one) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.to_string()),
        },
        many => {
            let values: Vec<serde_json::Value> = many
                .iter()
                .map(|c| row.get(c).map(Value::to_json).unwrap_or_default())
                .collect();
            if values.iter().any(|v| v.is_null()) {
                return None;
            }
            Some(serde_json::Value::Array(values).to_string())
        }
    }
}

impl TableJoin {
    /// A stream–table join as `spec` says; the spec is checked.
    pub fn new(spec: TableJoinSpec) -> Result<Self> {
        if spec.stream_keys.is_empty() || spec.stream_keys.len() != spec.table_keys.len() {
            return Err(Error::config(
                "table_join.on",
                "a table join needs at least one key column, as many on the table as on the stream",
            ));
        }
        Ok(TableJoin {
            columns: spec.table_columns.clone(),
            spec,
            global: None,
            table: HashMap::default(),
            changed: BTreeMap::new(),
            store: None,
            bytes: 0,
            rows_updated: 0,
            rows_removed: 0,
            unmatched: 0,
        })
    }

    /// A join against `table`, a global table every task shares: the
    /// operator keeps no state of its own.
    pub fn global(spec: TableJoinSpec, table: SharedTable) -> Result<Self> {
        let mut join = TableJoin::new(spec)?;
        join.global = Some(table);
        Ok(join)
    }

    fn upsert(&mut self, row: Row) -> Result<()> {
        let Some(key) = record_key(&row, &self.spec.table_keys) else {
            return Err(Error::Source(format!(
                "table `{}`: a row without its key {:?}",
                self.spec.table_name, self.spec.table_keys
            )));
        };
        for (name, _) in row.entries() {
            if !self.columns.contains(name) {
                self.columns.push(name.clone());
            }
        }
        if self.store.is_some() {
            self.changed.insert(key.clone(), Some(row.clone()));
        }
        self.bytes += key.len() + 64;
        self.table.insert(key, row);
        self.rows_updated += 1;
        Ok(())
    }

    fn delete(&mut self, key: &str) {
        if self.table.remove(key).is_some() {
            self.bytes = self.bytes.saturating_sub(key.len() + 64);
            self.rows_removed += 1;
            if self.store.is_some() {
                self.changed.insert(key.to_string(), None);
            }
        }
    }

    fn enrich(&self, mut row: Row, table_row: Option<&Row>) -> Row {
        super::join::add_other_side(
            &mut row,
            table_row,
            &self.columns,
            (&self.spec.stream_keys, &self.spec.table_keys),
            &self.spec.table_name,
        );
        row
    }
}

fn encode_row(row: &Row) -> Vec<u8> {
    let mut out = vec![STATE_VERSION];
    put_row(row, &mut out);
    out
}

fn decode_row(bytes: &[u8]) -> Result<Row> {
    let mut r = Reader(bytes);
    if r.u8()? != STATE_VERSION {
        return Err(corrupt("unknown table layout"));
    }
    r.row()
}

impl Operator for TableJoin {
    fn describe(&self) -> String {
        format!(
            "StreamTableJoin {} {:?} = {}.{:?}",
            if self.spec.keep_unmatched {
                "LeftOuter"
            } else {
                "Inner"
            },
            self.spec.stream_keys,
            self.spec.table_name,
            self.spec.table_keys
        )
    }

    fn on_row(&mut self, row: Row, _ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let key = record_key(&row, &self.spec.stream_keys);
        let found = match (&self.global, &key) {
            (_, None) => None,
            (Some(shared), Some(k)) => shared
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(k)
                .cloned(),
            (None, Some(k)) => self.table.get(k).cloned(),
        };
        match found {
            Some(t) => out.push(self.enrich(row, Some(&t))),
            None if self.spec.keep_unmatched => {
                self.unmatched += 1;
                out.push(self.enrich(row, None));
            }
            None => self.unmatched += 1,
        }
        Ok(())
    }

    fn on_input_row(
        &mut self,
        input: usize,
        row: Row,
        ctx: &BatchContext,
        out: &mut Vec<Row>,
    ) -> Result<()> {
        match input {
            0 => self.on_row(row, ctx, out),
            _ => self.upsert(row),
        }
    }

    fn on_input_tombstone(&mut self, _input: usize, key: &[u8]) -> Result<()> {
        let key = std::str::from_utf8(key).map_err(|_| {
            Error::Source(format!(
                "table `{}`: a tombstone whose key is not UTF-8 text",
                self.spec.table_name
            ))
        })?;
        self.delete(key);
        Ok(())
    }

    fn is_stateful(&self) -> bool {
        // A global table is the query's, fed from its topic at start.
        self.global.is_none()
    }

    fn open_state(
        &mut self,
        store: Box<dyn StateStore>,
        _cache_bytes: Option<usize>,
    ) -> Result<()> {
        self.table.clear();
        for (key, value) in store.prefix(b"")? {
            let key = String::from_utf8(key).map_err(|_| corrupt("table key is not UTF-8"))?;
            let row = decode_row(&value)?;
            for (name, _) in row.entries() {
                if !self.columns.contains(name) {
                    self.columns.push(name.clone());
                }
            }
            self.bytes += key.len() + 64;
            self.table.insert(key, row);
        }
        self.store = Some(store);
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<()> {
        let changed = std::mem::take(&mut self.changed);
        match self.store.as_mut() {
            Some(store) => super::state_codec::write_changes(store.as_mut(), changed, encode_row),
            None => Ok(()),
        }
    }

    fn state_progress(&mut self) -> Option<StateOperatorProgress> {
        let mut custom_metrics = BTreeMap::new();
        custom_metrics.insert(
            "numUnmatchedStreamRows".into(),
            std::mem::take(&mut self.unmatched),
        );
        if self.global.is_some() {
            return None;
        }
        Some(StateOperatorProgress {
            operator_name: "streamTableJoin".into(),
            num_rows_total: self.table.len() as u64,
            num_rows_updated: std::mem::take(&mut self.rows_updated),
            num_rows_removed: std::mem::take(&mut self.rows_removed),
            num_rows_dropped_by_watermark: 0,
            memory_used_bytes: self.bytes as u64,
            custom_metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> BatchContext {
        BatchContext {
            batch_id: 0,
            processing_time: 0,
            late_threshold: 0,
            watermark: 0,
            collect_late_rows: false,
            real_time: false,
        }
    }

    fn row(pairs: &[(&str, Value)]) -> Row {
        pairs.iter().map(|(n, v)| (*n, v.clone())).collect()
    }

    #[test]
    fn upserts_deletes_and_restores() {
        let spec = TableJoinSpec {
            keep_unmatched: true,
            stream_keys: vec!["customer".into()],
            table_keys: vec!["id".into()],
            table_name: "customers".into(),
            table_columns: vec![],
        };
        let mut join = TableJoin::new(spec.clone()).unwrap();
        join.open_state(Box::new(tidemark_state::InMemoryStore::new("t")), None)
            .unwrap();
        let mut out = Vec::new();
        join.on_input_row(
            1,
            row(&[("id", 7.into()), ("tier", "gold".into())]),
            &ctx(),
            &mut out,
        )
        .unwrap();
        join.on_input_row(
            1,
            row(&[("id", 8.into()), ("tier", "blue".into())]),
            &ctx(),
            &mut out,
        )
        .unwrap();
        join.on_input_row(
            1,
            row(&[("id", 7.into()), ("tier", "platinum".into())]),
            &ctx(),
            &mut out,
        )
        .unwrap();
        join.on_input_tombstone(1, b"8").unwrap();
        assert!(out.is_empty(), "table updates emit nothing");
        join.checkpoint().unwrap();
        let store = join.store.take().unwrap();
        let mut restored = TableJoin::new(spec).unwrap();
        restored.open_state(store, None).unwrap();
        for c in [7, 8] {
            restored
                .on_row(row(&[("customer", Value::Long(c))]), &ctx(), &mut out)
                .unwrap();
        }
        assert_eq!(out[0].get("tier"), Some(&Value::from("platinum")));
        assert_eq!(out[0].get("id"), Some(&Value::Long(7)));
        assert_eq!(out[1].get("tier"), Some(&Value::Null), "8 was deleted");
    }
}
