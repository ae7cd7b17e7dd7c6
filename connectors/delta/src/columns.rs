//! Rows to Arrow: the column types a batch of rows implies, how they meet a
//! table's schema (new nullable columns, or a refusal naming the column and
//! both types), and the record batch itself.

use deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, BooleanBuilder, Float64Builder, Int64Array, Int64Builder,
    RecordBatchOptions, StringBuilder, TimestampMicrosecondBuilder,
};
use deltalake::arrow::compute::{cast, concat};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::arrow::record_batch::RecordBatch;
use std::borrow::Borrow;
use std::sync::Arc;
use tidemark::columns::Column;
use tidemark::error::{Error, Result};
use tidemark::row::{Row, Value};

/// The Arrow type of a value; `None` for null (no type).
fn type_of(v: &Value) -> Option<DataType> {
    match v {
        Value::Null => None,
        Value::Bool(_) => Some(DataType::Boolean),
        Value::Long(_) => Some(DataType::Int64),
        Value::Double(_) => Some(DataType::Float64),
        Value::Timestamp(_) => Some(timestamp()),
        Value::Str(_) => Some(DataType::Utf8),
    }
}

/// Delta's `timestamp`: microseconds, UTC.
pub(crate) fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// A type name for messages, as Delta names it.
pub(crate) fn delta_name(t: &DataType) -> String {
    match t {
        DataType::Boolean => "boolean".into(),
        DataType::Int64 => "long".into(),
        DataType::Int32 => "integer".into(),
        DataType::Float64 => "double".into(),
        DataType::Float32 => "float".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Timestamp(_, Some(_)) => "timestamp".into(),
        DataType::Timestamp(_, None) => "timestamp_ntz".into(),
        DataType::Date32 => "date".into(),
        other => other.to_string(),
    }
}

/// Whether a value of type `from` can be stored in a column of type `to`.
fn fits(from: &DataType, to: &DataType) -> bool {
    from == to
        || matches!(
            (from, to),
            (DataType::Int64, DataType::Float64)
                | (DataType::Timestamp(_, _), DataType::Timestamp(_, _))
                | (DataType::Utf8, DataType::LargeUtf8 | DataType::Utf8View)
        )
}

/// The output a sink buffers: rows, or a columnar batch as the engine gave
/// it (a chain of filters, projections and computed columns).
#[derive(Debug, Clone)]
pub(crate) enum Buffered {
    /// Rows.
    Rows(Vec<Row>),
    /// The rows of a columnar batch.
    Columns(RecordBatch),
}

impl Buffered {
    pub(crate) fn num_rows(&self) -> usize {
        match self {
            Buffered::Rows(rows) => rows.len(),
            Buffered::Columns(batch) => batch.num_rows(),
        }
    }

    /// Sets column `name` to `value` in every row, as `Row::set` does: in
    /// its place when there is one, last otherwise.
    pub(crate) fn set_column(&mut self, name: &str, value: i64) -> Result<()> {
        match self {
            Buffered::Rows(rows) => {
                for row in rows {
                    row.set(name, Value::Long(value));
                }
            }
            Buffered::Columns(batch) => {
                let array: ArrayRef = Arc::new(Int64Array::from(vec![value; batch.num_rows()]));
                let field = Field::new(name, DataType::Int64, true);
                let mut fields: Vec<Field> = batch
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone())
                    .collect();
                let mut arrays = batch.columns().to_vec();
                match fields.iter().position(|f| f.name() == name) {
                    Some(at) => (fields[at], arrays[at]) = (field, array),
                    None => {
                        fields.push(field);
                        arrays.push(array);
                    }
                }
                *batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
                    .map_err(|e| Error::sink_failed(format!("adding column `{name}`"), e))?;
            }
        }
        Ok(())
    }
}

/// The columns rows hold, in order of first appearance, with the type
/// their values imply (long and double together widen to double; a column
/// of nulls only is a string).
#[derive(Default)]
struct InferredColumns {
    columns: Vec<(String, Option<DataType>)>,
}

