//! The testcontainers path, as a user's `cargo test` takes it where Docker
//! runs and `KAFKA_BOOTSTRAP` is unset (scripts/test.sh runs this file with
//! `env -u KAFKA_BOOTSTRAP`, after scripts/images.sh built the images):
//! `KafkaContainer::start()` starts the local Kafka image, the tidemark
//! image runs `examples/pipelines/tumbling-count/kafka.yaml` against it
//! (`docker run ... tidemark run /pipelines/...`), its windows are read back
//! from the output topic, `docker stop` ends it cleanly, and dropping the
//! handle removes the broker's container.

mod common;

use common::*;
use tidemark_testcontainers::{BrokerOrigin, KafkaContainer};

/// Removes a container however the test ends.
struct RemovedOnDrop(String);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = run("docker", &["rm", "-f", &self.0], None);
    }
}

#[test]
fn start_runs_the_local_kafka_image_a_tidemark_container_processes_a_pipeline_on_it_and_drop_removes_it(
) {
    assert!(
        std::env::var_os("KAFKA_BOOTSTRAP").is_none(),
        "this test takes the container path: run it with `env -u KAFKA_BOOTSTRAP` (scripts/test.sh does)"
    );
    let kafka = KafkaContainer::start().unwrap();
    assert_eq!(kafka.origin(), BrokerOrigin::Container);
    let broker = kafka.container_id().unwrap().to_string();
    assert_eq!(containers(&format!("id={broker}")), vec![broker.clone()]);
    let exec = ["docker", "exec", "-i", broker.as_str()];
    produce(&exec, "readings", READINGS);

    let name = format!("tidemark-testkit-{}", std::process::id());
    let pipelines = format!("{}:/pipelines:ro", examples_dir().display());
    let bootstrap = format!("KAFKA_BOOTSTRAP={}", kafka.bootstrap());
    let image = tidemark_image();
    // Guarded before it exists: a container made but not started goes too.
    let _pipeline = RemovedOnDrop(name.clone());
    docker(&[
        "run",
        "-d",
        "--pull",
        "never",
        "--label",
        "tidemark.testkit=pipeline",
        "--name",
        &name,
        "--network",
        "host",
        "-e",
        &bootstrap,
        "-v",
        &pipelines,
        &image,
        "run",
        "/pipelines/tumbling-count/kafka.yaml",
    ]);
    let rows = consume(&exec, "window-counts", EXPECTED_WINDOWS.len(), 90_000);
    let logs = run("docker", &["logs", "--tail", "40", &name], None);
    let context = format!("tidemark's log:\n{}", String::from_utf8_lossy(&logs.stderr));
    assert_windows(&rows, &context);

    // SIGTERM (what `docker stop` sends) ends the run after its batch, exit 0,
    // and what it committed is those windows once each.
    docker(&["stop", "-t", "60", &name]);
    let exit = docker(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(exit.trim(), "0", "{context}");
    // The timeout also covers joining the group and the first fetch.
    let all = consume(&exec, "window-counts", EXPECTED_WINDOWS.len() + 1, 20_000);
    assert_windows(&all, &context);

    drop(kafka);
    assert_eq!(containers(&format!("id={broker}")), Vec::<String>::new());
}
