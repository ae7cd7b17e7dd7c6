//! Commits per task, for several instances writing one table.
//!
//! Each task partition numbers its commits (its *sequence*), and every
//! Delta commit carries one `txn` per partition it holds rows of: app id
//! `<query id>-<partition>`, version = that partition's sequence. A batch
//! goes in three steps:
//!
//! 1. **stage** (before the source commits): each partition's rows are
//!    written to Parquet files of their own, and their add actions to a
//!    staged-commit file under `_tidemark/staged/`, named uniquely per
//!    writer; the name and the sequence go into the task's checkpoint;
//! 2. the source commits its offsets with those checkpoints (in the Kafka
//!    transaction under `exactly_once`);
//! 3. **publish**: one Delta commit adds the staged files with their
//!    `txn`s, leaving out any partition whose `txn` already reached that
//!    sequence (a concurrent commit's conflict on the same app id makes it
//!    look again).
//!
//! A crash between 2 and 3 leaves the rows staged, not lost: whoever owns
//! the partition next finds the staged commit named in its checkpoint and
//! publishes it before writing anything else. A zombie that staged and was
//! fenced in step 2 never publishes, and its staged files stay unused; a
//! zombie that publishes late finds the partition's `txn` already there.
//! So every partition's rows enter the table once, whichever instance owns
//! it and whenever it moves.

use super::{columns, delta_error, write_files, DeltaSink, BATCH_ID_KEY};
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake::kernel::{Action, Transaction};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::writer::WriteMode;
use deltalake::DeltaTableError;
use object_store::ObjectStoreExt;
use std::collections::BTreeMap;
use std::time::Instant;
use tidemark::error::{Error, Result};
use tidemark::row::Row;
use tidemark::runtime::SinkCommit;

/// Where staged commits are kept, under the table's root. Delta readers
/// and `VACUUM` leave directories starting with `_` alone.
pub(crate) const STAGED_DIR: &str = "_tidemark/staged";

/// How many publishes pass between two sweeps of superseded staged
/// commits (besides the one at start).
const SWEEP_EVERY: u64 = 100;

/// How often a publish looks again after a conflicting commit.
const PUBLISH_ATTEMPTS: usize = 10;

/// One partition's staged output.
pub(super) struct StagedCommit {
    partition: i32,
    seq: u64,
    name: String,
    actions: Vec<Action>,
}

/// Rows of the open batch, per task partition, and what was staged of them.
#[derive(Default)]
pub(super) struct TaskBuffers {
    rows: BTreeMap<i32, Vec<Row>>,
    staged: Vec<StagedCommit>,
}

impl TaskBuffers {
    /// Keeps `rows` apart by the task that emitted each (`(partition,
    /// end)` runs).
    pub(super) fn add(&mut self, rows: &[Row], tasks: &[(i32, usize)]) {
        let mut start = 0;
        for (partition, end) in tasks {
            let end = (*end).min(rows.len());
            if end > start {
                self.rows
                    .entry(*partition)
                    .or_default()
                    .extend_from_slice(&rows[start..end]);
            }
            start = end;
        }
    }

    /// Drops the open batch's rows and what was staged of them.
    pub(super) fn clear(&mut self) {
        self.rows.clear();
        self.staged.clear();
    }
}

fn app_id(sink: &DeltaSink, partition: i32) -> String {
    format!("{}-{partition}", sink.config.app_id)
}

fn staged_path(name: &str) -> Result<deltalake::Path> {
    deltalake::Path::parse(format!("{STAGED_DIR}/{name}.json"))
        .map_err(|e| delta_error("a staged commit's path", e))
}

/// A name no other writer picks: the partition, its sequence, this
/// process and the time.
fn staged_name(sink: &DeltaSink, partition: i32, seq: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-s{seq}-{}-{nanos}",
        app_id(sink, partition),
        std::process::id()
    )
}

