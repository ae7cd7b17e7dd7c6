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
//! The table's rows are the engine's cached state (`tidemark_state::StateCache`:
//! `K` + key → the row, `N` → the row count). With a disk store and a
//! memory bound (`open_state` with `cache_bytes`) the table is read through
//! the store and memory caches a bounded number of rows (plus the rows a
//! batch upserts, which stay in memory until its checkpoint writes them);
//! otherwise the whole table is held in memory as well. Either way the store keeps the
//! columns seen (`C`): the nulls of an unmatched row after a restart.
//!
//! Keys are compared in their record-key form (the text of a single key
//! column, a JSON array for several, as tidemark's Kafka sink writes them),
//! so that a tombstone's record key finds the row it deletes.

use super::state_codec::{corrupt, put_row, Reader};
use super::{BatchContext, KeyRange, Operator, QueryableState};
use crate::error::{Error, Result};
use crate::progress::StateOperatorProgress;
use crate::row::{Row, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use tidemark_state::{StateCache, StateCodec, StateStore};

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
    /// The table's rows by record key, whole in memory or read through
    /// the store.
    table: StateCache<TableRowCodec>,
    /// Columns learned since the last checkpoint (stored with it).
    columns_changed: bool,
    columns: Vec<Arc<str>>,
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
            table: StateCache::counted(TableRowCodec, ROW_COUNT),
            columns_changed: false,
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
            return Err(Error::bad_row(
                "<key>",
                format!(
                    "table `{}`: a row without its key {:?}",
                    self.spec.table_name, self.spec.table_keys
                ),
            ));
        };
        self.columns_changed |= learn_columns(&mut self.columns, &row);
        self.rows_updated += 1;
        self.table.insert(key.as_bytes(), row)
    }

    fn delete(&mut self, key: &str) -> Result<()> {
        if self.table.remove(key.as_bytes())? {
            self.rows_removed += 1;
        }
        Ok(())
    }

    /// The table row of `key` as it stands, for a reader: the global
    /// table's, or cached, or read from the store without caching it.
    fn peek(&self, key: &str) -> Result<Option<Row>> {
        if let Some(shared) = &self.global {
            let table = shared.read().unwrap_or_else(|p| p.into_inner());
            return Ok(table.get(key).cloned());
        }
        Ok(self.table.peek(key.as_bytes())?.map(|row| row.clone()))
    }

    /// Learns the columns a previous run stored: a table whose rows were
    /// all deleted still knows them for its unmatched rows' nulls.
    fn read_columns(&mut self, store: &dyn StateStore) -> Result<()> {
        if let Some(bytes) = store.get(COLUMNS)? {
            let names: Vec<String> =
                serde_json::from_slice(&bytes).map_err(|_| corrupt("table columns"))?;
            for name in names {
                let name: Arc<str> = name.into();
                if !self.columns.contains(&name) {
                    self.columns.push(name);
                }
            }
        }
        Ok(())
    }

    /// Stores the columns when rows taught new ones since the last time.
    fn write_columns(&mut self) -> Result<()> {
        let Some(store) = self.table.store_mut() else {
            return Ok(());
        };
        if std::mem::take(&mut self.columns_changed) {
            let names: Vec<&str> = self.columns.iter().map(|c| c.as_ref()).collect();
            let bytes = serde_json::to_vec(&names).map_err(|e| Error::Internal(e.to_string()))?;
            store.put(COLUMNS, &bytes)?;
        }
        Ok(())
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

/// The store entry counting the rows, when the table is read through it.
const ROW_COUNT: &[u8] = b"N";
/// The store entry listing the columns seen (the nulls of an unmatched
/// row).
const COLUMNS: &[u8] = b"C";

/// Adds `row`'s columns not yet in `columns`; whether there were any.
fn learn_columns(columns: &mut Vec<Arc<str>>, row: &Row) -> bool {
    let mut learned = false;
    for (name, _) in row.entries() {
        if !columns.contains(name) {
            columns.push(name.clone());
            learned = true;
        }
    }
    learned
}

/// A table row in the store: its layout version, then the row.
struct TableRowCodec;

impl StateCodec for TableRowCodec {
    type Value = Row;
    fn encode(&self, row: &Row) -> Result<Vec<u8>> {
        let mut out = vec![STATE_VERSION];
        put_row(row, &mut out);
        Ok(out)
    }
    fn decode(&self, bytes: &[u8]) -> Result<Row> {
        decode_row(bytes)
    }
}

pub(crate) fn decode_row(bytes: &[u8]) -> Result<Row> {
    let mut r = Reader(bytes);
    r.version("table join", STATE_VERSION)?;
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
            (None, Some(k)) => self.table.get(k.as_bytes())?.cloned(),
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
            Error::bad_row(
                "<key>",
                format!(
                    "table `{}`: a tombstone whose key is not UTF-8 text",
                    self.spec.table_name
                ),
            )
        })?;
        self.delete(key)
    }

    fn is_stateful(&self) -> bool {
        // A global table is the query's, fed from its topic at start.
        self.global.is_none()
    }

    fn open_state(&mut self, store: Box<dyn StateStore>, cache_bytes: Option<usize>) -> Result<()> {
        self.read_columns(store.as_ref())?;
        // A row costs its key, its values and the map's share: about 256.
        let max_cached_rows = cache_bytes.map(|bytes| (bytes / 256).max(16));
        self.table.open(store, max_cached_rows)?;
        let mut columns = std::mem::take(&mut self.columns);
        for (_, row) in self.table.iter() {
            learn_columns(&mut columns, row);
        }
        self.columns = columns;
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<()> {
        self.write_columns()?;
        self.table.checkpoint()?;
        Ok(())
    }

    /// The table's key columns, a global table's too.
    fn queryable_state(&self) -> Option<QueryableState> {
        Some(QueryableState {
            kind: "table",
            key_columns: self.spec.table_keys.iter().map(|c| c.to_string()).collect(),
        })
    }

    /// The table's row for the key, as its last upsert wrote it (every
    /// column of that record, the key columns included); empty when the
    /// table has none (never written, deleted by a tombstone, or a null in
    /// the key). The key is matched in its record-key form, as stream rows
    /// and tombstones are. The range is not used. Reads through the store
    /// without caching the row or changing any state.
    fn read_key(&mut self, key: &[Value], _range: &KeyRange) -> Result<Vec<Row>> {
        let key_row: Row = self
            .spec
            .table_keys
            .iter()
            .cloned()
            .zip(key.iter().cloned())
            .collect();
        let Some(record_key) = record_key(&key_row, &self.spec.table_keys) else {
            return Ok(Vec::new());
        };
        Ok(self.peek(&record_key)?.into_iter().collect())
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
            num_rows_total: self.table.len(),
            num_rows_updated: std::mem::take(&mut self.rows_updated),
            num_rows_removed: std::mem::take(&mut self.rows_removed),
            num_rows_dropped_by_watermark: 0,
            // A row's key, values and the map's share: about 256 bytes.
            memory_used_bytes: self.table.cached_len() as u64 * 256,
            custom_metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

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

    fn spec() -> TableJoinSpec {
        TableJoinSpec {
            keep_unmatched: true,
            stream_keys: vec!["customer".into()],
            table_keys: vec!["id".into()],
            table_name: "customers".into(),
            table_columns: vec![],
        }
    }

    #[test]
    fn upserts_deletes_and_restores() {
        // All in memory, and read through the store with 16 rows cached.
        for cache_bytes in [None, Some(1)] {
            upserts_deletes_and_restores_with(cache_bytes);
        }
    }

    fn upserts_deletes_and_restores_with(cache_bytes: Option<usize>) {
        let spec = spec();
        let mut join = TableJoin::new(spec.clone()).unwrap();
        join.open_state(
            Box::new(tidemark_state::InMemoryStore::new("t")),
            cache_bytes,
        )
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
        let store = join.table.take_store().unwrap();
        let mut restored = TableJoin::new(spec).unwrap();
        restored.open_state(store, cache_bytes).unwrap();
        assert_eq!(restored.state_progress().unwrap().num_rows_total, 1);
        for c in [7, 8] {
            restored
                .on_row(row(&[("customer", Value::Long(c))]), &ctx(), &mut out)
                .unwrap();
        }
        assert_eq!(out[0].get("tier"), Some(&Value::from("platinum")));
        assert_eq!(out[0].get("id"), Some(&Value::Long(7)));
        assert_eq!(out[1].get("tier"), Some(&Value::Null), "8 was deleted");
    }

    /// Progress without the memory used: which rows a bounded cache keeps
    /// depends on its hasher's random seed.
    fn progress(join: &mut TableJoin) -> StateOperatorProgress {
        let mut progress = join.state_progress().unwrap();
        progress.memory_used_bytes = 0;
        progress
    }

    #[test]
    fn read_key_gives_the_table_row_through_the_store_and_changes_nothing() {
        // All in memory, and read through the store with 16 rows cached.
        for cache_bytes in [None, Some(1)] {
            let open = || {
                let mut join = TableJoin::new(spec()).unwrap();
                let store = Box::new(tidemark_state::InMemoryStore::new("t"));
                join.open_state(store, cache_bytes).unwrap();
                join
            };
            // `join` is read, `twin` is not: they must stay alike.
            let (mut join, mut twin) = (open(), open());
            let tier = |id: i64| match id {
                7 => "platinum".to_string(),
                id => format!("tier{id}"),
            };
            for j in [&mut join, &mut twin] {
                let mut out = Vec::new();
                for id in (0..40).chain([7]) {
                    let table_row = row(&[("id", id.into()), ("tier", tier(id).as_str().into())]);
                    j.on_input_row(1, table_row, &ctx(), &mut out).unwrap();
                }
                j.on_input_tombstone(1, b"8").unwrap();
                j.checkpoint().unwrap();
                assert!(out.is_empty());
            }
            let cached: BTreeSet<String> = join
                .table
                .iter()
                .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
                .collect();
            if cache_bytes.is_some() {
                assert!(cached.len() < 39, "{} rows cached", cached.len());
            }
            let stored = join.table.store().unwrap().approximate_len();

            let state = join.queryable_state().unwrap();
            assert_eq!(state.kind, "table");
            assert_eq!(state.key_columns, vec!["id".to_string()]);
            for id in (0..40).filter(|id| *id != 8) {
                let expected = row(&[("id", id.into()), ("tier", tier(id).as_str().into())]);
                let read = join.read_key(&[id.into()], &KeyRange::default()).unwrap();
                assert_eq!(read, vec![expected], "{cache_bytes:?}: id {id}");
            }
            for absent in [Value::Long(8), Value::Long(40), Value::Null] {
                let read = join.read_key(&[absent], &KeyRange::default()).unwrap();
                assert!(read.is_empty(), "{cache_bytes:?}: {read:?}");
            }

            // Nothing cached, stored or counted by the reads.
            let now_cached: BTreeSet<String> = join
                .table
                .iter()
                .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
                .collect();
            assert_eq!(now_cached, cached, "{cache_bytes:?}");
            let now_stored = join.table.store().unwrap().approximate_len();
            assert_eq!(now_stored, stored, "{cache_bytes:?}");
            assert_eq!(progress(&mut join), progress(&mut twin));
            let (mut out, mut twin_out) = (Vec::new(), Vec::new());
            for c in [3, 7, 8, 40] {
                let stream_row = row(&[("customer", Value::Long(c))]);
                join.on_row(stream_row.clone(), &ctx(), &mut out).unwrap();
                twin.on_row(stream_row, &ctx(), &mut twin_out).unwrap();
            }
            assert_eq!(out, twin_out, "{cache_bytes:?}");
            assert_eq!(out[1].get("tier"), Some(&Value::from("platinum")));
            assert_eq!(progress(&mut join), progress(&mut twin));
        }
    }

    #[test]
    fn read_key_reads_a_global_table_by_its_key_columns() {
        let keys: Vec<Arc<str>> = vec!["id".into(), "region".into()];
        let spec = TableJoinSpec {
            stream_keys: vec!["customer".into(), "region".into()],
            table_keys: keys.clone(),
            ..spec()
        };
        let shared = SharedTable::default();
        let table_row = row(&[
            ("id", 1.into()),
            ("region", "eu".into()),
            ("tier", "gold".into()),
        ]);
        let record = record_key(&table_row, &keys).unwrap();
        shared.write().unwrap().insert(record, table_row.clone());
        let mut join = TableJoin::global(spec, shared.clone()).unwrap();
        let state = join.queryable_state().unwrap();
        assert_eq!(state.kind, "table");
        assert_eq!(
            state.key_columns,
            vec!["id".to_string(), "region".to_string()]
        );
        let read = |join: &mut TableJoin, key: [Value; 2]| {
            join.read_key(&key, &KeyRange::default()).unwrap()
        };
        assert_eq!(read(&mut join, [1.into(), "eu".into()]), vec![table_row]);
        assert!(read(&mut join, [1.into(), "us".into()]).is_empty());
        assert!(read(&mut join, [2.into(), "eu".into()]).is_empty());
        assert!(read(&mut join, [1.into(), Value::Null]).is_empty());
        assert_eq!(shared.read().unwrap().len(), 1);
    }

    /// One step of a table join's input.
    #[derive(Debug, Clone)]
    enum Step {
        Upsert(u8, u8),
        Tombstone(u8),
        Stream(u8),
        Restart,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (0u8..30, any::<u8>()).prop_map(|(k, v)| Step::Upsert(k, v)),
            (0u8..30).prop_map(Step::Tombstone),
            (0u8..30).prop_map(Step::Stream),
            Just(Step::Restart),
        ]
    }

    /// The rows `steps` emit and the table's size after each step, with a
    /// checkpoint after every step and a reopening at each restart.
    fn run(steps: &[Step], cache_bytes: Option<usize>) -> Vec<(String, u64)> {
        let open = |store: Box<dyn StateStore>| {
            let mut join = TableJoin::new(spec()).unwrap();
            join.open_state(store, cache_bytes).unwrap();
            join
        };
        let mut join = open(Box::new(tidemark_state::InMemoryStore::new("t")));
        let mut seen = Vec::new();
        for step in steps {
            let mut out = Vec::new();
            match step {
                Step::Upsert(k, v) => {
                    let table_row = row(&[
                        ("id", Value::Long(*k as i64)),
                        ("v", Value::Long(*v as i64)),
                    ]);
                    join.on_input_row(1, table_row, &ctx(), &mut out).unwrap();
                }
                Step::Tombstone(k) => join
                    .on_input_tombstone(1, k.to_string().as_bytes())
                    .unwrap(),
                Step::Stream(k) => {
                    let stream_row = row(&[("customer", Value::Long(*k as i64))]);
                    join.on_row(stream_row, &ctx(), &mut out).unwrap();
                }
                Step::Restart => {
                    join.checkpoint().unwrap();
                    join = open(join.table.take_store().unwrap());
                }
            }
            join.checkpoint().unwrap();
            let rows = join.state_progress().unwrap().num_rows_total;
            seen.push((format!("{out:?}"), rows));
        }
        seen
    }

    proptest::proptest! {
        #[test]
        fn a_table_read_through_the_store_joins_as_one_held_in_memory(
            steps in proptest::collection::vec(step(), 1..200),
        ) {
            proptest::prop_assert_eq!(run(&steps, Some(1)), run(&steps, None));
        }
    }
}
