//! The Delta Lake sink: each micro-batch is one Delta commit carrying a
//! `txn` action (app id = the query's id, version = the batch id), so a
//! batch replayed after a crash finds its version committed and is skipped.
//!
//! Output modes map to commits as Spark's Delta sink does: append adds the
//! batch's files; complete replaces every file in one commit; update either
//! appends every emitted row with its `batch_id` (`changes`), or merges the
//! rows into a latest-value table keyed by the group keys (`upsert`): the
//! files holding any of the batch's keys are rewritten without those rows,
//! plus the new rows, in one commit (copy-on-write, as Delta's MERGE does,
//! without deltalake's DataFusion-based MERGE and its build cost).
//!
//! In real-time mode rows are committed every `commit_interval` instead of
//! at the batch's end (at-least-once, as the trigger's output).
#![deny(missing_docs)]

mod columns;
mod compaction;
mod orphans;
mod owner;
mod task_commits;

pub use owner::LEASE as WRITER_LEASE;

use deltalake::arrow::array::{Array, RecordBatch};
use deltalake::arrow::compute::{cast, concat_batches, filter_record_batch};
use deltalake::arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::kernel::engine::arrow_conversion::{TryIntoArrow, TryIntoKernel};
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, MetadataExt, StructType, Transaction};
use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::writer::{DeltaWriter, RecordBatchWriter, WriteMode};
use deltalake::DeltaTable;
use object_store::ObjectStoreExt;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::IntoFuture;
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark::row::Row;
use tidemark::runtime::{BatchOutput, OutputPart, Sink, SourceOffsets};

/// What a commit does with the batch's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeltaWriteMode {
    /// Output mode append: add the rows.
    Append,
    /// Output mode complete: the rows replace the table, in one commit.
    Overwrite,
    /// Output mode update, `mode: changes`: every emitted row is appended
    /// with the `batch_id` that emitted it.
    Changes,
    /// Output mode update, `mode: upsert`: the table holds the latest row
    /// per `keys`.
    Upsert {
        /// The columns identifying a row.
        keys: Vec<String>,
    },
}

/// Commit latencies a [`DeltaSink`] keeps for
/// [`DeltaSink::take_commit_micros`] at most.
pub const MAX_COMMIT_LATENCIES: usize = 4096;

/// Settings of a [`DeltaSink`].
#[derive(Debug, Clone)]
pub struct DeltaSinkConfig {
    /// A local path or an object-store URL (`s3://…`, `gs://…`,
    /// `abfss://…`, with the matching cargo feature).
    pub location: String,
    /// How rows are committed.
    pub mode: DeltaWriteMode,
    /// Partition columns of a table created here.
    pub partition_by: Vec<String>,
    /// Table properties of a table created here (`delta.*`).
    pub table_properties: BTreeMap<String, String>,
    /// Object-store options (credentials, endpoint, region…); `Debug`
    /// masks the credentials.
    pub storage_options: tidemark::secrets::Properties,
    /// Add new nullable columns instead of refusing them.
    pub merge_schema: bool,
    /// The `txn` app id: the query's id.
    pub app_id: String,
    /// Commit per task partition, staged before the source commits and
    /// published after (see `task_commits`): several instances write one
    /// table. Append and changes modes, with a source that keeps each
    /// partition's checkpoint (Kafka).
    pub task_commits: bool,
    /// Real-time mode: commit this often (no `txn` skip: at-least-once).
    pub commit_interval: Option<Duration>,
    /// Where one instance writes the table (not `task_commits`): this
    /// instance's id, under which it holds the table's writer lease
    /// (`_tidemark/owner.json`, see [`WRITER_LEASE`]); a commit while
    /// another live instance holds it is refused. `None`: no lease.
    pub owner: Option<String>,
    /// Write a Delta checkpoint every this many commits (0: never).
    pub checkpoint_every: u64,
    /// Compact when this many files smaller than `compact_target_bytes`
    /// exist (0: never).
    pub compact_min_files: usize,
    /// Files below this size are compacted.
    pub compact_target_bytes: u64,
}