impl InferredColumns {
    /// Column `name` seen with a value of type `new` (`None`: null).
    fn observe(&mut self, name: &str, new: Option<DataType>) -> Result<()> {
        let position = match self.columns.iter().position(|(n, _)| n == name) {
            Some(p) => p,
            None => {
                self.columns.push((name.to_string(), None));
                self.columns.len() - 1
            }
        };
        let Some(new) = new else { return Ok(()) };
        let slot = &mut self.columns[position].1;
        *slot = match slot.take() {
            None => Some(new),
            Some(old) if old == new => Some(old),
            Some(old) if fits(&old, &new) => Some(new),
            Some(old) if fits(&new, &old) => Some(old),
            Some(old) => {
                return Err(Error::Sink(format!(
                    "column `{name}` holds both {} and {} values in one batch",
                    delta_name(&old),
                    delta_name(&new)
                )))
            }
        };
        Ok(())
    }

    fn observe_rows(&mut self, rows: &[Row]) -> Result<()> {
        for row in rows {
            for (name, value) in row.columns() {
                self.observe(name, type_of(value))?;
            }
        }
        Ok(())
    }

    /// A columnar batch's columns, each typed by its values as rows
    /// would be: by its kind once it holds a value that is not null, in
    /// the order rows meet those values (so a conflict names the column
    /// rows would name).
    fn observe_columns(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let mut typed: Vec<(usize, usize, DataType)> = Vec::new();
        for (at, (field, array)) in batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .enumerate()
        {
            self.observe(field.name(), None)?;
            let column = Column::of(field.name(), array.as_ref())?;
            let kind = match column {
                Column::Missing | Column::Null => continue,
                Column::Str(_) | Column::LargeStr(_) => DataType::Utf8,
                Column::Long(_) => DataType::Int64,
                Column::Double(_) => DataType::Float64,
                Column::Bool(_) => DataType::Boolean,
                Column::Timestamp(_) => timestamp(),
            };
            if let Some(first) = (0..batch.num_rows()).position(|i| !column.is_null(i)) {
                typed.push((first, at, kind));
            }
        }
        typed.sort_by_key(|(first, at, _)| (*first, *at));
        let schema = batch.schema();
        for (_, at, kind) in typed {
            self.observe(schema.field(at).name(), Some(kind))?;
        }
        Ok(())
    }

    fn schema(self) -> Schema {
        Schema::new(
            self.columns
                .into_iter()
                .map(|(name, t)| Field::new(name, t.unwrap_or(DataType::Utf8), true))
                .collect::<Vec<_>>(),
        )
    }
}

/// The columns `rows` hold (see [`InferredColumns`]).
pub(crate) fn infer_schema(rows: &[Row]) -> Result<Schema> {
    let mut inferred = InferredColumns::default();
    inferred.observe_rows(rows)?;
    Ok(inferred.schema())
}

/// The columns buffered output holds, rows and columns alike, as
/// [`infer_schema`] infers them from its rows.
pub(crate) fn infer_schema_of(parts: &[Buffered]) -> Result<Schema> {
    let mut inferred = InferredColumns::default();
    for part in parts {
        match part {
            Buffered::Rows(rows) => inferred.observe_rows(rows)?,
            Buffered::Columns(batch) => inferred.observe_columns(batch)?,
        }
    }
    Ok(inferred.schema())
}

/// How a batch's columns meet the table's.
pub(crate) struct SchemaPlan {
    /// The schema to write: the table's, plus new columns at the end.
    pub schema: SchemaRef,
    /// Whether columns were added.
    pub widened: bool,
}

/// The schema a batch inferred as `batch` is written with into a table of
/// schema `table`: every table column (those the batch lacks are null), and
/// with `merge_schema` the batch's new columns appended as nullable. A new
/// column without `merge_schema`, or a value type the table column cannot
/// hold, is refused before anything is written.
pub(crate) fn plan_schema(
    table: &Schema,
    batch: &Schema,
    merge_schema: bool,
) -> Result<SchemaPlan> {
    let mut fields: Vec<Field> = table.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut widened = false;
    for field in batch.fields() {
        match table.field_with_name(field.name()) {
            Ok(existing) => {
                if !fits(field.data_type(), existing.data_type()) {
                    return Err(Error::Sink(format!(
                        "column `{}`: the table has {}, the rows have {}; nothing was written",
                        field.name(),
                        delta_name(existing.data_type()),
                        delta_name(field.data_type())
                    )));
                }
            }
            Err(_) if merge_schema => {
                fields.push(Field::new(field.name(), field.data_type().clone(), true));
                widened = true;
            }
            Err(_) => {
                return Err(Error::Sink(format!(
                    "column `{}` ({}) is not in the table; set `merge_schema: true` to add it, nothing was written",
                    field.name(),
                    delta_name(field.data_type())
                )))
            }
        }
    }
    for field in table.fields() {
        if !field.is_nullable() && batch.field_with_name(field.name()).is_err() {
            return Err(Error::Sink(format!(
                "column `{}` of the table is not nullable and the rows do not have it",
                field.name()
            )));
        }
    }
    Ok(SchemaPlan {
        schema: Arc::new(Schema::new(fields)),
        widened,
    })
}

