//! `KafkaApp` checks what it is given when it builds (#45 item 1): a bad
//! setting names its key, two processors of one name are refused, code steps build, and a file's `code` step that
//! no program registered is refused naming the key.

use tidemark::operators::processor::*;
use tidemark_connectors::KafkaApp;

struct Nothing;

impl StatefulProcessor for Nothing {
    type Input = serde_json::Value;
    type Output = serde_json::Value;
    fn handle_inputs(
        &mut self,
        _: &GroupKey,
        _: Vec<serde_json::Value>,
        _: &mut ProcessorContext<'_, serde_json::Value>,
    ) -> ProcessorResult {
        Ok(())
    }
}

fn app() -> KafkaApp {
    KafkaApp::new("checks").input("in", &[("user", "string"), ("ts", "timestamp")])
}

#[test]
fn a_bad_setting_fails_the_build_naming_its_key() {
    let e = app()
        .event_time("ts", "soon")
        .to_topic("out", &["user"])
        .build()
        .expect_err("a watermark delay that is no duration");
    assert!(e.to_string().contains("watermark"), "{e}");
    let e = KafkaApp::new("checks")
        .input("in", &[("user", "strin")])
        .build()
        .expect_err("a type that is none");
    assert!(e.to_string().contains("source.schema"), "{e}");
    assert!(e.to_string().contains("column `user`"), "{e}");
    let e = app()
        .filter("user = ")
        .build()
        .expect_err("a condition that does not parse");
    assert!(e.to_string().contains("steps[].filter"), "{e}");
    let e = app()
        .state_memory_mb(384)
        .build()
        .expect_err("a state budget without a state directory");
    assert!(e.to_string().contains("state.dir"), "{e}");
    let e = app()
        .exactly_once()
        .build()
        .expect_err("exactly-once into standard output");
    assert!(e.to_string().contains("processing_guarantee"), "{e}");
}

#[test]
fn two_processors_of_one_name_are_refused() {
    let e = app()
        .process("p", &["user"], |_| Ok(Nothing))
        .process("p", &["user"], |_| Ok(Nothing))
        .build()
        .expect_err("one name, two processors");
    assert!(
        e.to_string().contains("two processors are named `p`"),
        "{e}"
    );
}

#[test]
fn code_steps_and_processors_build_and_an_unregistered_code_step_is_refused() {
    let file = app()
        .event_time("ts", "1 minute")
        .steps(|q| q.filter("user != 'bot'"))
        .process("p", &["user"], |_| Ok(Nothing))
        .output_mode(tidemark::operators::OutputMode::Update)
        .to_topic("out", &["user"])
        .build()
        .unwrap();
    let described: Vec<String> = file.query_builder().unwrap().plan().store_names();
    assert_eq!(
        described.len(),
        1,
        "the processor keeps state: {described:?}"
    );
    let e = tidemark_pipeline::PipelineFile::parse(
        "name: x\nsource: {kind: kafka, topic: t}\nsteps: [{code: nowhere}]\nsink: {kind: stdout}\n",
    )
    .unwrap()
    .query_builder()
    .err()
    .expect("not registered");
    assert!(e.to_string().contains("steps[].code"), "{e}");
}

#[test]
fn state_standbys_avro_delta_and_the_http_services_are_set_on_the_builder() {
    let file = app()
        .state_dir("state")
        .standby_replicas(2)
        .state_memory_mb(384)
        .serve("127.0.0.1:7070", Some("t0ken"))
        .serve_advertised("host-a:7070")
        .configure(|settings| settings.source.static_membership = false)
        .ui("127.0.0.1:7071", None)
        .prometheus("127.0.0.1:7072", Some("t0ken"))
        .to_delta("tables/out")
        .build()
        .unwrap();
    let state = file.state.as_ref().expect("a state section");
    assert_eq!(
        (
            state.dir.as_str(),
            state.num_standby_replicas,
            state.memory_mb
        ),
        ("state", 2, 384)
    );
    assert_eq!(file.sink.kind, tidemark_pipeline::SinkKind::Delta);
    assert_eq!(file.sink.path.as_deref(), Some("tables/out"));
    let serve = file.serve.as_ref().expect("serve");
    assert_eq!(serve.listen, "127.0.0.1:7070");
    assert_eq!(serve.advertised(), "host-a:7070");
    assert!(!file.source.static_membership, "set through configure");
    assert_eq!(
        file.ui.as_ref().map(|u| u.listen.as_str()),
        Some("127.0.0.1:7071")
    );
    let metrics = file.metrics.as_ref().expect("metrics");
    assert_eq!(metrics.prometheus, "127.0.0.1:7072");
    // The token is kept, and masked wherever the settings are shown.
    assert!(!format!("{file:?}").contains("t0ken"));
    let e = app()
        .standby_replicas(1)
        .build()
        .expect_err("standbys of no state");
    assert!(e.to_string().contains("state_dir"), "{e}");
    let file = KafkaApp::new("avro")
        .input("in", &[("user", "string")])
        .avro_input("http://127.0.0.1:8081")
        .schema_registry_property("basic.auth.user.info", "user:s3cr3t-pass")
        .late_data_topic("late")
        .task_timeout(std::time::Duration::from_secs(30))
        .build()
        .unwrap();
    assert_eq!(file.source.format, tidemark_pipeline::Format::Avro);
    let registry = file.schema_registry.as_ref().expect("a registry");
    assert_eq!(
        registry
            .properties
            .get("basic.auth.user.info")
            .map(String::as_str),
        Some("user:s3cr3t-pass")
    );
    assert!(!format!("{file:?}").contains("s3cr3t"), "masked");
    assert_eq!(
        file.late_data.as_ref().and_then(|l| l.topic.as_deref()),
        Some("late")
    );
    assert_eq!(
        file.task_timeout.map(|t| t.0),
        Some(std::time::Duration::from_secs(30))
    );
    let e = app()
        .schema_registry_property("basic.auth.user.info", "u:p")
        .build()
        .expect_err("a registry property without a registry");
    assert!(e.to_string().contains("schema_registry"), "{e}");
}

