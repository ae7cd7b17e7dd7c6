//! `tidemark describe` ([`PipelineFile::describe`]): a pipeline file's
//! topology as Kafka Streams' `Topology#describe` prints it, each stage's
//! stores named with the changelog topics they restore from.

use super::PipelineFile;
use tidemark::error::Result;
use tidemark::runtime::{Stage, StageInput, StageOutput};
use tidemark::topology::{NodeDescription, SubTopologyDescription, TopologyDescription};

/// The pipeline's topology, printed as Kafka Streams prints
/// `Topology#describe`: one sub-topology per stage, split at repartition
/// topics.
pub(crate) fn describe_pipeline(file: &PipelineFile) -> Result<TopologyDescription> {
    let mut watermark = Vec::new();
    if let (Some(et), Some(wm)) = (&file.event_time, file.watermark) {
        watermark.push(NodeDescription {
            name: format!(
                "EventTimeWatermark [{et}, delay {}, policy {:?}]",
                wm.to_spark_string(),
                file.multiple_watermark_policy
            ),
            stores: Vec::new(),
        });
    }
    let sink = format!(
        "{:?} {} (output mode {:?}, trigger {:?})",
        file.sink.kind,
        sink_target(file),
        file.output_mode,
        file.trigger.0
    );
    let co_partitioned = true;
    let topology = file.topology(co_partitioned)?;
    let mut subs = Vec::new();
    for stage in topology.stages {
        let mut sources = match &stage.input {
            StageInput::Source => vec![source_target(file)],
            StageInput::Joined { topics, .. } => topics.clone(),
            StageInput::Repartition { topic, .. } => vec![topic.clone()],
        };
        sources.extend(
            stage
                .query
                .plan()
                .joined_topics()
                .into_iter()
                .flat_map(|(_, t)| t),
        );
        let mut processors = match stage.input {
            StageInput::Source => std::mem::take(&mut watermark),
            _ => Vec::new(),
        };
        let sink = match &stage.output {
            StageOutput::Sink => sink.clone(),
            StageOutput::Repartition { topic, keys } => {
                format!("(topic: {topic}) keyed by [{}]", keys.join(", "))
            }
        };
        let keeps_state = stage.output == StageOutput::Sink;
        processors.extend(stage_processors(file, stage, keeps_state)?);
        subs.push(SubTopologyDescription {
            sources,
            processors,
            sink,
        });
    }
    Ok(TopologyDescription {
        sub_topologies: subs,
    })
}

/// A stage's processors, each store named with the changelog topic it is
/// restored from when the stage keeps one (`<stage>-<store>-changelog`).
fn stage_processors(
    file: &PipelineFile,
    stage: Stage,
    keeps_state: bool,
) -> Result<Vec<NodeDescription>> {
    let kafka = file.source.kind == super::SourceKind::Kafka;
    let state = file.state_spec().filter(|_| keeps_state);
    let name = stage.name;
    let mut processors = stage.query.build()?.processors();
    for store in processors.iter_mut().flat_map(|p| p.stores.iter_mut()) {
        let kept = match &state {
            None => "in memory".to_string(),
            Some(s) if s.changelog.unwrap_or(kafka) => {
                format!("RocksDB, changelog: {name}-{store}-changelog")
            }
            Some(_) => "RocksDB, no changelog".to_string(),
        };
        *store = format!("{store} ({kept})");
    }
    Ok(processors)
}

fn sink_target(file: &PipelineFile) -> String {
    match (&file.sink.path, &file.sink.topic) {
        (Some(p), _) => p.clone(),
        (_, Some(t)) => t.clone(),
        _ => String::new(),
    }
}

fn source_target(file: &PipelineFile) -> String {
    match (&file.source.path, &file.source.topic) {
        (Some(p), _) => p.clone(),
        (_, Some(t)) => t.0.join(","),
        _ => String::new(),
    }
}
