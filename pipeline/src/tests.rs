//! The pipeline file's unit tests: reading, checking and lowering.

use super::*;
use tidemark::runtime::Trigger;
use tidemark::runtime::{StageInput, StageOutput};

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
    /// A pipeline file with any of its lines dropped, doubled or cut
    /// short parses or is refused with an error, never a panic (#15).
    #[test]
    fn no_mangled_pipeline_file_panics_the_parser(
        edits in proptest::collection::vec((0usize..40, 0u8..3, 0usize..30), 0..6)
    ) {
        let mut lines: Vec<String> = GOOD.lines().map(str::to_string).collect();
        for (at, edit, cut) in edits {
            if lines.is_empty() {
                break;
            }
            let at = at % lines.len();
            match edit {
                0 => {
                    lines.remove(at);
                }
                1 => lines.insert(at, lines[at].clone()),
                _ => {
                    let line = &lines[at];
                    let end = line.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(line.len());
                    lines[at] = line[..end].to_string();
                }
            }
        }
        if let Ok(file) = PipelineFile::parse(&lines.join("\n")) {
            let _ = file.query_builder();
        }
    }

    /// Any text at all parses or is refused, never a panic.
    #[test]
    fn no_text_panics_the_pipeline_parser(text in "\\PC{0,200}") {
        let _ = PipelineFile::parse(&text);
    }
}

const GOOD: &str = r#"name: tumbling-count
source:
  kind: files
  path: batches/
  format: json
  schema: {event_time: timestamp, id: string, amount: double}
clock: {batch_times: ["2026-01-01T10:00:00Z", "2026-01-01T10:01:00Z"]}
event_time: event_time
watermark: 10 minutes
multiple_watermark_policy: min
steps:
  - filter: "amount >= 0"
  - window_aggregate:
      keys: [id]
      window: {tumbling: 5 minutes}
      aggregates:
        - {fn: count, as: count}
        - {fn: sum, column: amount, as: total}
output_mode: append
trigger: available_now
sink: {kind: jsonl, path: out.jsonl}
"#;

const JOIN: &str = r#"name: ad-clicks
source: {kind: files, path: batches/, topic: impressions}
event_time: impressionTime
watermark: 1 hour
steps:
  - join:
      topic: clicks
      type: left_outer
      on: [{left: impressionAdId, right: clickAdId}]
      event_time: clickTime
      watermark: 2 hours
      between: ["0 seconds", "1 hour"]
sink: {kind: jsonl, path: out.jsonl}
"#;

#[test]
fn a_join_step_reads_and_its_mistakes_name_the_line_and_the_choices() {
    let file = PipelineFile::parse(JOIN).unwrap();
    assert_eq!(file.input_topics().unwrap(), vec!["impressions", "clicks"]);
    let described = file.query_builder().unwrap().build().unwrap().describe();
    assert!(described[0].contains("LeftOuter"), "{described:?}");

    let e = PipelineFile::parse(&JOIN.replace("type: left_outer", "type: cross")).unwrap_err();
    assert_eq!(e.line, Some(8), "{e}");
    assert!(
        e.message.contains("left_outer") && e.message.contains("left_semi"),
        "{e}"
    );

    let e = PipelineFile::parse(&JOIN.replace(
        r#"between: ["0 seconds", "1 hour"]"#,
        r#"between: ["0 seconds", "1 hour"]
      window: 10 minutes"#,
    ))
    .unwrap()
    .query_builder()
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("one of `between`, `bounds` or `window`"), "{e}");

    let strict = PipelineFile::parse(&JOIN.replace(
        r#"between: ["0 seconds", "1 hour"]"#,
        r#"bounds: ["> 0 seconds", "< 1 hour"]"#,
    ))
    .unwrap();
    let described = strict.query_builder().unwrap().build().unwrap().describe();
    assert!(
        described[0]
            .contains("clickTime > impressionTime + 0s AND clickTime < impressionTime + 3600s"),
        "{described:?}"
    );
    let e = PipelineFile::parse(&JOIN.replace(
        r#"between: ["0 seconds", "1 hour"]"#,
        r#"bounds: ["0 seconds", "< 1 hour"]"#,
    ))
    .unwrap()
    .query_builder()
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("join.bounds") && e.contains("`>` or `>=`"),
        "{e}"
    );

    let e = PipelineFile::parse(&JOIN.replace("      watermark: 2 hours\n", ""))
        .unwrap()
        .query_builder()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("both streams"), "{e}");
}