#[test]
fn a_typed_stream_takes_its_columns_from_its_type_and_the_event_time_reads_as_a_time() {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Tx {
        card: String,
        ts: String,
        amount: f64,
        declines: Option<i64>,
    }
    let file = KafkaApp::new("typed")
        .stream::<Tx>("txs")
        .event_time("ts", "1 minute")
        .build()
        .unwrap();
    use tidemark::schema::FieldType;
    let schema: Vec<(String, FieldType)> = file
        .schema()
        .fields()
        .map(|(name, kind)| (name.to_string(), kind))
        .collect();
    assert_eq!(
        schema,
        [
            ("card".to_string(), FieldType::String),
            ("ts".into(), FieldType::Timestamp),
            ("amount".into(), FieldType::Double),
            ("declines".into(), FieldType::Long)
        ]
    );
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Nested {
        card: String,
        tags: Vec<String>,
    }
    let file = KafkaApp::new("typed")
        .stream::<Tx>("txs")
        .event_time("ts", std::time::Duration::from_millis(90_500))
        .build()
        .unwrap();
    assert_eq!(
        file.watermark.map(|w| w.0),
        Some(std::time::Duration::from_millis(90_500)),
        "a delay given as a Duration"
    );
    let e = KafkaApp::new("typed")
        .stream::<Nested>("txs")
        .build()
        .expect_err("a list is no column");
    assert!(
        e.to_string().contains("source.schema") && e.to_string().contains("field `tags`"),
        "{e}"
    );
}

impl HandleInitialState<serde_json::Value> for Nothing {
    fn handle_initial_state(
        &mut self,
        _: &GroupKey,
        _: serde_json::Value,
        _: &mut ProcessorContext<'_, serde_json::Value>,
    ) -> ProcessorResult {
        Ok(())
    }
}

#[test]
fn an_initial_state_needs_the_input_keyed_by_the_processors_keys() {
    let seeded = |app: KafkaApp| {
        app.process_with_initial_state::<_, serde_json::Value, _>(
            "p",
            &["user"],
            |_| Ok(Nothing),
            "seeds",
            &[("user", "string")],
        )
        .build()
    };
    let e = seeded(app()).expect_err("no keyed_by");
    assert!(e.to_string().contains("keyed_by"), "{e}");
    let e = seeded(app().keyed_by(&["ts"])).expect_err("keyed by another column");
    assert!(e.to_string().contains("keyed_by"), "{e}");
    seeded(app().keyed_by(&["user"])).expect("keyed by the processor's key");
}

/// A join added in code is checked as a file's join is: a grouping after
/// it that does not include its keys (or the record key's columns) would
/// spread a key's rows over tasks, and is refused at `build`.
#[test]
fn a_join_written_in_code_has_its_groupings_checked() {
    use tidemark::operators::{JoinTimeCondition, JoinType};
    use tidemark::prelude::*;
    use tidemark::runtime::JoinInput;
    let app = |keys: &'static [&'static str]| {
        KafkaApp::new("joined")
            .input(
                "views",
                &[("user", "string"), ("page", "string"), ("ts", "timestamp")],
            )
            .event_time("ts", "1 minute")
            .steps(move |q| {
                let clicks = JoinInput::new("clicks")
                    .event_time("ts")
                    .watermark("1 minute")?;
                let between = JoinTimeCondition::between("0 seconds", "10 minutes")?;
                Ok(
                    q.join(clicks, JoinType::Inner, &[("user", "user")], between)?
                        .window_aggregate(
                            keys.iter().copied(),
                            tumbling("5 minutes")?,
                            vec![count()],
                        ),
                )
            })
            .to_topic("views-per-page", &["page"])
    };
    let e = app(&["page"])
        .build()
        .expect_err("a grouping off the join keys");
    assert!(e.to_string().contains("must include the join keys"), "{e}");
    let file = app(&["user", "page"]).build().unwrap();
    assert_eq!(
        file.input_topics().unwrap(),
        ["views", "clicks"],
        "the joined stream's topic is read"
    );
}
