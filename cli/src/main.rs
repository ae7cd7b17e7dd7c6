//! `tidemark`: run, validate and describe pipeline files.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tidemark::pipeline::PipelineFile;
use tidemark::progress::QueryProgress;
use tidemark::topology::{NodeDescription, SubTopologyDescription, TopologyDescription};

#[derive(Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Stateful stream processing on Apache Kafka"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a pipeline file until its source is exhausted (available_now) or Ctrl-C.
    Run {
        /// The pipeline file (YAML).
        file: PathBuf,
        /// Print each batch's progress JSON to stderr.
        #[arg(long)]
        progress: bool,
    },
    /// Check a pipeline file; errors name the line and the fix (exit code 2).
    Validate {
        /// The pipeline file (YAML).
        file: PathBuf,
    },
    /// Print the operator graph of a pipeline file.
    Describe {
        /// The pipeline file (YAML).
        file: PathBuf,
    },
}

fn load(path: &Path) -> Result<(String, PipelineFile), ExitCode> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: cannot read: {e}", path.display());
            return Err(ExitCode::from(2));
        }
    };
    match PipelineFile::parse(&text) {
        Ok(file) => Ok((text, file)),
        Err(e) => {
            eprintln!(
                "{}:{}: error: {}",
                path.display(),
                e.line.map(|l| l.to_string()).unwrap_or_default(),
                e.message
            );
            if let Some(line) = e.line.and_then(|l| text.lines().nth(l - 1)) {
                eprintln!("  {:>4} | {line}", e.line.unwrap_or_default());
                if let Some(col) = e.column {
                    eprintln!("       | {}^", " ".repeat(col.saturating_sub(1)));
                }
            }
            eprintln!("  fix: {}", fix_hint(&e.message));
            Err(ExitCode::from(2))
        }
    }
}

fn fix_hint(message: &str) -> String {
    if message.contains("unknown field") {
        if let Some(expected) = message.split("expected one of ").nth(1) {
            return format!("use one of the keys {expected}; see docs/pipeline-file.md");
        }
        return "remove or rename the key; see docs/pipeline-file.md".into();
    }
    if message.contains("unknown variant") {
        if let Some(expected) = message.split("expected ").nth(1) {
            return format!("use {expected}");
        }
    }
    if message.contains("missing field") {
        return "add the missing section; see docs/pipeline-file.md for its keys".into();
    }
    if message.contains("unit") || message.contains("months") {
        return "write a duration such as \"10 minutes\", \"5 seconds\", \"250 milliseconds\""
            .into();
    }
    if let Some(allowed) = message.split("allowed: ").nth(1) {
        return format!("use one of: {allowed}");
    }
    "see docs/pipeline-file.md".into()
}

/// The pipeline's topology, printed as Kafka Streams prints
/// `Topology#describe`: one sub-topology per stage, split at repartition
/// topics.
fn describe(file: &PipelineFile) -> anyhow::Result<TopologyDescription> {
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
fn stage_processors(stage: &PipelineFile) -> anyhow::Result<Vec<NodeDescription>> {
    let mut processors = stage.query_builder()?.build()?.processors();
    let kafka = stage.source.kind == tidemark::pipeline::SourceKind::Kafka;
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

struct StatusLine {
    terminal: bool,
    print_json: bool,
}

impl StatusLine {
    fn show(&self, p: &QueryProgress) {
        if self.print_json {
            eprintln!("{}", p.json());
        }
        if self.terminal {
            let lag = p
                .sources
                .first()
                .and_then(|s| s.metrics.get("offsetsBehindLatest").cloned())
                .unwrap_or_else(|| "-".into());
            let watermark = p
                .event_time
                .get("watermark")
                .cloned()
                .unwrap_or_else(|| "-".into());
            eprint!(
                "\r\x1b[2Kbatch {} | {:.0} rows/s in | {} rows | watermark {} | lag {}",
                p.batch_id, p.input_rows_per_second, p.num_input_rows, watermark, lag
            );
        }
    }
}

fn run(path: &Path, progress: bool) -> anyhow::Result<()> {
    let (_, file) = load(path).map_err(|_| anyhow::anyhow!("invalid pipeline file"))?;
    if let Some(m) = &file.metrics {
        let addr: std::net::SocketAddr = m
            .prometheus
            .parse()
            .with_context(|| format!("metrics.prometheus: `{}` is not host:port", m.prometheus))?;
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .context("starting the Prometheus endpoint")?;
    }
    let base = path.parent().unwrap_or(Path::new("."));
    // One identity for the process, kept across restarts of its stages:
    // every stage's transactional id derives from it.
    let identity = std::sync::Arc::new(tidemark_connectors::instance_identity(&file, base)?);
    tracing::info!(instance = identity.id(), origin = ?identity.origin(), "instance identity");
    let stop = tidemark::runtime::StopHandle::default();
    let on_ctrl_c = stop.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        eprintln!("\nstopping after the current batch…");
        on_ctrl_c.stop();
    });
    // Joined topics that are not co-partitioned are repartitioned, as
    // Kafka Streams does, rather than refused.
    let stages = match file.repartition_stages() {
        Some(stages) => Some(stages),
        None if tidemark_connectors::join_needs_repartition(&file)? => {
            file.join_repartition_stages()
        }
        None => None,
    };
    let Some(stages) = stages else {
        let summary = run_stage(&file, base, &identity, progress, true, &stop)?;
        print_summary(&summary);
        return Ok(());
    };
    // A grouping that is not on the record key runs as two stages joined
    // by the repartition topic, as Kafka Streams' sub-topologies.
    tidemark_connectors::ensure_repartition_topic(&file, &stages)?;
    let summary = if file.trigger.0 == tidemark::runtime::Trigger::AvailableNow {
        // The reader's end offsets must include everything the writers
        // wrote: run the writers to the end first.
        run_stage(&stages.writer, base, &identity, progress, false, &stop)?;
        if let Some((_, side)) = &stages.side_writer {
            run_stage(side, base, &identity, progress, false, &stop)?;
        }
        run_stage(&stages.reader, base, &identity, progress, true, &stop)?
    } else {
        std::thread::scope(|scope| {
            let writers: Vec<_> = std::iter::once(&stages.writer)
                .chain(stages.side_writer.as_ref().map(|(_, w)| w))
                .map(|writer| {
                    let (stop, identity) = (&stop, &identity);
                    scope.spawn(move || {
                        let result = run_stage(writer, base, identity, progress, false, stop);
                        if result.is_err() {
                            stop.stop();
                        }
                        result
                    })
                })
                .collect();
            let reader = run_stage(&stages.reader, base, &identity, progress, true, &stop);
            if reader.is_err() {
                stop.stop();
            }
            for writer in writers {
                writer
                    .join()
                    .map_err(|_| anyhow::anyhow!("a repartition writer panicked"))??;
            }
            reader
        })?
    };
    print_summary(&summary);
    Ok(())
}