const UNION: &str = r#"
name: sales
source: {kind: kafka, topic: sales-us, format: json, schema: {event_time: timestamp, id: string, amount: double}}
event_time: event_time
watermark: 10 minutes
steps:
  - union:
      topic: sales-eu
      name: eu
      watermark: 1 hour
      schema: {event_time: timestamp, id: string, vat: double}
      steps: [{filter: "vat >= 0"}]
  - window_aggregate: {keys: [id], window: {tumbling: 5 minutes}, aggregates: [{fn: count, as: n}]}
output_mode: update
sink: {kind: stdout}
"#;

#[test]
fn a_union_step_reads_and_what_it_cannot_do_is_named() {
    let file = PipelineFile::parse(UNION).unwrap();
    assert_eq!(file.input_topics().unwrap(), ["sales-us", "sales-eu"]);
    let described = file.query_builder().unwrap().build().unwrap().describe();
    assert_eq!(
        described[..2],
        ["[eu] Filter [vat >= 0]", "Union [eu] by name"]
    );
    // Update mode is allowed after a union (it is no join); the record
    // keys are unknown, so the grouping is repartitioned.
    assert!(file.topology(true).unwrap().is_repartitioned());

    let e = PipelineFile::parse(&UNION.replace(
        r#"steps: [{filter: "vat >= 0"}]"#,
        "steps: [{dedup: {keys: [id]}}]",
    ))
    .unwrap()
    .query_builder()
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("union.steps"), "{e}");
    let e = PipelineFile::parse(&UNION.replace(
        "watermark: 10 minutes
",
        "",
    ))
    .unwrap()
    .query_builder()
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("`watermark`") && e.contains("eu"), "{e}");
    let e = PipelineFile::parse(&UNION.replace(
        "      name: eu
",
        "      nmae: eu
",
    ))
    .unwrap_err();
    assert!(e.message.contains("nmae"), "{e}");

    let refused = |from: &str, to: &str| {
        let text = UNION.replace(from, to);
        assert_ne!(text, UNION, "`{from}` not found");
        PipelineFile::parse(&text)
            .unwrap()
            .query_builder()
            .err()
            .unwrap()
            .to_string()
    };
    let e = refused("topic: sales-eu", "topic: sales-us");
    assert!(e.contains("union.topic") && e.contains("sales-us"), "{e}");
    let e = refused("name: eu\n", "name: eu\n      event_time: ts\n");
    assert!(e.contains("union.event_time") && e.contains("`ts`"), "{e}");
    let e = refused(
        "steps:\n  - union:",
        "steps:\n  - dedup: {keys: [id]}\n  - union:",
    );
    assert!(e.contains("after a stateful step"), "{e}");
    // A join with a union, in either order, is refused as that
    // combination, not with advice that leads to the other refusal.
    let table_join =
        "  - table_join: {topic: rates, on: [id], schema: {id: string, rate: double}}\n";
    for (from, to) in [
        (
            "steps:\n  - union:",
            format!("steps:\n{table_join}  - union:"),
        ),
        (
            "  - window_aggregate:",
            format!("{table_join}  - window_aggregate:"),
        ),
    ] {
        let e = refused(from, &to);
        assert!(e.contains("a union and a join"), "{e}");
    }
}

