//! A task's checkpoint: what a task keeps with its source offsets (the
//! batch that committed them, the watermark, the last sink commit, and
//! each store with the step keeping it). A source carries it as a
//! [`TaskCheckpoint`] it stores and hands back without reading it; the
//! engine alone encodes and reads it.

use super::SinkCommit;
use crate::error::{Error, Result};
use crate::watermark::WatermarkTracker;
use std::collections::BTreeMap;

/// The encoding of the task checkpoints this release writes. One without
/// a version was written before versions were recorded (version 1); a
/// higher one, by a newer release, is refused rather than misread.
pub(super) const CHECKPOINT_VERSION: u32 = 1;

/// The largest checkpoint kept whole. Kafka keeps at most
/// `offset.metadata.max.bytes` (4 KiB by default) with a committed offset.
const CHECKPOINT_BUDGET: usize = 3 * 1024;

/// A task's checkpoint as a source keeps it beside the partition's offsets
/// (Kafka: the committed offset's metadata; the files source: its commit
/// log) and hands back in
/// [`SourceBatch::restored_checkpoints`](super::SourceBatch::restored_checkpoints)
/// when the partition comes back. Its text is the engine's own versioned
/// encoding: store it as it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct TaskCheckpoint {
    encoded: String,
}

impl TaskCheckpoint {
    /// A checkpoint read back from where a source stored it (any text: one
    /// this release cannot read is refused or ignored where it is restored,
    /// never misread).
    pub fn from_stored(encoded: impl Into<String>) -> Self {
        TaskCheckpoint {
            encoded: encoded.into(),
        }
    }

    /// The text to store beside the offsets.
    pub fn as_str(&self) -> &str {
        &self.encoded
    }

    /// The batch that committed it (`None` for a checkpoint from before
    /// batch ids were recorded, or text that is not a checkpoint). Read
    /// whatever the encoding's version: a replay only compares it.
    pub fn batch_id(&self) -> Option<u64> {
        serde_json::from_str::<CheckpointContents>(&self.encoded)
            .ok()
            .map(|c| c.batch_id)
    }

