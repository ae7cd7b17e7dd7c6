//! `KafkaApp` checks what it is given when it builds (#45 item 1): a bad
//! setting names its key, two processors of one name and steps set as a
//! setting are refused, code steps build, and a file's `code` step that
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
    let e = app()
        .setting(
            "state",
            serde_json::json!({"dir": "s", "memory_mb": "lots"}),
        )
        .build()
        .expect_err("memory_mb is a number");
    assert!(e.to_string().contains("state.memory_mb"), "{e}");
}

#[test]
fn two_processors_of_one_name_and_steps_as_a_setting_are_refused() {
    let e = app()
        .process("p", &["user"], |_| Ok(Nothing))
        .process("p", &["user"], |_| Ok(Nothing))
        .build()
        .expect_err("one name, two processors");
    assert!(
        e.to_string().contains("two processors are named `p`"),
        "{e}"
    );
    let e = app()
        .setting("steps", serde_json::json!([]))
        .build()
        .expect_err("steps are the builder's");
    assert!(e.to_string().contains("steps"), "{e}");
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
    let described: Vec<String> = file.query_builder().unwrap().store_names();
    assert_eq!(
        described.len(),
        1,
        "the processor keeps state: {described:?}"
    );
    let e = tidemark::pipeline::PipelineFile::parse(
        "name: x\nsource: {kind: kafka, topic: t}\nsteps: [{code: nowhere}]\nsink: {kind: stdout}\n",
    )
    .unwrap()
    .query_builder()
    .err()
    .expect("not registered");
    assert!(e.to_string().contains("steps[].code"), "{e}");
}
