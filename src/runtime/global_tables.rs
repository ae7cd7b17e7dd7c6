//! Global tables between batches: each reads what its feed has and
//! applies it to the one copy every task looks rows up in.

use super::plan::GlobalTable;
use super::{DeadLetter, Decoder, TableFeed};
use crate::error::{Error, Result};

/// Reads what `feed` has for `table` and applies it: an upsert per record,
/// a delete per tombstone (by record key). Bad records go to
/// `dead_letter`; the count of them is returned.
pub(super) fn catch_up(
    table: &GlobalTable,
    feed: &mut dyn TableFeed,
    decoder: &mut dyn Decoder,
    dead_letter: &mut dyn DeadLetter,
) -> Result<u64> {
    let records = feed.catch_up()?;
    let mut bad = 0;
    let mut rows = table.rows.write().unwrap_or_else(|p| p.into_inner());
    for record in &records {
        let applied = match (&record.value, &record.key) {
            (None, Some(key)) => match std::str::from_utf8(key) {
                Ok(key) => {
                    rows.remove(key);
                    Ok(())
                }
                Err(_) => Err("a tombstone whose key is not UTF-8 text".to_string()),
            },
            (None, None) => Err("a tombstone without a key deletes nothing".to_string()),
            (Some(_), _) => match decoder.decode(record) {
                Ok(row) => match crate::operators::table_record_key(&row, &table.keys) {
                    Some(key) => {
                        rows.insert(key, row);
                        Ok(())
                    }
                    None => Err(format!("the key columns {:?} are missing", table.keys)),
                },
                Err(e) if e.is_bad_data() => Err(e.to_string()),
                // A registry outage is not the record's fault.
                Err(e) => return Err(e),
            },
        };
        if let Err(reason) = applied {
            bad += 1;
            let error = Error::BadRecord {
                position: record.position.clone(),
                field: "<table>".into(),
                reason,
            };
            dead_letter.send_between_batches(record, &error)?;
        }
    }
    Ok(bad)
}
