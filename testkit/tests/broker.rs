//! The fallback path against the broker the tests run on: with
//! `KAFKA_BOOTSTRAP` set (as scripts/test.sh sets it), `start` hands it
//! back and a client reaches it (a Kafka ApiVersions request answered).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use tidemark_testcontainers::{BrokerOrigin, KafkaContainer};

/// Sends an ApiVersions v0 request; the broker's answer carries the same
/// correlation id and error code 0.
fn api_versions(bootstrap: &str) -> (i32, i16) {
    let mut stream = TcpStream::connect(bootstrap).expect("the broker accepts connections");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let client = b"tidemark-testkit";
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes()); // ApiVersions
    body.extend_from_slice(&0i16.to_be_bytes()); // version 0
    body.extend_from_slice(&4242i32.to_be_bytes()); // correlation id
    body.extend_from_slice(&(client.len() as i16).to_be_bytes());
    body.extend_from_slice(client);
    stream
        .write_all(&(body.len() as i32).to_be_bytes())
        .unwrap();
    stream.write_all(&body).unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).unwrap();
    let mut answer = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut answer).unwrap();
    let correlation = i32::from_be_bytes(answer[0..4].try_into().unwrap());
    let error = i16::from_be_bytes(answer[4..6].try_into().unwrap());
    (correlation, error)
}

#[test]
fn with_kafka_bootstrap_set_start_hands_back_that_broker_and_it_answers() {
    let expected = std::env::var("KAFKA_BOOTSTRAP")
        .expect("this test runs against KAFKA_BOOTSTRAP's broker (scripts/test.sh sets it)");
    let kafka = KafkaContainer::start().unwrap();
    assert_eq!(kafka.origin(), BrokerOrigin::Environment);
    assert_eq!(kafka.bootstrap(), expected);
    assert_eq!(api_versions(kafka.bootstrap()), (4242, 0));
}
