//! State benchmark: a tumbling, session or rolling count and sum per key, driven batch by
//! batch through the operator, with state all in memory or read through a
//! RocksDB store under one memory budget. Reports events/s, peak RSS and the
//! keys and windows held.
//!
//! ```text
//! # 10M keys of state under a 512 MiB budget
//! cargo run -p tidemark-bench --bin state -- --store rocksdb --keys 10000000 --events 10000000
//! # the same in memory, for comparison
//! cargo run -p tidemark-bench --bin state -- --store memory --keys 10000000 --events 10000000
//! # the same with session windows (1-day gap)
//! cargo run -p tidemark-bench --bin state -- --window session --store rocksdb --keys 10000000 --events 10000000
//! # and rolling windows (1-day count and sum)
//! cargo run -p tidemark-bench --bin state -- --window rolling --store rocksdb --keys 10000000 --events 10000000
//! # steady state: 10M events over 100k hot keys
//! cargo run -p tidemark-bench --bin state -- --store rocksdb --keys 100000 --events 10000000
//! ```
//!
//! Each run is its own process, so that the peak RSS (`VmHWM`) is its own.

use clap::{Parser, ValueEnum};
use std::sync::Arc;
use std::time::Instant;
use tidemark::operators::{
    AggregateSpec, BatchContext, FrontierSpec, Operator, OutputMode, RollingMeasure, RollingWindow,
    TimeColumn, WindowAggregate,
};
use tidemark::row::{Row, Value};
use tidemark::window::WindowSpec;
use tidemark_state::{CachingStore, MemoryBudget, TaskDb};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Store {
    /// All state in the operator's hash map.
    Memory,
    /// RocksDB under the budget; the operator keeps its share in memory.
    Rocksdb,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Window {
    /// A 1-day tumbling window.
    Tumbling,
    /// Sessions with a 1-day gap.
    Session,
    /// A rolling 1-day count and sum per key (the frontier past every event).
    Rolling,
}

#[derive(Parser)]
struct Args {
    /// The window: both keep one window per key for the whole run.
    #[arg(long, value_enum, default_value = "tumbling")]
    window: Window,
    /// Where state lives.
    #[arg(long, value_enum, default_value = "rocksdb")]
    store: Store,
    /// Distinct keys; event i goes to key i % keys.
    #[arg(long, default_value_t = 10_000_000)]
    keys: u64,
    /// Events in total.
    #[arg(long, default_value_t = 10_000_000)]
    events: u64,
    /// Events per batch (one checkpoint each).
    #[arg(long, default_value_t = 100_000)]
    batch: u64,
    /// The memory budget in MiB, split as `state.memory_mb` is.
    #[arg(long, default_value_t = 512)]
    budget_mb: usize,
    /// Overrides RocksDB's share of the budget (MiB), to see what it costs.
    #[arg(long)]
    rocksdb_mb: Option<usize>,
    /// Overrides the operator's share of the budget (MiB).
    #[arg(long)]
    operator_mb: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // One window for the whole run: no key's state expires.
    let window = |spec: WindowSpec| -> anyhow::Result<Box<dyn Operator>> {
        Ok(Box::new(WindowAggregate::new(
            vec![Arc::from("id")],
            TimeColumn::EventTime(Arc::from("event_time")),
            spec,
            vec![AggregateSpec::count(), AggregateSpec::of("sum", "amount")?],
            OutputMode::Append,
        )))
    };
    let mut op: Box<dyn Operator> = match args.window {
        Window::Tumbling => window(WindowSpec::tumbling("1 day")?)?,
        Window::Session => window(WindowSpec::session("1 day")?)?,
        Window::Rolling => Box::new(RollingWindow::new(
            &["id"],
            "event_time",
            FrontierSpec::default(),
            vec![
                RollingMeasure::of("count", "*")?.over("1 day")?,
                RollingMeasure::of("sum", "amount")?.over("1 day")?,
            ],
        )?),
    };
    let dir = tempfile::tempdir()?;
    let budget_bytes = args.budget_mb << 20;
    let _db = match args.store {
        Store::Memory => None,
        Store::Rocksdb => {
            let (rocksdb_bytes, operator_bytes) =
                tidemark_connectors::split_memory_budget(budget_bytes, 1);
            let rocksdb_bytes = args.rocksdb_mb.map_or(rocksdb_bytes, |mb| mb << 20);
            let operator_bytes = args.operator_mb.map_or(operator_bytes, |mb| mb << 20);
            let budget = MemoryBudget::new(rocksdb_bytes);
            let db = TaskDb::open(dir.path(), "bench-state", "0", &budget)?;
            let store = CachingStore::new(db.store("op0")?, operator_bytes / 8);
            op.open_state(Box::new(store), Some(operator_bytes))?;
            Some((db, budget))
        }
    };
    let start_micros = tidemark::time::parse_rfc3339("2026-01-01T00:00:00Z")
        .ok_or_else(|| anyhow::anyhow!("bad start time"))?;
    let ctx = BatchContext {
        batch_id: 0,
        // The rolling frontier: past every event, inside every range.
        processing_time: start_micros + 3_600_000_000,
        late_threshold: 0,
        watermark: 0,
        collect_late_rows: false,
        real_time: false,
    };
    let id_column: Arc<str> = Arc::from("id");
    let started = Instant::now();
    let mut out = Vec::new();
    let mut rows_out = 0u64;
    let mut done = 0u64;
    while done < args.events {
        let n = args.batch.min(args.events - done);
        for i in done..done + n {
            let mut row = Row::new();
            row.set(
                "event_time",
                Value::Timestamp(start_micros + (i % 1000) as i64),
            );
            row.set(
                id_column.clone(),
                Value::from(format!("key-{}", i % args.keys).as_str()),
            );
            row.set("amount", Value::Double(1.5));
            op.on_row(row, &ctx, &mut out)?;
        }
        op.on_batch_end(&ctx, &mut out)?;
        // Counted, not kept: a sink would have written them.
        rows_out += out.len() as u64;
        out.clear();
        op.checkpoint()?;
        done += n;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let progress = op.state_progress().expect("a stateful operator");
    let result = serde_json::json!({
        "store": match args.store { Store::Memory => "memory", Store::Rocksdb => "rocksdb" },
        "window": match args.window {
            Window::Tumbling => "tumbling",
            Window::Session => "session",
            Window::Rolling => "rolling",
        },
        "keys": args.keys,
        "events": args.events,
        "budget_mb": args.budget_mb,
        "seconds": elapsed,
        "events_per_second": args.events as f64 / elapsed,
        "peak_rss_mib": tidemark_bench::peak_rss_mib(),
        "windows_total": progress.num_rows_total,
        "rows_out": rows_out,
        "state_memory_estimate_mib": progress.memory_used_bytes as f64 / (1 << 20) as f64,
    });
    println!("{result}");
    Ok(())
}