/// Step 1: writes each partition's rows and stages their commit as
/// `next_seqs[partition]`.
pub(super) fn stage(
    sink: &mut DeltaSink,
    batch_id: u64,
    next_seqs: &BTreeMap<i32, u64>,
) -> Result<BTreeMap<i32, SinkCommit>> {
    // All rows in one vector (moved, not copied), each partition's a range
    // of it: the schema is inferred once over them all.
    let mut all: Vec<Row> = Vec::new();
    let mut ranges = Vec::new();
    for (partition, rows) in std::mem::take(&mut sink.tasks.rows) {
        if !rows.is_empty() {
            ranges.push((partition, all.len()..all.len() + rows.len()));
            all.extend(rows);
        }
    }
    if all.is_empty() {
        return Ok(BTreeMap::new());
    }
    if sink.config.mode == super::DeltaWriteMode::Changes {
        for row in all.iter_mut() {
            row.set("batch_id", tidemark::row::Value::Long(batch_id as i64));
        }
    }
    let inferred = columns::infer_schema(&all)?;
    refresh(sink)?;
    if sink.table.is_none() {
        create_or_open(sink, &inferred)?;
    }
    let table = sink.table.as_ref().expect("created above");
    let plan = columns::plan_schema(
        &DeltaSink::table_schema(table)?,
        &inferred,
        sink.config.merge_schema,
    )?;
    let widened = plan
        .widened
        .then(|| sink.widened_metadata(&plan))
        .transpose()?;
    let mode = if plan.widened {
        WriteMode::MergeSchema
    } else {
        WriteMode::Default
    };
    let mut out = BTreeMap::new();
    for (partition, range) in ranges {
        let Some(seq) = next_seqs.get(&partition).copied() else {
            return Err(Error::Sink(format!(
                "rows of partition {partition}, which has no task"
            )));
        };
        let batch = columns::to_record_batch(&all[range], &plan.schema)?;
        let table = sink.table.as_ref().expect("created above");
        let adds = sink.runtime.block_on(write_files(table, batch, mode))?;
        let mut actions: Vec<Action> = widened.iter().cloned().collect();
        actions.extend(adds.into_iter().map(Action::Add));
        let name = staged_name(sink, partition, seq);
        write_staged(sink, &name, &actions)?;
        out.insert(
            partition,
            SinkCommit {
                seq,
                staged: name.clone(),
            },
        );
        sink.tasks.staged.push(StagedCommit {
            partition,
            seq,
            name,
            actions,
        });
    }
    Ok(out)
}

/// Step 3: publishes what [`stage`] staged, in one commit.
pub(super) fn publish(sink: &mut DeltaSink, batch_id: u64) -> Result<()> {
    let staged = std::mem::take(&mut sink.tasks.staged);
    if staged.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    commit_unpublished(sink, &staged, Some(batch_id))?;
    sink.record_commit_latency(started);
    for s in &staged {
        remove_staged(sink, &s.name);
    }
    if sink.commits > 0 && sink.commits.is_multiple_of(SWEEP_EVERY) {
        sink.sweep_orphans();
    }
    sink.maintain()
}

/// Removes the staged commits a zombie or an aborted batch left, once
/// their partitions' `txn`s passed them, with their unpublished files
/// (see the `orphans` module).
pub(super) fn sweep(sink: &mut DeltaSink) -> Result<()> {
    refresh(sink)?;
    crate::orphans::sweep_staged(sink, STAGED_DIR, |partition| published_seq(sink, partition))?;
    Ok(())
}

/// A task resumed with `commit` as its last: publishes it if the table
/// does not hold it yet.
pub(super) fn recover(sink: &mut DeltaSink, partition: i32, commit: &SinkCommit) -> Result<()> {
    refresh(sink)?;
    if published_seq(sink, partition)? >= Some(commit.seq) {
        return Ok(());
    }
    let actions = read_staged(sink, &commit.staged).map_err(|e| {
        let outer = format!(
            "partition {partition}'s commit {} was staged as `{}` and its offsets committed, \
             but it is neither in the table nor readable",
            commit.seq, commit.staged
        );
        match e {
            // Delta's own error stays the source, one level down.
            e @ (Error::SinkFailed { .. } | Error::Sink(_)) => e.in_context(outer),
            other => Error::sink_failed(outer, other),
        }
    })?;
    let staged = StagedCommit {
        partition,
        seq: commit.seq,
        name: commit.staged.clone(),
        actions,
    };
    tracing::info!(
        partition,
        seq = commit.seq,
        staged = %commit.staged,
        "publishing a commit staged before a stop"
    );
    commit_unpublished(sink, std::slice::from_ref(&staged), None)?;
    remove_staged(sink, &staged.name);
    Ok(())
}

