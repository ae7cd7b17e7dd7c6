//! Interactive queries for a pipeline file's `serve:`: the HTTP service
//! over the state of the stage writing the sink, with the other instances
//! found through that stage's consumer group.

use std::sync::Arc;
use tidemark::error::{Error, Result};
use tidemark::pipeline::{PipelineFile, SourceKind};
use tidemark::runtime::{StateService, Topology};
use tidemark_kafka::GroupMembers;
use tidemark_serve::{HttpServer, Peer, PeerDirectory, ProgressHistory, StateServer};

/// The instances of a query: its consumer group's members.
struct GroupPeers(GroupMembers);

impl PeerDirectory for GroupPeers {
    fn peers(&self) -> std::result::Result<Vec<Peer>, String> {
        self.0
            .serving_members()
            .map(|members| {
                members
                    .into_iter()
                    .map(|m| Peer {
                        advertised: m.advertised,
                    })
                    .collect()
            })
            .map_err(|e| e.to_string())
    }
}

/// Starts serving `service`'s query when `file` asks for it; the server
/// stops when the returned value drops.
pub(crate) fn start(
    file: &PipelineFile,
    topology: &Topology,
    service: &StateService,
) -> Result<Option<StateServer>> {
    let Some(serve) = &file.serve else {
        return Ok(None);
    };
    let peers: Option<Arc<dyn PeerDirectory>> = match file.source.kind {
        SourceKind::Kafka => {
            let sink_stage = topology.stages.last().expect("a topology has a stage");
            let group = crate::from_pipeline::sink_stage_group(file, sink_stage);
            let cluster = crate::KafkaClients::of_pipeline(file)?.cluster;
            Some(Arc::new(GroupPeers(GroupMembers::new(&cluster, &group)?)))
        }
        // One process reads the files: it holds every key.
        SourceKind::Files => None,
    };
    StateServer::start(&serve.listen, serve.advertised(), service.reader(), peers)
        .map(Some)
        .map_err(|e| Error::config(e.key(), e.to_string()))
}

/// Starts the web page over `history` when `file` asks for it.
pub(crate) fn start_ui(
    file: &PipelineFile,
    history: &ProgressHistory,
) -> Result<Option<HttpServer>> {
    let Some(ui) = &file.ui else {
        return Ok(None);
    };
    HttpServer::start_ui(&ui.listen, history.clone())
        .map(Some)
        .map_err(|e| Error::config(e.key(), e.to_string()))
}
