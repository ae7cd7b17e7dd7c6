//! Window aggregation at scale, in memory: 10M events per iteration through
//! one `WindowAggregate` (one core), append mode, with the watermark
//! advancing every 100k events so windows close and are evicted as in a
//! running query.
//!
//! - `tumbling_count_sum/10k_keys` and `/1M_keys`: 1-minute windows;
//! - `tumbling_7_aggregates/10k_keys`: the same with `avg`, `min`, `max`,
//!   `stddev` and `count` of the amount too (what each aggregate adds);
//! - `sliding_6h_1h/10k_keys`: 6-hour windows every hour (6 per event);
//! - `session_30m/10k_keys`: 30-minute gap sessions.
//!
//! Each case runs twice: rows through `on_row`, and the same events as
//! Arrow batches of 100k rows through `on_columns` (`.../columns`).
//!
//! Also prints the heap bytes per open window, measured with a counting
//! allocator.
//!
//! ```text
//! cargo bench -p tidemark-bench --profile dev --bench windows
//! ```

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deltalake::arrow::array::{
    ArrayRef, Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark::operators::{
    AggregateInput, AggregateSpec, BatchContext, Operator, OutputMode, TimeColumn, WindowAggregate,
};
use tidemark::prelude::{AggregateFn, Row, Value, WindowSpec};

/// Counts live heap bytes, to measure state size.
struct CountingAllocator;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
/// Counting costs an atomic add per allocation: it is on only in the
/// untimed run that measures state size.
static COUNTING: AtomicBool = AtomicBool::new(false);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const EVENTS: u64 = 10_000_000;
const CHUNK: u64 = 100_000;
const START: i64 = 1_767_225_600_000_000;

/// Event `i`'s time: advancing `step_micros` per event with a little
/// disorder (every 7th event 3 steps behind).
fn event_time(i: u64, step_micros: i64) -> i64 {
    let late = if i.is_multiple_of(7) {
        3 * step_micros
    } else {
        0
    };
    START + i as i64 * step_micros - late
}

/// Event `i` as a row: key `i % keys`, amount `i % 100`.
fn event(i: u64, keys: u64, step_micros: i64, key_names: &[Arc<str>]) -> Row {
    [
        ("event_time", Value::Timestamp(event_time(i, step_micros))),
        ("id", Value::Str(key_names[(i % keys) as usize].clone())),
        ("amount", Value::Double((i % 100) as f64)),
    ]
    .into_iter()
    .collect()
}

/// Events `range` as one columnar batch, the same values as [`event`].
fn events_batch(
    range: std::ops::Range<u64>,
    keys: u64,
    step_micros: i64,
    key_names: &[Arc<str>],
) -> RecordBatch {
    let schema = tidemark_bench::arrow_schema();
    let times: TimestampMicrosecondArray = TimestampMicrosecondArray::from_iter_values(
        range.clone().map(|i| event_time(i, step_micros)),
    );
    let ids: StringArray = range
        .clone()
        .map(|i| Some(key_names[(i % keys) as usize].as_ref()))
        .collect();
    let amounts: Float64Array = range.map(|i| (i % 100) as f64).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(times.with_timezone("UTC")),
        Arc::new(ids),
        Arc::new(amounts),
    ];
    RecordBatch::try_new(schema, columns).expect("the batch matches its schema")
}

/// `count(*)` and `sum(amount)`.
fn count_sum() -> Vec<AggregateSpec> {
    vec![
        AggregateSpec::count(),
        AggregateSpec::new(
            AggregateFn::built_in("sum").unwrap(),
            AggregateInput::Column(Arc::from("amount")),
        ),
    ]
}

/// Six aggregates of `amount` beside `count(*)`: what each aggregate
/// adds per row.
fn seven_aggregates() -> Vec<AggregateSpec> {
    let mut aggregates = count_sum();
    for f in ["avg", "min", "max", "stddev", "count"] {
        aggregates.push(AggregateSpec::of(f, "amount").unwrap());
    }
    aggregates
}

fn operator(window: WindowSpec, aggregates: Vec<AggregateSpec>) -> WindowAggregate {
    WindowAggregate::new(
        vec![Arc::from("id")],
        TimeColumn::EventTime(Arc::from("event_time")),
        window,
        aggregates,
        OutputMode::Append,
    )
}

/// How the events reach the operator.
#[derive(Clone, Copy, PartialEq)]
enum Input {
    /// One `Row` per event, through `on_row`.
    Rows,
    /// One Arrow batch per chunk, through `on_columns`.
    Columns,
}