#[test]
fn a_join_keyed_otherwise_splits_into_two_writers_and_a_reader() {
    let text = JOIN
        .replace(
            "source: {kind: files, path: batches/, topic: impressions}",
            "source: {kind: kafka, topic: impressions, keyed_by: [impressionId], group: g}",
        )
        .replace(
            "      watermark: 2 hours\n",
            "      watermark: 2 hours\n      keyed_by: [clickId]\n",
        );
    let file = PipelineFile::parse(&text).unwrap();
    let mut stages = file.topology(true).unwrap().stages;
    assert_eq!(stages.len(), 3);
    let reader = stages.pop().unwrap();
    let (left, right) = (&stages[0], &stages[1]);
    assert_eq!(left.name, "ad-clicks-left-repartition-writer");
    assert_eq!(left.input, StageInput::Source);
    assert_eq!(
        left.output,
        StageOutput::Repartition {
            topic: "ad-clicks-left-repartition".into(),
            keys: vec!["impressionAdId".into()]
        }
    );
    assert_eq!(
        right.input,
        StageInput::Joined {
            stream: "clicks".into(),
            topics: vec!["clicks".into()],
            schema: file.query_builder().unwrap().plan().second_inputs()[0]
                .schema
                .clone(),
        }
    );
    assert_eq!(
        right.output,
        StageOutput::Repartition {
            topic: "ad-clicks-right-repartition".into(),
            keys: vec!["clickAdId".into()]
        }
    );
    assert!(right.query.plan().joined_topics().is_empty());
    assert_eq!(reader.name, "ad-clicks");
    assert_eq!(reader.output, StageOutput::Sink);
    assert_eq!(
        reader.input,
        StageInput::Repartition {
            topic: "ad-clicks-left-repartition".into(),
            keys: vec!["impressionAdId".into()]
        }
    );
    assert_eq!(
        reader.query.plan().joined_topics(),
        vec![(
            "clicks".to_string(),
            vec!["ad-clicks-right-repartition".to_string()]
        )]
    );
    let described = reader.query.build().unwrap().describe();
    assert!(described[0].contains("clicks."), "{described:?}");
    // Keyed by the join keys and co-partitioned: one stage. Not
    // co-partitioned (the broker says so): repartitioned all the same.
    let keyed = JOIN.replace(
        "source: {kind: files, path: batches/, topic: impressions}",
        "source: {kind: kafka, topic: impressions, keyed_by: [impressionAdId]}",
    );
    let file = PipelineFile::parse(&keyed).unwrap();
    assert_eq!(file.topology(true).unwrap().stages.len(), 1);
    assert_eq!(file.topology(false).unwrap().stages.len(), 3);
    // After a repartitioned join the rows are keyed by the join keys,
    // not by the source's record key: grouping by the record key alone
    // would spread its groups over tasks.
    let grouped = text.replace("sink:", "  - dedup: {keys: [impressionId]}\nsink:");
    let e = PipelineFile::parse(&grouped)
        .unwrap()
        .topology(true)
        .err()
        .expect("a grouping off the join keys after a repartitioned join");
    assert!(e.to_string().contains("join keys"), "{e}");
    let by_join_key = grouped.replace(
        "keys: [impressionId]",
        "keys: [impressionAdId, impressionId]",
    );
    assert!(PipelineFile::parse(&by_join_key)
        .unwrap()
        .topology(true)
        .is_ok());
}

#[test]
fn max_by_needs_by_and_only_max_by_and_min_by_take_it() {
    let aggregate = |entry: &str| {
        serde_yaml::from_str::<AggregateYaml>(entry)
            .unwrap()
            .spec()
            .map(|s| s.output.to_string())
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        aggregate("{fn: max_by, column: auction, by: price}").unwrap(),
        "max_by(auction, price)"
    );
    let e = aggregate("{fn: max_by, column: auction}").unwrap_err();
    assert!(e.contains("`by`") && e.contains("aggregates.by"), "{e}");
    let e = aggregate("{fn: sum, column: price, by: auction}").unwrap_err();
    assert!(e.contains("max_by and min_by"), "{e}");
}

#[test]
fn reads_the_documented_example() {
    let file = PipelineFile::parse(GOOD).unwrap();
    assert_eq!(file.steps.len(), 2);
    assert_eq!(file.trigger.0, Trigger::AvailableNow);
    let query = file.query_builder().unwrap().build().unwrap();
    assert_eq!(query.describe().len(), 2);
}

fn error_for(from: &str, to: &str) -> PipelineError {
    let text = GOOD.replace(from, to);
    assert_ne!(text, GOOD, "replacement `{from}` not found");
    PipelineError::clone(&PipelineFile::parse(&text).unwrap_err())
}

#[test]
fn environment_variables_fill_string_values_and_an_unset_one_is_named() {
    let text = "name: demo\nsource:\n  kind: kafka\n  topic: t\n  properties: {sasl.password: \"${PW}\", client.id: \"${ID:-app}\"}\nsink: {kind: stdout}\n";
    let env = |name: &str| (name == "PW").then(|| "s3cr\"et: #x".to_string());
    let file = PipelineFile::parse_with_env(text, &env).unwrap();
    assert_eq!(file.source.properties["sasl.password"], "s3cr\"et: #x");
    assert_eq!(file.source.properties["client.id"], "app");
    let error = PipelineFile::parse_with_env(text, &|_| None).unwrap_err();
    assert_eq!(error.line, Some(5), "{error}");
    assert!(error.message.contains("`PW` is not set"), "{error}");
}