    /// The stores it records (empty for one written before stores were
    /// recorded, or without a state backend): what `tidemark reset`
    /// deletes the changelogs of, beside those the current plan names.
    /// Only names this release gives stores (`op<index>`) from an encoding
    /// it knows: metadata another writer left on the group names no topic
    /// to delete.
    pub fn store_names(&self) -> Vec<String> {
        if self.check_version(0).is_err() {
            return Vec::new();
        }
        let Ok(saved) = serde_json::from_str::<CheckpointContents>(&self.encoded) else {
            return Vec::new();
        };
        let is_store_name = |name: &String| {
            name.strip_prefix("op")
                .is_some_and(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
        };
        saved.stores.into_keys().filter(is_store_name).collect()
    }

    /// Encodes `contents`. One that would not fit the offset metadata (a
    /// repartition reader's watermark holds every upstream partition,
    /// about 40 bytes each) keeps only its watermarks, not each input's
    /// progress: after a restore the watermark holds where it was until
    /// every input has reported again, which their next batches' markers
    /// do.
    pub(super) fn encode(mut contents: CheckpointContents) -> Option<TaskCheckpoint> {
        let whole = serde_json::to_string(&contents).ok()?;
        if whole.len() <= CHECKPOINT_BUDGET {
            return Some(TaskCheckpoint::from_stored(whole));
        }
        if let Some(w) = contents.watermark.as_mut() {
            w.forget_inputs();
        }
        let smaller = serde_json::to_string(&contents).ok()?;
        if smaller.len() <= CHECKPOINT_BUDGET {
            return Some(TaskCheckpoint::from_stored(smaller));
        }
        // Dozens of stateful steps: the stores go unchecked at the next start
        // rather than the offsets failing to commit.
        tracing::warn!(
            stores = contents.stores.len(),
            "the task checkpoint leaves out its stores to fit the offset metadata"
        );
        contents.stores.clear();
        serde_json::to_string(&contents)
            .ok()
            .map(TaskCheckpoint::from_stored)
    }

    /// What it holds; a bare watermark is how the first releases wrote it.
    pub(super) fn contents(&self) -> std::result::Result<CheckpointContents, serde_json::Error> {
        serde_json::from_str::<CheckpointContents>(&self.encoded).or_else(|_| {
            serde_json::from_str::<WatermarkTracker>(&self.encoded).map(|w| CheckpointContents {
                version: crate::encoding::first_version(),
                batch_id: 0,
                watermark: Some(w),
                sink: None,
                stores: BTreeMap::new(),
            })
        })
    }

    /// Refuses a checkpoint of `partition` of a newer encoding than this
    /// release writes: it may not parse as this release's type at all.
    fn check_version(&self, partition: i32) -> Result<()> {
        crate::encoding::check_json_version(
            || format!("the checkpoint of partition {partition}"),
            self.encoded.as_bytes(),
            CHECKPOINT_VERSION,
        )
    }

    /// Refuses to restore a task from this checkpoint of `partition` if
    /// it is of a newer encoding than this release writes, or — with a
    /// state backend, whose stores `stores` lists with the step keeping
    /// each — if the plan would misread or leave behind its stores: a step
    /// added, removed or moved before a stateful one renames the stores
    /// after it. A store now kept by another kind of step is refused; so
    /// is a store no step keeps any more while another starts without
    /// state (the renamed one). A checkpoint without stores (written
    /// before they were recorded) is not checked; a stateful step added
    /// after the others starts empty, and one removed after the others
    /// leaves its state behind.
    pub(super) fn check(
        &self,
        partition: i32,
        stores: Option<&BTreeMap<String, String>>,
    ) -> Result<()> {
        // An unreadable checkpoint is reported where it is restored.
        self.check_version(partition)?;
        let (Some(stores), Ok(saved)) = (
            stores,
            serde_json::from_str::<CheckpointContents>(&self.encoded),
        ) else {
            return Ok(());
        };
        let starting_empty: Vec<&String> = stores
            .keys()
            .filter(|name| !saved.stores.is_empty() && !saved.stores.contains_key(*name))
            .collect();
        for (name, kept_by) in &saved.stores {
            let now = match stores.get(name) {
                Some(now) if now == kept_by => continue,
                Some(now) => format!("would now be restored into the {now}"),
                None => match starting_empty.first() {
                    Some(renamed) => format!(
                        "has no step any more, while `{renamed}` (the {}) starts without state",
                        stores[*renamed]
                    ),
                    // The last stateful steps were removed: nothing is misread.
                    None => continue,
                },
            };
            return Err(Error::config(
                "steps",
                format!(
                    "the state store `{name}` of partition {partition} was kept by the {kept_by} and {now}: a step was added, removed or moved before it. Put the steps back as they were, or start the query over without its state (`tidemark reset`)"
                ),
            ));
        }
        Ok(())
    }
}

/// What a task checkpoints with its source offsets: the batch that
/// committed them, the watermark and the last sink commit of its output.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CheckpointContents {
    /// Its encoding (see [`CHECKPOINT_VERSION`]).
    #[serde(rename = "v", default = "crate::encoding::first_version")]
    pub(super) version: u32,
    #[serde(rename = "batchId")]
    pub(super) batch_id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) watermark: Option<WatermarkTracker>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) sink: Option<SinkCommit>,
    /// Each store of the task (`op<index>`) with what kept it (see
    /// `QueryPlan::store_identities`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) stores: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::TaskCheckpoint;

    /// What `tidemark reset` takes from a committed checkpoint: the store
    /// names this release gives (`op<index>`), from an encoding it knows.
    #[test]
    fn a_reset_names_only_the_stores_of_a_known_checkpoint() {
        let stores = TaskCheckpoint::from_stored(
            r#"{"v":1,"batchId":3,"stores":{"op0":"join","op12":"distinct","eu-op0":"join","op":"join"}}"#,
        )
        .store_names();
        assert_eq!(stores, ["op0", "op12"]);
        let newer = TaskCheckpoint::from_stored(r#"{"v":2,"batchId":3,"stores":{"op0":"join"}}"#);
        assert!(newer.store_names().is_empty());
        assert!(TaskCheckpoint::from_stored("someone else's metadata")
            .store_names()
            .is_empty());
    }

    /// The batch that committed a checkpoint, which a replay after a crash
    /// compares with the batch it replays; foreign metadata says none.
    #[test]
    fn the_batch_id_is_read_from_a_checkpoint_and_none_from_anything_else() {
        assert_eq!(
            TaskCheckpoint::from_stored(r#"{"v":1,"batchId":7}"#).batch_id(),
            Some(7)
        );
        assert_eq!(
            TaskCheckpoint::from_stored(r#"{"batchId":7}"#).batch_id(),
            Some(7),
            "written before versions"
        );
        assert_eq!(TaskCheckpoint::from_stored("metadata").batch_id(), None);
    }

    /// A source stores the checkpoint's text as it is: in a serde model
    /// (the files source's commit log) it is that text, not an object.
    #[test]
    fn a_checkpoint_serializes_as_its_text() {
        let checkpoint = TaskCheckpoint::from_stored(r#"{"v":1,"batchId":7}"#);
        let json = serde_json::to_string(&checkpoint).unwrap();
        assert_eq!(json, r#""{\"v\":1,\"batchId\":7}""#);
        let back: TaskCheckpoint = serde_json::from_str(&json).unwrap();
        assert_eq!(back, checkpoint);
    }
}
