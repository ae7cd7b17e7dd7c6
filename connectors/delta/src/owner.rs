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
//! is renewed when a quarter of [`LEASE`] has passed. A thread renews it
//! as often between commits, so an idle owner (no input for minutes) keeps
//! its table, but only while the query loop shows life (a turn within
//! [`MAX_SILENCE`], Kafka's `max.poll.interval.ms`): a process whose query
//! thread hangs lets the table go, as a consumer that stops polling leaves
//! its group. An instance whose lease another took over after it expired
//! (a zombie, paused past [`LEASE`]) finds that out at its next commit and
//! stops. Reading and writing the lease is not atomic with the commit: an
//! instance paused between the two for longer than the lease can still
//! commit once, which a lease on a table without a lock service cannot
//! rule out.

use crate::{delta_error, DeltaSink};
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tidemark::error::{Error, Result};

/// How long a lease holds without renewal: a process that neither commits
/// nor renews for this long (dead, or paused) loses it.
pub const LEASE: Duration = Duration::from_secs(60);

/// How often the lease is renewed: a quarter of [`LEASE`], so that three
/// renewals in a row can fail (a slow store) before it runs out.
const RENEW_EVERY: Duration = Duration::from_secs(15);

/// How long the query loop may go without a turn (one batch running that
/// long, or a hung thread) before the lease is no longer renewed for it:
/// Kafka's `max.poll.interval.ms` default. A batch that ran longer takes
/// its lease back at its commit if no other instance took it meanwhile.
pub const MAX_SILENCE: Duration = Duration::from_secs(300);

/// The lease file, under the table's root.
const OWNER_FILE: &str = "_tidemark/owner.json";

/// What the lease file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lease {
    /// Its encoding ([`LEASE_VERSION`]; 1 when absent: written before
    /// versions).
    #[serde(default = "tidemark::encoding::first_version")]
    v: u32,
    /// The owning instance's id.
    owner: String,
    /// The query writing (the `txn` app id).
    app_id: String,
    /// When it was last renewed, epoch milliseconds.
    renewed_ms: i64,
}

/// Now, in epoch milliseconds.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The encoding of the leases this release writes. A lease of a newer one
/// is an error, not a file to take over: its writer may well be alive.
const LEASE_VERSION: u32 = 1;

/// Reads the table's lease; `None` when there is none (or it is not a
/// lease: a file another tool left is taken over).
async fn read_lease(store: &dyn ObjectStore) -> Result<Option<Lease>> {
    let path = object_store::path::Path::from(OWNER_FILE);
    let reading = |e| delta_error("reading the table's writer lease", e);
    let bytes = match store.get(&path).await {
        Ok(got) => got.bytes().await.map_err(reading)?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(reading(e)),
    };
    tidemark::encoding::check_json_version(
        || format!("the writer lease {OWNER_FILE} (remove it once no writer of that release runs)"),
        &bytes,
        LEASE_VERSION,
    )?;
    Ok(serde_json::from_slice(&bytes).ok())
}

/// Writes `owner`'s lease, renewed now.
async fn write_lease(store: &dyn ObjectStore, owner: &str, app_id: &str) -> Result<()> {
    let renewed = Lease {
        v: LEASE_VERSION,
        owner: owner.to_string(),
        app_id: app_id.to_string(),
        renewed_ms: now_ms(),
    };
    let bytes = serde_json::to_vec(&renewed).map_err(|e| delta_error("a writer lease", e))?;
    store
        .put(&object_store::path::Path::from(OWNER_FILE), bytes.into())
        .await
        .map_err(|e| delta_error("renewing the table's writer lease", e))?;
    Ok(())
}

fn lease_ms() -> i64 {
    i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX)
}

/// Makes sure `sink`'s instance holds the table's lease before it commits
/// (see the module documentation); a table not created yet has none.
/// Returns a renewing thread, started once the lease is held, unless one
/// is `renewing` already.
pub(crate) fn ensure_owner(
    sink: &DeltaSink,
    owner: &str,
    renewing: bool,
) -> Result<Option<Renewer>> {
    let Some(table) = &sink.table else {
        return Ok(None);
    };
    let store = table.object_store();
    let lease = sink.runtime.block_on(read_lease(store.as_ref()))?;
    let renew_ms = i64::try_from(RENEW_EVERY.as_millis()).unwrap_or(i64::MAX);
    if let Some(lease) = &lease {
        let age_ms = now_ms().saturating_sub(lease.renewed_ms);
        if lease.owner == owner && age_ms < renew_ms {
            // Held, and renewed recently: no write on every commit (a
            // restart within the renewal interval starts its thread).
            return renewer_unless(renewing, sink, owner);
        }
        if lease.owner != owner && age_ms < lease_ms() {
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
                (age_ms - lease_ms()) / 1000
            );
        }
    }
    sink.runtime
        .block_on(write_lease(store.as_ref(), owner, &sink.config.app_id))?;
    renewer_unless(renewing, sink, owner)
}

