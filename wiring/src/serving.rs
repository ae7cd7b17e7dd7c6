//! Interactive queries for a pipeline file's `serve:`: the HTTP service
//! over the state of the stage writing the sink, with the other instances
//! found through that stage's consumer group.

use std::path::Path;
use std::sync::Arc;
use tidemark::error::{Error, Result};
use tidemark::runtime::{RunStatus, StateService, Topology};
use tidemark_kafka::GroupMembers;
use tidemark_pipeline::{PipelineFile, ServeSpec, SourceKind, TlsSpec};
use tidemark_serve::{
    HttpOptions, HttpServer, Peer, PeerDirectory, ProgressHistory, StateServer, TlsConfig,
};

/// The instances of a query: its consumer group's members.
struct GroupPeers(GroupMembers);

impl PeerDirectory for GroupPeers {
    fn peers(&self) -> std::result::Result<Vec<Peer>, String> {
        self.0
            .serving_members()
            .map(|members| {
                members
                    .into_iter()
                    .map(|m| {
                        // Tasks are numbered by partition (co-partitioned
                        // topics share them).
                        let mut partitions: Vec<i32> = m
                            .partitions
                            .iter()
                            .filter_map(|p| p.rsplit_once('/')?.1.parse().ok())
                            .collect();
                        partitions.sort_unstable();
                        partitions.dedup();
                        Peer {
                            advertised: m.advertised,
                            partitions,
                        }
                    })
                    .collect()
            })
            .map_err(|e| e.to_string())
    }
}

/// Starts serving `service`'s query when `file` asks for it, `/readyz`
/// answering for `status`; the server stops when the returned value drops.
pub(crate) fn start(
    file: &PipelineFile,
    base: &Path,
    topology: &Topology,
    service: &StateService,
    status: &RunStatus,
) -> Result<Option<StateServer>> {
    let Some(serve) = &file.serve else {
        return Ok(None);
    };
    let peers: Option<Arc<dyn PeerDirectory>> = match file.source.kind {
        SourceKind::Kafka => {
            check_advertised(serve)?;
            let sink_stage = topology.stages.last().expect("a topology has a stage");
            let group = crate::from_pipeline::stage_group(file, &sink_stage.input);
            // The source's own properties (credentials among them) too.
            let properties = &file.source.properties.0;
            let cluster = crate::KafkaClients::of_pipeline(file)?
                .cluster
                .with_overrides(properties);
            let client_id = properties.get("client.id").map(String::as_str);
            Some(Arc::new(GroupPeers(GroupMembers::new(
                &cluster, &group, client_id,
            )?)))
        }
        // One process reads the files: it holds every key.
        SourceKind::Files => None,
    };
    let options = HttpOptions {
        readiness: Some(status.clone()),
        ..http_options("serve", base, &serve.auth_token, &serve.tls)?
    };
    StateServer::start_with(
        &serve.listen,
        serve.advertised(),
        service.reader(),
        peers,
        options,
    )
    .map(Some)
    .map_err(|e| Error::config(e.key(), e.to_string()))
}

/// The other instances ask this one at `advertised`: an address that means
/// "any interface" or "a port to be chosen" cannot be asked.
fn check_advertised(serve: &ServeSpec) -> Result<()> {
    let address = serve.advertised();
    let (host, port) = address.rsplit_once(':').unwrap_or((address, ""));
    let unreachable =
        ["0.0.0.0", "[::]", "::", ""].contains(&host) || port == "0" || port.is_empty();
    if unreachable {
        return Err(Error::config(
            "serve.advertised",
            format!("`{address}` is not an address the other instances can reach: set `serve.advertised` to this instance's `host:port` (with `listen` on all interfaces or port 0, it must be given)"),
        ));
    }
    Ok(())
}

