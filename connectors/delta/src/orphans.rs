//! Data files written for a commit that never happened are removed
//! (#44 item 10): Delta readers never see them, but they would fill the
//! table's storage for ever, as nothing names them.
//!
//! Two kinds are left behind:
//!
//! - **Staged commits** (several instances, `task_commits`): a zombie that
//!   staged a partition's rows and was fenced, or a batch staged and then
//!   aborted, leaves `_tidemark/staged/<entry>.json` and its Parquet files.
//!   Once the partition's `txn` reached the entry's sequence, the entry is
//!   never read again (a recovery reads only a sequence the table does not
//!   hold yet), so the entry goes, and so do its files unless the table
//!   references them.
//! - **A commit that failed or crashed** (one instance): its files were
//!   written first. Before committing, the sink records their names in
//!   `_tidemark/pending/<query id>.json`, and removes the record after the
//!   commit; a record still there at the next commit or start names files
//!   to remove unless the table references them (the commit did land).
//!
//! "References": an active file or a tombstone of the table's state (a
//! file removed by a later commit, which time travel still reads). A file
//! the table names is never removed here; removing old tombstoned files is
//! `VACUUM`'s job.

use crate::{delta_error, DeltaSink};
use deltalake::kernel::Action;
use futures::StreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::{BTreeMap, HashSet};
use tidemark::error::Result;

/// Where a one-instance writer records the files of the commit under way.
const PENDING_DIR: &str = "_tidemark/pending";

/// The record of this instance's commit under way: one per query and
/// instance, so that an instance taking the table over never acts on the
/// record of another (a paused owner may still commit the files it names).
fn pending_path(sink: &DeltaSink) -> Result<deltalake::Path> {
    let name = match &sink.config.owner {
        Some(owner) => format!("{}-{owner}", sink.config.app_id),
        None => sink.config.app_id.clone(),
    };
    deltalake::Path::parse(format!("{PENDING_DIR}/{name}.json"))
        .map_err(|e| delta_error("a pending commit's path", e))
}

/// Records `adds` as the files of the commit about to be made.
pub(crate) fn record_pending(sink: &DeltaSink, adds: &[String]) -> Result<()> {
    let Some(table) = &sink.table else {
        return Ok(());
    };
    let bytes = serde_json::to_vec(adds).map_err(|e| delta_error("a pending commit", e))?;
    sink.runtime
        .block_on(table.object_store().put(&pending_path(sink)?, bytes.into()))
        .map_err(|e| delta_error("recording the files of a commit", e))?;
    Ok(())
}

/// The commit landed: its record goes. Best effort: a record left names
/// files the table references, which a sweep keeps.
pub(crate) fn clear_pending(sink: &DeltaSink) {
    let (Some(table), Ok(path)) = (&sink.table, pending_path(sink)) else {
        return;
    };
    match sink.runtime.block_on(table.object_store().delete(&path)) {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => tracing::debug!(error = %e, "the record of a landed commit was not removed"),
    }
}

