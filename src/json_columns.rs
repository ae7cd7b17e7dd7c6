//! JSON records decoded straight into Apache Arrow columns, one builder
//! per schema column. A record is parsed whole (and checked by the caller)
//! before any of its fields is appended, so a bad record leaves the
//! columns as they were: it goes to the dead-letter output and the batch
//! goes on without it.

use crate::error::{Error, Result};
use crate::json_row::{Slot, TypedSlots};
use crate::schema::{FieldType, Schema};
use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, LargeStringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema as ArrowSchema, TimeUnit};
use std::sync::Arc;

/// The Arrow type a schema column is decoded into.
fn arrow_type(ty: FieldType) -> DataType {
    match ty {
        // 64-bit offsets: a poll of one task may hold more than 2 GiB of
        // text (a large file), which 32-bit offsets cannot address.
        FieldType::String => DataType::LargeUtf8,
        FieldType::Long => DataType::Int64,
        FieldType::Double => DataType::Float64,
        FieldType::Boolean => DataType::Boolean,
        FieldType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
    }
}

/// One column being built.
enum ColumnBuilder {
    Str(LargeStringBuilder),
    Long(Int64Builder),
    Double(Float64Builder),
    Bool(BooleanBuilder),
    Timestamp(TimestampMicrosecondBuilder),
}

impl ColumnBuilder {
    fn new(ty: FieldType) -> Self {
        match ty {
            FieldType::String => ColumnBuilder::Str(LargeStringBuilder::new()),
            FieldType::Long => ColumnBuilder::Long(Int64Builder::new()),
            FieldType::Double => ColumnBuilder::Double(Float64Builder::new()),
            FieldType::Boolean => ColumnBuilder::Bool(BooleanBuilder::new()),
            FieldType::Timestamp => {
                ColumnBuilder::Timestamp(TimestampMicrosecondBuilder::new().with_timezone("UTC"))
            }
        }
    }

    /// Appends `slot`; a slot of another type than the column's (which the
    /// parser never gives) is appended as NULL.
    fn append(&mut self, slot: Slot<'_>) {
        match (self, slot) {
            (ColumnBuilder::Str(b), Slot::Str(s)) => b.append_value(s),
            (ColumnBuilder::Str(b), _) => b.append_null(),
            (ColumnBuilder::Long(b), Slot::Long(v)) => b.append_value(v),
            (ColumnBuilder::Long(b), _) => b.append_null(),
            (ColumnBuilder::Double(b), Slot::Double(v)) => b.append_value(v),
            (ColumnBuilder::Double(b), _) => b.append_null(),
            (ColumnBuilder::Bool(b), Slot::Bool(v)) => b.append_value(v),
            (ColumnBuilder::Bool(b), _) => b.append_null(),
            (ColumnBuilder::Timestamp(b), Slot::Timestamp(v)) => b.append_value(v),
            (ColumnBuilder::Timestamp(b), _) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            ColumnBuilder::Str(b) => Arc::new(b.finish()),
            ColumnBuilder::Long(b) => Arc::new(b.finish()),
            ColumnBuilder::Double(b) => Arc::new(b.finish()),
            ColumnBuilder::Bool(b) => Arc::new(b.finish()),
            ColumnBuilder::Timestamp(b) => Arc::new(b.finish()),
        }
    }
}

/// The columns of a typed JSON schema, filled record by record.
pub(crate) struct JsonColumns {
    schema: Arc<ArrowSchema>,
    builders: Vec<ColumnBuilder>,
    rows: usize,
}

impl JsonColumns {
    /// Empty columns for `schema` (which lists at least one column).
    pub(crate) fn new(schema: &Schema) -> Self {
        let fields: Vec<Field> = schema
            .columns()
            .iter()
            .map(|(name, ty)| Field::new(name.as_ref(), arrow_type(*ty), true))
            .collect();
        JsonColumns {
            schema: Arc::new(ArrowSchema::new(fields)),
            builders: schema
                .columns()
                .iter()
                .map(|(_, ty)| ColumnBuilder::new(*ty))
                .collect(),
            rows: 0,
        }
    }

    /// Appends one parsed record: its slots in schema order.
    pub(crate) fn append(&mut self, slots: TypedSlots<'_>) {
        for (builder, slot) in self.builders.iter_mut().zip(slots.into_slots()) {
            builder.append(slot);
        }
        self.rows += 1;
    }

    /// Rows appended since the last [`JsonColumns::finish`].
    pub(crate) fn len(&self) -> usize {
        self.rows
    }

    /// The rows appended so far as one batch; the columns start empty again.
    pub(crate) fn finish(&mut self) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = self.builders.iter_mut().map(|b| b.finish()).collect();
        let rows = std::mem::take(&mut self.rows);
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
        // The arrays are built from this schema's own types, one value per
        // row each: an error here is a bug, which fails the batch.
        RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)
            .map_err(|e| Error::source_failed("decoded JSON columns", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_row::tests::typed;
    use crate::json_row::{decode_row, parse_typed};
    use crate::record::SourcePosition;
    use tidemark_types::columns::rows_of;

    #[test]
    fn columns_hold_the_rows_the_row_decoder_makes_and_skip_bad_records() {
        let records: &[&str] = &[
            r#"{"event_time":"2026-01-01T10:00:00.250Z","id":"a","amount":2.5,"n":3,"ok":true}"#,
            r#"{"id":7,"amount":"1.5","n":"42","event_time":1767261600000,"extra":[1]}"#,
            r#"{"n":1.5}"#,
            r#"{"id":"caf\u00e9","id":"b\"q","amount":1}"#,
            r#"not json"#,
            r#"{}"#,
        ];
        let schema = typed();
        let position = SourcePosition::new("t", 0, 1);
        let mut columns = JsonColumns::new(&schema);
        let mut expected = Vec::new();
        for record in records {
            if let Ok(slots) = parse_typed(&schema, record.as_bytes(), &position) {
                columns.append(slots);
                expected.push(decode_row(&schema, record.as_bytes(), &position).unwrap());
            } else {
                assert!(decode_row(&schema, record.as_bytes(), &position).is_err());
            }
        }
        assert_eq!(columns.len(), 4);
        let batch = columns.finish().unwrap();
        assert_eq!(rows_of(&batch).unwrap(), expected);
        assert_eq!(columns.len(), 0);
        assert_eq!(columns.finish().unwrap().num_rows(), 0);
    }
}
