//! A left outer stream-stream join of two co-partitioned topics over a real
//! broker under `exactly_once`, killed with SIGKILL twice mid-stream and
//! restarted: the output topic, read `read_committed`, holds every clicked
//! ad once with its click and every other ad once with a null click (its
//! outer row, written when the watermark evicted it). Topics that are not
//! co-partitioned are refused at start, naming both.

mod common;

use common::{run_and_kill, run_to_end};
use std::time::Duration;
use tidemark_integration_tests::*;

const ADS: i64 = 400;
const PARTITIONS: i32 = 4;

/// The join, its watermarks per partition: every partition ends with a
/// pair ten hours on, and under Spark's query-wide watermark the first
/// partition to deliver its pair would make the others' unread ads late.
fn pipeline(app: &str, impressions: &str, clicks: &str, output: &str, trigger: &str) -> String {
    format!(
        r#"name: {app}
source:
  kind: kafka
  topic: {impressions}
  keyed_by: [adId]
  schema: {{adId: string, impressionTime: timestamp}}
  properties: {{session.timeout.ms: "6000", heartbeat.interval.ms: "1000"}}
event_time: impressionTime
watermark: 30 minutes
watermark_scope: partition
steps:
  - join:
      topic: {clicks}
      name: clicks
      type: left_outer
      on: [adId]
      event_time: clickTime
      watermark: 1 hour
      between: ["0 seconds", "20 minutes"]
      schema: {{adId: string, clickTime: timestamp}}
output_mode: append
trigger: {trigger}
max_records_per_batch: 100
sink: {{kind: kafka, topic: {output}, key: [adId]}}
state: {{dir: state, changelog: true, memory_mb: 32}}
processing_guarantee: exactly_once
"#
    )
}

fn at(start: i64, seconds: i64) -> String {
    tidemark::time::format_rfc3339(start + seconds * 1_000_000)
}

#[test]
fn sigkill_twice_under_exactly_once_then_each_ad_is_written_once() {
    let (impressions, clicks) = (unique("join-imp"), unique("join-clk"));
    let (output, app) = (unique("join-out"), unique("join-app"));
    create_topic(&impressions, PARTITIONS);
    create_topic(&clicks, PARTITIONS);
    create_topic(&output, 1);
    // Ad i is shown at 30 s steps; even ads are clicked 10 minutes later
    // (inside the 20-minute range), odd ads never.
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    let shown: Vec<_> = (0..ADS)
        .map(|i| {
            let value = format!(
                r#"{{"adId": "ad{i}", "impressionTime": "{}"}}"#,
                at(start, i * 30)
            );
            (format!("ad{i}"), value.into_bytes())
        })
        .collect();
    let clicked: Vec<_> = (0..ADS)
        .step_by(2)
        .map(|i| {
            let value = format!(
                r#"{{"adId": "ad{i}", "clickTime": "{}"}}"#,
                at(start, i * 30 + 600)
            );
            (format!("ad{i}"), value.into_bytes())
        })
        .collect();
    // Same keys, same partitioner: co-partitioned.
    produce(&impressions, &shown);
    produce(&clicks, &clicked);
    // A late pair in every partition moves each task's watermarks past
    // every ad, so that every unmatched impression is evicted and written.
    for p in 0..PARTITIONS {
        let key = format!("end{p}");
        let imp = format!(
            r#"{{"adId": "{key}", "impressionTime": "{}"}}"#,
            at(start, 10 * 3600)
        );
        let clk = format!(
            r#"{{"adId": "{key}", "clickTime": "{}"}}"#,
            at(start, 10 * 3600 + 60)
        );
        produce_to(&impressions, Some(p), &[(key.clone(), imp.into_bytes())]);
        produce_to(&clicks, Some(p), &[(key, clk.into_bytes())]);
    }

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let write = |trigger: &str| {
        std::fs::write(
            &file,
            pipeline(&app, &impressions, &clicks, &output, trigger),
        )
        .unwrap();
    };
    write("{micro_batch: 200 milliseconds}");
    run_and_kill(&file, 3);
    run_and_kill(&file, 5);
    write("available_now");
    let done = run_to_end(&file);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );

    let expected = ADS as usize + PARTITIONS as usize;
    let out = consume_all(&output, expected, Duration::from_secs(60));
    let mut seen = std::collections::BTreeMap::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let ad = v["adId"].as_str().unwrap().to_string();
        assert!(seen.insert(ad.clone(), v.clone()).is_none(), "{ad} twice");
        if let Some(i) = ad.strip_prefix("ad").and_then(|n| n.parse::<i64>().ok()) {
            assert_eq!(v["impressionTime"], at(start, i * 30), "{v}");
            if i % 2 == 0 {
                assert_eq!(v["clickTime"], at(start, i * 30 + 600), "{v}");
            } else {
                assert!(v["clickTime"].is_null(), "an unclicked ad: {v}");
            }
        } else {
            assert_eq!(v["clickTime"], at(start, 10 * 3600 + 60), "{v}");
        }
    }
    let missing: Vec<String> = (0..ADS)
        .map(|i| format!("ad{i}"))
        .chain((0..PARTITIONS).map(|p| format!("end{p}")))
        .filter(|ad| !seen.contains_key(ad))
        .collect();
    let warnings: Vec<_> = String::from_utf8_lossy(&done.stderr)
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(str::to_string)
        .collect();
    if !missing.is_empty() {
        // Written but not committed (an open or aborted transaction), or
        // never written at all?
        let uncommitted: Vec<String> = consume_uncommitted(&output, Duration::from_secs(5))
            .iter()
            .filter_map(|r| {
                let v: serde_json::Value = serde_json::from_slice(r.value.as_deref()?).ok()?;
                Some(v["adId"].as_str()?.to_string())
            })
            .filter(|ad| missing.contains(ad))
            .collect();
        let last_run = String::from_utf8_lossy(&done.stderr);
        let tail: Vec<&str> = last_run.lines().rev().take(40).collect();
        panic!(
            "ads never written: {missing:?}; of these, read uncommitted: {uncommitted:?}; \
             the last run's warnings: {warnings:#?}; its last lines (newest first): {tail:#?}"
        );
    }
    assert_eq!(seen.len(), expected, "every ad once");
}

