//! Restore rate: how fast a task rebuilds a store from its Kafka changelog.
//!
//! Writes `--keys` keys (values of `--value-bytes`) through the caching and
//! change-logging layers to a fresh changelog partition, then times reading
//! the partition back and writing it into an empty RocksDB store.
//!
//! ```text
//! cargo run -p tidemark-bench --bin restore -- --keys 1000000
//! ```

use anyhow::Context;
use clap::Parser;
use std::time::Instant;
use tidemark_connectors::kafka::{
    changelog_topic, default_bootstrap, ensure_topic_with_config, read_changelog,
    KafkaChangelogWriter,
};
use tidemark_state::{
    CachingStore, ChangeLoggingStore, MemoryBudget, StateStore, TaskDb, VecChangelog,
};

#[derive(Parser)]
struct Args {
    /// Distinct keys in the store.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Kafka bootstrap servers (default: KAFKA_BOOTSTRAP or 127.0.0.1:9092).
    #[arg(long)]
    bootstrap: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bootstrap = args.bootstrap.unwrap_or_else(default_bootstrap);
    let app = format!(
        "bench-restore-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let store = "windows";
    ensure_topic_with_config(
        &bootstrap,
        &changelog_topic(&app, store),
        1,
        1,
        &[("cleanup.policy", "compact")],
    )?;
    let dir = tempfile::tempdir()?;
    let budget = MemoryBudget::new(256 << 20);

    let writer = KafkaChangelogWriter::new(&bootstrap, &app)?;
    let started = Instant::now();
    {
        let db = TaskDb::open(dir.path(), &app, "source", &budget)?;
        let logged = ChangeLoggingStore::new(db.store(store)?, writer.clone(), 0);
        let mut cached = CachingStore::new(logged, 64 << 20);
        let value = vec![7u8; args.value_bytes];
        for k in 0..args.keys {
            cached.put(&k.to_be_bytes(), &value)?;
        }
        cached.flush()?;
        writer.flush()?;
    }
    let write_s = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let (records, end) = read_changelog(&bootstrap, &app, store, 0, None)?;
    let read_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let db = TaskDb::open(dir.path(), &app, "restored", &budget)?;
    let mut restored = ChangeLoggingStore::new(db.store(store)?, VecChangelog::default(), 0);
    let count = restored.restore(records)?;
    restored.flush()?;
    let apply_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(count == args.keys, "restored {count} of {} keys", args.keys);
    let check = restored
        .get(&(args.keys - 1).to_be_bytes())?
        .context("last key missing after restore")?;
    anyhow::ensure!(check.len() == args.value_bytes, "value size changed");

    println!(
        "keys: {}, value bytes: {}, changelog records: {end}",
        args.keys, args.value_bytes
    );
    println!("| phase | seconds | records/s |");
    println!("|---|---:|---:|");
    println!(
        "| write through cache + changelog (acks) | {write_s:.2} | {:.0} |",
        args.keys as f64 / write_s
    );
    println!(
        "| read changelog partition | {read_s:.2} | {:.0} |",
        count as f64 / read_s
    );
    println!(
        "| apply to RocksDB | {apply_s:.2} | {:.0} |",
        count as f64 / apply_s
    );
    println!(
        "| **restore (read + apply)** | {:.2} | **{:.0}** |",
        read_s + apply_s,
        count as f64 / (read_s + apply_s)
    );
    Ok(())
}
