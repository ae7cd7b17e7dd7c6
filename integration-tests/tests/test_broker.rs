//! The test kit's broker for users' integration tests: `KAFKA_BOOTSTRAP`
//! when set, else the broker `scripts/kafka.sh` runs; a missing script is
//! a configuration error naming what to set.

use tidemark_connectors::kafka::test_broker::{BrokerOrigin, TestKafka};
use tidemark_connectors::kafka::{ensure_topic, partition_count};

#[test]
fn the_script_broker_answers_and_kafka_bootstrap_wins_when_set() {
    let scripted = TestKafka::from_script().unwrap();
    assert_eq!(scripted.origin(), BrokerOrigin::Script);
    let topic = tidemark_integration_tests::unique("test-broker");
    ensure_topic(&scripted.connection(), &topic, 3).unwrap();
    assert_eq!(partition_count(&scripted.connection(), &topic).unwrap(), 3);

    let started = TestKafka::start().unwrap();
    match std::env::var("KAFKA_BOOTSTRAP") {
        Ok(bootstrap) => {
            assert_eq!(started.origin(), BrokerOrigin::Environment);
            assert_eq!(started.bootstrap(), bootstrap);
        }
        Err(_) => assert_eq!(started.origin(), BrokerOrigin::Script),
    }

    // The only test in this binary: no other thread reads the variable.
    std::env::set_var("TIDEMARK_KAFKA_SCRIPT", "/nonexistent/kafka.sh");
    let missing = TestKafka::from_script().err().unwrap().to_string();
    std::env::remove_var("TIDEMARK_KAFKA_SCRIPT");
    assert!(
        missing.contains("TIDEMARK_KAFKA_SCRIPT") && missing.contains("KAFKA_BOOTSTRAP"),
        "{missing}"
    );
}
