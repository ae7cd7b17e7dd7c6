//! `tidemark reset <file>`: a pipeline with a Kafka source made to start
//! over, as Kafka Streams' application reset tool does — its consumer
//! groups' offsets on its input topics moved to their start (or to a time),
//! the groups reading its repartition topics deleted, its internal topics
//! (changelogs, repartition topics, the watermark exchange) deleted, its
//! local state removed. Every instance must be stopped first: a group with
//! members is refused.
//!
//! Only what this pipeline made is touched, named exactly as it names it
//! (never by a pattern, which could catch another pipeline's or a user's
//! topic): `<stage>-op<i>-changelog` for each stateful step of each stage,
//! and for each store its committed task checkpoints record (a chain
//! changed since names other stores: their changelogs would otherwise
//! outlive the reset and be restored by a later chain reusing the name),
//! its stages' repartition topics, `<name>-watermarks`; in the state
//! directory, which pipelines may share, only `<dir>/<stage>` for each
//! stage and its instance slot `<dir>/.instances/<name>`.
//!
//! Its output is not touched. A Kafka sink receives the replayed results
//! again; a Delta table remembers the batches it committed and would skip
//! them, so a reset refuses while the table exists (delete it first).

use crate::kafka::reset::{self, ResetTo};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use tidemark::error::{Error, Result};
use tidemark::runtime::StageInput;
use tidemark_pipeline::{PipelineFile, SinkKind, SourceKind};

/// What a reset does, worked out before anything is changed (what
/// `--dry-run` prints).
#[derive(Debug, Clone)]
pub struct ResetPlan {
    /// Where input offsets go.
    pub to: ResetTo,
    /// Each consumer group reading input topics, with those topics: its
    /// offsets are committed to `to`.
    pub input_groups: Vec<(String, Vec<String>)>,
    /// Groups reading repartition topics: deleted with their offsets.
    pub internal_groups: Vec<String>,
    /// Changelog and repartition topics: deleted (the next run creates them).
    pub internal_topics: Vec<String>,
    /// This pipeline's directories under its state directory: removed.
    pub state_dirs: Vec<PathBuf>,
}

impl ResetPlan {
    /// Works out the reset of `file` (paths relative to `base`), reading the
    /// cluster's topics; checks that no instance runs.
    pub fn of(file: &PipelineFile, base: &Path, to: ResetTo) -> Result<Self> {
        if file.source.kind != SourceKind::Kafka {
            return Err(Error::config(
                "source.kind",
                "`tidemark reset` resets a Kafka source's pipeline; a files source's record of what it read is its checkpoint (`source.checkpoint`, or `files-source` under the state directory): stop the pipeline and remove it, with the state directory",
            ));
        }
        check_sink(file, base)?;
        let co_partitioned = !crate::join_needs_repartition(file)?;
        let topology = file.topology(co_partitioned)?;
        // Joined streams read by a writer of their own are not the source
        // stage's input.
        let joins_apart = topology
            .stages
            .iter()
            .any(|s| matches!(s.input, StageInput::Joined { .. }));
        let mut input_groups = Vec::new();
        let mut internal_groups = Vec::new();
        let mut candidates = vec![format!("{}-watermarks", file.name)];
        let mut state_dirs = Vec::new();
        let state_dir = file
            .state_spec()
            .map(|s| crate::from_pipeline::resolve(base, &s.dir));
        let cluster = crate::KafkaClients::of_pipeline(file)?.cluster;
        for stage in &topology.stages {
            let group = crate::from_pipeline::stage_group(file, &stage.input);
            let read = match &stage.input {
                StageInput::Source => source_topics(file, joins_apart)?,
                StageInput::Joined { topics, .. } => topics.clone(),
                StageInput::Repartition { topic, .. } => vec![topic.clone()],
            };
            let mut stores = stage.query.plan().store_names();
            for checkpoint in reset::committed_metadata(&cluster, &group, &read)? {
                stores.extend(
                    tidemark::runtime::TaskCheckpoint::from_stored(checkpoint).store_names(),
                );
            }
            stores.sort();
            stores.dedup();
            for store in stores {
                candidates.push(format!("{}-{store}-changelog", stage.name));
            }
            match &stage.input {
                StageInput::Source => input_groups.push((group, read)),
                StageInput::Joined { .. } => {
                    input_groups.push((group, read));
                    candidates.push(format!("{}-watermarks", stage.name));
                }
                StageInput::Repartition { .. } => internal_groups.push(group),
            }
            if let Some(dir) = &state_dir {
                state_dirs.push(dir.join(&stage.name));
            }
        }
        candidates.extend(
            topology
                .repartition_topics()
                .into_iter()
                .map(|(topic, _)| topic.to_string()),
        );
        if let Some(dir) = &state_dir {
            state_dirs.push(dir.join(".instances").join(&file.name));
        }
        // Never an input or output topic, whatever it is called.
        let mut outside = file.input_topics()?;
        outside.extend(file.sink.topic.clone());
        candidates.retain(|topic| !outside.contains(topic));
        for group in input_groups
            .iter()
            .map(|(g, _)| g)
            .chain(internal_groups.iter())
        {
            reset::ensure_group_empty(&cluster, group)?;
        }
        Ok(ResetPlan {
            to,
            input_groups,
            internal_groups,
            internal_topics: reset::existing_topics(&cluster, &candidates)?,
            state_dirs,
        })
    }

