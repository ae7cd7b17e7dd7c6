//! A stream–table join through a real broker: a compacted `customers`
//! topic held as a table (upserts and a tombstone), `orders` enriched from
//! it, the table kept in the state store (changelog) across three runs.

mod common;

use common::tidemark_run;
use std::process::Stdio;
use std::time::Duration;
use tidemark_integration_tests::*;

/// A customer row keyed by its id.
fn customer(i: i64, tier: &str) -> (String, Vec<u8>) {
    (
        format!("c{i}"),
        format!(r#"{{"id": "c{i}", "tier": "{tier}"}}"#).into_bytes(),
    )
}

fn run(file: &std::path::Path) {
    let done = tidemark_run(file, None, Stdio::piped()).output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
}

#[test]
fn orders_are_enriched_from_the_latest_customer_rows() {
    let (orders, customers) = (unique("tj-orders"), unique("tj-customers"));
    let (output, app) = (unique("tj-out"), unique("tj-app"));
    create_topic(&orders, 2);
    create_topic(&customers, 2);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        format!(
            r#"name: {app}
source:
  kind: kafka
  topic: {orders}
  keyed_by: [customerId]
  schema: {{orderId: string, customerId: string}}
steps:
  - table_join:
      topic: {customers}
      name: customers
      type: left_outer
      on: [{{left: customerId, right: id}}]
      schema: {{id: string, tier: string}}
output_mode: append
trigger: available_now
sink: {{kind: kafka, topic: {output}, key: [orderId]}}
state: {{dir: state, changelog: true, memory_mb: 32}}
"#
        ),
    )
    .unwrap();
    // Run 1: the table alone.
    produce(
        &customers,
        &(0..20).map(|i| customer(i, "basic")).collect::<Vec<_>>(),
    );
    run(&file);
    // Run 2: an upsert and a tombstone; the state dir is removed so that
    // the table comes back from the changelog.
    produce(&customers, &[customer(5, "gold")]);
    produce_tombstone(&customers, "c7");
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    run(&file);
    // Run 3: the orders.
    let placed: Vec<_> = (0..40)
        .map(|i| {
            let c = format!("c{}", i % 20);
            let value = format!(r#"{{"orderId": "o{i}", "customerId": "{c}"}}"#);
            (c, value.into_bytes())
        })
        .collect();
    produce(&orders, &placed);
    run(&file);

    let out = consume_all(&output, 40, Duration::from_secs(30));
    let mut seen = std::collections::BTreeMap::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let order = v["orderId"].as_str().unwrap().to_string();
        let customer = v["customerId"].as_str().unwrap();
        let want = match customer {
            "c5" => serde_json::json!("gold"),
            "c7" => serde_json::Value::Null,
            _ => serde_json::json!("basic"),
        };
        assert_eq!(v["tier"], want, "{v}");
        assert!(
            seen.insert(order, v.clone()).is_none(),
            "written twice: {v}"
        );
    }
    assert_eq!(seen.len(), 40);
}

/// The topics of a global-table run: orders, customers, output, and the
/// application's name.
struct GlobalTableTopics {
    orders: String,
    customers: String,
    output: String,
    app: String,
}

/// Three order partitions keyed by order, one customer partition (not
/// co-partitioned, and not keyed alike), filled: 20 customers, c5 then
/// upgraded, c7 deleted, 60 orders over them.
fn global_table_topics(prefix: &str) -> GlobalTableTopics {
    let topics = GlobalTableTopics {
        orders: unique(&format!("{prefix}-orders")),
        customers: unique(&format!("{prefix}-customers")),
        output: unique(&format!("{prefix}-out")),
        app: unique(&format!("{prefix}-app")),
    };
    create_topic(&topics.orders, 3);
    create_topic(&topics.customers, 1);
    create_topic(&topics.output, 1);
    produce(
        &topics.customers,
        &(0..20).map(|i| customer(i, "basic")).collect::<Vec<_>>(),
    );
    produce(&topics.customers, &[customer(5, "gold")]);
    produce_tombstone(&topics.customers, "c7");
    let placed: Vec<_> = (0..60)
        .map(|i| {
            let value = format!(r#"{{"orderId": "o{i}", "customerId": "c{}"}}"#, i % 20);
            (format!("o{i}"), value.into_bytes())
        })
        .collect();
    produce(&topics.orders, &placed);
    topics
}

/// Every order but c7's three, each once, with its customer's latest tier.
fn assert_orders_enriched(output: &str) {
    // c7 was deleted: its three orders find no customer (inner join).
    let out = consume_all(output, 57, Duration::from_secs(30));
    let mut seen = std::collections::BTreeSet::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let want = if v["customerId"] == "c5" {
            "gold"
        } else {
            "basic"
        };
        assert_eq!(v["tier"], want, "{v}");
        assert_ne!(v["customerId"], "c7", "{v}");
        assert!(seen.insert(v["orderId"].to_string()), "twice: {v}");
    }
    assert_eq!(seen.len(), 57);
}

#[test]
fn a_global_table_serves_orders_that_are_not_co_partitioned_with_it() {
    let GlobalTableTopics {
        orders,
        customers,
        output,
        app,
    } = global_table_topics("gt");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        format!(
            r#"name: {app}
source:
  kind: kafka
  topic: {orders}
  schema: {{orderId: string, customerId: string}}
steps:
  - table_join:
      topic: {customers}
      global: true
      type: inner
      on: [{{left: customerId, right: id}}]
      schema: {{id: string, tier: string}}
output_mode: append
trigger: available_now
sink: {{kind: kafka, topic: {output}, key: [orderId]}}
"#
        ),
    )
    .unwrap();
    run(&file);
    assert_orders_enriched(&output);
}

/// The same join written in Rust on the query builder, inside a
/// `KafkaApp`: the wiring learns of the table from the built query (its
/// topic, its columns' types) and feeds it as it feeds a file's.
#[test]
fn a_global_table_joined_in_code_is_fed_as_a_files_is() {
    use tidemark::runtime::JoinInput;
    use tidemark::schema::{FieldType, Schema};
    let GlobalTableTopics {
        orders,
        customers,
        output,
        app,
    } = global_table_topics("gt-code");
    let summary = tidemark_connectors::KafkaApp::new(&app)
        .bootstrap(&bootstrap())
        .input(&orders, &[("orderId", "string"), ("customerId", "string")])
        .steps(move |q| {
            let table = JoinInput::table("customers")
                .topics(&[customers.as_str()])
                .schema(Schema::new([
                    ("id", FieldType::String),
                    ("tier", FieldType::String),
                ]));
            q.join_global_table(table, false, &[("customerId", "id")])
        })
        .available_now()
        .to_topic(&output, &["orderId"])
        .runner()
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(summary.output_rows, 57);
    assert_orders_enriched(&output);
}