#[test]
fn errors_name_line_and_fix() {
    let e = error_for("watermark: 10 minutes", "watermark: 10 fortnights");
    assert_eq!(e.line, Some(9), "{e}");
    assert!(e.message.contains("unknown unit"), "{e}");

    let e = error_for(
        "multiple_watermark_policy: min",
        "multiple_watermark_polcy: min",
    );
    assert_eq!(e.line, Some(10), "{e}");
    assert!(e.message.contains("unknown field"), "{e}");

    let e = error_for("amount: double", "amount: decimal");
    assert_eq!(e.line, Some(6), "{e}");
    assert!(e.message.contains("allowed: string"), "{e}");

    let e = error_for("{fn: count, as: count}", "{fn: median, as: count}");
    assert_eq!(e.line, Some(17), "{e}");

    let e = error_for(
        "{tumbling: 5 minutes}",
        "{sliding: 5 minutes, slide: 10 minutes}",
    );
    assert_eq!(e.line, Some(15), "{e}");
    assert!(e.message.contains("slide"), "{e}");

    let e = error_for("\"amount >= 0\"", "\"amount >= \"");
    assert_eq!(e.line, Some(12), "{e}");

    let e = error_for("watermark: 10 minutes", "watermark: 1 month");
    assert!(e.message.contains("months and years"), "{e}");
}

const ROLLING: &str = r#"
name: fraud
source: {kind: kafka, topic: payments, schema: {ts: timestamp, card: string, amount: double}}
event_time: ts
steps:
  - rolling_window:
      partition_by: [card]
      frontier: {delay: 0 seconds, alias: frontier}
      measures: [{fn: sum, column: amount, range: 10 minutes, as: sum_10m}, {fn: count, column: amount, as: n}]
output_mode: update
trigger: {real_time: 5 minutes}
sink: {kind: kafka, topic: alerts}
"#;

#[test]
fn rolling_windows_and_the_real_time_trigger_read_and_check() {
    let file = PipelineFile::parse(ROLLING).unwrap();
    assert_eq!(
        file.trigger.0,
        Trigger::RealTime {
            checkpoint_interval: std::time::Duration::from_secs(300)
        }
    );
    let query = file.query_builder().unwrap().build().unwrap();
    assert!(
        query.describe()[0].contains("sum_10m over 10 minutes"),
        "{:?}",
        query.describe()
    );

    let append = ROLLING.replace("output_mode: update", "output_mode: append");
    let err = PipelineFile::parse(&append)
        .unwrap()
        .query_builder()
        .unwrap()
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("only update output mode"), "{err}");

    let exactly_once = ROLLING.replace(
        "name: fraud",
        "name: fraud\nprocessing_guarantee: exactly_once",
    );
    let err = PipelineFile::parse(&exactly_once).unwrap_err().to_string();
    assert!(err.contains("at-least-once"), "{err}");

    let event_time_without_watermark =
        ROLLING.replace("alias: frontier}", "alias: frontier, basis: event_time}");
    let err = PipelineFile::parse(&event_time_without_watermark)
        .unwrap()
        .query_builder()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("follows the watermark"), "{err}");

    let range_in_window_aggregate = GOOD.replace(
        "{fn: count, as: count}",
        "{fn: count, as: count, range: 1 minute}",
    );
    let err = PipelineFile::parse(&range_in_window_aggregate)
        .unwrap()
        .query_builder()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("rolling_window measures"), "{err}");

    for (time, ok) in [("event_time", true), ("window", false), ("amount", false)] {
        let file = GOOD.replace(
            "window: {tumbling: 5 minutes}",
            &format!("window: {{tumbling: 5 minutes}}\n      time: {time}"),
        );
        let built = PipelineFile::parse(&file).unwrap().query_builder();
        match (built, ok) {
            (Ok(_), true) => {}
            (Err(e), false) => assert!(
                e.to_string().contains("window_aggregate.time"),
                "{time}: {e}"
            ),
            (Ok(_), false) => panic!("time: {time} accepted"),
            (Err(e), true) => panic!("time: {time} refused: {e}"),
        }
    }
}