impl DeltaSinkConfig {
    /// Defaults for a table at `location` written by query `app_id`.
    pub fn new(location: &str, app_id: &str, mode: DeltaWriteMode) -> Self {
        DeltaSinkConfig {
            location: location.to_string(),
            mode,
            partition_by: Vec::new(),
            table_properties: BTreeMap::new(),
            storage_options: Default::default(),
            merge_schema: false,
            app_id: app_id.to_string(),
            task_commits: false,
            commit_interval: None,
            owner: None,
            checkpoint_every: 10,
            compact_min_files: 0,
            compact_target_bytes: 32 << 20,
        }
    }
}

/// Writes rows to a Delta table (see the module documentation).
pub struct DeltaSink {
    config: DeltaSinkConfig,
    runtime: tokio::runtime::Runtime,
    table: Option<DeltaTable>,
    /// Output written and not committed yet, with the batch that wrote it.
    buffer: Vec<(u64, columns::Buffered)>,
    last_commit: Instant,
    commits: u64,
    /// Upsert: which file holds each key (built from the table on first use).
    key_files: Option<HashMap<String, String>>,
    /// The table version `key_files` describes: another writer's commit
    /// since (an OPTIMIZE moving keys into other files) rebuilds it.
    key_files_version: Option<u64>,
    /// Commit latencies in microseconds (for benchmarks).
    commit_micros: Vec<u64>,
    /// The source's offsets at the end of the batch being committed.
    source_offsets: Option<SourceOffsets>,
    /// Append tables: compaction on a thread of its own.
    compactor: Option<compaction::Background>,
    /// Task commits: the open batch's rows per partition, and what was
    /// staged of them.
    tasks: task_commits::TaskBuffers,
    /// The thread renewing the writer lease, once it is held.
    lease: Option<owner::Renewer>,
    /// When the query loop last showed life (epoch ms): the lease is
    /// renewed only while it does.
    alive_at_ms: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// A commit's files were recorded and the commit did not finish: they
    /// are removed before the next (see the `orphans` module).
    pending_recorded: bool,
}

/// The commit-info keys under which a batch's id and end offsets are kept.
const BATCH_ID_KEY: &str = "tidemark.batchId";
const END_OFFSETS_KEY: &str = "tidemark.endOffsets";

/// A Delta, Arrow or object-store error while `context`, kept as the
/// error's source.
fn delta_error(context: &str, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::sink_failed(context, e)
}

impl Drop for DeltaSink {
    /// A clean stop gives the writer lease up (a crash leaves it to run
    /// out).
    fn drop(&mut self) {
        // Stop renewing before giving the lease up.
        self.lease = None;
        if let Some(owner) = self.lease_owner() {
            owner::release(self, owner);
        }
    }
}

