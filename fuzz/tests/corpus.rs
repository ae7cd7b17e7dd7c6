//! Every fuzz target over its corpus (`fuzz/corpus/<target>/`: inputs that
//! once crashed a decoder, kept as regressions, and seeds) and over
//! inputs mutated from it and from the valid seeds built here, for
//! `TIDEMARK_FUZZ_SECONDS` (default 10) per target. Not coverage-guided:
//! `scripts/fuzz.sh` runs the same bodies under libFuzzer for that.
//!
//! A panic fails the test, naming the target and writing the input under
//! the test's temporary directory, to be copied into the corpus.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A small xorshift generator: reproducible runs from the seed printed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes decoders find interesting: bounds of the integer widths and
/// Avro's zig-zag varints.
const INTERESTING: &[&[u8]] = &[
    &[0x00],
    &[0xff],
    &[0x7f],
    &[0x80],
    &[0xff, 0xff, 0xff, 0xff],
    &[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[0xfe, 0xff, 0xff, 0xff, 0x0f],
    b"\"",
    b"{",
    b"\n",
    b",",
    b"\\u0000",
    b"1e999",
    b"-9223372036854775809",
];

fn mutate(input: &[u8], seeds: &[Vec<u8>], random: &mut Random) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + random.below(4) {
        let at = random.below(out.len() + 1);
        match random.below(7) {
            0 if !out.is_empty() => {
                let i = random.below(out.len());
                out[i] ^= 1 << random.below(8);
            }
            1 if !out.is_empty() => {
                let i = random.below(out.len());
                out[i] = random.next() as u8;
            }
            2 => {
                let piece = INTERESTING[random.below(INTERESTING.len())];
                out.splice(at..at, piece.iter().copied());
            }
            3 if !out.is_empty() => {
                let end = (at + 1 + random.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            4 if !out.is_empty() => {
                let start = random.below(out.len());
                let end = (start + 1 + random.below(32)).min(out.len());
                let piece = out[start..end].to_vec();
                out.splice(at..at, piece);
            }
            5 => out.truncate(at),
            _ => {
                // Splice in a part of another seed.
                let other = &seeds[random.below(seeds.len())];
                if !other.is_empty() {
                    let start = random.below(other.len());
                    let end = (start + 1 + random.below(64)).min(other.len());
                    out.splice(at..at, other[start..end].iter().copied());
                }
            }
        }
    }
    out
}

/// The corpus files of `target`.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut paths: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Valid inputs built here, where a text corpus cannot hold them.
fn built_seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "avro" => vec![avro_seed()],
        "parquet" => vec![parquet_seed()],
        "csv_gzip" => vec![gzip(b"id,n,x,ts\na,1,1.5,2026-01-01T00:00:00Z\nb,2,,\n")],
        _ => Vec::new(),
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn avro_seed() -> Vec<u8> {
    use apache_avro::types::Value;
    let schema = apache_avro::Schema::parse_str(tidemark_fuzz::AVRO_SCHEMA).unwrap();
    let value = Value::Record(vec![
        ("id".into(), Value::String("a".into())),
        ("n".into(), Value::Long(-3)),
        ("i".into(), Value::Int(7)),
        ("x".into(), Value::Double(1.5)),
        ("f".into(), Value::Float(0.25)),
        ("b".into(), Value::Boolean(true)),
        ("ts".into(), Value::TimestampMicros(1_767_225_600_000_000)),
        (
            "opt".into(),
            Value::Union(1, Box::new(Value::String("o".into()))),
        ),
        ("tags".into(), Value::Array(vec![Value::String("t".into())])),
        (
            "m".into(),
            Value::Map([("k".to_string(), Value::Long(1))].into()),
        ),
        ("raw".into(), Value::Bytes(vec![1, 2, 3])),
        ("kind".into(), Value::Enum(1, "b".into())),
        (
            "inner".into(),
            Value::Record(vec![("z".into(), Value::Long(9))]),
        ),
    ]);
    let mut framed = vec![0, 0, 0, 0, 1];
    let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&schema)
        .build()
        .unwrap()
        .write_value_to_vec(value)
        .unwrap();
    framed.extend(datum);
    framed
}

fn parquet_seed() -> Vec<u8> {
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(StringArray::from(vec![Some("a"), None]))),
        ("n", Arc::new(Int64Array::from(vec![1, 2]))),
        (
            "ts",
            Arc::new(TimestampMicrosecondArray::from(vec![0, 1_000_000]).with_timezone("+00:00")),
        ),
    ];
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut out = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

fn fuzz(name: &str) {
    let (_, body) = tidemark_fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a target");
    let mut seeds = corpus(name);
    assert!(
        !seeds.is_empty(),
        "fuzz/corpus/{name}/ holds no input: every target keeps a seed"
    );
    seeds.extend(built_seeds(name));
    let seconds: u64 = std::env::var("TIDEMARK_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let seed = std::env::var("TIDEMARK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let mut random = Random(seed);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut runs = 0u64;
    let mut run = |input: &[u8]| {
        runs += 1;
        if std::panic::catch_unwind(|| body(input)).is_err() {
            let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("crash-{name}-{seed}"));
            std::fs::write(&saved, input).unwrap();
            panic!(
                "target `{name}` panicked (TIDEMARK_FUZZ_SEED={seed}); the input is in {}: copy it into fuzz/corpus/{name}/",
                saved.display()
            );
        }
    };
    for input in &seeds {
        run(input);
    }
    while Instant::now() < deadline {
        let base = &seeds[random.below(seeds.len())];
        let input = mutate(base, &seeds, &mut random);
        run(&input);
    }
    eprintln!("{name}: {runs} inputs in {seconds} s (TIDEMARK_FUZZ_SEED={seed})");
}

/// The HTTP target reaches the state, not only the parser: its seed
/// reading a key is answered with the key's window.
#[test]
fn the_http_target_reads_the_served_querys_state() {
    let request = b"GET /v1/stores/op1/keys/a HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer fuzz-token\r\nConnection: close\r\n\r\n";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = String::from_utf8_lossy(&tidemark_fuzz::http_exchange(request)).into_owned();
        if answer.starts_with("HTTP/1.1 200") && answer.contains("\"c\":1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never answered with the key: {answer}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                fuzz(stringify!($name));
            }
        )*
        #[test]
        fn every_target_is_tested_here() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in tidemark_fuzz::TARGETS {
                assert!(tested.contains(name), "`{name}` has no test in fuzz/tests/corpus.rs");
            }
        }
    };
}

targets!(
    json,
    avro,
    csv,
    csv_gzip,
    parquet,
    pipeline_file,
    window_state,
    rolling_state,
    dedup_state,
    join_state,
    table_join_state,
    http_request,
);