/// Removes the files of a commit recorded and never made (see the module
/// documentation), then its record; returns how many files went.
pub(crate) fn sweep_pending(sink: &DeltaSink) -> Result<usize> {
    let Some(table) = &sink.table else {
        return Ok(0);
    };
    let store = table.object_store();
    let path = pending_path(sink)?;
    let recorded = sink.runtime.block_on(async {
        match store.get(&path).await {
            Ok(got) => got.bytes().await.map(Some),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    });
    let Some(bytes) = recorded.map_err(|e| delta_error("reading the record of a commit", e))?
    else {
        return Ok(0);
    };
    // An unreadable record names nothing to remove.
    let adds: Vec<String> = serde_json::from_slice(&bytes).unwrap_or_default();
    let removed = match adds.is_empty() {
        true => 0,
        false => remove_unreferenced(sink, &adds, &referenced_paths(sink)?)?,
    };
    clear_pending(sink);
    Ok(removed)
}

/// Removes this query's staged commits whose partition's `txn` reached
/// their sequence, and the files of theirs the table does not reference;
/// returns (entries, files) removed.
pub(crate) fn sweep_staged(
    sink: &DeltaSink,
    staged_dir: &str,
    published: impl Fn(i32) -> Result<Option<u64>>,
) -> Result<(usize, usize)> {
    let Some(table) = &sink.table else {
        return Ok((0, 0));
    };
    let store = table.object_store();
    let prefix = deltalake::Path::from(staged_dir);
    let listed: Vec<deltalake::Path> = sink
        .runtime
        .block_on(async {
            let mut listing = store.list(Some(&prefix));
            let mut paths = Vec::new();
            while let Some(meta) = listing.next().await {
                paths.push(meta?.location);
            }
            Ok::<_, object_store::Error>(paths)
        })
        .map_err(|e| delta_error("listing the staged commits", e))?;
    let mut seqs: BTreeMap<i32, Option<u64>> = BTreeMap::new();
    let mut obsolete = Vec::new();
    for path in listed {
        let Some((partition, seq)) = path
            .filename()
            .and_then(|name| staged_partition_and_seq(&sink.config.app_id, name))
        else {
            continue;
        };
        let published = match seqs.get(&partition) {
            Some(known) => *known,
            None => *seqs.entry(partition).or_insert(published(partition)?),
        };
        if published >= Some(seq) {
            obsolete.push(path);
        }
    }
    let mut files = 0;
    let referenced = match obsolete.is_empty() {
        true => HashSet::new(),
        false => referenced_paths(sink)?,
    };
    for path in &obsolete {
        let adds = sink.runtime.block_on(read_adds(store.as_ref(), path));
        // An entry that cannot be read names nothing to remove.
        files += remove_unreferenced(sink, &adds.unwrap_or_default(), &referenced)?;
        delete(sink, store.as_ref(), path)?;
    }
    if !obsolete.is_empty() {
        tracing::info!(
            entries = obsolete.len(),
            files,
            table = %sink.config.location,
            "removed staged commits already published or superseded, and their unpublished files"
        );
    }
    Ok((obsolete.len(), files))
}

/// The partition and sequence of a staged entry of query `app_id`
/// (`<app_id>-<partition>-s<seq>-<pid>-<nanos>.json`), read from the right
/// so that a query whose id extends this one's is never taken for it.
fn staged_partition_and_seq(app_id: &str, name: &str) -> Option<(i32, u64)> {
    let rest = name.strip_suffix(".json")?;
    let (rest, nanos) = rest.rsplit_once('-')?;
    let (rest, pid) = rest.rsplit_once('-')?;
    let (rest, seq) = rest.rsplit_once("-s")?;
    let (query, partition) = rest.rsplit_once('-')?;
    let numbers = [nanos, pid, seq, partition];
    if query != app_id || !numbers.iter().all(|n| n.parse::<u64>().is_ok()) {
        return None;
    }
    Some((partition.parse().ok()?, seq.parse().ok()?))
}

/// The add paths of a staged entry.
async fn read_adds(
    store: &dyn ObjectStore,
    path: &deltalake::Path,
) -> object_store::Result<Vec<String>> {
    let bytes = store.get(path).await?.bytes().await?;
    let actions: Vec<Action> = serde_json::from_slice(&bytes).unwrap_or_default();
    Ok(actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Add(add) => Some(add.path),
            _ => None,
        })
        .collect())
}

/// Every file the table's state references: its active files and its
/// tombstones (files removed by a commit, which time travel still reads).
fn referenced_paths(sink: &DeltaSink) -> Result<HashSet<String>> {
    let Some(table) = &sink.table else {
        return Ok(HashSet::new());
    };
    let referenced = sink.runtime.block_on(async {
        let state = table.snapshot()?;
        let mut paths: HashSet<String> = state
            .log_data()
            .into_iter()
            .map(|f| f.path().to_string())
            .collect();
        let mut tombstones = state.all_tombstones(table.log_store().as_ref());
        while let Some(tombstone) = tombstones.next().await {
            paths.insert(tombstone?.path().to_string());
        }
        Ok::<_, deltalake::DeltaTableError>(paths)
    });
    referenced.map_err(|e| delta_error("reading the table's files", e))
}

/// Removes those of `adds` (table-relative paths, as in add actions) not
/// in `referenced`; returns how many went.
fn remove_unreferenced(
    sink: &DeltaSink,
    adds: &[String],
    referenced: &HashSet<String>,
) -> Result<usize> {
    let Some(table) = &sink.table else {
        return Ok(0);
    };
    let store = table.object_store();
    let mut removed = 0;
    for add in adds {
        let decoded = percent_encoding::percent_decode_str(add).decode_utf8_lossy();
        if referenced.contains(decoded.as_ref()) {
            continue;
        }
        let Ok(path) = deltalake::Path::parse(decoded.as_ref()) else {
            tracing::debug!(path = %decoded, "an unusable path in a commit's record; left alone");
            continue;
        };
        delete(sink, store.as_ref(), &path)?;
        removed += 1;
    }
    Ok(removed)
}

/// Deletes `path`; one already gone is fine.
fn delete(sink: &DeltaSink, store: &dyn ObjectStore, path: &deltalake::Path) -> Result<()> {
    match sink.runtime.block_on(store.delete(path)) {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(delta_error(&format!("removing {path}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_entrys_name_gives_its_partition_and_sequence() {
        assert_eq!(
            staged_partition_and_seq("q-1", "q-1-3-s17-4242-1700000000000.json"),
            Some((3, 17))
        );
        // Another query whose id starts alike is not this one's.
        assert_eq!(
            staged_partition_and_seq("q", "q-1-3-s17-4242-1700000000000.json"),
            None
        );
        assert_eq!(
            staged_partition_and_seq("q", "q-3-s9-3-s17-4242-1700000000000.json"),
            None
        );
        assert_eq!(staged_partition_and_seq("q-1", "q-1-x.json"), None);
    }
}
