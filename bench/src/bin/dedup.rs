//! Deduplication throughput with many distinct keys, in process, one core:
//! `--events` rows over `--keys` guids (so every guid repeats
//! events/keys times), through `dropDuplicatesWithinWatermark(guid)` with
//! a watermark that evicts as event time moves, or `dropDuplicates(guid)`
//! with no eviction. Prints events/s, state keys at the end, peak RSS.
//! With `--memory-mb`, the state is read through a RocksDB store under that
//! budget, as a pipeline file's `state: {dir, memory_mb}` gives it, and
//! every batch checkpoints.
//!
//! ```text
//! cargo run -p tidemark-bench --bin dedup -- --keys 10000000 --events 20000000
//! cargo run -p tidemark-bench --bin dedup -- --keys 10000000 --events 20000000 --memory-mb 512
//! ```

use clap::Parser;
use std::sync::Arc;
use std::time::Instant;
use tidemark::operators::{BatchContext, DedupSpec, Deduplicate, Operator};
use tidemark::row::{Row, Value};
use tidemark::runtime::StateBackend;

#[derive(Parser)]
struct Args {
    /// Distinct guids.
    #[arg(long, default_value_t = 10_000_000)]
    keys: u64,
    /// Rows in total.
    #[arg(long, default_value_t = 20_000_000)]
    events: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 100_000)]
    batch: u64,
    /// `within-watermark` (evicts) or `keys` (keeps every guid).
    #[arg(long, default_value = "within-watermark")]
    mode: String,
    /// State read through RocksDB under this budget (MiB); 0 keeps every
    /// key in memory.
    #[arg(long, default_value_t = 0)]
    memory_mb: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // One event a millisecond; a guid's repeats are `keys` ms apart, inside
    // a watermark delay of twice that.
    let delay_micros = 2 * args.keys as i64 * 1000;
    let spec = match args.mode.as_str() {
        "keys" => DedupSpec::Keys(vec![Arc::from("guid")]),
        _ => DedupSpec::WithinWatermark {
            keys: vec![Arc::from("guid")],
            delay_micros,
        },
    };
    let mut op = Deduplicate::new(spec, Some(Arc::from("ts")))?;
    let state_dir = tempfile::tempdir()?;
    let mut backend = None;
    if args.memory_mb > 0 {
        let (rocksdb_bytes, operator_bytes) =
            tidemark_connectors::split_memory_budget(args.memory_mb << 20, 1);
        let mut rocks = tidemark_connectors::state_backend::RocksDbStateBackend::new(
            state_dir.path(),
            "bench-dedup",
            rocksdb_bytes,
            operator_bytes,
            None,
        )?;
        op.open_state(rocks.open(0, "dedup")?, Some(operator_bytes))?;
        backend = Some(rocks);
    }
    let started = Instant::now();
    let mut out = Vec::new();
    let mut emitted = 0u64;
    let mut done = 0u64;
    let mut batch_id = 0;
    while done < args.events {
        let n = args.batch.min(args.events - done);
        // Spark's watermark: the previous batch's maximum minus the delay.
        let watermark = (done as i64 * 1000 - delay_micros).max(0);
        let ctx = BatchContext {
            batch_id,
            processing_time: 0,
            late_threshold: watermark,
            watermark,
            collect_late_rows: false,
            real_time: false,
        };
        for i in done..done + n {
            let mut row = Row::new();
            row.set("ts", Value::Timestamp(1 + i as i64 * 1000));
            row.set("guid", Value::from(format!("g{}", i % args.keys).as_str()));
            op.on_row(row, &ctx, &mut out)?;
        }
        op.on_batch_end(&ctx, &mut out)?;
        op.checkpoint()?;
        emitted += out.len() as u64;
        out.clear();
        done += n;
        batch_id += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    let progress = op.state_progress().expect("stateful");
    println!(
        "{}",
        serde_json::json!({
            "mode": args.mode,
            "memory_mb": args.memory_mb,
            "keys": args.keys,
            "events": args.events,
            "events_per_second": (args.events as f64 / seconds).round(),
            "rows_emitted": emitted,
            "state_keys_at_end": progress.num_rows_total,
            "peak_rss_mib": tidemark_bench::peak_rss_mib(),
        })
    );
    drop(op);
    drop(backend);
    Ok(())
}