/// Runs `EVENTS` events; times only the operator (rows or batches are
/// built per chunk outside the clock). Returns the elapsed time and the
/// peak open windows.
fn run(
    (window, aggregates): (&WindowSpec, fn() -> Vec<AggregateSpec>),
    keys: u64,
    step_micros: i64,
    delay_micros: i64,
    input: Input,
) -> (Duration, usize, isize) {
    let key_names: Vec<Arc<str>> = (0..keys).map(|k| Arc::from(format!("c{k}"))).collect();
    let mut op = operator(window.clone(), aggregates());
    let mut elapsed = Duration::ZERO;
    let mut peak = (0usize, 0isize);
    let mut watermark = 0;
    let mut out = Vec::new();
    let mut chunk: Vec<Row> = Vec::with_capacity(CHUNK as usize);
    // Everything allocated so far (key strings, buffers) is not state.
    let baseline = LIVE_BYTES.load(Ordering::Relaxed);
    let mut i = 0;
    while i < EVENTS {
        let range = i..(i + CHUNK).min(EVENTS);
        chunk.clear();
        let batch = match input {
            Input::Rows => {
                chunk.extend(range.map(|j| event(j, keys, step_micros, &key_names)));
                None
            }
            Input::Columns => Some(events_batch(range, keys, step_micros, &key_names)),
        };
        let max_t = START + (i + CHUNK) as i64 * step_micros;
        let ctx = BatchContext {
            batch_id: i / CHUNK,
            processing_time: 0,
            late_threshold: watermark,
            watermark,
            collect_late_rows: false,
            real_time: false,
        };
        let started = Instant::now();
        match &batch {
            None => {
                for row in chunk.drain(..) {
                    op.on_row(row, &ctx, &mut out).unwrap();
                }
            }
            Some(batch) => op.on_columns(batch, &ctx, &mut out).unwrap(),
        }
        elapsed += started.elapsed();
        drop(batch);
        // The chunk's rows were consumed (its buffer predates the baseline):
        // what is live beyond the baseline is the operator's state.
        let open = op
            .state_progress()
            .map(|p| p.num_rows_total as usize)
            .unwrap_or(0);
        let state_bytes = LIVE_BYTES.load(Ordering::Relaxed) - baseline;
        if open > peak.0 {
            peak = (open, state_bytes);
        }
        let started = Instant::now();
        op.on_batch_end(&ctx, &mut out).unwrap();
        elapsed += started.elapsed();
        out = Vec::new();
        watermark = max_t - delay_micros;
        i += CHUNK;
    }
    (elapsed, peak.0, peak.1)
}

fn bench(c: &mut Criterion) {
    let minute = 60_000_000i64;
    // Event time advances `step` per event; with 10k keys and a 60 µs step
    // each key sees ~100 events per 1-minute window, and 10M events span
    // 10 minutes. With 1M keys and a 6 µs step the run spans one minute:
    // 1M windows open at once, 10 events each.
    let cases = [
        (
            "tumbling_count_sum/10k_keys",
            WindowSpec::tumbling("1 minute").unwrap(),
            10_000u64,
            60i64,
            minute,
        ),
        (
            "tumbling_7_aggregates/10k_keys",
            WindowSpec::tumbling("1 minute").unwrap(),
            10_000u64,
            60i64,
            minute,
        ),
        (
            "tumbling_count_sum/1M_keys",
            WindowSpec::tumbling("1 minute").unwrap(),
            1_000_000,
            6,
            minute,
        ),
        // 10M events over 24 hours: each event lands in 6 windows.
        (
            "sliding_6h_1h/10k_keys",
            WindowSpec::sliding("6 hours", "1 hour").unwrap(),
            10_000,
            8_640,
            60 * minute,
        ),
        // Each key sees an event every 0.6 s: its session grows for the
        // whole run (one open session per key, merged into on every event).
        (
            "session_30m/10k_keys",
            WindowSpec::session("30 minutes").unwrap(),
            10_000,
            60,
            minute,
        ),
    ];
    let mut group = c.benchmark_group("windows");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(EVENTS));
    for (name, window, keys, step, delay) in cases {
        let aggregates: fn() -> Vec<AggregateSpec> = match name.starts_with("tumbling_7") {
            true => seven_aggregates,
            false => count_sum,
        };
        let spec = (&window, aggregates);
        // The same events as rows (`on_row`) and as Arrow batches
        // (`on_columns`, `/columns`): the two paths of the operator.
        for (input, suffix) in [(Input::Rows, ""), (Input::Columns, "/columns")] {
            group.bench_function(format!("{name}{suffix}"), |b| {
                b.iter_custom(|iterations| {
                    (0..iterations)
                        .map(|_| run(spec, keys, step, delay, input).0)
                        .sum()
                })
            });
        }
        // One more run, untimed, with the allocator counting: the state size.
        COUNTING.store(true, Ordering::SeqCst);
        let (_, open, bytes) = run(spec, keys, step, delay, Input::Rows);
        COUNTING.store(false, Ordering::SeqCst);
        println!(
            "{name}: peak open windows {open}, state heap {bytes} bytes, {:.0} bytes per open window",
            bytes as f64 / open.max(1) as f64
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