#[test]
fn a_grouping_off_the_record_key_splits_at_the_repartition_topic() {
    let text = r#"
application_id: orders
source: {kind: kafka, topic: in, group: g, schema: {event_time: timestamp, region: string}}
event_time: event_time
watermark: 1 minute
steps:
  - filter: "region is not null"
  - window_aggregate: {keys: [region], window: {tumbling: 1 minute}, aggregates: [{fn: count}]}
sink: {kind: kafka, topic: out}
state_dir: state
processing_guarantee: exactly_once
"#;
    let file = PipelineFile::parse(text).unwrap();
    assert_eq!(file.name, "orders");
    assert_eq!(file.state_spec().unwrap().dir, "state");
    let mut stages = file.topology(true).unwrap().stages;
    assert_eq!(stages.len(), 2);
    let reader = stages.pop().unwrap();
    let writer = stages.pop().unwrap();
    assert_eq!(writer.name, "orders-repartition-writer");
    assert_eq!(writer.input, StageInput::Source);
    assert_eq!(writer.query.build().unwrap().describe().len(), 1);
    assert_eq!(reader.name, "orders");
    assert_eq!(reader.output, StageOutput::Sink);
    assert_eq!(
        reader.input,
        StageInput::Repartition {
            topic: "orders-op1-repartition".into(),
            keys: vec!["region".into()]
        }
    );
    let described = reader.query.build().unwrap().describe();
    assert_eq!(described.len(), 1, "{described:?}");
    let split_keys = |text: &str| {
        let stages = PipelineFile::parse(text)
            .unwrap()
            .topology(true)
            .unwrap()
            .stages;
        match &stages[0].output {
            StageOutput::Repartition { keys, .. } => Some(keys.clone()),
            StageOutput::Sink => None,
        }
    };
    assert_eq!(split_keys(text), Some(vec!["region".to_string()]));

    let keyed = text.replace("group: g,", "group: g, keyed_by: [region],");
    assert_eq!(split_keys(&keyed), None);
    // Grouping by the record key and more: each group is still in one
    // partition. By part of a composite key: it is not.
    let wider = keyed.replace("keys: [region]", "keys: [region, event_time]");
    assert_eq!(split_keys(&wider), None);
    // A step that rewrites the key column before the grouping: the rows
    // are no longer partitioned by what the grouping reads.
    let rewritten = keyed.replace(
        "  - filter: \"region is not null\"",
        "  - with_column: {name: region, expr: \"'all'\"}",
    );
    assert!(split_keys(&rewritten).is_some());
    let renamed = keyed
        .replace(
            "schema: {event_time: timestamp, region: string}",
            "schema: {event_time: timestamp, region: string, shop: string}",
        )
        .replace(
            "  - filter: \"region is not null\"",
            "  - select: {event_time: event_time, area: region, region: shop}",
        );
    assert_eq!(
        split_keys(&renamed),
        Some(vec!["region".to_string()]),
        "region now holds the shop"
    );
    let carried = renamed.replace("keys: [region]", "keys: [area]");
    assert_eq!(split_keys(&carried), None);
    let narrower = text.replace("group: g,", "group: g, keyed_by: [region, shop],");
    assert_eq!(split_keys(&narrower), Some(vec!["region".to_string()]));
    // The files source has one partition: never split.
    let files = text
        .replace(
            "{kind: kafka, topic: in, group: g,",
            "{kind: files, path: in,",
        )
        .replace("exactly_once", "at_least_once");
    assert_eq!(split_keys(&files), None);
    let both = format!("{text}state: {{dir: s}}\n");
    assert!(PipelineFile::parse(&both)
        .unwrap_err()
        .message
        .contains("state_dir"));
}

#[test]
fn a_grouping_after_a_join_must_include_the_join_keys() {
    let text = r#"
name: q8
source: {kind: kafka, topic: persons, schema: {id: long, name: string, dateTime: timestamp}}
event_time: dateTime
watermark: 4 seconds
steps:
  - join:
      topic: auctions
      on: [{left: id, right: seller}]
      event_time: dateTime
      watermark: 4 seconds
      window: 10 seconds
      schema: {seller: long, dateTime: timestamp}
  - dedup: {keys: [id, window_start]}
sink: {kind: kafka, topic: out}
"#;
    let file = PipelineFile::parse(text).unwrap();
    file.query_builder().unwrap();
    let off_key = text.replace("keys: [id, window_start]", "keys: [name, window_start]");
    let err = PipelineFile::parse(&off_key)
        .unwrap()
        .query_builder()
        .err()
        .expect("a grouping off the join keys")
        .to_string();
    assert!(err.contains("`source.keyed_by`), [\"id\"]"), "{err}");
    let rewritten = text.replace(
        "  - dedup:",
        "  - with_column: {name: id, expr: \"id % 10\"}\n  - dedup:",
    );
    assert!(PipelineFile::parse(&rewritten)
        .unwrap()
        .query_builder()
        .is_err());
    // A right outer join's unmatched auctions have a null `id`: only
    // their `seller` keeps them in one partition.
    let outer = text.replace("on: [{left: id", "type: right_outer\n      on: [{left: id");
    let check = |t: &str| PipelineFile::parse(t).unwrap().query_builder().map(|_| ());
    assert!(check(&outer).is_err());
    assert!(check(&outer.replace(
        "keys: [id, window_start]",
        "keys: [id, seller, window_start]"
    ))
    .is_ok());
    let same_name = outer
        .replace("{left: id, right: seller}", "id")
        .replace("{seller: long,", "{id: long,");
    assert!(
        check(&same_name).is_ok(),
        "a key named alike is filled from the right"
    );
}

