//! The bytes of operator state in a store: values, windows and
//! accumulators of one key, in a compact versioned layout.

use crate::aggregate::Accumulator;
use crate::error::{Error, Result};
use crate::row::Value;
use crate::time::TimestampMicros;
use crate::window::TimeWindow;
use crate::AggregateSpec;
use std::sync::Arc;

const VERSION: u8 = 1;

/// Stored operator state that is not what its layout says
/// ([`Error::Corrupt`]).
pub(crate) fn corrupt(what: &str) -> Error {
    Error::Corrupt {
        what: "operator state".into(),
        reason: what.into(),
    }
}

/// Appends one value.
pub(crate) fn put_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(0),
        Value::Bool(b) => out.extend([1, *b as u8]),
        Value::Long(x) => {
            out.push(2);
            out.extend(x.to_le_bytes());
        }
        Value::Double(x) => {
            out.push(3);
            out.extend(x.to_bits().to_le_bytes());
        }
        Value::Timestamp(x) => {
            out.push(4);
            out.extend(x.to_le_bytes());
        }
        Value::Str(s) => {
            out.push(5);
            out.extend((s.len() as u32).to_le_bytes());
            out.extend(s.as_bytes());
        }
    }
}

/// Reads what the `put_*` functions wrote.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(corrupt("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    /// The leading layout version of `what`'s state: one newer than
    /// `supported` was written by a newer release and is refused as such,
    /// never read as this layout; 0 is no layout at all.
    pub(crate) fn version(&mut self, what: &str, supported: u8) -> Result<u8> {
        let found = self.u8()?;
        if found == 0 {
            return Err(corrupt(&format!("{what}: no layout version")));
        }
        tidemark_types::encoding::check_version(
            || format!("the {what} state"),
            found.into(),
            supported.into(),
        )?;
        Ok(found)
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(crate) fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(crate) fn value(&mut self) -> Result<Value> {
        Ok(match self.u8()? {
            0 => Value::Null,
            1 => Value::Bool(self.u8()? != 0),
            2 => Value::Long(self.i64()?),
            3 => Value::Double(f64::from_bits(self.i64()? as u64)),
            4 => Value::Timestamp(self.i64()?),
            5 => {
                let n = self.u32()? as usize;
                let s = std::str::from_utf8(self.take(n)?)
                    .map_err(|_| corrupt("string is not UTF-8"))?;
                Value::Str(Arc::from(s))
            }
            t => return Err(corrupt(&format!("unknown value tag {t}"))),
        })
    }
}

/// Writes an operator's changes since its last checkpoint to `store`
/// (`None`: the key was removed), encoding each value with `encode`, then
/// flushes the store.
pub(crate) fn write_changes<K: AsRef<[u8]>, V>(
    store: &mut dyn tidemark_state::StateStore,
    changes: impl IntoIterator<Item = (K, Option<V>)>,
    mut encode: impl FnMut(&V) -> Vec<u8>,
) -> Result<()> {
    for (key, value) in changes {
        match value {
            Some(v) => store.put(key.as_ref(), &encode(&v))?,
            None => store.delete(key.as_ref())?,
        }
    }
    store.flush()?;
    Ok(())
}

/// Prefix of a key's entry in a store shared with an expiry index.
const KEY_PREFIX: u8 = b'K';
/// Prefix of the expiry index: `E`, the time, then the key.
const EXPIRY_PREFIX: u8 = b'E';

/// The store key of an operator key's entry: `K` then the key.
pub(crate) fn state_key_into(key: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.push(KEY_PREFIX);
    out.extend_from_slice(key);
}

/// [`state_key_into`] into a new buffer.
pub(crate) fn state_key(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 1);
    state_key_into(key, &mut out);
    out
}

/// The prefix every [`state_key`] starts with.
pub(crate) const STATE_KEY_PREFIX: &[u8] = &[KEY_PREFIX];

