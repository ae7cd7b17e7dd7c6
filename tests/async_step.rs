//! An asynchronous call per row (#45 item 4) through the test driver: the
//! concurrency bound holds, ordered output keeps the input's order and
//! unordered output the answers', a timeout or a failed call fails the
//! batch naming the step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tidemark::async_step::{AsyncOptions, CallError};
use tidemark::prelude::*;
use tidemark::test_driver::PipelineTestDriver;

#[derive(serde::Deserialize)]
struct Tx {
    n: i64,
}

#[derive(serde::Serialize)]
struct Scored {
    n: i64,
    score: i64,
}

const ROWS: i64 = 40;

fn run(options: AsyncOptions, in_flight: Arc<AtomicUsize>, most: Arc<AtomicUsize>) -> Vec<i64> {
    let query = Query::builder("async")
        .map_async("score", options, move |tx: Tx| {
            let (in_flight, most) = (in_flight.clone(), most.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Later rows answer sooner.
                tokio::time::sleep(Duration::from_millis((ROWS - tx.n) as u64 * 2)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Scored {
                    n: tx.n,
                    score: tx.n * 10,
                })
            }
        })
        .unwrap();
    let mut driver = PipelineTestDriver::new(query);
    for n in 0..ROWS {
        driver = driver.pipe("t", &format!(r#"{{"n": {n}}}"#));
    }
    let run = driver.run().unwrap();
    run.output
        .iter()
        .map(|(_, row)| {
            let n = row.get("n").and_then(Value::as_f64).unwrap() as i64;
            let score = row.get("score").and_then(Value::as_f64).unwrap() as i64;
            assert_eq!(score, n * 10);
            n
        })
        .collect()
}

#[test]
fn calls_run_at_most_concurrency_at_a_time_and_ordered_output_keeps_the_input_order() {
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let options = AsyncOptions {
        concurrency: 8,
        ..AsyncOptions::default()
    };
    let out = run(options, in_flight, most.clone());
    assert_eq!(out, (0..ROWS).collect::<Vec<_>>());
    assert_eq!(
        most.load(Ordering::SeqCst),
        8,
        "eight calls in flight, never more"
    );
}

#[test]
fn unordered_output_comes_in_the_order_the_calls_answered() {
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let options = AsyncOptions {
        concurrency: ROWS as usize,
        ordered: false,
        ..AsyncOptions::default()
    };
    let out = run(options, in_flight, most);
    let mut sorted = out.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..ROWS).collect::<Vec<_>>(),
        "every row answered once"
    );
    assert_eq!(out[0], ROWS - 1, "the last row answered first: {out:?}");
}

#[test]
fn a_call_that_times_out_or_fails_fails_the_batch_naming_the_step() {
    for (limit_ms, expected) in [(5, "took longer than"), (10_000, "model server down")] {
        let query = Query::builder("async")
            .map_async(
                "score",
                AsyncOptions {
                    timeout: Duration::from_millis(limit_ms),
                    ..AsyncOptions::default()
                },
                |tx: Tx| async move {
                    if tx.n == 1 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        return Err::<Scored, CallError>("model server down".into());
                    }
                    Ok(Scored { n: tx.n, score: 0 })
                },
            )
            .unwrap();
        let e = PipelineTestDriver::new(query)
            .pipe("t", r#"{"n": 0}"#)
            .pipe("t", r#"{"n": 1}"#)
            .run()
            .expect_err("the batch fails");
        let text = e.to_string();
        assert!(text.contains("score") && text.contains(expected), "{text}");
    }
    let bad = Query::builder("async").map_async(
        "score",
        AsyncOptions {
            concurrency: 0,
            ..AsyncOptions::default()
        },
        |tx: Tx| async move { Ok::<_, std::io::Error>(Scored { n: tx.n, score: 0 }) },
    );
    assert!(bad
        .err()
        .expect("refused")
        .to_string()
        .contains("map_async.concurrency"));
}

/// A test driving the query from inside a tokio runtime (`#[tokio::test]`)
/// runs the calls too: a runtime cannot block inside another, so they run
/// from a thread of their own.
#[tokio::test]
async fn the_driver_runs_async_calls_from_inside_a_tokio_runtime() {
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let out = run(AsyncOptions::default(), in_flight, most);
    assert_eq!(out, (0..ROWS).collect::<Vec<_>>());
}
