//! Three `tidemark run` processes of one pipeline file under
//! `exactly_once`, started as people start replicas of a service: the same
//! file, the same working directory, no `TIDEMARK_INSTANCE_ID`. Each takes
//! its own instance slot in the state directory, so their transactional ids
//! differ and they share the partitions instead of fencing each other. A
//! producer writes throughout; instances are killed with SIGKILL and
//! restarted (taking their freed slot back), and the broker restarts once.
//! The replicas, all three live at the end, write every window exactly
//! once; no lone final run is needed.

mod common;

use common::*;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 6;
const REPLICAS: usize = 3;

#[test]
fn three_replicas_of_one_file_share_the_work_exactly_once_through_kills_and_a_broker_restart() {
    let managed_broker = broker_restartable();
    let (input, output, group) = (
        unique("replicas-in"),
        unique("replicas-out"),
        unique("replicas-app"),
    );
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    // One directory for all three, as replicas started from one checkout.
    let dir = tempfile::tempdir().unwrap();
    let names = (group.as_str(), input.as_str(), output.as_str());
    let file = write_pipeline(dir.path(), names, "{micro_batch: 200 milliseconds}", 50);
    let mut replicas: Vec<Replica> = (0..REPLICAS).map(|_| start_replica(&file)).collect();
    // Each replica holds its own slot: three ids on disk.
    let slots = dir.path().join("state/.instances").join(&group);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && ids_on_disk(&slots) < REPLICAS {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(ids_on_disk(&slots), REPLICAS, "one instance slot each");

    // Ten minutes of events in ten chunks; a replica is killed and
    // restarted after chunks 2, 4 and 7, the broker restarts after chunk 5.
    let (mut killed_batches, mut killed_fenced) = (0, 0);
    for chunk in 0..10 {
        produce_seconds(&input, PARTITIONS, chunk * 60, (chunk + 1) * 60);
        std::thread::sleep(Duration::from_secs(2));
        if [2, 4, 7].contains(&chunk) {
            let victim = (chunk as usize) % REPLICAS;
            let r = &mut replicas[victim];
            killed_batches += r.batches_with_input.load(Ordering::Relaxed);
            killed_fenced += r.fenced.load(Ordering::Relaxed);
            r.child.kill().unwrap(); // SIGKILL
            r.child.wait().unwrap();
            replicas[victim] = start_replica(&file);
        }
        if chunk == 5 && managed_broker {
            assert!(kafka_script("stop"), "stopping the broker");
            std::thread::sleep(Duration::from_secs(3));
            assert!(kafka_script("start"), "starting the broker again");
        }
    }

    // Every window, written while all three replicas run.
    let expected = expected_rows(PARTITIONS);
    wait_for_records(&output, expected);
    let live: Vec<usize> = replicas
        .iter()
        .map(|r| r.batches_with_input.load(Ordering::Relaxed))
        .collect();
    for r in &mut replicas {
        assert!(
            r.child.try_wait().unwrap().is_none(),
            "a replica exited by itself"
        );
        interrupt(&mut r.child);
    }
    assert_exact_windows(
        &consume_all(&output, expected, Duration::from_secs(10)),
        PARTITIONS,
    );
    // No live replica was ever fenced: none shared a transactional id with
    // another (a restarted one fences only its dead predecessor).
    let fenced = killed_fenced
        + replicas
            .iter()
            .map(|r| r.fenced.load(Ordering::Relaxed))
            .sum::<usize>();
    assert_eq!(
        fenced, 0,
        "fenced producers (see the `fenced:` lines above)"
    );
    let working = live.iter().filter(|&&n| n > 0).count();
    assert!(
        working >= 2,
        "the work was shared: batches with input per live replica {live:?} (killed ones: {killed_batches})"
    );
    ids_are_distinct(&slots);
}

fn ids_on_disk(slots: &Path) -> usize {
    std::fs::read_dir(slots)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "id"))
                .count()
        })
        .unwrap_or(0)
}

fn ids_are_distinct(slots: &Path) {
    let mut ids: Vec<String> = std::fs::read_dir(slots)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "id"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    let count = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), count, "every slot has its own id");
    assert_eq!(
        count, REPLICAS,
        "restarted replicas took their freed slots back"
    );
}