/// An expiry index entry: big-endian with the sign bit flipped, so that
/// byte order is time order and a range scan finds what expires by a time.
pub(crate) fn expiry_key(time: TimestampMicros, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 9);
    out.push(EXPIRY_PREFIX);
    out.extend(((time as u64) ^ (1 << 63)).to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The time and key of an [`expiry_key`]; `None` for any other entry.
pub(crate) fn parse_expiry_key(bytes: &[u8]) -> Option<(TimestampMicros, &[u8])> {
    let (&prefix, rest) = bytes.split_first()?;
    if prefix != EXPIRY_PREFIX || rest.len() < 8 {
        return None;
    }
    let (time, key) = rest.split_at(8);
    let time = u64::from_be_bytes(time.try_into().ok()?) ^ (1 << 63);
    Some((time as i64, key))
}

/// The expiry index entries of `store` with a time at or before `time`.
pub(crate) fn expired_by(
    store: &dyn tidemark_state::StateStore,
    time: TimestampMicros,
) -> Result<tidemark_state::Entries> {
    Ok(store.range(
        &expiry_key(i64::MIN, b""),
        &expiry_key(time.saturating_add(1), b""),
    )?)
}

/// Appends a whole row: column count, then each name and value.
pub(crate) fn put_row(row: &crate::row::Row, out: &mut Vec<u8>) {
    out.extend((row.len() as u16).to_le_bytes());
    for (name, value) in row.columns() {
        out.extend((name.len() as u32).to_le_bytes());
        out.extend(name.as_bytes());
        put_value(value, out);
    }
}

impl Reader<'_> {
    /// Reads what [`put_row`] wrote.
    pub(crate) fn row(&mut self) -> Result<crate::row::Row> {
        let mut row = crate::row::Row::new();
        for _ in 0..self.u16()? {
            let n = self.u32()? as usize;
            let name = std::str::from_utf8(self.take(n)?)
                .map_err(|_| corrupt("column name is not UTF-8"))?;
            let name: Arc<str> = Arc::from(name);
            row.set(name, self.value()?);
        }
        Ok(row)
    }
}

/// Encodes a key's values and its windows with their accumulators.
pub(crate) fn encode_key_state<'a>(
    key_values: &[Value],
    windows: impl Iterator<Item = (TimeWindow, &'a [Accumulator])>,
    aggregates: &[AggregateSpec],
) -> Result<Vec<u8>> {
    let mut out = vec![VERSION];
    out.extend((key_values.len() as u16).to_le_bytes());
    for v in key_values {
        put_value(v, &mut out);
    }
    let windows: Vec<(TimeWindow, &[Accumulator])> = windows.collect();
    out.extend((windows.len() as u16).to_le_bytes());
    for (w, accumulators) in windows {
        out.extend(w.start.to_le_bytes());
        out.extend(w.end.to_le_bytes());
        out.extend((accumulators.len() as u16).to_le_bytes());
        for (spec, acc) in aggregates.iter().zip(accumulators) {
            let bytes = spec.function.encode(acc)?;
            out.extend((bytes.len() as u32).to_le_bytes());
            out.extend(bytes);
        }
    }
    Ok(out)
}

/// A key's values and windows decoded.
pub(crate) type KeyState = (Vec<Value>, Vec<(TimeWindow, Vec<Accumulator>)>);