/// The rows as a record batch of `schema` (types as `plan_schema` allowed).
pub(crate) fn to_record_batch(rows: &[Row], schema: &SchemaRef) -> Result<RecordBatch> {
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let name = field.name().as_str();
        let values = rows.iter().map(|r| r.get(name).unwrap_or(&Value::Null));
        arrays.push(array_of_values(field, rows.len(), values)?);
    }
    RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| Error::sink_failed("building the record batch", e))
}

/// Buffered output, rows and columns, as one record batch of `schema`:
/// the batch [`to_record_batch`] makes of the same rows. A column already
/// of its field's type is taken as it is.
pub(crate) fn to_record_batch_of(parts: &[Buffered], schema: &SchemaRef) -> Result<RecordBatch> {
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    let num_rows: usize = parts.iter().map(Buffered::num_rows).sum();
    for field in schema.fields() {
        let name = field.name().as_str();
        let mut pieces: Vec<ArrayRef> = Vec::with_capacity(parts.len());
        for part in parts {
            pieces.push(match part {
                Buffered::Rows(rows) => {
                    let values = rows.iter().map(|r| r.get(name).unwrap_or(&Value::Null));
                    array_of_values(field, rows.len(), values)?
                }
                Buffered::Columns(batch) => array_of_column(field, batch)?,
            });
        }
        let array = match pieces.len() {
            0 => new_null_array(field.data_type(), 0),
            1 => pieces
                .pop()
                .unwrap_or_else(|| new_null_array(field.data_type(), 0)),
            _ => {
                let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
                concat(&refs).map_err(|e| Error::sink_failed(format!("column `{name}`"), e))?
            }
        };
        arrays.push(array);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(num_rows));
    RecordBatch::try_new_with_options(schema.clone(), arrays, &options)
        .map_err(|e| Error::sink_failed("building the record batch", e))
}

/// Column `field` of `batch` for the table: as it is when its type is the
/// field's (text of either offset width as `Utf8`), otherwise value by
/// value as rows would be written; all NULL when the batch lacks it.
fn array_of_column(field: &Field, batch: &RecordBatch) -> Result<ArrayRef> {
    let name = field.name().as_str();
    let Ok(at) = batch.schema_ref().index_of(name) else {
        return Ok(new_null_array(field.data_type(), batch.num_rows()));
    };
    let array = batch.column(at);
    match (array.data_type(), field.data_type()) {
        (from, to) if from == to => Ok(array.clone()),
        (DataType::LargeUtf8, DataType::Utf8) => cast(array, &DataType::Utf8)
            .map_err(|e| Error::sink_failed(format!("column `{name}`"), e)),
        _ => {
            let column = Column::of(name, array.as_ref())?;
            let values = (0..batch.num_rows()).map(|i| column.value(i));
            array_of_values(field, batch.num_rows(), values)
        }
    }
}

