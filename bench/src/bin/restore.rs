//! Restore rate: how fast a task rebuilds a store from its Kafka changelog.
//!
//! Writes `--keys` keys (values of `--value-bytes`) through the caching and
//! change-logging layers to a fresh changelog partition, then times a task's
//! restore: the partition streamed into an empty RocksDB store in bounded
//! chunks. `--write-only` then `--restore <app>` run the two halves in two
//! processes, so that the peak resident memory printed is the restore's.
//!
//! ```text
//! cargo run --release --bin restore -- --keys 1000000
//! app=$(cargo run --release --bin restore -- --keys 10000000 --write-only)
//! cargo run --release --bin restore -- --keys 10000000 --restore $app
//! ```

use anyhow::Context;
use clap::Parser;
use std::time::Instant;
use tidemark_connectors::kafka::{
    changelog_topic, default_bootstrap, ensure_topic_with_config, restore_changelog,
    KafkaChangelogWriter, RestoreOptions,
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
    /// Only write the changelog, and print the application id to restore
    /// it from with `--restore` (in another process, so that its peak
    /// resident memory is the restore's alone).
    #[arg(long)]
    write_only: bool,
    /// Only restore the changelog of this application id (written before
    /// with `--write-only` and the same `--keys`).
    #[arg(long)]
    restore: Option<String>,
    /// RocksDB's memory budget (block cache and write buffers) while
    /// restoring, in MiB.
    #[arg(long, default_value_t = 256)]
    memory_mb: usize,
}

const STORE: &str = "windows";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bootstrap = args.bootstrap.clone().unwrap_or_else(default_bootstrap);
    let dir = tempfile::tempdir()?;
    let (app, write_s) = match &args.restore {
        Some(app) => (app.clone(), None),
        None => {
            let app = format!(
                "bench-restore-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            );
            let write_s = write_changelog(&args, &bootstrap, &app, dir.path())?;
            (app, Some(write_s))
        }
    };
    if args.write_only {
        println!("{app}");
        return Ok(());
    }

    let started = Instant::now();
    let db = TaskDb::open(
        dir.path(),
        &app,
        "restored",
        &MemoryBudget::new(args.memory_mb << 20),
    )?;
    let mut restored = ChangeLoggingStore::new(db.store(STORE)?, VecChangelog::default(), 0);
    let (count, end) = restore_changelog(
        &tidemark_connectors::kafka::KafkaConnection::new(&bootstrap),
        &app,
        STORE,
        0,
        None,
        RestoreOptions::default(),
        &mut |chunk| Ok(restored.restore_chunk(chunk)?),
    )?;
    restored.flush()?;
    let restore_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(count == args.keys, "restored {count} of {} keys", args.keys);
    let check = restored
        .get(&(args.keys - 1).to_be_bytes())?
        .context("last key missing after restore")?;
    anyhow::ensure!(check.len() == args.value_bytes, "value size changed");

    println!(
        "keys: {}, value bytes: {}, changelog records: {end}, RocksDB budget: {} MiB",
        args.keys, args.value_bytes, args.memory_mb
    );
    println!("| phase | seconds | records/s |");
    println!("|---|---:|---:|");
    if let Some(write_s) = write_s {
        println!(
            "| write through cache + changelog (acks) | {write_s:.2} | {:.0} |",
            args.keys as f64 / write_s
        );
    }
    println!(
        "| **restore (streamed read + apply)** | {restore_s:.2} | **{:.0}** |",
        count as f64 / restore_s
    );
    println!("peak RSS: {:.0} MiB", tidemark_bench::peak_rss_mib());
    Ok(())
}

/// Writes `--keys` keys through the write cache and the change-logging
/// layer to a fresh changelog partition of `app`; returns the seconds taken.
fn write_changelog(
    args: &Args,
    bootstrap: &str,
    app: &str,
    dir: &std::path::Path,
) -> anyhow::Result<f64> {
    ensure_topic_with_config(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap),
        &changelog_topic(app, STORE),
        1,
        1,
        &[("cleanup.policy", "compact")],
    )?;
    let budget = MemoryBudget::new(256 << 20);
    let writer = KafkaChangelogWriter::new(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap),
        app,
    )?;
    let started = Instant::now();
    let db = TaskDb::open(dir, app, "source", &budget)?;
    let logged = ChangeLoggingStore::new(db.store(STORE)?, writer.clone(), 0);
    let mut cached = CachingStore::new(logged, 64 << 20);
    let value = vec![7u8; args.value_bytes];
    for k in 0..args.keys {
        cached.put(&k.to_be_bytes(), &value)?;
    }
    cached.flush()?;
    writer.flush()?;
    Ok(started.elapsed().as_secs_f64())
}