/// Decodes what [`encode_key_state`] wrote.
pub(crate) fn decode_key_state(bytes: &[u8], aggregates: &[AggregateSpec]) -> Result<KeyState> {
    let mut r = Reader(bytes);
    r.version("window aggregation", VERSION)?;
    let key_values = (0..r.u16()?)
        .map(|_| r.value())
        .collect::<Result<Vec<_>>>()?;
    let mut windows = Vec::new();
    for _ in 0..r.u16()? {
        let window = TimeWindow {
            start: r.i64()?,
            end: r.i64()?,
        };
        let n = r.u16()? as usize;
        if n != aggregates.len() {
            return Err(corrupt(
                "the aggregates changed since the state was written",
            ));
        }
        let mut accumulators = Vec::with_capacity(n);
        for spec in aggregates {
            let len = r.u32()? as usize;
            accumulators.push(spec.function.decode(r.take(len)?)?);
        }
        windows.push((window, accumulators));
    }
    Ok((key_values, windows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::AggregateFn;
    use crate::AggregateInput;

    /// One of each built-in aggregate, sketches included: their decoders
    /// read bytes from the state store.
    fn every_aggregate() -> Vec<AggregateSpec> {
        [
            "count",
            "sum",
            "avg",
            "min",
            "max",
            "max_by",
            "stddev",
            "var_pop",
            "approx_count_distinct",
            "approx_percentile",
        ]
        .iter()
        .map(|name| {
            AggregateSpec::new(
                AggregateFn::built_in(name).unwrap(),
                AggregateInput::Column("x".into()),
            )
        })
        .collect()
    }

    /// A stored value of a newer layout is refused as such (not read as
    /// this one, not reported as corrupt); version 0 is corrupt.
    #[test]
    fn state_of_a_newer_layout_is_refused_as_written_by_a_newer_release() {
        let aggs = every_aggregate();
        let mut bytes = encode_key_state(&[Value::Long(1)], std::iter::empty(), &aggs).unwrap();
        assert!(decode_key_state(&bytes, &aggs).is_ok());
        bytes[0] = VERSION + 1;
        let e = decode_key_state(&bytes, &aggs).unwrap_err();
        assert!(
            matches!(&e, Error::UnknownEncoding { found, supported: 1, .. } if found == "2"),
            "{e}"
        );
        assert!(e.to_string().contains("window aggregation"), "{e}");
        let e = crate::table_join::decode_row(&[VERSION + 1, 0, 0]).unwrap_err();
        assert!(e.to_string().contains("table join"), "{e}");
        bytes[0] = 0;
        assert!(!matches!(
            decode_key_state(&bytes, &aggs).unwrap_err(),
            Error::UnknownEncoding { .. }
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Corrupt state (any bytes, or a valid encoding cut or flipped) is
        /// an error, never a panic (#15): the state codecs read what a disk
        /// or a changelog hands back.
        #[test]
        fn no_bytes_panic_the_state_decoders(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
            flip in 0usize..400,
            cut in 0usize..400,
        ) {
            let aggs = every_aggregate();
            let _ = decode_key_state(&bytes, &aggs);
            let _ = Reader(&bytes).row();
            let _ = Reader(&bytes).value();
            for spec in &aggs {
                let _ = spec.function.decode(&bytes);
            }
            // A valid encoding, damaged.
            let mut accs: Vec<Accumulator> = aggs.iter().map(|a| a.function.zero()).collect();
            for (spec, acc) in aggs.iter().zip(accs.iter_mut()) {
                spec.function.reduce(acc, &Value::Long(bytes.len() as i64));
            }
            let window = TimeWindow { start: 0, end: 10 };
            let mut valid = encode_key_state(
                &[Value::from("k")],
                std::iter::once((window, &accs[..])),
                &aggs,
            )
            .unwrap();
            {
                let at = flip % valid.len();
                valid[at] ^= 0xA5;
                let _ = decode_key_state(&valid, &aggs);
                valid.truncate(cut % (valid.len() + 1));
                let _ = decode_key_state(&valid, &aggs);
            }
        }
    }

    #[test]
    fn round_trips() {
        let aggs = vec![
            AggregateSpec::count(),
            AggregateSpec::new(
                AggregateFn::built_in("max").unwrap(),
                AggregateInput::Column("x".into()),
            ),
        ];
        let mut accs: Vec<Accumulator> = aggs.iter().map(|a| a.function.zero()).collect();
        aggs[0].function.reduce(&mut accs[0], &Value::Bool(true));
        aggs[1].function.reduce(&mut accs[1], &Value::from("zz"));
        let key = vec![
            Value::from("k"),
            Value::Long(-3),
            Value::Null,
            Value::Timestamp(7),
            Value::Double(1.5),
        ];
        let w = TimeWindow { start: 10, end: 20 };
        let bytes = encode_key_state(&key, std::iter::once((w, accs.as_slice())), &aggs).unwrap();
        let (k, windows) = decode_key_state(&bytes, &aggs).unwrap();
        assert_eq!(k, key);
        assert_eq!(windows[0].0, w);
        assert_eq!(aggs[0].function.finish(&windows[0].1[0]), Value::Long(1));
        assert_eq!(aggs[1].function.finish(&windows[0].1[1]), Value::from("zz"));
        assert!(decode_key_state(&bytes[..bytes.len() - 1], &aggs).is_err());
    }
}
