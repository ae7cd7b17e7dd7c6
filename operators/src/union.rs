//! Spark's `unionByName` of the rows so far with a second stream: rows of
//! both pass unchanged in content, lined up on one list of columns.

use super::{BatchContext, Operator};
use crate::error::Result;
use crate::row::{Row, Value};
use std::sync::Arc;

/// The union of the main stream (input 0) and a second stream (input 1),
/// columns matched by name (Spark's `unionByName(other,
/// allowMissingColumns = true)`): every output row has `columns` in that
/// order, a column its stream lacks written null, and any column not in
/// the list kept after them. With no columns declared, rows pass as they
/// are. Stateless: lateness and the watermark belong to the steps after.
///
/// ```
/// use tidemark_operators::{BatchContext, Operator, Union};
/// use tidemark_types::row::{Row, Value};
/// let mut union = Union::new("eu", &["id", "region", "amount"]);
/// let mut row = Row::new();
/// row.set("amount", Value::Long(3));
/// row.set("id", Value::from("a"));
/// let mut out = Vec::new();
/// let ctx = BatchContext { batch_id: 0, processing_time: 0, late_threshold: 0, watermark: 0,
///     collect_late_rows: false, real_time: false };
/// union.on_input_row(1, row, &ctx, &mut out).unwrap();
/// assert_eq!(out[0].to_json().to_string(), r#"{"id":"a","region":null,"amount":3}"#);
/// ```
pub struct Union {
    stream: Arc<str>,
    columns: Vec<Arc<str>>,
}

impl Union {
    /// The union with stream `stream`, its rows written with `columns`.
    pub fn new<S: AsRef<str>>(stream: &str, columns: &[S]) -> Self {
        Union {
            stream: Arc::from(stream),
            columns: columns.iter().map(|c| Arc::from(c.as_ref())).collect(),
        }
    }

    /// `row` with the union's columns in order, missing ones null.
    fn lined_up(&self, mut row: Row) -> Row {
        if self.columns.is_empty() || self.is_lined_up(&row) {
            return row;
        }
        let mut out = Row::with_capacity(self.columns.len().max(row.len()));
        for name in &self.columns {
            let value = row.remove(name).unwrap_or(Value::Null);
            out.push_new_column(name.clone(), value);
        }
        for (name, value) in row.entries() {
            out.push_new_column(name.clone(), value.clone());
        }
        out
    }

    /// Whether `row` already has exactly the union's columns in order (the
    /// common case: no copy).
    fn is_lined_up(&self, row: &Row) -> bool {
        row.len() == self.columns.len()
            && row
                .entries()
                .zip(&self.columns)
                .all(|((name, _), column)| name == column)
    }
}

impl Operator for Union {
    fn describe(&self) -> String {
        format!("Union [{}] by name", self.stream)
    }

    fn on_row(&mut self, row: Row, _: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        out.push(self.lined_up(row));
        Ok(())
    }

    fn on_input_row(
        &mut self,
        _input: usize,
        row: Row,
        _: &BatchContext,
        out: &mut Vec<Row>,
    ) -> Result<()> {
        out.push(self.lined_up(row));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> BatchContext {
        BatchContext {
            batch_id: 0,
            processing_time: 0,
            late_threshold: 0,
            watermark: 0,
            collect_late_rows: false,
            real_time: false,
        }
    }

    fn row(columns: &[(&str, Value)]) -> Row {
        let mut row = Row::new();
        for (name, value) in columns {
            row.set(*name, value.clone());
        }
        row
    }

    #[test]
    fn both_streams_come_out_on_the_same_columns_missing_ones_null() {
        let mut union = Union::new("eu", &["id", "n"]);
        let ctx = context();
        let mut out = Vec::new();
        union
            .on_row(
                row(&[("id", Value::from("a")), ("n", Value::Long(1))]),
                &ctx,
                &mut out,
            )
            .unwrap();
        union
            .on_input_row(
                1,
                row(&[("extra", Value::Long(7)), ("id", Value::from("b"))]),
                &ctx,
                &mut out,
            )
            .unwrap();
        let json: Vec<String> = out.iter().map(|r| r.to_json().to_string()).collect();
        assert_eq!(
            json,
            [r#"{"id":"a","n":1}"#, r#"{"id":"b","n":null,"extra":7}"#]
        );
    }

    #[test]
    fn without_declared_columns_rows_pass_as_they_are() {
        let mut union = Union::new("eu", &[] as &[&str]);
        let mut out = Vec::new();
        let input = row(&[("z", Value::Long(1)), ("a", Value::Long(2))]);
        union
            .on_input_row(1, input.clone(), &context(), &mut out)
            .unwrap();
        assert_eq!(out, [input]);
    }
}
