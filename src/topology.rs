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