#[test]
fn streams_keyed_otherwise_or_not_co_partitioned_are_repartitioned_and_joined() {
    let (impressions, clicks) = (unique("rj-imp"), unique("rj-clk"));
    let (output, app) = (unique("rj-out"), unique("rj-app"));
    // Two and three partitions, keyed by impression and click ids: neither
    // co-partitioned nor keyed by the ad.
    create_topic(&impressions, 2);
    create_topic(&clicks, 3);
    create_topic(&output, 1);
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    let ads = 200;
    let shown: Vec<_> = (0..ads)
        .map(|i| {
            let value = format!(
                r#"{{"impressionId": "imp{i}", "adId": "ad{i}", "impressionTime": "{}"}}"#,
                at(start, i * 30)
            );
            (format!("imp{i}"), value.into_bytes())
        })
        .collect();
    let clicked: Vec<_> = (0..ads)
        .step_by(2)
        .map(|i| {
            let value = format!(
                r#"{{"clickId": "clk{i}", "adId": "ad{i}", "clickTime": "{}"}}"#,
                at(start, i * 30 + 600)
            );
            (format!("clk{i}"), value.into_bytes())
        })
        .collect();
    produce(&impressions, &shown);
    produce(&clicks, &clicked);
    // Late rows in every input partition move every stream's watermark
    // past the ads (a reader task's watermark waits for all origins).
    for (topic, partitions, column) in [
        (&impressions, 2, "impressionTime"),
        (&clicks, 3, "clickTime"),
    ] {
        for p in 0..partitions {
            // Ads of their own: they match nothing, and the impressions
            // stay buffered (nothing passes them).
            let value = format!(
                r#"{{"adId": "end-{column}-{p}", "{column}": "{}"}}"#,
                at(start, 10 * 3600)
            );
            produce_to(topic, Some(p), &[(format!("end{p}"), value.into_bytes())]);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let text = pipeline(&app, &impressions, &clicks, &output, "available_now")
        .replace("keyed_by: [adId]", "keyed_by: [impressionId]")
        .replace(
            "schema: {adId: string, impressionTime: timestamp}",
            "schema: {impressionId: string, adId: string, impressionTime: timestamp}",
        )
        .replace(
            "      schema: {adId: string, clickTime: timestamp}",
            "      schema: {clickId: string, adId: string, clickTime: timestamp}\n      keyed_by: [clickId]",
        )
        .replace("processing_guarantee: exactly_once\n", "");
    std::fs::write(&file, text).unwrap();
    let described = common::tidemark_describe(&file);
    assert!(
        described.contains("-left-repartition") && described.contains("-right-repartition"),
        "{described}"
    );
    let done = run_to_end(&file);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let out = consume_all(&output, ads as usize, Duration::from_secs(60));
    let mut seen = std::collections::BTreeMap::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let ad = v["adId"].as_str().unwrap().to_string();
        let i: i64 = ad
            .trim_start_matches("ad")
            .parse()
            .unwrap_or_else(|_| panic!("{v}"));
        if i % 2 == 0 {
            assert_eq!(v["clickTime"], at(start, i * 30 + 600), "{v}");
        } else {
            assert!(v["clickTime"].is_null(), "{v}");
        }
        assert!(seen.insert(ad, v.clone()).is_none(), "twice: {v}");
    }
    assert_eq!(seen.len(), ads as usize, "every ad once");
}

#[test]
fn a_query_over_topics_that_are_not_co_partitioned_is_refused_by_name() {
    let (impressions, clicks) = (unique("join-imp2"), unique("join-clk3"));
    create_topic(&impressions, 2);
    create_topic(&clicks, 3);
    let dir = tempfile::tempdir().unwrap();
    let text = pipeline(
        &unique("join-refused"),
        &impressions,
        &clicks,
        &unique("join-out"),
        "available_now",
    );
    let file = tidemark_pipeline::PipelineFile::parse(&text).unwrap();
    // The CLI repartitions such a pipeline; a query connected directly
    // over the topics is refused.
    let e = tidemark_connectors::connect(&file, dir.path())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("not co-partitioned")
            && e.contains(&format!("`{impressions}` has 2"))
            && e.contains(&format!("`{clicks}` has 3")),
        "{e}"
    );
}
