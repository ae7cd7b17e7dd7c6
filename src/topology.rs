//! A query's topology as Kafka Streams' `Topology#describe` prints it:
//! sub-topologies split at repartition topics, each with the topics it
//! reads, its processors and the stores they keep, and where it writes.
//!
//! ```
//! use tidemark::topology::{NodeDescription, SubTopologyDescription, TopologyDescription};
//! let topology = TopologyDescription {
//!     sub_topologies: vec![SubTopologyDescription {
//!         sources: vec!["clicks".into()],
//!         processors: vec![NodeDescription {
//!             name: "Filter [amount >= 0]".into(),
//!             stores: vec![],
//!         }],
//!         sink: "Kafka topic `clicks-valid`".into(),
//!     }],
//! };
//! let text = topology.to_string();
//! assert!(text.contains("Sub-topology: 0"));
//! assert!(text.contains("Source: (topics: [clicks])"));
//! assert!(text.contains("--> Filter [amount >= 0]"));
//! ```

use crate::error::Result;
use crate::pipeline::PipelineFile;
use crate::runtime::{Stage, StageInput, StageOutput};
use std::fmt;

/// Every sub-topology of a query, in the order records flow through them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopologyDescription {
    /// Sub-topologies; each after the first reads what an earlier one
    /// wrote to a repartition topic.
    pub sub_topologies: Vec<SubTopologyDescription>,
}

/// One sub-topology: its input topics, processors and output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubTopologyDescription {
    /// Topics (or paths, for the files source) it reads.
    pub sources: Vec<String>,
    /// Its processors in the order rows go through them.
    pub processors: Vec<NodeDescription>,
    /// Where it writes: the query's sink or a repartition topic.
    pub sink: String,
}

/// One processor and the state stores it keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDescription {
    /// What it does, e.g. `Filter [amount >= 0]`.
    pub name: String,
    /// Its stores (with their changelog topics, when they have one).
    pub stores: Vec<String>,
}

impl fmt::Display for TopologyDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Topologies:")?;
        for (id, sub) in self.sub_topologies.iter().enumerate() {
            writeln!(f, "   Sub-topology: {id}")?;
            sub.fmt(f)?;
        }
        Ok(())
    }
}

impl fmt::Display for SubTopologyDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sink = format!("Sink: {}", self.sink);
        let source = format!("Source: (topics: [{}])", self.sources.join(", "));
        let mut previous = source.clone();
        let names: Vec<&str> = self.processors.iter().map(|p| p.name.as_str()).collect();
        writeln!(f, "    {source}")?;
        writeln!(f, "      --> {}", names.first().copied().unwrap_or(&sink))?;
        for (i, node) in self.processors.iter().enumerate() {
            writeln!(
                f,
                "    Processor: {} (stores: [{}])",
                node.name,
                node.stores.join(", ")
            )?;
            writeln!(
                f,
                "      --> {}",
                names.get(i + 1).copied().unwrap_or(&sink)
            )?;
            writeln!(f, "      <-- {previous}")?;
            previous = node.name.clone();
        }
        writeln!(f, "    {sink}")?;
        writeln!(f, "      <-- {previous}")
    }
}

impl TopologyDescription {
    /// The topology of a pipeline file, as `tidemark describe` prints it:
    /// its watermark, each stage's processors and stores (with their
    /// changelog topics), split at repartition topics.
    pub fn of_pipeline(file: &PipelineFile) -> Result<Self> {
        describe_pipeline(file)
    }
}

/// The pipeline's topology, printed as Kafka Streams prints
/// `Topology#describe`: one sub-topology per stage, split at repartition
/// topics.
fn describe_pipeline(file: &PipelineFile) -> Result<TopologyDescription> {
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
        sources.extend(stage.query.joined_topics().into_iter().flat_map(|(_, t)| t));
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
    let kafka = file.source.kind == crate::pipeline::SourceKind::Kafka;
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
