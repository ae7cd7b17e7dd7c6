//! One writer per table where only one may write (#44): complete mode,
//! upsert, a files source, the real-time trigger. Those commit as the
//! query (`txn` app id = the query's id, version = the batch id), so a
//! second instance of the same query would count its own batch ids and
//! skip every batch the other already committed (`committed_batch() >=
//! batch_id`), and a zombie could do the same to the new owner: a wrong
//! table without a word.
//!
//! The owner holds a lease, `_tidemark/owner.json` in the table's
//! directory: its instance id (stable across restarts: a restarted
//! instance takes its own lease back at once) and when it last renewed it.
//! Before each commit the sink reads the lease: another live owner's lease
//! refuses the commit (a configuration error, which ends the run; no batch
//! is skipped), an expired one (its owner died) is taken over, and its own
//! is renewed. An instance whose lease another took over after it expired
//! (a zombie, paused past [`LEASE`]) finds that out at its next commit and
//! stops. Reading and writing the lease is not atomic with the commit: an
//! instance paused between the two for longer than the lease can still
//! commit once, which a lease on a table without a lock service cannot
//! rule out.

use crate::{delta_error, DeltaSink};
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tidemark::error::{Error, Result};

/// How long a lease holds without renewal. A commit renews it; the owner
/// of a query that commits nothing for this long (no batch at all) loses
/// it to another instance and stops at its next commit.
pub const LEASE: Duration = Duration::from_secs(60);

/// The lease file, under the table's root.
const OWNER_FILE: &str = "_tidemark/owner.json";

/// What the lease file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lease {
    /// The owning instance's id.
    owner: String,
    /// The query writing (the `txn` app id).
    app_id: String,
    /// When it was last renewed, epoch milliseconds.
    renewed_ms: i64,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Makes sure `sink`'s instance holds the table's lease before it commits
/// (see the module documentation); a table not created yet has none.
pub(crate) fn ensure_owner(sink: &DeltaSink, owner: &str) -> Result<()> {
    let Some(table) = &sink.table else {
        return Ok(());
    };
    let store = table.object_store();
    let path = object_store::path::Path::from(OWNER_FILE);
    let current = sink.runtime.block_on(async {
        match store.get(&path).await {
            Ok(got) => got.bytes().await.map(Some),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    });
    let current = current.map_err(|e| delta_error("reading the table's writer lease", e))?;
    let lease: Option<Lease> = current.and_then(|bytes| serde_json::from_slice(&bytes).ok());
    if let Some(lease) = &lease {
        let age_ms = now_ms().saturating_sub(lease.renewed_ms);
        let live = age_ms < i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX);
        if lease.owner != owner && live {
            return Err(Error::config(
                "sink.path",
                format!(
                    "the Delta table at {} is written by another instance (`{}`, its lease renewed {} s ago): in complete mode, upsert, from a files source or under the real-time trigger one instance writes a table; stop the other, or start this one again after its lease ({} s) has run out",
                    sink.config.location,
                    lease.owner,
                    age_ms / 1000,
                    LEASE.as_secs()
                ),
            ));
        }
        if lease.owner != owner {
            tracing::warn!(
                previous = %lease.owner,
                table = %sink.config.location,
                "taking over the Delta table's writer lease, expired {} s ago",
                (age_ms / 1000).saturating_sub(LEASE.as_secs() as i64)
            );
        }
    }
    let renewed = Lease {
        owner: owner.to_string(),
        app_id: sink.config.app_id.clone(),
        renewed_ms: now_ms(),
    };
    let bytes = serde_json::to_vec(&renewed).map_err(|e| delta_error("a writer lease", e))?;
    sink.runtime
        .block_on(store.put(&path, bytes.into()))
        .map_err(|e| delta_error("renewing the table's writer lease", e))?;
    Ok(())
}

/// Gives the lease up (a clean stop): the next instance, or the next run
/// of a query whose instance id is made per process, need not wait for it
/// to run out. Only this instance's own lease is removed.
pub(crate) fn release(sink: &DeltaSink, owner: &str) {
    let Some(table) = &sink.table else {
        return;
    };
    let store = table.object_store();
    let path = object_store::path::Path::from(OWNER_FILE);
    let released = sink.runtime.block_on(async {
        let bytes = store.get(&path).await?.bytes().await?;
        match serde_json::from_slice::<Lease>(&bytes) {
            Ok(lease) if lease.owner == owner => store.delete(&path).await.map(|_| true),
            _ => Ok(false),
        }
    });
    match released {
        Ok(true) => tracing::debug!(table = %sink.config.location, "writer lease released"),
        Ok(false) => {}
        Err(e) => tracing::debug!(error = %e, "the writer lease was not released"),
    }
}
