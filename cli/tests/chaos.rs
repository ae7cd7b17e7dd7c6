//! The chaos soak: three `tidemark run` replicas of one `exactly_once`
//! pipeline file, a producer writing throughout, SIGKILLs of random
//! replicas at random moments (not only after commits), a broker restart
//! midway, a fourth replica added and one stopped (rebalances), then one
//! `available_now` run to finish. Every window must be in the output
//! exactly once and complete: a Kafka topic read `read_committed`, and (a
//! second soak) one Delta table all replicas commit to, read back by the
//! Python `deltalake` package.
//!
//! Each soak runs twice over. First with replicas sharing one state
//! directory, each taking an instance slot in it: into Kafka as the
//! default static members the slot's id makes them, into Delta as dynamic
//! members (`source.static_membership: false`). Then with static members
//! named by hand, the deployment Kafka Streams users are told to use: each
//! replica its own `TIDEMARK_INSTANCE_ID` (so `group.instance.id`) and its
//! own state directory, a killed one restarted on both, taking its
//! partitions back without a rebalance.
//!
//! `CHAOS_KILLS` sets the number of kills (default 6, the short version CI
//! runs); `CHAOS_SEED` replays a run's random choices (printed at the
//! start); `TIDEMARK_TEST_LOG_DIR` keeps every process's stderr there
//! (`tidemark-0.log`: the final run). The long version is
//! `scripts/chaos.sh` (100 kills).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 6;
const REPLICAS: usize = 3;
const CHUNKS: i64 = 10;
/// The chunk after which the broker restarts.
const RESTART_CHUNK: i64 = 5;

/// xorshift64*: enough randomness for choosing victims and moments, and
/// reproducible from the printed seed without another dependency.
struct Chaos(u64);

impl Chaos {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % below.max(1)
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: a number expected"))
        })
        .unwrap_or(default)
}

/// The two soaks share the broker, which each restarts midway: one at a
/// time.
static ONE_SOAK_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn replicas_write_every_window_exactly_once_through_random_kills_a_broker_restart_and_rebalances() {
    let _one = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    soak(Output::Kafka, Membership::Slot);
}

/// The same soak into one Delta table that every replica commits to, read
/// back by the Python `deltalake` package.
#[test]
fn replicas_write_every_window_exactly_once_into_one_delta_table_through_the_same_chaos() {
    let _one = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    soak(Output::Delta, Membership::Dynamic);
}

/// The Kafka soak with static members, each on its own state directory.
#[test]
fn static_members_write_every_window_exactly_once_through_random_kills_and_a_broker_restart() {
    let _one = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    soak(Output::Kafka, Membership::Static);
}

/// The Delta soak with static members, each on its own state directory.
#[test]
fn static_members_write_every_window_exactly_once_into_one_delta_table_through_the_same_chaos() {
    let _one = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    soak(Output::Delta, Membership::Static);
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Output {
    Kafka,
    Delta,
}

/// How the replicas belong to the consumer group.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Membership {
    /// No instance id: replicas sharing one state directory, each taking
    /// an instance slot in it, whose stable id makes it a static member
    /// (the default; a killed replica takes its slot back on restart).
    Slot,
    /// As [`Membership::Slot`] with `source.static_membership: false`:
    /// dynamic members, a killed one's partitions moving at a rebalance.
    Dynamic,
    /// `TIDEMARK_INSTANCE_ID=r<n>` per replica (static membership), each on
    /// its own state directory `state-r<n>`; a killed replica restarts with
    /// both.
    Static,
}

/// The replicas of a soak: each process and the instance id it runs as.
struct Replicas {
    membership: Membership,
    file: std::path::PathBuf,
    running: Vec<(Replica, Option<String>)>,
    /// Instance ids given so far (the next replica added takes a new one).
    named: usize,
}

impl Replicas {
    fn start(membership: Membership, file: &std::path::Path, count: usize) -> Self {
        let mut replicas = Replicas {
            membership,
            file: file.to_path_buf(),
            running: Vec::new(),
            named: 0,
        };
        for _ in 0..count {
            replicas.add();
        }
        replicas
    }

    /// Starts one more replica, under a new instance id when static.
    fn add(&mut self) {
        let id = (self.membership == Membership::Static).then(|| format!("r{}", self.named));
        self.named += 1;
        let replica = start_replica_as(&self.file, id.as_deref());
        self.running.push((replica, id));
    }

    /// SIGKILLs replica `victim` and starts it again as the same instance.
    fn kill_and_restart(&mut self, victim: usize) {
        let (replica, id) = &mut self.running[victim];
        replica.child.kill().unwrap(); // SIGKILL, at whatever it was doing
        replica.child.wait().unwrap();
        *replica = start_replica_as(&self.file, id.as_deref());
    }
}

