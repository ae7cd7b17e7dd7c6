//! The Delta sink: rows/s by batch size (given rows, and given the same
//! rows as the columnar batches a stateless chain hands it), commit latency of small real-time
//! commits, and how long an independent reader (Python `deltalake`) takes
//! to read a table after 1,000 small commits, with and without compaction.
//!
//! ```text
//! cargo run -p tidemark-bench --bin delta
//! ```

use clap::Parser;
use hdrhistogram::Histogram;
use std::time::Instant;
use tidemark::columns::array_of;
use tidemark::row::{Row, Value};
use tidemark::runtime::{BatchOutput, ColumnsOutput, Sink};
use tidemark_connectors::delta::{DeltaSink, DeltaSinkConfig, DeltaWriteMode};

#[derive(Parser)]
struct Args {
    /// Small commits for the latency and read-time parts.
    #[arg(long, default_value_t = 1000)]
    small_commits: u64,
    /// Rows per small commit.
    #[arg(long, default_value_t = 100)]
    rows_per_small_commit: u64,
}

fn rows(from: u64, n: u64) -> Vec<Row> {
    (from..from + n)
        .map(|i| {
            let mut r = Row::new();
            r.set("key", Value::from(format!("k{}", i % 100_000).as_str()));
            r.set(
                "window_start",
                Value::Timestamp(1_767_225_600_000_000 + (i as i64 % 3600) * 1_000_000),
            );
            r.set("n", Value::Long(i as i64));
            r.set("total", Value::Double(i as f64 * 1.5));
            r.set("label", Value::from("some text of moderate length"));
            r
        })
        .collect()
}

/// `rows` as one columnar batch of the types the engine's JSON decoding
/// gives (text as `LargeUtf8`, timestamps in microseconds, UTC).
fn columns_of(rows: &[Row]) -> anyhow::Result<ColumnsOutput> {
    let names = ["key", "window_start", "n", "total", "label"];
    let mut columns = Vec::new();
    for name in names {
        let values: Vec<Value> = rows
            .iter()
            .map(|r| r.get(name).cloned().unwrap_or(Value::Null))
            .collect();
        let array = array_of(&values).ok_or_else(|| anyhow::anyhow!("`{name}`: mixed types"))?;
        columns.push((name, array));
    }
    Ok(ColumnsOutput {
        before_row: 0,
        partition: 0,
        batch: deltalake::arrow::array::RecordBatch::try_from_iter(columns)?,
    })
}

fn sink(path: &std::path::Path, compact_min_files: usize) -> anyhow::Result<DeltaSink> {
    let mut config = DeltaSinkConfig::new(path.to_str().unwrap(), "bench", DeltaWriteMode::Append);
    config.compact_min_files = compact_min_files;
    Ok(DeltaSink::new(config)?)
}

/// Seconds the Python reader takes to open the table and read every row.
fn read_seconds(path: &std::path::Path) -> anyhow::Result<f64> {
    let script = "import sys, time\nfrom deltalake import DeltaTable\nt = time.perf_counter()\nrows = DeltaTable(sys.argv[1]).to_pyarrow_table().num_rows\nprint(time.perf_counter() - t, rows)\nsys.stdout.flush()\nimport os\nos._exit(0)\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let seconds: f64 = text
        .split_whitespace()
        .next()
        .ok_or_else(|| {
            anyhow::anyhow!(
                "reader printed nothing: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?
        .parse()?;
    Ok(seconds)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;

    println!("| batch size | commits | rows/s, given rows | rows/s, given columns |");
    println!("|---:|---:|---:|---:|");
    for (size, commits) in [(1_000u64, 100u64), (100_000, 10), (1_000_000, 2)] {
        let batches: Vec<Vec<Row>> = (0..commits).map(|c| rows(c * size, size)).collect();
        let mut rates = Vec::new();
        for as_columns in [false, true] {
            let path = dir.path().join(format!("throughput-{size}-{as_columns}"));
            let mut sink = sink(&path, 0)?;
            // The columns are made before the clock starts, as the engine
            // hands them over made.
            let columns: Vec<ColumnsOutput> = match as_columns {
                false => Vec::new(),
                true => batches
                    .iter()
                    .map(|b| columns_of(b))
                    .collect::<anyhow::Result<_>>()?,
            };
            let started = Instant::now();
            for (batch_id, batch) in batches.iter().enumerate() {
                match as_columns {
                    false => sink.write(batch_id as u64, batch)?,
                    true => sink.write_output(
                        batch_id as u64,
                        &BatchOutput {
                            rows: &[],
                            tasks: &[],
                            columns: std::slice::from_ref(&columns[batch_id]),
                        },
                    )?,
                }
                sink.commit(batch_id as u64)?;
            }
            rates.push((size * commits) as f64 / started.elapsed().as_secs_f64());
        }
        println!("| {size} | {commits} | {:.0} | {:.0} |", rates[0], rates[1]);
    }

    for compact in [0usize, 50] {
        let path = dir.path().join(format!("small-{compact}"));
        let mut sink = sink(&path, compact)?;
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
        let started = Instant::now();
        for c in 0..args.small_commits {
            sink.write(
                c,
                &rows(c * args.rows_per_small_commit, args.rows_per_small_commit),
            )?;
            sink.commit(c)?;
        }
        sink.wait_for_compaction();
        let total = started.elapsed();
        for micros in sink.take_commit_micros() {
            histogram.record(micros.max(1))?;
        }
        let read = read_seconds(&path)?;
        let files = std::fs::read_dir(&path)?
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "parquet"))
            })
            .count();
        println!(
            "{} small commits of {} rows, compaction {}: commit p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {:.1} s in all; {} parquet files on disk; Python reader {:.3} s",
            args.small_commits,
            args.rows_per_small_commit,
            if compact > 0 { format!("every {compact} small files") } else { "off".into() },
            histogram.value_at_quantile(0.5) as f64 / 1000.0,
            histogram.value_at_quantile(0.99) as f64 / 1000.0,
            histogram.max() as f64 / 1000.0,
            total.as_secs_f64(),
            files,
            read,
        );
    }
    Ok(())
}