impl DeltaSink {
    /// Opens the table at the configured location, if it exists; a missing
    /// table is created from the first batch's columns.
    pub fn new(config: DeltaSinkConfig) -> Result<Self> {
        let per_task_modes = matches!(
            config.mode,
            DeltaWriteMode::Append | DeltaWriteMode::Changes
        );
        if config.task_commits && (!per_task_modes || config.commit_interval.is_some()) {
            return Err(Error::config(
                "sink.mode",
                "several instances writing one Delta table need output mode append or \
                 `mode: changes` under micro-batch triggers",
            ));
        }
        if let DeltaWriteMode::Upsert { keys } = &config.mode {
            if keys.is_empty() {
                return Err(Error::config(
                    "sink.key",
                    "an upsert table needs key columns: `key: [..]` (the grouping columns)",
                ));
            }
            if !config.partition_by.is_empty() {
                return Err(Error::config(
                    "sink.partition_by",
                    "upsert tables are not partitioned in this version; drop `partition_by` or use `mode: changes`",
                ));
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting the Delta sink's runtime", e))?;
        let mut sink = DeltaSink {
            config,
            runtime,
            table: None,
            buffer: Vec::new(),
            last_commit: Instant::now(),
            commits: 0,
            key_files: None,
            key_files_version: None,
            commit_micros: Vec::new(),
            source_offsets: None,
            compactor: None,
            tasks: Default::default(),
            lease: None,
            alive_at_ms: std::sync::Arc::new(std::sync::atomic::AtomicI64::new(owner::now_ms())),
            pending_recorded: false,
        };
        sink.table = sink.open_existing()?;
        // A second writer is refused at its start, not at its first batch.
        sink.ensure_owner()?;
        sink.sweep_orphans();
        Ok(sink)
    }

    fn url(&self) -> Result<url::Url> {
        let location = &self.config.location;
        if !location.contains("://") {
            std::fs::create_dir_all(location)
                .map_err(|e| Error::io(format!("creating {location}"), e))?;
        }
        deltalake::ensure_table_uri(location)
            .map_err(|e| Error::config("sink.path", format!("`{location}`: {e}")))
    }

    fn storage_options(&self) -> HashMap<String, String> {
        self.config.storage_options.0.clone().into_iter().collect()
    }

    fn open_existing(&self) -> Result<Option<DeltaTable>> {
        let url = self.url()?;
        let options = self.storage_options();
        self.runtime.block_on(async {
            let mut table = deltalake::DeltaTableBuilder::from_url(url)
                .map_err(|e| delta_error("opening the Delta table", e))?
                .with_storage_options(options)
                .build()
                .map_err(|e| delta_error("opening the Delta table", e))?;
            match table.load().await {
                Ok(()) => Ok(Some(table)),
                Err(deltalake::DeltaTableError::NotATable(_)) => Ok(None),
                Err(e) => Err(delta_error("loading the Delta table", e)),
            }
        })
    }

    /// Removes the data files of commits that never happened: staged
    /// commits already superseded (several instances), or the commit a
    /// crash or a failure interrupted (one instance).
    fn sweep_orphans(&mut self) {
        // Best effort: a file left behind costs storage, never a wrong
        // table, so a failing store does not stop the query.
        let swept = match self.config.task_commits {
            true => task_commits::sweep(self),
            false => self.sweep_pending(),
        };
        if let Err(e) = swept {
            tracing::warn!(error = %e, table = %self.config.location, "files of commits that did not happen were not removed; trying again later");
        }
    }

    fn sweep_pending(&mut self) -> Result<()> {
        // Whether the interrupted commit landed is read from the table as
        // it is now, not as this process last saw it.
        if let Some(table) = self.table.as_mut() {
            self.runtime
                .block_on(table.update_state())
                .map_err(|e| delta_error("reloading the table", e))?;
        }
        let removed = orphans::sweep_pending(self)?;
        if removed > 0 {
            tracing::info!(files = removed, table = %self.config.location, "removed the files of a commit that did not happen");
        }
        self.pending_recorded = false;
        Ok(())
    }

    /// The instance id under which this sink holds the table's writer
    /// lease: where one instance writes the table (see
    /// [`DeltaSinkConfig::owner`]), not under task commits.
    fn lease_owner(&self) -> Option<&str> {
        match self.config.task_commits {
            true => None,
            false => self.config.owner.as_deref(),
        }
    }

    /// Holds the table's writer lease when one instance writes it.
    fn ensure_owner(&mut self) -> Result<()> {
        let Some(owner) = self.lease_owner() else {
            return Ok(());
        };
        let renewing = self.lease.as_ref().is_some_and(owner::Renewer::is_running);
        if let Some(renewer) = owner::ensure_owner(self, owner, renewing)? {
            self.lease = Some(renewer);
        }
        Ok(())
    }

    /// The last batch id committed by this query, from the table's `txn`.
    pub fn committed_batch(&self) -> Result<Option<u64>> {
        self.txn_version(&self.config.app_id)
    }

    /// The version of application `app_id`'s last `txn` in the table.
    fn txn_version(&self, app_id: &str) -> Result<Option<u64>> {
        let Some(table) = &self.table else {
            return Ok(None);
        };
        let app_id = app_id.to_string();
        self.runtime.block_on(async {
            let state = table
                .snapshot()
                .map_err(|e| delta_error("reading the table state", e))?;
            let version = state
                .transaction_version(table.log_store().as_ref(), app_id)
                .await
                .map_err(|e| delta_error("reading the txn version", e))?;
            Ok(version.map(|v| v as u64))
        })
    }

    /// The end offsets recorded with batch `batch_id`'s commit.
    fn recorded_offsets(&self, batch_id: u64) -> Result<Option<SourceOffsets>> {
        use futures::StreamExt;
        let Some(table) = &self.table else {
            return Ok(None);
        };
        self.runtime.block_on(async {
            let mut history = table.history(Some(100));
            while let Some(info) = history.next().await {
                let info = info.map_err(|e| delta_error("reading the table history", e))?;
                if info.info.get(BATCH_ID_KEY).and_then(|v| v.as_u64()) == Some(batch_id) {
                    let Some(offsets) = info.info.get(END_OFFSETS_KEY) else {
                        return Ok(None);
                    };
                    let what =
                        format!("the commit of batch {batch_id} in the Delta table's history");
                    return SourceOffsets::from_stored(offsets, &what).map(Some);
                }
            }
            Ok(None)
        })
    }

    /// Commit latencies in microseconds since the last call (the most
    /// recent [`MAX_COMMIT_LATENCIES`] of them).
    pub fn take_commit_micros(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.commit_micros)
    }

    /// Records one commit's latency for [`Self::take_commit_micros`] and as
    /// the `tidemark_delta_commit_seconds` histogram. Bounded: a sink whose
    /// latencies nobody takes (every sink outside a benchmark) must not
    /// grow by one entry per commit for as long as it runs.
    fn record_commit_latency(&mut self, started: Instant) {
        let elapsed = started.elapsed();
        metrics::histogram!("tidemark_delta_commit_seconds").record(elapsed.as_secs_f64());
        if self.commit_micros.len() >= MAX_COMMIT_LATENCIES {
            self.commit_micros.drain(..MAX_COMMIT_LATENCIES / 2);
        }
        self.commit_micros
            .push(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    /// The table's Arrow schema.
    fn table_schema(table: &DeltaTable) -> Result<Schema> {
        let kernel = table
            .snapshot()
            .map_err(|e| delta_error("reading the table schema", e))?
            .schema();
        let schema: Schema = kernel
            .as_ref()
            .try_into_arrow()
            .map_err(|e| delta_error("the table schema in Arrow", e))?;
        Ok(schema)
    }

    fn create_table(&mut self, schema: &Schema) -> Result<()> {
        let kernel: StructType = schema
            .try_into_kernel()
            .map_err(|e| delta_error("the table schema in Delta", e))?;
        let url = self.url()?;
        let builder = deltalake::operations::create::CreateBuilder::new()
            .with_location(url.to_string())
            .with_storage_options(self.storage_options())
            .with_columns(kernel.fields().cloned())
            .with_partition_columns(self.config.partition_by.clone())
            .with_configuration(
                self.config
                    .table_properties
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(v.clone()))),
            );
        let table = self
            .runtime
            .block_on(builder.into_future())
            .map_err(|e| delta_error("creating the Delta table", e))?;
        tracing::info!(location = %self.config.location, columns = schema.fields().len(), "Delta table created");
        self.table = Some(table);
        Ok(())
    }

    /// Real-time commits: commits what is buffered when the interval is up.
    fn commit_if_due(&mut self) -> Result<()> {
        if let Some(every) = self.config.commit_interval {
            if self.last_commit.elapsed() >= every {
                self.commit_buffer(None)?;
            }
        }
        Ok(())
    }

    /// Commits what is buffered; with `txn_version`, as that batch, unless
    /// the table already holds it.
    fn commit_buffer(&mut self, txn_version: Option<u64>) -> Result<()> {
        let started = Instant::now();
        if self.pending_recorded {
            // The last commit failed: its files go before anything of
            // this one is planned (the sweep reloads the table).
            self.sweep_orphans();
        }
        let buffered = std::mem::take(&mut self.buffer);
        let num_rows: usize = buffered.iter().map(|(_, part)| part.num_rows()).sum();
        self.last_commit = Instant::now();
        if let Some(version) = txn_version {
            if self.committed_batch()?.is_some_and(|v| v >= version) {
                tracing::info!(
                    batch_id = version,
                    rows = num_rows,
                    "batch already in the Delta table; skipped"
                );
                return Ok(());
            }
        }
        // A batch without rows still commits its `txn` (and end offsets), as
        // Spark's Delta sink does: a restart then knows exactly where the
        // table stands.
        if num_rows == 0
            && self.config.mode != DeltaWriteMode::Overwrite
            && (txn_version.is_none() || self.table.is_none())
        {
            return Ok(());
        }
        let mut parts: Vec<columns::Buffered> = Vec::with_capacity(buffered.len());
        for (batch_id, mut part) in buffered {
            if self.config.mode == DeltaWriteMode::Changes {
                part.set_column("batch_id", batch_id as i64)?;
            }
            parts.push(part);
        }
        let inferred = columns::infer_schema_of(&parts)?;
        if self.table.is_none() {
            if num_rows == 0 {
                return Ok(());
            }
            self.create_table(&inferred)?;
        }
        let table = self.table.as_ref().expect("created above");
        let plan = columns::plan_schema(
            &Self::table_schema(table)?,
            &inferred,
            self.config.merge_schema,
        )?;
        let batch = columns::to_record_batch_of(&parts, &plan.schema)?;
        let mut actions: Vec<Action> = Vec::new();
        let operation = match &self.config.mode {
            DeltaWriteMode::Overwrite => {
                actions.extend(self.all_files()?.into_iter().map(Action::Remove));
                DeltaOperation::Write {
                    mode: SaveMode::Overwrite,
                    partition_by: none_if_empty(&self.config.partition_by),
                    predicate: None,
                }
            }
            DeltaWriteMode::Append | DeltaWriteMode::Changes => DeltaOperation::Write {
                mode: SaveMode::Append,
                partition_by: none_if_empty(&self.config.partition_by),
                predicate: None,
            },
            DeltaWriteMode::Upsert { keys } => {
                let keys = keys.clone();
                self.follow_other_writers()?;
                let (removes, survivors) = self.upsert_rewrite(&keys, &batch)?;
                actions.extend(removes.into_iter().map(Action::Remove));
                let merged = match survivors {
                    Some(old) => concat_batches(&plan.schema, [&old, &batch])
                        .map_err(|e| delta_error("merging rows", e))?,
                    None => batch.clone(),
                };
                return self.write_and_commit(
                    merged,
                    &plan,
                    actions,
                    DeltaOperation::Write {
                        mode: SaveMode::Append,
                        partition_by: None,
                        predicate: Some(format!("upsert on {}", keys.join(", "))),
                    },
                    txn_version,
                    started,
                    Some(&keys),
                );
            }
        };
        self.write_and_commit(batch, &plan, actions, operation, txn_version, started, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_and_commit(
        &mut self,
        batch: RecordBatch,
        plan: &columns::SchemaPlan,
        mut actions: Vec<Action>,
        operation: DeltaOperation,
        txn_version: Option<u64>,
        started: Instant,
        upsert_keys: Option<&[String]>,
    ) -> Result<()> {
        let table = self.table.as_mut().expect("the table exists");
        let mode = if plan.widened {
            WriteMode::MergeSchema
        } else {
            WriteMode::Default
        };
        let app_id = self.config.app_id.clone();
        let adds = self.runtime.block_on(write_files(table, batch, mode))?;
        if plan.widened {
            actions.push(self.widened_metadata(plan)?);
        }
        let new_paths: Vec<String> = adds.iter().map(|a| a.path.clone()).collect();
        // Named before the commit: should it not happen, the next commit
        // or start removes them.
        orphans::record_pending(self, &new_paths)?;
        self.pending_recorded = true;
        let table = self.table.as_mut().expect("the table exists");
        actions.extend(adds.into_iter().map(Action::Add));
        let mut properties = CommitProperties::default();
        if let Some(version) = txn_version {
            let mut metadata = vec![(BATCH_ID_KEY.to_string(), serde_json::json!(version))];
            if let Some(offsets) = &self.source_offsets {
                metadata.push((END_OFFSETS_KEY.to_string(), offsets.to_stored()));
            }
            properties = properties
                .with_application_transaction(Transaction::new(&app_id, version as i64))
                .with_metadata(metadata);
        }
        let version = self.runtime.block_on(async {
            let state = table
                .snapshot()
                .map_err(|e| delta_error("table state", e))?;
            let finalized = CommitBuilder::from(properties)
                .with_actions(actions)
                .build(Some(state), table.log_store(), operation)
                .await
                .map_err(|e| delta_error("committing to the Delta log", e))?;
            let version = finalized.version();
            table
                .update_state()
                .await
                .map_err(|e| delta_error("reloading the table", e))?;
            Ok::<_, Error>(version)
        })?;
        orphans::clear_pending(self);
        self.pending_recorded = false;
        self.commits += 1;
        self.record_commit_latency(started);
        metrics::counter!("tidemark_delta_commits_total").increment(1);
        tracing::debug!(version, batch_id = ?txn_version, "Delta commit");
        if let Some(keys) = upsert_keys {
            if self.key_files_version == Some(version - 1) {
                self.index_files(keys, &new_paths)?;
                self.key_files_version = Some(version);
            } else {
                // Another writer committed between the reload and this
                // commit without a conflict: its files are not indexed.
                self.key_files = None;
            }
        }
        self.maintain()?;
        Ok(())
    }

    /// The table's metadata with `plan`'s widened schema.
    fn widened_metadata(&self, plan: &columns::SchemaPlan) -> Result<Action> {
        let table = self.table.as_ref().expect("the table exists");
        let state = table
            .snapshot()
            .map_err(|e| delta_error("table state", e))?;
        let kernel: StructType = plan
            .schema
            .as_ref()
            .try_into_kernel()
            .map_err(|e| delta_error("the widened schema", e))?;
        let metadata = state
            .metadata()
            .clone()
            .with_schema(&kernel)
            .map_err(|e| delta_error("the widened schema", e))?;
        Ok(Action::Metadata(metadata))
    }

    /// Every active file, as remove actions.
    fn all_files(&self) -> Result<Vec<deltalake::kernel::Remove>> {
        let Some(table) = &self.table else {
            return Ok(Vec::new());
        };
        let state = table
            .snapshot()
            .map_err(|e| delta_error("table state", e))?;
        Ok(state
            .log_data()
            .into_iter()
            .map(|f| f.remove_action(true))
            .collect())
    }

    /// Reads one data file of the table.
    fn read_file(&self, path: &str) -> Result<Vec<RecordBatch>> {
        let table = self.table.as_ref().expect("the table exists");
        read_file(&self.runtime, table, path)
    }

    /// Upsert: the files holding any key of `batch` (to remove), and their
    /// rows whose keys `batch` does not replace (to write again).
    fn upsert_rewrite(
        &mut self,
        keys: &[String],
        batch: &RecordBatch,
    ) -> Result<(Vec<deltalake::kernel::Remove>, Option<RecordBatch>)> {
        if self.key_files.is_none() {
            let paths: Vec<String> = self.all_files()?.into_iter().map(|r| r.path).collect();
            self.key_files = Some(HashMap::new());
            self.index_files(keys, &paths)?;
            self.key_files_version = self.table.as_ref().and_then(|t| t.version());
        }
        let new_keys: HashSet<String> = key_strings(batch, keys)?.into_iter().collect();
        let index = self.key_files.as_ref().expect("built above");
        let touched: HashSet<&String> = new_keys.iter().filter_map(|k| index.get(k)).collect();
        if touched.is_empty() {
            return Ok((Vec::new(), None));
        }
        let removes: Vec<deltalake::kernel::Remove> = self
            .all_files()?
            .into_iter()
            .filter(|r| touched.contains(&r.path))
            .collect();
        let schema = batch.schema();
        let mut kept = Vec::new();
        for remove in &removes {
            for old in self.read_file(&remove.path)? {
                let old = conform(&old, &schema)?;
                let old_keys = key_strings(&old, keys)?;
                let keep: deltalake::arrow::array::BooleanArray = old_keys
                    .iter()
                    .map(|k| Some(!new_keys.contains(k)))
                    .collect();
                kept.push(
                    filter_record_batch(&old, &keep)
                        .map_err(|e| delta_error("filtering rows", e))?,
                );
            }
        }
        let index = self.key_files.as_mut().expect("built above");
        index.retain(|_, path| !touched_contains(&removes, path));
        let survivors =
            concat_batches(&schema, &kept).map_err(|e| delta_error("merging rows", e))?;
        Ok((removes, Some(survivors)))
    }

    /// Upsert: brings the table up to its latest version, and forgets the
    /// key index when another writer committed since it was built (an
    /// OPTIMIZE, a VACUUM-then-rewrite): its keys may live in other files
    /// now, and a stale index would leave an old row beside the new one.
    fn follow_other_writers(&mut self) -> Result<()> {
        let Some(table) = self.table.as_mut() else {
            return Ok(());
        };
        self.runtime
            .block_on(table.update_state())
            .map_err(|e| delta_error("reloading the table", e))?;
        if self.key_files.is_some() && table.version() != self.key_files_version {
            tracing::info!(
                table = %self.config.location,
                indexed = ?self.key_files_version,
                latest = ?table.version(),
                "another writer committed to the upsert table; its key index is rebuilt"
            );
            self.key_files = None;
        }
        Ok(())
    }

    /// Records which of `paths` holds each key.
    fn index_files(&mut self, keys: &[String], paths: &[String]) -> Result<()> {
        let mut found = Vec::new();
        for path in paths {
            for batch in self.read_file(path)? {
                for key in key_strings(&batch, keys)? {
                    found.push((key, path.clone()));
                }
            }
        }
        self.key_files
            .get_or_insert_with(HashMap::new)
            .extend(found);
        Ok(())
    }

    /// Checkpoints and compaction, when due.
    fn maintain(&mut self) -> Result<()> {
        let every = self.config.checkpoint_every;
        if every > 0 && self.commits.is_multiple_of(every) {
            let table = self.table.as_ref().expect("the table exists");
            self.runtime
                .block_on(deltalake::checkpoints::create_checkpoint(table, None))
                .map_err(|e| delta_error("writing a Delta checkpoint", e))?;
        }
        if self.config.compact_min_files > 0 && self.config.partition_by.is_empty() {
            match self.config.mode {
                // Appends never remove files: compaction runs beside them.
                DeltaWriteMode::Append | DeltaWriteMode::Changes => {
                    if self.compactor.is_none() {
                        self.compactor = Some(compaction::Background::start(
                            self.url()?,
                            self.storage_options(),
                            self.config.compact_min_files,
                            self.config.compact_target_bytes,
                        )?);
                    }
                    if let Some(c) = &self.compactor {
                        c.request();
                    }
                }
                // Rewrites and overwrites remove files themselves: compact
                // in line, between commits.
                DeltaWriteMode::Overwrite | DeltaWriteMode::Upsert { .. } => {
                    let table = self.table.as_mut().expect("the table exists");
                    let compacted = compaction::compact(
                        &self.runtime,
                        table,
                        self.config.compact_min_files,
                        self.config.compact_target_bytes,
                    )?;
                    if compacted.is_some() {
                        // Keys moved to the compacted file.
                        self.key_files = None;
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits until background compaction is idle (tests and benchmarks).
    pub fn wait_for_compaction(&mut self) {
        if let Some(c) = self.compactor.take() {
            c.finish();
        }
    }
}

/// Reads one data file of `table`.
pub(crate) fn read_file(
    runtime: &tokio::runtime::Runtime,
    table: &DeltaTable,
    path: &str,
) -> Result<Vec<RecordBatch>> {
    let store = table.object_store();
    let location = deltalake::Path::parse(path).map_err(|e| delta_error("file path", e))?;
    let bytes = runtime.block_on(async {
        let got = store
            .get(&location)
            .await
            .map_err(|e| delta_error(&format!("reading {path}"), e))?;
        got.bytes()
            .await
            .map_err(|e| delta_error(&format!("reading {path}"), e))
    })?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.build())
        .map_err(|e| delta_error(&format!("decoding {path}"), e))?;
    reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| delta_error(&format!("decoding {path}"), e))
}

/// Writes `batch` as Parquet files of `table` (none for no rows); returns
/// their add actions, to be committed.
async fn write_files(
    table: &DeltaTable,
    batch: RecordBatch,
    mode: WriteMode,
) -> Result<Vec<deltalake::kernel::Add>> {
    let mut writer = RecordBatchWriter::for_table(table)
        .map_err(|e| delta_error("opening a Delta writer", e))?;
    if batch.num_rows() > 0 {
        writer
            .write_with_mode(batch, mode)
            .await
            .map_err(|e| delta_error("writing Parquet", e))?;
    }
    writer
        .flush()
        .await
        .map_err(|e| delta_error("writing Parquet", e))
}

fn touched_contains(removes: &[deltalake::kernel::Remove], path: &str) -> bool {
    removes.iter().any(|r| r.path == path)
}

fn none_if_empty(columns: &[String]) -> Option<Vec<String>> {
    (!columns.is_empty()).then(|| columns.to_vec())
}

/// `batch` with the columns of `schema` (missing ones null, in order).
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => cast(c, f.data_type()).map_err(|e| delta_error("casting a column", e)),
            None => Ok(deltalake::arrow::array::new_null_array(
                f.data_type(),
                batch.num_rows(),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| delta_error("conforming rows", e))
}

/// Each row's key, as text: the key columns cast to strings, joined.
fn key_strings(batch: &RecordBatch, keys: &[String]) -> Result<Vec<String>> {
    let mut columns = Vec::with_capacity(keys.len());
    for key in keys {
        let column = batch
            .column_by_name(key)
            .ok_or_else(|| Error::Sink(format!("upsert key column `{key}` is not in the rows")))?;
        let text = cast(column, &DataType::Utf8).map_err(|e| delta_error("key as text", e))?;
        columns.push(text);
    }
    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let mut key = String::new();
        for c in &columns {
            let strings = c
                .as_any()
                .downcast_ref::<deltalake::arrow::array::StringArray>()
                .expect("cast to Utf8");
            if strings.is_null(i) {
                key.push('\u{0}');
            } else {
                key.push_str(strings.value(i));
            }
            key.push('\u{1}');
        }
        out.push(key);
    }
    Ok(out)
}

impl Sink for DeltaSink {
    fn describe(&self) -> String {
        format!("DeltaSink[{}]", self.config.location)
    }

    fn alive(&mut self) {
        self.alive_at_ms
            .store(owner::now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()> {
        if !rows.is_empty() {
            self.buffer
                .push((batch_id, columns::Buffered::Rows(rows.to_vec())));
        }
        self.commit_if_due()
    }

    fn write_tasks(&mut self, batch_id: u64, rows: &[Row], tasks: &[(i32, usize)]) -> Result<()> {
        if !self.config.task_commits {
            return self.write(batch_id, rows);
        }
        self.tasks.add(rows, tasks);
        Ok(())
    }

    /// Columnar batches are buffered as they are and written to the table
    /// without becoming rows; task commits keep rows per task.
    fn write_output(&mut self, batch_id: u64, output: &BatchOutput<'_>) -> Result<()> {
        if output.columns.is_empty() {
            return self.write_tasks(batch_id, output.rows, output.tasks);
        }
        if self.config.task_commits {
            let (rows, tasks) = output.to_rows()?;
            return self.write_tasks(batch_id, &rows, &tasks);
        }
        for part in output.parts() {
            let part = match part {
                OutputPart::Rows { rows, .. } => columns::Buffered::Rows(rows.to_vec()),
                OutputPart::Columns { batch, .. } => columns::Buffered::Columns(batch.clone()),
            };
            self.buffer.push((batch_id, part));
        }
        self.commit_if_due()
    }

    fn prepare(
        &mut self,
        batch_id: u64,
        next_seqs: &BTreeMap<i32, u64>,
    ) -> Result<BTreeMap<i32, tidemark::runtime::SinkCommit>> {
        if !self.config.task_commits {
            return Ok(BTreeMap::new());
        }
        task_commits::stage(self, batch_id, next_seqs)
    }

    fn publish(&mut self, batch_id: u64) -> Result<()> {
        task_commits::publish(self, batch_id)
    }

    fn recover_task(
        &mut self,
        partition: i32,
        commit: &tidemark::runtime::SinkCommit,
    ) -> Result<()> {
        if !self.config.task_commits {
            return Ok(());
        }
        task_commits::recover(self, partition, commit)
    }

    fn abort(&mut self, batch_id: u64) {
        self.tasks.clear();
        // Rows committed already (real-time commits) stay: at-least-once.
        let before = self.buffer.len();
        self.buffer.retain(|(b, _)| *b != batch_id);
        tracing::debug!(
            batch_id,
            dropped_parts = before - self.buffer.len(),
            "aborted batch's rows dropped"
        );
    }

    fn source_offsets(&mut self, offsets: &SourceOffsets) {
        self.source_offsets = Some(offsets.clone());
    }

    fn recovered_batch(&mut self) -> Result<Option<(u64, SourceOffsets)>> {
        if self.config.commit_interval.is_some() || self.config.task_commits {
            // Task commits recover per partition (`recover_task`).
            // Real-time commits carry no batch record: at-least-once.
            return Ok(None);
        }
        let Some(batch) = self.committed_batch()? else {
            return Ok(None);
        };
        let offsets = self.recorded_offsets(batch)?.unwrap_or_default();
        Ok(Some((batch, offsets)))
    }

    fn commit(&mut self, batch_id: u64) -> Result<()> {
        if self.config.task_commits {
            // Staged in `prepare`, published after the source's commit.
            return Ok(());
        }
        // Before the `txn` check in `commit_buffer` can skip a batch that
        // another writer committed under the same batch id.
        self.ensure_owner()?;
        let existed = self.table.is_some();
        match self.config.commit_interval {
            // Real-time: what is left, at the checkpoint.
            Some(_) => self.commit_buffer(None)?,
            None => self.commit_buffer(Some(batch_id))?,
        }
        if !existed {
            // The first commit made the table: its lease starts now.
            self.ensure_owner()?;
        }
        Ok(())
    }
}
