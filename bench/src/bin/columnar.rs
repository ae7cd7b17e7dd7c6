//! Row path vs Arrow columnar path for the stateless pipeline's per-record
//! work, in memory: decode JSON by the schema, filter `amount >= 0`, encode
//! the kept rows as JSON, one payload per record. Measures the decision
//! #14 leaves open ("if you find a faster design than Arrow for this
//! workload, show the numbers side by side").
//!
//! ```text
//! cargo run --release -p tidemark-bench --bin columnar -- --records 2000000 --batch 10000
//! ```

use anyhow::Result;
use clap::Parser;
use deltalake::arrow::array::{Array, Float64Array, RecordBatch};
use deltalake::arrow::compute::filter_record_batch;
use deltalake::arrow::compute::kernels::cmp::gt_eq;
use deltalake::arrow::json::{LineDelimitedWriter, ReaderBuilder};
use std::time::Instant;
use tidemark::decode::JsonDecoder;
use tidemark::expr::Expr;
use tidemark::record::{Record, SourcePosition};
use tidemark::runtime::Decoder;

#[derive(Parser)]
struct Args {
    /// Records per run.
    #[arg(long, default_value_t = 2_000_000)]
    records: u64,
    /// Records per batch.
    #[arg(long, default_value_t = 10_000)]
    batch: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let payloads: Vec<Vec<u8>> = (0..args.records)
        .map(|i| tidemark_bench::payload(i, args.value_bytes))
        .collect();
    let (row_secs, row_out) = row_path(&payloads, args.batch)?;
    let (arrow_secs, arrow_out) = arrow_path(&payloads, args.batch)?;
    let n = args.records as f64;
    println!("| path | records/s | output bytes |");
    println!("|---|---:|---:|");
    println!(
        "| rows (JsonDecoder, Expr, serde_json) | {:.0} | {row_out} |",
        n / row_secs
    );
    println!("| Arrow (arrow-json decoder, cmp + filter kernels, arrow-json writer) | {:.0} | {arrow_out} |", n / arrow_secs);
    println!("ratio Arrow / rows: {:.2}", row_secs / arrow_secs);
    Ok(())
}

fn row_path(payloads: &[Vec<u8>], batch: usize) -> Result<(f64, usize)> {
    let mut decoder = JsonDecoder::new(tidemark_bench::schema());
    let expr = Expr::parse(tidemark_bench::FILTER)?;
    let start = Instant::now();
    let mut out_bytes = 0;
    let mut json = Vec::with_capacity(256);
    let mut phases = [0.0f64; 3];
    for (b, chunk) in payloads.chunks(batch).enumerate() {
        let mut rows = Vec::with_capacity(chunk.len());
        for (i, p) in chunk.iter().enumerate() {
            let record = Record {
                key: None,
                value: Some(p.clone()),
                timestamp_ms: None,
                headers: Vec::new(),
                position: SourcePosition::new("bench", 0, (b * batch + i) as i64),
            };
            rows.push(decoder.decode(&record)?);
        }
        let t = Instant::now();
        let kept: Vec<&tidemark::row::Row> = rows.iter().filter(|r| expr.matches(r)).collect();
        phases[1] += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for row in kept {
            json.clear();
            serde_json::to_writer(&mut json, row)?;
            out_bytes += json.len();
        }
        phases[2] += t.elapsed().as_secs_f64();
    }
    let total = start.elapsed().as_secs_f64();
    println!(
        "rows phases: decode {:.3} s, filter {:.3} s, encode {:.3} s",
        total - phases[1] - phases[2],
        phases[1],
        phases[2]
    );
    Ok((total, out_bytes))
}

fn arrow_path(payloads: &[Vec<u8>], batch: usize) -> Result<(f64, usize)> {
    let schema = tidemark_bench::arrow_schema();
    let mut decoder = ReaderBuilder::new(schema.clone())
        .with_batch_size(batch)
        .build_decoder()?;
    let zero = Float64Array::new_scalar(0.0);
    let start = Instant::now();
    let mut out_bytes = 0;
    let mut buf = Vec::with_capacity(256 * batch);
    let mut phases = [0.0f64; 3];
    for chunk in payloads.chunks(batch) {
        for p in chunk {
            let mut rest: &[u8] = p;
            while !rest.is_empty() {
                let used = decoder.decode(rest)?;
                rest = &rest[used..];
            }
        }
        let Some(decoded): Option<RecordBatch> = decoder.flush()? else {
            continue;
        };
        let t = Instant::now();
        let keep = gt_eq(decoded.column(2), &zero)?;
        let kept = filter_record_batch(&decoded, &keep)?;
        phases[1] += t.elapsed().as_secs_f64();
        let t = Instant::now();
        buf.clear();
        let mut writer = LineDelimitedWriter::new(&mut buf);
        writer.write(&kept)?;
        writer.finish()?;
        drop(writer);
        // One payload per row: the lines of the buffer.
        out_bytes += buf
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::len)
            .sum::<usize>();
        assert_eq!(kept.num_rows(), kept.column(1).len());
        phases[2] += t.elapsed().as_secs_f64();
    }
    let total = start.elapsed().as_secs_f64();
    println!(
        "arrow phases: decode {:.3} s, filter {:.3} s, encode {:.3} s",
        total - phases[1] - phases[2],
        phases[1],
        phases[2]
    );
    Ok((total, out_bytes))
}
