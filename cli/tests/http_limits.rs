//! The HTTP services are safe to expose (#44 item 6), tried on a running
//! `tidemark run` against the real broker: `serve.auth_token` (read from
//! the environment) is asked for and checked, the web page on a loopback
//! address refuses a foreign `Host` (DNS rebinding), and 300 connections
//! that send half a request and wait neither keep a real request from
//! being answered nor stay open past the header-read deadline (before,
//! none of them was ever closed).

mod common;

use common::{free_port, interrupt, start_replica};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const TOKEN: &str = "s3cret-test-token";
const HALF_OPEN: usize = 300;
/// The services' header-read deadline (`HttpOptions::default`), with room
/// for a loaded machine.
const CLOSED_WITHIN: Duration = Duration::from_secs(10 + 20);

fn pipeline(app: &str, input: &str, output: &str, serve: u16, ui: u16) -> String {
    format!(
        r#"application_id: {app}
source:
  kind: kafka
  topic: {input}
  group: {app}
  format: json
  schema: {{event_time: timestamp, id: string}}
event_time: event_time
watermark: 1 minute
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 minute}}
      aggregates: [{{fn: count, as: n}}]
output_mode: update
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}, format: json}}
state_dir: state
serve: {{listen: "127.0.0.1:{serve}", advertised: "127.0.0.1:{serve}", auth_token: "${{HTTP_LIMITS_TOKEN}}"}}
ui: {{listen: "127.0.0.1:{ui}"}}
"#
    )
}

/// `GET http://{address}{path}` with `headers`: the status.
fn status(address: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut request =
        ureq::get(&format!("http://{address}{path}")).timeout(Duration::from_secs(10));
    for (name, value) in headers {
        request = request.set(name, value);
    }
    match request.call() {
        Ok(response) => response.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{address}{path}: {e}"),
    }
}

#[test]
fn the_services_ask_for_their_token_refuse_foreign_hosts_and_close_half_sent_requests() {
    let (input, output, app) = (unique("http-in"), unique("http-out"), unique("http-app"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let (serve_port, ui_port) = (free_port(), free_port());
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&app, &input, &output, serve_port, ui_port)).unwrap();
    // The only test in this binary: the child inherits the variable.
    std::env::set_var("HTTP_LIMITS_TOKEN", TOKEN);
    let mut replica = start_replica(&file);
    let serve = format!("127.0.0.1:{serve_port}");
    let ui = format!("127.0.0.1:{ui_port}");
    let bearer = format!("Bearer {TOKEN}");
    let authorized = [("Authorization", bearer.as_str())];

    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(&serve).is_err() || status(&serve, "/v1/stores", &authorized) != 200 {
        assert!(Instant::now() < deadline, "{serve} never served");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(status(&serve, "/v1/stores", &[]), 401, "no token");
    assert_eq!(
        status(&serve, "/v1/stores", &[("Authorization", "Bearer wrong")]),
        401,
        "a wrong token"
    );

    // The page answers its own loopback names only.
    assert_eq!(status(&ui, "/api/status", &[]), 200);
    assert_eq!(
        status(
            &ui,
            "/api/status",
            &[("Host", &format!("localhost:{ui_port}"))]
        ),
        200
    );
    assert_eq!(
        status(
            &ui,
            "/api/status",
            &[("Host", &format!("rebound.example:{ui_port}"))]
        ),
        403,
        "a name rebound to 127.0.0.1"
    );

    let mut half_open: Vec<TcpStream> = (0..HALF_OPEN)
        .map(|_| {
            let mut socket = TcpStream::connect(&serve).unwrap();
            socket
                .write_all(b"GET /v1/stores HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .unwrap();
            socket
        })
        .collect();
    assert_eq!(
        status(&serve, "/v1/stores", &authorized),
        200,
        "a real request among {HALF_OPEN} half-sent ones"
    );
    // Every half-sent request's connection is closed by the server.
    let started = Instant::now();
    for socket in &mut half_open {
        let left = CLOSED_WITHIN
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        socket.set_read_timeout(Some(left)).unwrap();
        let mut buffer = [0u8; 512];
        loop {
            match socket.read(&mut buffer) {
                // Closed (a 408 may come first).
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!(
                    "a half-sent request's connection still open after {:?}: {e}",
                    started.elapsed()
                ),
            }
        }
    }
    eprintln!(
        "{HALF_OPEN} half-sent requests closed within {:?}",
        started.elapsed()
    );
    assert_eq!(
        status(&serve, "/v1/stores", &authorized),
        200,
        "still serving"
    );
    assert!(
        replica.child.try_wait().unwrap().is_none(),
        "the query still runs"
    );
    interrupt(&mut replica.child);
}