/// Commits the staged partitions the table does not hold yet; looks again
/// after a conflicting commit.
fn commit_unpublished(
    sink: &mut DeltaSink,
    staged: &[StagedCommit],
    batch_id: Option<u64>,
) -> Result<()> {
    for attempt in 1..=PUBLISH_ATTEMPTS {
        refresh(sink)?;
        let mut pending = Vec::new();
        for s in staged {
            if published_seq(sink, s.partition)? >= Some(s.seq) {
                tracing::info!(
                    partition = s.partition,
                    seq = s.seq,
                    "partition's commit already in the Delta table; skipped"
                );
            } else {
                pending.push(s);
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        match try_commit(sink, &pending, batch_id) {
            Ok(()) => return Ok(()),
            Err(DeltaTableError::Transaction {
                source: TransactionError::CommitConflict(conflict),
            }) if attempt < PUBLISH_ATTEMPTS => {
                tracing::info!(attempt, %conflict, "a concurrent Delta commit; looking again");
            }
            Err(e) => return Err(delta_error("publishing staged commits", e)),
        }
    }
    Err(Error::Sink(format!(
        "publishing staged commits: still conflicting after {PUBLISH_ATTEMPTS} attempts"
    )))
}

fn try_commit(
    sink: &mut DeltaSink,
    pending: &[&StagedCommit],
    batch_id: Option<u64>,
) -> std::result::Result<(), DeltaTableError> {
    let mut actions: Vec<Action> = Vec::new();
    let mut txns = Vec::new();
    for s in pending {
        // One metadata action at most: every partition of a batch staged
        // the same widened schema.
        for action in &s.actions {
            let duplicate = matches!(action, Action::Metadata(_)) && actions.contains(action);
            if !duplicate {
                actions.push(action.clone());
            }
        }
        txns.push(Transaction::new(app_id(sink, s.partition), s.seq as i64));
    }
    let mut properties = CommitProperties::default().with_application_transactions(txns);
    if let Some(batch_id) = batch_id {
        properties =
            properties.with_metadata([(BATCH_ID_KEY.to_string(), serde_json::json!(batch_id))]);
    }
    let partition_by = super::none_if_empty(&sink.config.partition_by);
    let table = sink.table.as_mut().expect("refreshed before");
    let version = sink.runtime.block_on(async {
        let state = table.snapshot()?;
        let finalized = CommitBuilder::from(properties)
            .with_actions(actions)
            .build(
                Some(state),
                table.log_store(),
                DeltaOperation::Write {
                    mode: SaveMode::Append,
                    partition_by,
                    predicate: None,
                },
            )
            .await?;
        let version = finalized.version();
        table.update_state().await?;
        Ok::<_, DeltaTableError>(version)
    })?;
    sink.commits += 1;
    metrics::counter!("tidemark_delta_commits_total").increment(1);
    tracing::debug!(
        version,
        batch_id,
        partitions = pending.len(),
        "Delta commit of staged partitions"
    );
    Ok(())
}

/// The table as it is now (created by another instance meanwhile, or
/// moved on by its commits).
fn refresh(sink: &mut DeltaSink) -> Result<()> {
    match sink.table.as_mut() {
        Some(table) => sink
            .runtime
            .block_on(table.update_state())
            .map_err(|e| delta_error("reloading the table", e)),
        None => {
            sink.table = sink.open_existing()?;
            Ok(())
        }
    }
}

/// Creates the table, or opens it when another instance just did.
fn create_or_open(
    sink: &mut DeltaSink,
    schema: &deltalake::arrow::datatypes::Schema,
) -> Result<()> {
    if let Err(e) = sink.create_table(schema) {
        sink.table = sink.open_existing()?;
        if sink.table.is_none() {
            return Err(e);
        }
    }
    Ok(())
}

/// The last commit of `partition` the table holds.
fn published_seq(sink: &DeltaSink, partition: i32) -> Result<Option<u64>> {
    sink.txn_version(&app_id(sink, partition))
}

fn write_staged(sink: &DeltaSink, name: &str, actions: &[Action]) -> Result<()> {
    let table = sink.table.as_ref().expect("staged after the table exists");
    let bytes = serde_json::to_vec(actions).map_err(|e| delta_error("a staged commit", e))?;
    let path = staged_path(name)?;
    let store = table.object_store();
    sink.runtime
        .block_on(store.put(&path, bytes.into()))
        .map_err(|e| delta_error(&format!("writing the staged commit {name}"), e))?;
    Ok(())
}

fn read_staged(sink: &DeltaSink, name: &str) -> Result<Vec<Action>> {
    let Some(table) = &sink.table else {
        return Err(Error::Sink("the table does not exist".into()));
    };
    let path = staged_path(name)?;
    let store = table.object_store();
    let bytes = sink.runtime.block_on(async {
        let got = store.get(&path).await?;
        got.bytes().await
    });
    let bytes = bytes.map_err(|e| delta_error(&format!("reading the staged commit {name}"), e))?;
    serde_json::from_slice(&bytes).map_err(|e| delta_error(&format!("decoding {name}"), e))
}

/// Published: the staged file is no longer needed (best effort; one left
/// behind is never read again once its `txn` is in the table).
fn remove_staged(sink: &DeltaSink, name: &str) {
    let (Some(table), Ok(path)) = (&sink.table, staged_path(name)) else {
        return;
    };
    let store = table.object_store();
    if let Err(e) = sink.runtime.block_on(store.delete(&path)) {
        tracing::debug!(staged = name, error = %e, "a published staged commit was not removed");
    }
}
