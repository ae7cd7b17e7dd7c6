//! The checks that span sections, run once the file is read: what each
//! source, sink and late-data or dead-letter output needs, the event time
//! against the source's schema, the files source's settings and the state
//! they allow.

use crate::{DeadLetterKind, Format, PipelineFile, ProcessingGuarantee, SinkKind, SourceKind};
use tidemark::error::{Error, Result};
use tidemark::runtime::Trigger;
use tidemark::schema::FieldType;

impl PipelineFile {
    /// Checks the settings together as a file's are checked on read (a
    /// Kafka source names its topic, exactly-once has a sink that can
    /// take part, the event time is a column of the schema...); an error
    /// names the key.
    pub fn check_settings(&self) -> Result<()> {
        self.check()
            .map_err(|(key, message)| Error::config(key, message))
    }

    pub(crate) fn check(&self) -> std::result::Result<(), (String, String)> {
        let err = |k: &str, m: &str| Err((k.to_string(), m.to_string()));
        match self.source.kind {
            SourceKind::Files if self.source.path.is_none() => {
                return err("source.path", "the files source needs `path: <directory>`")
            }
            SourceKind::Kafka if self.source.topic.is_none() => {
                return err("source.topic", "the kafka source needs `topic: <name>`")
            }
            _ => {}
        }
        if self.source.format == Format::Avro
            && self.source.schema_registry.is_none()
            && self.schema_registry.is_none()
            && self.source.avro_schemas.is_empty()
        {
            return err(
                "source.format",
                "avro needs a `schema_registry` (top level: a URL or {url, properties}) or `source.avro_schemas: {<id>: <file.avsc>}`",
            );
        }
        match self.sink.kind {
            SinkKind::Jsonl if self.sink.path.is_none() => {
                return err("sink.path", "the jsonl sink needs `path: <file>`")
            }
            SinkKind::Kafka if self.sink.topic.is_none() => {
                return err("sink.topic", "the kafka sink needs `topic: <name>`")
            }
            SinkKind::Kafka
                if self.sink.format == Format::Avro && self.sink.avro_schema.is_none() =>
            {
                return err(
                    "sink.format",
                    "the avro format needs `avro_schema: <file.avsc>`",
                )
            }
            _ => {}
        }
        if let Some(late) = &self.late_data {
            match late.kind {
                SinkKind::Jsonl if late.path.is_none() => {
                    return err("late_data.path", "needs `path: <file>`")
                }
                SinkKind::Kafka if late.topic.is_none() => {
                    return err("late_data.topic", "needs `topic: <name>`")
                }
                _ => {}
            }
        }
        self.check_files_source()?;
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && !matches!(self.sink.kind, SinkKind::Kafka | SinkKind::Delta)
        {
            return err(
                "processing_guarantee",
                "exactly_once needs a kafka or delta sink (allowed otherwise: at_least_once)",
            );
        }
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && self.source.kind == SourceKind::Files
            && self.files_checkpoint().is_none()
        {
            return err(
                "processing_guarantee",
                "exactly_once over a files source needs it to remember its progress: set `state_dir` or `source.checkpoint`",
            );
        }
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && self
                .dead_letter
                .as_ref()
                .is_some_and(|d| d.kind == DeadLetterKind::Kafka && !d.properties.is_empty())
        {
            return err(
                "dead_letter.properties",
                "under exactly_once dead letters go out in the query's transaction, whose producer takes `kafka.properties` and `sink.properties`: move these there",
            );
        }
        if self.schema_registry.is_some() && self.source.schema_registry.is_some() {
            return err(
                "source.schema_registry",
                "give the registry once, as the top-level `schema_registry` (it serves the source and the sink)",
            );
        }
        if self.schema_registry.is_some()
            && self.sink.format == Format::Avro
            && self.sink.avro_schema_id.is_some()
        {
            return err(
                "sink.avro_schema_id",
                "with a `schema_registry` the sink registers `avro_schema` under its subject and writes the id the registry gives: leave `avro_schema_id` out",
            );
        }
        if self.sink.kind == SinkKind::Delta && self.sink.path.is_none() {
            return err(
                "sink.path",
                "the delta sink needs `path: <directory or s3://, gs://, abfss:// URL>`",
            );
        }
        if self.sink.kind != SinkKind::Delta && self.sink.mode.is_some() {
            return err(
                "sink.mode",
                "`mode` (changes | upsert) belongs to the delta sink",
            );
        }
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && matches!(self.trigger.0, Trigger::RealTime { .. })
        {
            return err(
                "processing_guarantee",
                "the real_time trigger sends output as records arrive, before its checkpoint: its output is at-least-once (as in Databricks); set `processing_guarantee: at_least_once` or use {micro_batch: <interval>}",
            );
        }
        if self.watermark.is_some() && self.event_time.is_none() {
            return err("watermark", "a watermark needs `event_time: <column>`");
        }
        if let (Some(col), false) = (&self.event_time, self.source.schema.0.is_empty()) {
            match self.source.schema.0.field_type(col) {
                None => return err("event_time", &format!("column `{col}` is not in `source.schema`")),
                Some(FieldType::Timestamp) | Some(FieldType::Long) => {}
                Some(other) => {
                    return err(
                        "event_time",
                        &format!("column `{col}` is {other}; the event time must be a timestamp or long (epoch ms)"),
                    )
                }
            }
        }
        if self.state.is_some() && self.state_dir.is_some() {
            return err(
                "state_dir",
                "give either `state_dir: <dir>` or `state: {dir: <dir>, ...}`, not both",
            );
        }
        if let Some(d) = &self.dead_letter {
            match d.kind {
                DeadLetterKind::Kafka if d.topic.is_none() => {
                    return err("dead_letter.topic", "needs `topic`")
                }
                DeadLetterKind::File if d.path.is_none() => {
                    return err("dead_letter.path", "needs `path`")
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The files source's own keys: only with `kind: files`, and valid.
    fn check_files_source(&self) -> std::result::Result<(), (String, String)> {
        let src = &self.source;
        let err = |k: &str, m: &str| Err((k.to_string(), m.to_string()));
        let files_keys = [
            ("source.checkpoint", src.checkpoint.is_some()),
            (
                "source.max_files_per_batch",
                src.max_files_per_batch.is_some(),
            ),
            ("source.pattern", src.pattern.is_some()),
            ("source.start", src.start.is_some()),
            ("source.settle_delay", src.settle_delay.is_some()),
            ("source.follow_symlinks", src.follow_symlinks.is_some()),
            ("source.max_file_mb", src.max_file_mb.is_some()),
        ];
        if src.kind != SourceKind::Files {
            if let Some((key, _)) = files_keys.iter().find(|(_, set)| *set) {
                return err(key, "belongs to the files source (`kind: files`)");
            }
            if matches!(src.format, Format::Csv | Format::Parquet) {
                return err("source.format", "csv and parquet are formats of the files source; a kafka source reads json or avro");
            }
        }
        if matches!(self.sink.format, Format::Csv | Format::Parquet) {
            return err("sink.format", "a sink writes json or avro");
        }
        if src.max_files_per_batch == Some(0) {
            return err("source.max_files_per_batch", "must be at least 1");
        }
        if let Some(Err(e)) = src.pattern.as_deref().map(glob::Pattern::new) {
            return err("source.pattern", &format!("not a glob pattern: {e}"));
        }
        if src.kind == SourceKind::Files && src.format == Format::Avro {
            return err(
                "source.format",
                "the files source reads json (lines), csv or parquet",
            );
        }
        let changelog = self.state_spec().and_then(|s| s.changelog).unwrap_or(false);
        if self.files_checkpoint().is_some() && changelog {
            return err("state.changelog", "a files source keeps its state on local disk, versioned with its checkpoint: leave `changelog` unset or false");
        }
        if let Some(state) = self.state_spec().filter(|s| s.num_standby_replicas > 0) {
            // Standbys are copies fed by the changelog (the default with a
            // Kafka source): without one there is nothing to copy.
            let has_changelog = state.changelog.unwrap_or(src.kind == SourceKind::Kafka);
            if !has_changelog {
                return err(
                    "state.num_standby_replicas",
                    "standby replicas are kept warm from the state's changelog topics: with a Kafka source leave `state.changelog` unset or true, or set `num_standby_replicas: 0`",
                );
            }
        }
        Ok(())
    }
}