    /// The plan as lines for a person.
    pub fn describe(&self) -> String {
        let mut text = String::new();
        let to = match self.to {
            ResetTo::Earliest => "the earliest offset".to_string(),
            ResetTo::Time(ms) => format!("the first record at or after {ms} ms since the epoch"),
        };
        for (group, topics) in &self.input_groups {
            let _ = writeln!(
                text,
                "offsets of group `{group}` on {} -> {to}",
                topics.join(", ")
            );
        }
        for group in &self.internal_groups {
            let _ = writeln!(text, "delete group `{group}`");
        }
        for topic in &self.internal_topics {
            let _ = writeln!(text, "delete topic `{topic}`");
        }
        for dir in &self.state_dirs {
            let _ = writeln!(text, "remove state directory {}", dir.display());
        }
        if text.is_empty() {
            text.push_str("nothing to reset\n");
        }
        text
    }

    /// Carries the plan out on `file`'s cluster.
    pub fn execute(&self, file: &PipelineFile) -> Result<()> {
        let cluster = crate::KafkaClients::of_pipeline(file)?.cluster;
        for (group, topics) in &self.input_groups {
            let moved = reset::reset_offsets(&cluster, group, topics, self.to)?;
            tracing::info!(group, partitions = moved.len(), "offsets reset");
        }
        reset::delete_groups(&cluster, &self.internal_groups)?;
        reset::delete_topics(&cluster, &self.internal_topics)?;
        for dir in &self.state_dirs {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", dir.display()), e)),
            }
        }
        Ok(())
    }
}

/// The topics the stage reading the source consumes: the source's, and
/// its joins' unless they are read `apart` (by writers of their own).
fn source_topics(file: &PipelineFile, apart: bool) -> Result<Vec<String>> {
    match apart {
        true => Ok(file.source.topic.clone().map(|t| t.0).unwrap_or_default()),
        false => file.input_topics(),
    }
}

/// A Delta table would skip the replayed batches (it records each batch
/// id it committed): refused while it exists.
fn check_sink(file: &PipelineFile, base: &Path) -> Result<()> {
    if file.sink.kind != SinkKind::Delta {
        return Ok(());
    }
    let path = file.sink.path.as_deref().unwrap_or_default();
    let local = !path.contains("://") || path.starts_with("file://");
    let table = crate::from_pipeline::resolve(base, path.trim_start_matches("file://"));
    if local && !table.join("_delta_log").exists() {
        return Ok(());
    }
    Err(Error::config(
        "sink.path",
        format!("the Delta table at `{path}` records the batches this query committed and would skip them when they are replayed: delete the table (or point `sink.path` at a new one) before resetting"),
    ))
}
