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
    // A join's (or table join's) second input is read with the main one.
    let sources = |f: &PipelineFile| {
        let mut topics = vec![source_target(f)];
        topics.extend(f.joined_inputs().iter().flat_map(|j| j.topics.0.clone()));
        topics
    };
    let Some(stages) = file.repartition_stages() else {
        let mut processors = watermark;
        processors.extend(stage_processors(file)?);
        let sub = SubTopologyDescription {
            sources: sources(file),
            processors,
            sink,
        };
        return Ok(TopologyDescription {
            sub_topologies: vec![sub],
        });
    };
    let mut writer = watermark;
    writer.extend(stage_processors(&stages.writer)?);
    let mut subs = vec![SubTopologyDescription {
        sources: sources(file),
        processors: writer,
        sink: format!(
            "(topic: {}) keyed by [{}]",
            stages.topic,
            stages.keys.join(", ")
        ),
    }];
    let mut reader_sources = vec![stages.topic.clone()];
    if let Some((topic, side)) = &stages.side_writer {
        subs.push(SubTopologyDescription {
            sources: sources(side),
            processors: stage_processors(side)?,
            sink: format!("(topic: {topic}) keyed by [{}]", side.sink.key.join(", ")),
        });
        reader_sources.push(topic.clone());
    }
    subs.push(SubTopologyDescription {
        sources: reader_sources,
        processors: stage_processors(&stages.reader)?,
        sink,
    });
    Ok(TopologyDescription {
        sub_topologies: subs,
    })
}

/// A stage's processors, each store named with the changelog topic it is
/// restored from when the stage keeps one (`<name>-<store>-changelog`).
fn stage_processors(stage: &PipelineFile) -> Result<Vec<NodeDescription>> {
    let mut processors = stage.query_builder()?.build()?.processors();
    let kafka = stage.source.kind == crate::pipeline::SourceKind::Kafka;
    for store in processors.iter_mut().flat_map(|p| p.stores.iter_mut()) {
        let kept = match &stage.state_spec() {
            None => "in memory".to_string(),
            Some(s) if s.changelog.unwrap_or(kafka) => {
                format!("RocksDB, changelog: {}-{store}-changelog", stage.name)
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