/// A renewing thread for the held lease, unless one runs already.
fn renewer_unless(renewing: bool, sink: &DeltaSink, owner: &str) -> Result<Option<Renewer>> {
    match renewing {
        true => Ok(None),
        false => Renewer::start(sink, owner).map(Some),
    }
}

/// Renews the lease every [`RENEW_EVERY`] on a thread of its own while
/// the sink lives, so that an owner without input keeps its table. It
/// stops renewing once another instance holds the lease (the next commit
/// then refuses) and stops at drop.
pub(crate) struct Renewer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Renewer {
    fn start(sink: &DeltaSink, owner: &str) -> Result<Self> {
        let Some(table) = &sink.table else {
            return Err(Error::Internal(
                "a lease renewed on a table not created".into(),
            ));
        };
        let store = table.object_store();
        let (owner, app_id) = (owner.to_string(), sink.config.app_id.clone());
        let location = sink.config.location.clone();
        let alive_at_ms = Arc::clone(&sink.alive_at_ms);
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("delta-lease".into())
            .spawn(move || {
                let lease = LeaseHolder {
                    store: store.as_ref(),
                    owner: &owner,
                    app_id: &app_id,
                    location: &location,
                    alive_at_ms: &alive_at_ms,
                };
                renew_until_stopped(&stopping, &lease)
            })
            .map_err(|e| Error::io("starting the Delta writer lease's thread", e))?;
        Ok(Renewer {
            stop,
            thread: Some(thread),
        })
    }

    /// Whether it still renews (it stops once another instance holds the
    /// lease).
    pub(crate) fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the renewing thread renews, for whom.
struct LeaseHolder<'a> {
    store: &'a dyn ObjectStore,
    owner: &'a str,
    app_id: &'a str,
    location: &'a str,
    /// When the query loop last showed life (epoch ms).
    alive_at_ms: &'a AtomicI64,
}

/// Whether a query loop last alive at `alive_at_ms` still has its lease
/// renewed at `now_ms`.
fn loop_shows_life(alive_at_ms: i64, now_ms: i64) -> bool {
    let limit_ms = i64::try_from(MAX_SILENCE.as_millis()).unwrap_or(i64::MAX);
    now_ms.saturating_sub(alive_at_ms) <= limit_ms
}

fn renew_until_stopped(stop: &(Mutex<bool>, Condvar), lease: &LeaseHolder) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::warn!(error = %e, "the Delta writer lease is renewed at commits only");
            return;
        }
    };
    let (stopped, wake) = stop;
    let mut silent = false;
    loop {
        let guard = stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = wake
            .wait_timeout_while(guard, RENEW_EVERY, |stopped| !*stopped)
            .unwrap_or_else(|e| e.into_inner());
        if *guard {
            return;
        }
        drop(guard);
        let alive = loop_shows_life(lease.alive_at_ms.load(Ordering::Relaxed), now_ms());
        if !alive {
            if !silent {
                tracing::warn!(
                    table = %lease.location,
                    "the query loop has not turned for {} s: the Delta table's writer lease is no longer renewed (another instance may take the table over; this one's next commit takes it back if none did)",
                    MAX_SILENCE.as_secs()
                );
            }
            silent = true;
            continue;
        }
        silent = false;
        let renewed = runtime.block_on(async {
            match read_lease(lease.store).await {
                Ok(Some(held)) if held.owner != lease.owner => Ok(Some(held.owner)),
                Ok(_) => write_lease(lease.store, lease.owner, lease.app_id)
                    .await
                    .map(|()| None),
                Err(e) => Err(e),
            }
        });
        match renewed {
            Ok(None) => tracing::trace!(table = %lease.location, "writer lease renewed"),
            Ok(Some(other)) => {
                // The next commit refuses, naming it.
                tracing::warn!(table = %lease.location, owner = %other, "another instance took the Delta table's writer lease");
                return;
            }
            // Written by a newer release: renewing cannot heal; the next
            // commit refuses, naming it.
            Err(e @ Error::UnknownEncoding { .. }) => {
                tracing::warn!(table = %lease.location, error = %e, "the Delta table's writer lease is not this release's; no longer renewed");
                return;
            }
            Err(e) => {
                tracing::warn!(table = %lease.location, error = %e, "the Delta table's writer lease was not renewed; retrying")
            }
        }
    }
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
            Ok(lease) if lease.owner == owner && lease.v <= LEASE_VERSION => {
                store.delete(&path).await.map(|_| true)
            }
            _ => Ok(false),
        }
    });
    match released {
        Ok(true) => tracing::debug!(table = %sink.config.location, "writer lease released"),
        Ok(false) => {}
        Err(e) => tracing::debug!(error = %e, "the writer lease was not released"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_is_renewed_only_while_the_query_loop_turns() {
        let now = 1_000_000_000;
        let limit = i64::try_from(MAX_SILENCE.as_millis()).unwrap();
        assert!(loop_shows_life(now, now));
        assert!(loop_shows_life(now - limit, now));
        assert!(!loop_shows_life(now - limit - 1, now));
        // A clock stepping back never stops renewal.
        assert!(loop_shows_life(now + 5_000, now));
    }
}
