//! Compaction of small Delta files: they are read, rewritten as one, and
//! swapped in one commit (`OPTIMIZE`, `dataChange: false`, so change-feed
//! readers skip it). Append tables compact on a thread of their own, beside
//! the sink's commits (which only add files, so they never conflict with a
//! compaction); tables whose commits remove files compact between commits.

use super::{conform, delta_error, read_file, write_files};
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::{Schema, SchemaRef};
use deltalake::kernel::engine::arrow_conversion::TryIntoArrow;
use deltalake::kernel::transaction::CommitBuilder;
use deltalake::kernel::Action;
use deltalake::protocol::DeltaOperation;
use deltalake::writer::WriteMode;
use deltalake::DeltaTable;
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use tidemark::error::{Error, Result};

/// Rewrites the files smaller than `target_bytes` into one when at least
/// `min_files` of them exist; returns how many files and the new version.
pub(crate) fn compact(
    runtime: &tokio::runtime::Runtime,
    table: &mut DeltaTable,
    min_files: usize,
    target_bytes: u64,
) -> Result<Option<(usize, u64)>> {
    let target = target_bytes as i64;
    let state = table
        .snapshot()
        .map_err(|e| delta_error("table state", e))?;
    let small: Vec<(String, deltalake::kernel::Remove)> = state
        .log_data()
        .into_iter()
        .filter(|f| f.size() < target)
        .map(|f| (f.path().to_string(), f.remove_action(false)))
        .collect();
    if small.len() < min_files.max(2) {
        return Ok(None);
    }
    let schema: Schema = state
        .schema()
        .as_ref()
        .try_into_arrow()
        .map_err(|e| delta_error("the table schema in Arrow", e))?;
    let schema: SchemaRef = Arc::new(schema);
    let mut batches = Vec::new();
    for (path, _) in &small {
        for b in read_file(runtime, table, path)? {
            batches.push(conform(&b, &schema)?);
        }
    }
    let merged = concat_batches(&schema, &batches).map_err(|e| delta_error("compacting", e))?;
    let files = small.len();
    let version = runtime.block_on(async {
        let adds = write_files(table, merged, WriteMode::Default).await?;
        let mut actions: Vec<Action> = small.into_iter().map(|(_, r)| Action::Remove(r)).collect();
        actions.extend(adds.into_iter().map(|mut a| {
            a.data_change = false;
            Action::Add(a)
        }));
        let state = table
            .snapshot()
            .map_err(|e| delta_error("table state", e))?;
        let finalized = CommitBuilder::default()
            .with_actions(actions)
            .build(
                Some(state),
                table.log_store(),
                DeltaOperation::Optimize {
                    predicate: None,
                    target_size: target,
                },
            )
            .await
            .map_err(|e| delta_error("committing the compaction", e))?;
        table
            .update_state()
            .await
            .map_err(|e| delta_error("reloading the table", e))?;
        Ok::<_, Error>(finalized.version())
    })?;
    tracing::info!(files, version, "Delta files compacted");
    metrics::counter!("tidemark_delta_compactions_total").increment(1);
    Ok(Some((files, version)))
}

/// A compaction thread with its own table handle: [`Background::request`]
/// after a commit; it compacts when enough small files have gathered.
pub(crate) struct Background {
    requests: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// Starts the thread for the table at `url`.
    pub(crate) fn start(
        url: url::Url,
        storage_options: HashMap<String, String>,
        min_files: usize,
        target_bytes: u64,
    ) -> Result<Self> {
        let (requests, received) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tidemark-delta-compaction".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "no runtime for Delta compaction");
                        return;
                    }
                };
                let mut table = None;
                while received.recv().is_ok() {
                    // Requests that queued meanwhile are one compaction.
                    while received.try_recv().is_ok() {}
                    let result = (|| {
                        let table = match &mut table {
                            Some(t) => t,
                            None => table.insert(
                                deltalake::DeltaTableBuilder::from_url(url.clone())
                                    .and_then(|b| b.with_storage_options(storage_options.clone()).build())
                                    .map_err(|e| delta_error("opening the table to compact", e))?,
                            ),
                        };
                        runtime
                            .block_on(table.update_state())
                            .map_err(|e| delta_error("loading the table to compact", e))?;
                        compact(&runtime, table, min_files, target_bytes)
                    })();
                    if let Err(e) = result {
                        // A commit that raced it, or a transient store
                        // error: the next request tries again.
                        tracing::warn!(error = %e, "Delta compaction failed; retried after the next commit");
                        table = None;
                    }
                }
            })
            .map_err(|e| Error::io("starting the Delta compaction thread", e))?;
        Ok(Background {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    /// Asks for a compaction check (never blocks).
    pub(crate) fn request(&self) {
        if let Some(r) = &self.requests {
            let _ = r.send(());
        }
    }

    /// Lets the thread finish what it was asked and stop.
    pub(crate) fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}