fn soak(sink: Output, membership: Membership) {
    let managed_broker = broker_restartable();
    let kills = env_number("CHAOS_KILLS", 6);
    let seed = env_number(
        "CHAOS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1,
    );
    eprintln!("chaos: {sink:?} {membership:?} CHAOS_KILLS={kills} CHAOS_SEED={seed}");
    let mut chaos = Chaos(seed);
    let (input, group) = (unique("chaos-in"), unique("chaos-app"));
    let output = match sink {
        Output::Kafka => unique("chaos-out"),
        Output::Delta => "unused".to_string(),
    };
    create_topic(&input, PARTITIONS);
    if sink == Output::Kafka {
        create_topic(&output, 1);
    }
    let dir = tempfile::tempdir().unwrap();
    let names = (group.as_str(), input.as_str(), output.as_str());
    let file = write_pipeline(dir.path(), names, "{micro_batch: 200 milliseconds}", 50);
    if sink == Output::Delta {
        use_delta_sink(&file);
    }
    if membership == Membership::Static {
        state_dir_per_instance(&file);
    }
    if membership == Membership::Dynamic {
        let text = std::fs::read_to_string(&file).unwrap();
        let dynamic = text.replacen(
            "  kind: kafka\n",
            "  kind: kafka\n  static_membership: false\n",
            1,
        );
        assert_ne!(text, dynamic);
        std::fs::write(&file, dynamic).unwrap();
    }
    let mut replicas = Replicas::start(membership, &file, REPLICAS);

    let started = Instant::now();
    let (mut killed, mut added, mut stopped, mut broker_restarts) = (0, 0, 0, 0);
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let plain = plain();
    for chunk in 0..CHUNKS {
        if chunk == RESTART_CHUNK + 1 && managed_broker {
            // Its first second of partition 0 went out before the restart.
            produce_seconds_to(&plain, &input, &[0], chunk * 60 + 1, (chunk + 1) * 60);
            produce_seconds_to(&plain, &input, &all[1..], chunk * 60, (chunk + 1) * 60);
        } else {
            produce_seconds(&input, PARTITIONS, chunk * 60, (chunk + 1) * 60);
        }
        let kills_now =
            kills * (chunk as u64 + 1) / CHUNKS as u64 - kills * chunk as u64 / CHUNKS as u64;
        for _ in 0..kills_now {
            std::thread::sleep(Duration::from_millis(chaos.next(1500)));
            let victim = chaos.next(replicas.running.len() as u64) as usize;
            replicas.kill_and_restart(victim);
            killed += 1;
        }
        std::thread::sleep(Duration::from_millis(500 + chaos.next(1000)));
        match chunk {
            3 => {
                replicas.add();
                added += 1;
            }
            RESTART_CHUNK if managed_broker => {
                // Idle first, long enough for every task to vouch for its
                // local files with a checkpoint (5 s after its last
                // commit); then one event, so that the restart catches a
                // batch that wrote to one task only and aborts it: the
                // other tasks' checkpoints must not outlive the abort
                // (#43).
                std::thread::sleep(Duration::from_secs(7));
                produce_seconds_to(&plain, &input, &[0], (chunk + 1) * 60, (chunk + 1) * 60 + 1);
                std::thread::sleep(Duration::from_millis(chaos.next(300)));
                assert!(kafka_script("stop"), "stopping the broker");
                std::thread::sleep(Duration::from_secs(3));
                assert!(kafka_script("start"), "starting the broker again");
                broker_restarts += 1;
            }
            7 => {
                let leaving = chaos.next(replicas.running.len() as u64) as usize;
                let (mut leaving, _) = replicas.running.remove(leaving);
                interrupt(&mut leaving.child);
                stopped += 1;
            }
            _ => {}
        }
    }
    let phase = |name: &str| eprintln!("chaos: {name} at {:.0} s", started.elapsed().as_secs_f64());
    phase("faults done");
    for (r, _) in &mut replicas.running {
        assert!(
            r.child.try_wait().unwrap().is_none(),
            "a replica exited by itself"
        );
        interrupt(&mut r.child);
    }

    phase("replicas stopped");
    // A replica killed (SIGKILL) without leaving the group, and a static
    // member even when stopped cleanly, keeps its partitions until its 6 s
    // session timeout, and an available-now run
    // ends once the partitions it was given are caught up. Started sooner,
    // the final run could finish without those partitions.
    std::thread::sleep(Duration::from_secs(8));
    // One available-now run finishes what the replicas left.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("{micro_batch: 200 milliseconds}", "available_now"),
    )
    .unwrap();
    let finish = tidemark_run(&file, None, std::process::Stdio::piped())
        .output()
        .unwrap();
    if let Some(mut log) = replica_log(0) {
        use std::io::Write;
        let _ = log.write_all(&finish.stderr);
    }
    assert!(
        finish.status.success(),
        "{}",
        String::from_utf8_lossy(&finish.stderr)
    );

    phase("available-now run done");
    let expected = expected_rows(PARTITIONS);
    let rows: Vec<serde_json::Value> = match sink {
        Output::Kafka => consume_all(&output, expected, Duration::from_secs(60))
            .iter()
            .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
            .collect(),
        Output::Delta => read_delta(&dir.path().join("table"), None)["rows"]
            .as_array()
            .unwrap()
            .clone(),
    };
    let mut windows: BTreeMap<(String, String), Vec<(i64, f64)>> = BTreeMap::new();
    for v in &rows {
        windows
            .entry((
                v["id"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap().to_string(),
            ))
            .or_default()
            .push((v["n"].as_i64().unwrap(), v["total"].as_f64().unwrap()));
    }
    let duplicated: usize = windows.values().map(|w| w.len() - 1).sum();
    let wrong: Vec<_> = windows
        .iter()
        .filter(|(_, w)| w.iter().any(|v| *v != (12, 18.0)))
        .collect();
    let lost = expected.saturating_sub(windows.len());
    if lost > 0 {
        // Which windows: per key, the window starts written.
        let mut written: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (id, start) in windows.keys() {
            written.entry(id).or_default().push(&start[11..16]);
        }
        eprintln!("chaos: windows written per key: {written:?}");
    }
    eprintln!(
        "chaos: {killed} kills survived, {added} replica added, {stopped} stopped, \
         {broker_restarts} broker restart(s), {} records, {} windows expected, \
         lost = {lost}, duplicated = {duplicated}, wrong = {}, {:.0} s",
        PARTITIONS as i64 * CHUNKS * 60,
        expected,
        wrong.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((lost, duplicated), (0, 0), "seed {seed}");
    assert!(wrong.is_empty(), "seed {seed}: {wrong:?}");
    assert_eq!(windows.len(), expected, "seed {seed}: unexpected windows");
}