#[test]
fn missing_source_is_reported() {
    let text: String = GOOD
        .lines()
        .filter(|l| !l.starts_with("source") && !l.starts_with("  "))
        .collect::<Vec<_>>()
        .join("\n");
    let e = PipelineFile::parse(&text).unwrap_err();
    assert!(e.message.contains("missing field `source`"), "{e}");
}

/// The file's one client configuration and the registry's credentials
/// parse, and no secret survives `Debug` (which logs and errors use).
#[test]
fn kafka_and_registry_sections_parse_and_debug_masks_their_secrets() {
    let text = "name: sec\nkafka:\n  bootstrap: b:9093\n  properties: {security.protocol: SASL_SSL, sasl.password: \"${PW}\"}\nschema_registry: {url: \"https://r:8081\", properties: {basic.auth.user.info: \"u:${PW}\"}}\nsource: {kind: kafka, topic: t, format: avro}\nsink: {kind: stdout}\ndead_letter: {kind: kafka, topic: d, properties: {ssl.key.password: \"${PW}\"}}\n";
    let lookup = |name: &str| (name == "PW").then(|| "hunter2-secret".to_string());
    let file = PipelineFile::parse_with_env(text, &lookup).unwrap();
    let kafka = file.kafka.as_ref().unwrap();
    assert_eq!(kafka.bootstrap.as_deref(), Some("b:9093"));
    assert_eq!(kafka.properties["sasl.password"], "hunter2-secret");
    let registry = file.schema_registry.as_ref().unwrap();
    assert_eq!(
        registry.properties["basic.auth.user.info"],
        "u:hunter2-secret"
    );
    let shown = format!("{file:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("SASL_SSL"), "{shown}");
    let url_only = "name: r\nschema_registry: http://r:8081\nsource: {kind: kafka, topic: t}\nsink: {kind: stdout}\n";
    let file = PipelineFile::parse(url_only).unwrap();
    assert_eq!(file.schema_registry.unwrap().url, "http://r:8081");
}

/// The HTTP services' tokens never show in `Debug` either.
#[test]
fn serve_ui_and_metrics_tokens_are_masked() {
    let text = "name: t\nsource: {kind: kafka, topic: t}\nsink: {kind: stdout}\nserve: {listen: \"127.0.0.1:1\", auth_token: \"${TOKEN}\"}\nui: {listen: \"127.0.0.1:2\", auth_token: \"${TOKEN}\"}\nmetrics: {prometheus: \"127.0.0.1:3\", auth_token: \"${TOKEN}\", tls: {cert: c.pem, key: k.pem}}\n";
    let lookup = |name: &str| (name == "TOKEN").then(|| "hunter2-token".to_string());
    let file = PipelineFile::parse_with_env(text, &lookup).unwrap();
    assert_eq!(
        file.serve.as_ref().unwrap().auth_token.as_deref(),
        Some("hunter2-token")
    );
    assert_eq!(
        file.metrics.as_ref().unwrap().auth_token.as_deref(),
        Some("hunter2-token")
    );
    let shown = format!("{file:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

/// Standby replicas are fed by the changelog: asked for without one,
/// the file is refused naming the setting.
#[test]
fn standbys_without_a_changelog_are_refused() {
    let text = |changelog: &str| {
        format!("name: s\nsource: {{kind: kafka, topic: t}}\nsink: {{kind: stdout}}\nstate: {{dir: st, num_standby_replicas: 1{changelog}}}\n")
    };
    let e = PipelineFile::parse(&text(", changelog: false")).unwrap_err();
    assert!(e.message.contains("state.num_standby_replicas"), "{e}");
    PipelineFile::parse(&text("")).unwrap();
}
