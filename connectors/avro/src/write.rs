//! Avro binary datums written straight from tidemark values, without
//! building apache-avro's value tree and writer per row: the bytes
//! apache-avro writes for the value [`super::value_to_avro`] makes of
//! each column. What this writer does not take (a type it has no case
//! for, a value that fits no branch of a union, an `int` out of range) it
//! leaves to apache-avro, whose error then names the column as before.

use apache_avro::schema::Schema as AvroSchema;
use tidemark::row::Value;

/// Appends `v` as a datum of `schema`; `None` when this writer leaves it to
/// apache-avro (what it appended is then to be dropped).
pub(crate) fn write_value(out: &mut Vec<u8>, v: &Value, schema: &AvroSchema) -> Option<()> {
    match (schema, v) {
        (AvroSchema::Union(union), _) => {
            // The first branch the value fits, as `value_to_avro` picks it.
            let (index, branch) =
                union
                    .variants()
                    .iter()
                    .enumerate()
                    .find(|(_, branch)| match (branch, v) {
                        (AvroSchema::Null, Value::Null) => true,
                        (AvroSchema::Null, _) | (_, Value::Null) => false,
                        _ => fits(v, branch),
                    })?;
            write_long(out, index as i64);
            write_value(out, v, branch)
        }
        (AvroSchema::Null, Value::Null) => Some(()),
        (AvroSchema::Boolean, Value::Bool(b)) => {
            out.push(u8::from(*b));
            Some(())
        }
        (AvroSchema::Int, Value::Long(i)) => {
            write_long(out, i64::from(i32::try_from(*i).ok()?));
            Some(())
        }
        (AvroSchema::Long, Value::Long(i) | Value::Timestamp(i))
        | (AvroSchema::TimestampMicros, Value::Timestamp(i)) => {
            write_long(out, *i);
            Some(())
        }
        (AvroSchema::TimestampMillis, Value::Timestamp(t)) => {
            write_long(out, t.div_euclid(1000));
            Some(())
        }
        (AvroSchema::Double, Value::Double(f)) => {
            out.extend_from_slice(&f.to_le_bytes());
            Some(())
        }
        (AvroSchema::Double, Value::Long(i)) => {
            out.extend_from_slice(&(*i as f64).to_le_bytes());
            Some(())
        }
        (AvroSchema::Float, Value::Double(f)) => {
            out.extend_from_slice(&(*f as f32).to_le_bytes());
            Some(())
        }
        (AvroSchema::String, Value::Str(s)) => {
            write_bytes(out, s.as_bytes());
            Some(())
        }
        (AvroSchema::String, other) if !other.is_null() => {
            write_bytes(out, other.to_string().as_bytes());
            Some(())
        }
        _ => None,
    }
}

/// Whether [`write_value`] writes `v` as `schema` (a union's branch).
fn fits(v: &Value, schema: &AvroSchema) -> bool {
    match (schema, v) {
        (AvroSchema::Int, Value::Long(i)) => i32::try_from(*i).is_ok(),
        (AvroSchema::Null, Value::Null)
        | (AvroSchema::Boolean, Value::Bool(_))
        | (AvroSchema::Long, Value::Long(_) | Value::Timestamp(_))
        | (AvroSchema::TimestampMicros | AvroSchema::TimestampMillis, Value::Timestamp(_))
        | (AvroSchema::Double, Value::Double(_) | Value::Long(_))
        | (AvroSchema::Float, Value::Double(_)) => true,
        (AvroSchema::String, other) => !other.is_null(),
        _ => false,
    }
}

/// A zig-zag varint, as Avro writes `int` and `long`.
fn write_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    write_long(out, bytes.len() as i64);
    out.extend_from_slice(bytes);
}