/// The HTTP options of a service whose token is `auth_token` (the setting
/// `key`): an empty token (a `${VAR}` set to nothing) is refused rather
/// than taken as "no token".
/// The options of the service whose configuration is under `service`
/// (`serve`, `ui`, `metrics`): its token and TLS files (relative to
/// `base`, the pipeline file's directory, as every path of the file).
fn http_options(
    service: &'static str,
    base: &Path,
    auth_token: &Option<String>,
    tls: &Option<TlsSpec>,
) -> Result<HttpOptions> {
    if auth_token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(Error::config(
            format!("{service}.auth_token"),
            "the token is empty: set it (for instance from `${VAR}`) or remove the key",
        ));
    }
    let tls_key = match service {
        "serve" => "serve.tls",
        "ui" => "ui.tls",
        _ => "metrics.tls",
    };
    if let (Some(TlsSpec { ca: None, .. }), "serve") = (tls, service) {
        return Err(Error::config(
            "serve.tls.ca",
            "the CA certificates (PEM) the instances' certificates chain to: an instance forwards reads to the others over https and verifies them against it",
        ));
    }
    let tls = tls
        .as_ref()
        .map(|t| {
            let path = |p: &str| crate::from_pipeline::resolve(base, p).display().to_string();
            let ca = t.ca.as_deref().map(path);
            TlsConfig::from_pem_files(tls_key, &path(&t.cert), &path(&t.key), ca.as_deref())
        })
        .transpose()
        .map_err(|e| Error::config(e.key(), e.to_string()))?;
    Ok(HttpOptions {
        auth_token: auth_token.clone(),
        tls,
        ..HttpOptions::default()
    })
}

/// Serves Prometheus' text, as `render` gives it, when `file` asks for a
/// metrics endpoint (`metrics.prometheus`), with its token and TLS (its
/// files relative to `base`, the pipeline file's directory), and `/readyz`
/// for `status` when given.
pub fn start_metrics(
    file: &PipelineFile,
    base: &Path,
    render: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    status: Option<&RunStatus>,
) -> Result<Option<HttpServer>> {
    let Some(metrics) = &file.metrics else {
        return Ok(None);
    };
    let options = HttpOptions {
        readiness: status.cloned(),
        ..http_options("metrics", base, &metrics.auth_token, &metrics.tls)?
    };
    HttpServer::start_metrics_with(&metrics.prometheus, render, options)
        .map(Some)
        .map_err(|e| Error::config(e.key(), e.to_string()))
}

/// The process's Prometheus recorder, installed by the first run that asks
/// for a metrics endpoint and shared by every later one.
static PROMETHEUS: std::sync::OnceLock<
    std::result::Result<metrics_exporter_prometheus::PrometheusHandle, String>,
> = std::sync::OnceLock::new();

/// Serves this process's metrics on `metrics.prometheus` when `file` asks
/// for it, the Prometheus recorder installed first. A process whose own
/// code installed another `metrics` recorder is refused, naming the key:
/// tidemark's metrics already reach that recorder through the `metrics`
/// facade, so such a process leaves `metrics.prometheus` unset and serves
/// its recorder itself.
pub(crate) fn start_prometheus(
    file: &PipelineFile,
    base: &Path,
    status: &RunStatus,
) -> Result<Option<HttpServer>> {
    if file.metrics.is_none() {
        return Ok(None);
    }
    let installed = PROMETHEUS.get_or_init(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| e.to_string())
    });
    let handle = installed.clone().map_err(|e| {
        Error::config(
            "metrics.prometheus",
            format!(
                "the Prometheus recorder could not be installed ({e}): this process \
                 has a `metrics` recorder of its own, which tidemark's metrics reach \
                 already; leave `metrics.prometheus` unset and serve that recorder"
            ),
        )
    })?;
    // The exporter drains its histograms only at upkeep: run it at each
    // scrape, since nothing else does.
    let render = Arc::new(move || {
        handle.run_upkeep();
        handle.render()
    });
    start_metrics(file, base, render, Some(status))
}

/// Starts the web page over `history` when `file` asks for it.
pub(crate) fn start_ui(
    file: &PipelineFile,
    base: &Path,
    history: &ProgressHistory,
    status: &RunStatus,
) -> Result<Option<HttpServer>> {
    let Some(ui) = &file.ui else {
        return Ok(None);
    };
    let options = HttpOptions {
        readiness: Some(status.clone()),
        ..http_options("ui", base, &ui.auth_token, &ui.tls)?
    };
    HttpServer::start_ui_with(&ui.listen, history.clone(), options)
        .map(Some)
        .map_err(|e| Error::config(e.key(), e.to_string()))
}
