//! docker-compose.yml as a user runs it: `up -d` starts the Kafka image and
//! the tidemark image running examples/pipelines/tumbling-count/kafka.yaml,
//! readings produced to the broker come back as windows on the output
//! topic, and `down` removes both containers. Ports of its own, so it runs
//! beside scripts/kafka.sh's broker.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

/// `docker compose` (the plugin) where there is one, else `docker-compose`.
fn compose_program() -> Vec<&'static str> {
    let plugin = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|out| out.status.success());
    if plugin {
        vec!["docker", "compose"]
    } else {
        vec!["docker-compose"]
    }
}

/// A compose project of this file, taken down however the test ends.
struct Project {
    program: Vec<&'static str>,
    name: String,
    ports: [String; 2],
}

impl Project {
    fn args<'a>(&'a self, rest: &[&'a str]) -> Vec<&'a str> {
        let mut args = self.program[1..].to_vec();
        args.extend(["--project-name", &self.name, "--project-directory"]);
        args.push(REPOSITORY);
        args.extend(["-f", COMPOSE_FILE]);
        args.extend(rest);
        args
    }

    /// `docker compose ... ARGS`, which must succeed.
    fn run(&self, rest: &[&str]) -> String {
        let out = Command::new(self.program[0])
            .args(self.args(rest))
            .env("TIDEMARK_KAFKA_PORT", &self.ports[0])
            .env("TIDEMARK_KAFKA_CONTROLLER_PORT", &self.ports[1])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "compose {rest:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = Command::new(self.program[0])
            .args(self.args(&["down", "--volumes", "--timeout", "10"]))
            .output();
    }
}

const REPOSITORY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const COMPOSE_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docker-compose.yml");

#[test]
fn compose_up_runs_the_broker_and_the_tumbling_count_service_and_down_removes_them() {
    assert!(PathBuf::from(COMPOSE_FILE).is_file());
    let project = Project {
        program: compose_program(),
        name: format!("tidemark-compose-test-{}", std::process::id()),
        ports: free_ports(),
    };
    // `up` returns once the broker is healthy and tidemark started.
    project.run(&["up", "-d"]);
    let label = format!("label=com.docker.compose.project={}", project.name);
    assert_eq!(containers(&label).len(), 2, "the broker and tidemark");

    let mut exec = vec![project.program[0]];
    exec.extend(project.args(&["exec", "-T", "kafka"]));
    produce(&exec, "readings", READINGS);
    let rows = consume(&exec, "window-counts", EXPECTED_WINDOWS.len(), 90_000);
    let logs = project.run(&["logs", "--tail", "40", "tidemark"]);
    assert_windows(&rows, &format!("tidemark's log:\n{logs}"));

    project.run(&["down", "--volumes", "--timeout", "60"]);
    assert_eq!(containers(&label), Vec::<String>::new());
}
