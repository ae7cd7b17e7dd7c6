//! The layout of a stream-stream join's state when it is read through its
//! store (state larger than memory):
//!
//! * `R` + side + key length (u32, big-endian) + join key + id (u64,
//!   big-endian) → the buffered row: a prefix scan finds every row of one
//!   side with one join key, in arrival order;
//! * `E` + side + eviction key (big-endian, sign bit flipped) + join key +
//!   id → empty: an expiry index, scanned up to a side's state watermark;
//! * `N` + side → how many rows the side holds;
//! * `I` → the next row id;
//! * `C` + side → the side's columns seen (the nulls of an outer row); the
//!   in-memory layout (side + id → row) keeps them under the same key.

use super::state_codec::corrupt;
use crate::error::{Error, Result};
use crate::time::TimestampMicros;
use std::sync::Arc;
use tidemark_state::StateStore;

const ROW: u8 = b'R';
const EXPIRY: u8 = b'E';
const COUNT: u8 = b'N';
const NEXT_ID: &[u8] = b"I";
const COLUMNS: u8 = b'C';

/// The prefix of every row of `side` (0 left, 1 right) with `key`.
fn rows_prefix(side: u8, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 14);
    out.extend([ROW, side]);
    out.extend((key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The store key of row `id` of `side` with `key`.
pub(super) fn row_key(side: u8, key: &[u8], id: u64) -> Vec<u8> {
    let mut out = rows_prefix(side, key);
    out.extend(id.to_be_bytes());
    out
}

/// The id a [`row_key`] ends with.
pub(super) fn row_id(row_key: &[u8]) -> Result<u64> {
    let tail = row_key
        .len()
        .checked_sub(8)
        .map(|start| &row_key[start..])
        .ok_or_else(|| corrupt("join row key"))?;
    Ok(u64::from_be_bytes(tail.try_into().expect("8 bytes")))
}

/// Every stored row of `side` with `key`: (store key, value), oldest first.
pub(super) fn rows_of(
    store: &dyn StateStore,
    side: u8,
    key: &[u8],
) -> Result<tidemark_state::Entries> {
    Ok(store.prefix(&rows_prefix(side, key))?)
}

/// The expiry index entry of row `id` of `side` with `key`.
pub(super) fn expiry_key(side: u8, evict_key: TimestampMicros, key: &[u8], id: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 18);
    out.extend([EXPIRY, side]);
    out.extend(((evict_key as u64) ^ (1 << 63)).to_be_bytes());
    out.extend_from_slice(key);
    out.extend(id.to_be_bytes());
    out
}

/// A row due for eviction: its eviction key, join key and id.
pub(super) type Expired = (TimestampMicros, Arc<[u8]>, u64);

/// The rows of `side` whose eviction key is at or before `bound`, in
/// (eviction key, join key, id) order.
pub(super) fn expired(
    store: &dyn StateStore,
    side: u8,
    bound: TimestampMicros,
) -> Result<Vec<Expired>> {
    let start = [EXPIRY, side];
    let end = expiry_key(side, bound.saturating_add(1), b"", 0);
    let entries = store.range(&start, &end[..10])?;
    entries
        .into_iter()
        .map(|(index_key, _)| {
            if index_key.len() < 18 {
                return Err(corrupt("join expiry key"));
            }
            let evict = u64::from_be_bytes(index_key[2..10].try_into().expect("8 bytes"));
            let key: Arc<[u8]> = Arc::from(&index_key[10..index_key.len() - 8]);
            let id = row_id(&index_key)?;
            Ok(((evict ^ (1 << 63)) as i64, key, id))
        })
        .collect()
}

/// The store key counting the rows of `side`.
pub(super) fn count_key(side: u8) -> [u8; 2] {
    [COUNT, side]
}

/// The store key of the columns seen on `side`.
pub(super) fn columns_key(side: u8) -> [u8; 2] {
    [COLUMNS, side]
}

/// Reads a little-endian u64 entry; 0 when absent.
pub(super) fn read_u64(store: &dyn StateStore, key: &[u8]) -> Result<u64> {
    match store.get(key)? {
        None => Ok(0),
        Some(bytes) => Ok(u64::from_le_bytes(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| corrupt("join counter"))?,
        )),
    }
}

/// The next row id stored with the last checkpoint.
pub(super) fn read_next_id(store: &dyn StateStore) -> Result<u64> {
    read_u64(store, NEXT_ID)
}

/// Stores the next row id.
pub(super) fn write_next_id(store: &mut dyn StateStore, next_id: u64) -> Result<()> {
    Ok(store.put(NEXT_ID, &next_id.to_le_bytes())?)
}

/// Whether `key` holds a side's columns (both layouts keep them there).
pub(super) fn is_columns_key(key: &[u8]) -> bool {
    matches!(key, [COLUMNS, 0 | 1])
}

/// The columns stored for `side`.
pub(super) fn read_columns(store: &dyn StateStore, side: u8) -> Result<Vec<Arc<str>>> {
    let Some(bytes) = store.get(&columns_key(side))? else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = serde_json::from_slice(&bytes).map_err(|_| corrupt("join columns"))?;
    Ok(names.into_iter().map(Arc::from).collect())
}

/// Stores the columns of `side`.
pub(super) fn write_columns(
    store: &mut dyn StateStore,
    side: u8,
    columns: &[Arc<str>],
) -> Result<()> {
    let names: Vec<&str> = columns.iter().map(|c| c.as_ref()).collect();
    let bytes = serde_json::to_vec(&names).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(store.put(&columns_key(side), &bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_one_key_share_a_prefix_no_other_key_has() {
        // Without the length, key "a" would be a prefix of key "ab".
        let a = row_key(0, b"a", 7);
        let ab = row_key(0, b"ab", 1);
        assert!(a.starts_with(&rows_prefix(0, b"a")));
        assert!(!ab.starts_with(&rows_prefix(0, b"a")));
        assert_eq!(row_id(&a).unwrap(), 7);
    }

    #[test]
    fn the_expiry_index_is_in_time_order_across_signs() {
        let early = expiry_key(1, -5, b"k", 1);
        let late = expiry_key(1, 5, b"k", 0);
        assert!(early < late);
        let mut store = tidemark_state::InMemoryStore::new("j");
        store.put(&early, b"").unwrap();
        store.put(&late, b"").unwrap();
        store.put(&expiry_key(0, -5, b"k", 2), b"").unwrap();
        let due = expired(&store, 1, 0).unwrap();
        assert_eq!(due, vec![(-5, Arc::from(&b"k"[..]), 1)]);
        assert_eq!(expired(&store, 1, 5).unwrap().len(), 2);
    }
}