/// `n` values of column `field` as an array of its type; a value of
/// another type is an error naming the column.
fn array_of_values<V: Borrow<Value>>(
    field: &Field,
    n: usize,
    values: impl Iterator<Item = V>,
) -> Result<ArrayRef> {
    let name = field.name().as_str();
    let bad = |v: &Value| {
        Error::Sink(format!(
            "column `{name}`: a {} value does not fit {}",
            v.type_name(),
            delta_name(field.data_type())
        ))
    };
    let array: ArrayRef = match field.data_type() {
        DataType::Boolean => {
            let mut b = BooleanBuilder::with_capacity(n);
            for v in values {
                let v = v.borrow();
                match v {
                    Value::Null => b.append_null(),
                    Value::Bool(x) => b.append_value(*x),
                    other => return Err(bad(other)),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Int64 => {
            let mut b = Int64Builder::with_capacity(n);
            for v in values {
                let v = v.borrow();
                match v {
                    Value::Null => b.append_null(),
                    Value::Long(x) => b.append_value(*x),
                    other => return Err(bad(other)),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Float64 => {
            let mut b = Float64Builder::with_capacity(n);
            for v in values {
                let v = v.borrow();
                match v {
                    Value::Null => b.append_null(),
                    Value::Double(x) => b.append_value(*x),
                    Value::Long(x) => b.append_value(*x as f64),
                    other => return Err(bad(other)),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            let mut b = TimestampMicrosecondBuilder::with_capacity(n);
            for v in values {
                let v = v.borrow();
                match v {
                    Value::Null => b.append_null(),
                    Value::Timestamp(x) => b.append_value(*x),
                    other => return Err(bad(other)),
                }
            }
            Arc::new(b.finish().with_timezone_opt(zone.clone()))
        }
        DataType::Utf8 => {
            let mut b = StringBuilder::with_capacity(n, n * 8);
            for v in values {
                let v = v.borrow();
                match v {
                    Value::Null => b.append_null(),
                    Value::Str(s) => b.append_value(s),
                    other => return Err(bad(other)),
                }
            }
            Arc::new(b.finish())
        }
        other => {
            return Err(Error::Sink(format!(
                "column `{name}`: writing {} columns is not supported",
                delta_name(other)
            )))
        }
    };
    Ok(array)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pairs: &[(&str, Value)]) -> Row {
        let mut r = Row::new();
        for (k, v) in pairs {
            r.set(*k, v.clone());
        }
        r
    }

    #[test]
    fn types_are_inferred_widened_and_checked_against_the_table() {
        let rows = vec![
            row(&[
                ("k", Value::from("a")),
                ("n", Value::Long(1)),
                ("x", Value::Null),
            ]),
            row(&[
                ("k", Value::from("b")),
                ("n", Value::Double(2.5)),
                ("t", Value::Timestamp(5)),
            ]),
        ];
        let inferred = infer_schema(&rows).unwrap();
        let types: Vec<String> = inferred
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), delta_name(f.data_type())))
            .collect();
        assert_eq!(types, ["k:string", "n:double", "x:string", "t:timestamp"]);

        let table = Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Float64, true),
        ]);
        let err = plan_schema(&table, &inferred, false)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("`x`") && err.contains("merge_schema"), "{err}");
        let plan = plan_schema(&table, &inferred, true).unwrap();
        assert!(plan.widened);
        assert_eq!(plan.schema.fields().len(), 4);
        let batch = to_record_batch(&rows, &plan.schema).unwrap();
        assert_eq!(batch.num_rows(), 2);

        let strings = Schema::new(vec![Field::new("n", DataType::Utf8, true)]);
        let err = plan_schema(&strings, &inferred, true)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("the table has string, the rows have double"),
            "{err}"
        );
    }

    /// One column of a columnar part: the values its rows hold, and the
    /// Arrow type the engine may have given it.
    fn column_array(values: &[Value], kind: u8) -> ArrayRef {
        use deltalake::arrow::array::{Float32Array, Int32Array, TimestampMillisecondArray};
        let narrow = values.iter().all(|v| match v {
            Value::Long(n) => i32::try_from(*n).is_ok(),
            Value::Double(d) => (*d as f32) as f64 == *d || d.is_nan(),
            Value::Timestamp(t) => t % 1000 == 0,
            _ => true,
        });
        let first = values.iter().find(|v| !v.is_null());
        match (kind % 2, narrow, first) {
            (1, true, Some(Value::Long(_))) => Arc::new(
                values
                    .iter()
                    .map(|v| match v {
                        Value::Long(n) => Some(*n as i32),
                        _ => None,
                    })
                    .collect::<Int32Array>(),
            ),
            (1, true, Some(Value::Double(_))) => Arc::new(
                values
                    .iter()
                    .map(|v| match v {
                        Value::Double(d) => Some(*d as f32),
                        _ => None,
                    })
                    .collect::<Float32Array>(),
            ),
            (1, true, Some(Value::Timestamp(_))) => Arc::new(
                values
                    .iter()
                    .map(|v| match v {
                        Value::Timestamp(t) => Some(t / 1000),
                        _ => None,
                    })
                    .collect::<TimestampMillisecondArray>(),
            ),
            _ => tidemark::columns::array_of(values).expect("one type per column"),
        }
    }

    fn value_of(kind: u8, n: i64) -> Value {
        match kind % 6 {
            0 => Value::Null,
            1 => Value::Long(n),
            2 => Value::Double(n as f64 / 4.0),
            3 => Value::from(format!("s{n}").as_str()),
            4 => Value::Bool(n % 2 == 0),
            _ => Value::Timestamp(n * 1000),
        }
    }

    /// A part: `rows` rows of `names` columns (each with its kind), as
    /// rows or as columns; a value is NULL where `nulls` says.
    fn part(
        names: &[(String, u8)],
        rows: usize,
        nulls: u64,
        as_columns: bool,
        arrow_kind: u8,
    ) -> Buffered {
        let cell = |c: usize, r: usize| -> Value {
            let (_, kind) = &names[c];
            match nulls >> ((c * 7 + r) % 64) & 1 {
                1 => Value::Null,
                _ => value_of(*kind, (r as i64) * 3 - 5),
            }
        };
        if !as_columns {
            return Buffered::Rows(
                (0..rows)
                    .map(|r| {
                        let mut row = Row::new();
                        for (c, (name, _)) in names.iter().enumerate() {
                            row.set(name.as_str(), cell(c, r));
                        }
                        row
                    })
                    .collect(),
            );
        }
        let columns: Vec<(String, ArrayRef)> = names
            .iter()
            .enumerate()
            .map(|(c, (name, _))| {
                let values: Vec<Value> = (0..rows).map(|r| cell(c, r)).collect();
                (name.clone(), column_array(&values, arrow_kind))
            })
            .collect();
        Buffered::Columns(RecordBatch::try_from_iter(columns).expect("a batch"))
    }

    fn as_rows(parts: &[Buffered]) -> Vec<Row> {
        parts
            .iter()
            .flat_map(|p| match p {
                Buffered::Rows(rows) => rows.clone(),
                Buffered::Columns(batch) => tidemark::columns::rows_of(batch).unwrap(),
            })
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// Columnar parts (of the engine's Arrow types or narrower ones),
        /// among parts of rows, make the schema and the record batch the
        /// same rows make, or the same refusal.
        #[test]
        fn columns_are_written_as_their_rows_would_be(
            specs in proptest::collection::vec(
                (proptest::collection::vec((0usize..4, 0u8..6), 1..4), 1usize..6,
                 proptest::prelude::any::<u64>(), proptest::prelude::any::<bool>(), 0u8..2),
                1..4),
        ) {
            let parts: Vec<Buffered> = specs
                .iter()
                .map(|(columns, rows, nulls, as_columns, arrow_kind)| {
                    let mut names: Vec<(String, u8)> = Vec::new();
                    for (name, kind) in columns {
                        let name = format!("c{name}");
                        if !names.iter().any(|(n, _)| *n == name) {
                            names.push((name, *kind));
                        }
                    }
                    part(&names, *rows, *nulls, *as_columns, *arrow_kind)
                })
                .collect();
            let rows = as_rows(&parts);
            let by_rows = infer_schema(&rows);
            let by_parts = infer_schema_of(&parts);
            match (by_rows, by_parts) {
                (Ok(a), Ok(b)) => {
                    proptest::prop_assert_eq!(&a, &b);
                    let schema: SchemaRef = Arc::new(a);
                    let expected = to_record_batch(&rows, &schema).unwrap();
                    let got = to_record_batch_of(&parts, &schema).unwrap();
                    proptest::prop_assert_eq!(got, expected);
                }
                (Err(a), Err(b)) => proptest::prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => proptest::prop_assert!(false, "{a:?} against {b:?}"),
            }
        }
    }

    #[test]
    fn a_batch_id_column_is_set_in_place_or_added_last() {
        let mut columns = part(&[("batch_id".into(), 3), ("n".into(), 1)], 2, 0, true, 0);
        let mut rows = part(&[("batch_id".into(), 3), ("n".into(), 1)], 2, 0, false, 0);
        columns.set_column("batch_id", 7).unwrap();
        rows.set_column("batch_id", 7).unwrap();
        assert_eq!(as_rows(&[columns.clone()]), as_rows(&[rows]));
        columns.set_column("other", 1).unwrap();
        let Buffered::Columns(batch) = &columns else {
            panic!()
        };
        assert_eq!(batch.schema().field(2).name(), "other");
    }
}