fn print_summary(summary: &tidemark::runtime::RunSummary) {
    eprintln!(
        "\n{} batches, {} input records, {} output rows, {} bad records",
        summary.batches, summary.input_records, summary.output_rows, summary.bad_records
    );
}

/// Runs one stage until it ends or `stop`, as instance `identity`; `status`
/// shows the terminal status line for it.
fn run_stage(
    file: &PipelineFile,
    base: &Path,
    identity: &std::sync::Arc<tidemark_connectors::instance::InstanceIdentity>,
    progress: bool,
    status: bool,
    stop: &tidemark::runtime::StopHandle,
) -> anyhow::Result<tidemark::runtime::RunSummary> {
    // A failed batch is never half-committed: rebuilding the query resumes
    // from the last commit (state from the changelog, offsets from the
    // group). Transient failures — a broker restart, a fenced transaction
    // (this process was a zombie: it drops its tasks, rejoins the group and
    // carries on under its own id) — are retried with a capped backoff;
    // configuration errors are not.
    let mut failures = 0u32;
    loop {
        let started = std::time::Instant::now();
        let attempt = || -> anyhow::Result<tidemark::runtime::RunSummary> {
            let connected = tidemark_connectors::connect_as(file, base, identity)?;
            let status = StatusLine {
                terminal: status && std::io::stderr().is_terminal(),
                print_json: progress,
            };
            let (query, mut source, mut sink) = connected.wire(file.query_builder()?);
            let query = query
                .on_progress(move |p: &QueryProgress| status.show(p))
                .build()?
                .with_stop_handle(stop.clone());
            Ok(query.run(source.as_mut(), sink.as_mut())?)
        };
        match attempt() {
            Ok(summary) => return Ok(summary),
            Err(e) if is_transient(&e) && !stop.is_stopped() => {
                // A run that lasted is a fresh start: a failure hours later
                // is not the seventh in a row.
                if started.elapsed() > FAILURE_STREAK_RESET {
                    failures = 0;
                }
                failures += 1;
                let backoff = std::time::Duration::from_millis(500 * 2u64.pow(failures.min(6)));
                tracing::warn!(stage = %file.name, error = %format!("{e:#}"), failures, backoff_ms = backoff.as_millis() as u64, "query failed; restarting from the last commit");
                std::thread::sleep(backoff);
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long a run must last for its failure to start a new streak of
/// backoffs.
const FAILURE_STREAK_RESET: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether rebuilding the query may succeed: configuration and expression
/// errors will fail the same way again.
fn is_transient(error: &anyhow::Error) -> bool {
    !matches!(
        error.downcast_ref::<tidemark::Error>(),
        Some(tidemark::Error::Config { .. } | tidemark::Error::Expression { .. })
    )
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a terminal: logs piped to files stay plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { file } => match load(&file) {
            Ok((_, f)) => match describe(&f) {
                Ok(_) => {
                    println!("{}: ok", file.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{}: error: {e}", file.display());
                    ExitCode::from(2)
                }
            },
            Err(code) => code,
        },
        Command::Describe { file } => match load(&file) {
            Ok((_, f)) => match describe(&f) {
                Ok(topology) => {
                    print!("{topology}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{}: error: {e}", file.display());
                    ExitCode::from(2)
                }
            },
            Err(code) => code,
        },
        Command::Run { file, progress } => match run(&file, progress) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
