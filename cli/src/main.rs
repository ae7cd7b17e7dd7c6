//! `tidemark`: run, validate and describe pipeline files.

use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tidemark::progress::QueryProgress;
use tidemark::topology::TopologyDescription;
use tidemark_pipeline::PipelineFile;

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
    /// Make a stopped pipeline start over (Kafka Streams' application reset
    /// tool): its groups' input offsets to the earliest (or `--to-datetime`),
    /// its changelog and repartition topics and its state directory deleted.
    Reset {
        /// The pipeline file (YAML).
        file: PathBuf,
        /// Move input offsets to the first record at or after this time
        /// (RFC 3339, e.g. 2026-01-01T00:00:00Z) instead of the earliest.
        #[arg(long)]
        to_datetime: Option<String>,
        /// Print what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
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

fn describe(file: &PipelineFile) -> tidemark::Result<TopologyDescription> {
    file.describe()
}

/// The Kafka clients the query creates and how each connects, secrets
/// masked.
fn print_kafka_clients(file: &PipelineFile) {
    match tidemark_connectors::KafkaClients::of_pipeline(file) {
        Ok(clients) => {
            let listed = clients.describe(file);
            if !listed.is_empty() {
                println!("Kafka clients:");
            }
            for (client, connection) in listed {
                println!("  {client}: {connection}");
            }
        }
        Err(e) => println!("Kafka clients: {e}"),
    }
}

/// How the watermark is scoped and shared between instances, and what
/// the query serves over HTTP: what `run` sets up beside the topology.
fn print_watermark_and_services(file: &PipelineFile, topology: &TopologyDescription) {
    use tidemark::watermark::WatermarkScope;
    use tidemark_pipeline::SourceKind;
    if file.watermark.is_some() {
        let shared = match file.watermark_scope {
            WatermarkScope::Partition => "per input partition, not shared".to_string(),
            WatermarkScope::Query if topology.sub_topologies.len() > 1 => format!(
                "query-wide (Spark's), writers' progress exchanged on topic {}-watermarks \
                 and carried to the readers by the repartition topic's markers",
                file.name
            ),
            WatermarkScope::Query if file.source.kind == SourceKind::Kafka => format!(
                "query-wide (Spark's), partitions' progress exchanged on topic {}-watermarks",
                file.name
            ),
            WatermarkScope::Query => "query-wide (Spark's)".into(),
        };
        println!("Watermark: {shared}");
    }
    let mut services = Vec::new();
    if let Some(serve) = &file.serve {
        let advertised = serve.advertised.as_deref().unwrap_or(&serve.listen);
        services.push(format!(
            "interactive queries on {} (advertised as {advertised})",
            serve.listen
        ));
    }
    if let Some(ui) = &file.ui {
        services.push(format!("web page on http://{}/", ui.listen));
    }
    if let Some(metrics) = &file.metrics {
        services.push(format!("Prometheus metrics on {}", metrics.prometheus));
    }
    if !services.is_empty() {
        println!("Serves:");
    }
    for service in services {
        println!("  {service}");
    }
}

struct StatusLine {
    terminal: bool,
    print_json: bool,
}

impl StatusLine {
    fn show(&self, p: &QueryProgress, writes_sink: bool) {
        if self.print_json {
            eprintln!("{}", p.json());
        }
        if self.terminal && writes_sink {
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
    let base = path.parent().unwrap_or(Path::new("."));
    let stop = tidemark::runtime::StopHandle::default();
    // The terminal line follows the stage that writes the sink; every
    // stage's progress goes to the JSON lines.
    let status = StatusLine {
        terminal: std::io::stderr().is_terminal(),
        print_json: progress,
    };
    let sink_stage = file.name.clone();
    let runner = tidemark_connectors::PipelineRunner::new(file, base)
        .stop_handle(stop.clone())
        .on_progress(move |stage: &str, p: &QueryProgress| status.show(p, stage == sink_stage));
    tidemark_connectors::stop_on_signals(stop, runner.run_status(), |signal| {
        eprintln!("\n{signal}: stopping after the current batch…");
    })?;
    let summary = runner.run()?;
    print_summary(&summary);
    Ok(())
}

/// Stops the run after its current batch on Ctrl-C (SIGINT) or SIGTERM,
/// the signal orchestrators send: the run then ends cleanly, exit code 0.
fn print_summary(summary: &tidemark::runtime::RunSummary) {
    eprintln!(
        "\n{} batches, {} input records, {} output rows, {} bad records",
        summary.batches, summary.input_records, summary.output_rows, summary.bad_records
    );
}

/// The error and each cause its message does not already hold:
/// tidemark's client errors end their message with their source's, which
/// anyhow's `{:#}` would print a second time.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
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
                    print_kafka_clients(&f);
                    print_watermark_and_services(&f, &topology);
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
                eprintln!("error: {}", error_text(&e));
                ExitCode::FAILURE
            }
        },
        Command::Reset {
            file,
            to_datetime,
            dry_run,
        } => match reset(&file, to_datetime.as_deref(), dry_run) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {}", error_text(&e));
                ExitCode::FAILURE
            }
        },
    }
}

/// `tidemark reset`: prints the plan, then carries it out unless `dry_run`.
fn reset(path: &Path, to_datetime: Option<&str>, dry_run: bool) -> anyhow::Result<()> {
    use tidemark_connectors::kafka::reset::ResetTo;
    let (_, file) = load(path).map_err(|_| anyhow::anyhow!("invalid pipeline file"))?;
    let to = match to_datetime {
        None => ResetTo::Earliest,
        Some(text) => {
            let micros = tidemark::time::parse_rfc3339(text).ok_or_else(|| {
                anyhow::anyhow!(
                    "--to-datetime `{text}` is not an RFC 3339 time (e.g. 2026-01-01T00:00:00Z)"
                )
            })?;
            ResetTo::Time(micros.div_euclid(1000))
        }
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let plan = tidemark_connectors::ResetPlan::of(&file, base, to)?;
    print!("{}", plan.describe());
    if dry_run {
        println!("(dry run: nothing changed)");
        return Ok(());
    }
    plan.execute(&file)?;
    println!("reset done");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::error_text;

    /// A client's error is printed once, and an outer context anyhow adds
    /// still shows.
    #[test]
    fn each_cause_is_printed_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = anyhow::Error::from(tidemark::Error::source_failed("reading offsets", refused));
        assert_eq!(error_text(&e), "source error: reading offsets: refused");
        let e = e.context("starting the run");
        assert_eq!(
            error_text(&e),
            "starting the run: source error: reading offsets: refused"
        );
    }
}
