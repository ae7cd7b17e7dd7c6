//! Stateless steps: filter, select/rename, computed columns, typed map and
//! flat_map.

use super::{BatchContext, Operator};
use crate::columns::{array_of, Column, ColumnsRow};
use crate::error::{Error, Result};
use crate::expr::Expr;
use crate::row::{Row, Value};
use arrow_array::{new_null_array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, Schema};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;

/// Keeps rows whose condition is true.
pub struct Filter {
    condition: Expr,
    /// The columns the condition reads, resolved once per columnar batch.
    reads: Vec<Arc<str>>,
    text: String,
}

impl Filter {
    /// A filter from an expression such as `amount >= 0 and id != 'x'`.
    pub fn new(condition: &str) -> Result<Self> {
        let parsed = Expr::parse(condition)?;
        Ok(Filter {
            reads: parsed.columns(),
            condition: parsed,
            text: condition.to_string(),
        })
    }
}

impl Operator for Filter {
    fn describe(&self) -> String {
        format!("Filter [{}]", self.text)
    }
    fn on_row(&mut self, row: Row, _: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        if self.condition.matches(&row) {
            out.push(row);
        }
        Ok(())
    }

    fn maps_columns(&self) -> bool {
        true
    }

    /// The condition read from the columns row by row (the same evaluation
    /// as for rows, so the same NULL and coercion rules), then Arrow's
    /// filter kernel keeps the rows it passes.
    fn map_columns(&mut self, batch: &RecordBatch, _: &BatchContext) -> Result<RecordBatch> {
        let columns = resolve_columns(batch, &self.reads)?;
        let keep: BooleanArray = (0..batch.num_rows())
            .map(|i| {
                Some(self.condition.matches_in(&ColumnsRow {
                    columns: &columns,
                    i,
                }))
            })
            .collect();
        arrow_select::filter::filter_record_batch(batch, &keep)
            .map_err(|e| Error::source_failed(format!("{}: filtering a batch", self.describe()), e))
    }
}

/// Keeps the listed columns, in order, each optionally renamed.
pub struct Select {
    columns: Vec<(Arc<str>, Arc<str>)>,
}

impl Select {
    /// `columns` are `(source, output name)` pairs.
    pub fn new<S: Into<Arc<str>>, T: Into<Arc<str>>>(
        columns: impl IntoIterator<Item = (S, T)>,
    ) -> Self {
        Select {
            columns: columns
                .into_iter()
                .map(|(s, t)| (s.into(), t.into()))
                .collect(),
        }
    }
}

impl Operator for Select {
    fn describe(&self) -> String {
        let cols: Vec<String> = self
            .columns
            .iter()
            .map(|(s, t)| {
                if s == t {
                    s.to_string()
                } else {
                    format!("{s} AS {t}")
                }
            })
            .collect();
        format!("Project [{}]", cols.join(", "))
    }
    fn on_row(&mut self, row: Row, _: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let mut projected = Row::new();
        for (source, target) in &self.columns {
            projected.set(
                target.clone(),
                row.get(source).cloned().unwrap_or(crate::row::Value::Null),
            );
        }
        out.push(projected);
        Ok(())
    }

    fn maps_columns(&self) -> bool {
        true
    }

    /// The source columns' arrays under their new names, as
    /// [`Operator::on_row`] makes each row: a missing source is a NULL
    /// column, and a name given twice keeps its first place and the last
    /// value.
    fn map_columns(&mut self, batch: &RecordBatch, _: &BatchContext) -> Result<RecordBatch> {
        let schema = batch.schema_ref();
        let mut fields: Vec<Field> = Vec::with_capacity(self.columns.len());
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for (source, target) in &self.columns {
            let (field, array) = match schema.index_of(source) {
                Ok(i) => (
                    schema.field(i).clone().with_name(target.as_ref()),
                    batch.column(i).clone(),
                ),
                Err(_) => (
                    Field::new(target.as_ref(), DataType::Null, true),
                    new_null_array(&DataType::Null, batch.num_rows()),
                ),
            };
            match fields.iter().position(|f| f.name() == target.as_ref()) {
                Some(at) => (fields[at], arrays[at]) = (field, array),
                None => {
                    fields.push(field);
                    arrays.push(array);
                }
            }
        }
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), arrays, &options).map_err(
            |e| Error::source_failed(format!("{}: projecting a batch", self.describe()), e),
        )
    }
}

/// Adds (or replaces) a column computed from an expression.
pub struct WithColumn {
    name: Arc<str>,
    expr: Expr,
    /// The columns the expression reads, resolved once per columnar batch.
    reads: Vec<Arc<str>>,
    text: String,
}

impl WithColumn {
    /// `name = expression`, e.g. `("amount_cents", "amount * 100")`.
    pub fn new(name: &str, expression: &str) -> Result<Self> {
        let expr = Expr::parse(expression)?;
        Ok(WithColumn {
            name: Arc::from(name),
            reads: expr.columns(),
            expr,
            text: expression.to_string(),
        })
    }
}

impl Operator for WithColumn {
    fn describe(&self) -> String {
        format!("WithColumn [{} = {}]", self.name, self.text)
    }
    fn on_row(&mut self, mut row: Row, _: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let value = self.expr.eval(&row);
        row.set(self.name.clone(), value);
        out.push(row);
        Ok(())
    }

    fn maps_columns(&self) -> bool {
        true
    }

    /// The expression evaluated row by row over the columns (the same
    /// evaluation as for rows), its values made one array that replaces
    /// the column of that name in place or comes last, as `Row::set` does.
    fn map_columns(&mut self, batch: &RecordBatch, _: &BatchContext) -> Result<RecordBatch> {
        let columns = resolve_columns(batch, &self.reads)?;
        let values: Vec<Value> = (0..batch.num_rows())
            .map(|i| {
                self.expr.eval_in(&ColumnsRow {
                    columns: &columns,
                    i,
                })
            })
            .collect();
        // An expression's type follows from its columns' types, which a
        // batch fixes: its values never mix types.
        let Some(array) = array_of(&values) else {
            return Err(Error::Source(format!(
                "{}: values of more than one type in one batch",
                self.describe()
            )));
        };
        let field = Field::new(self.name.as_ref(), array.data_type().clone(), true);
        let schema = batch.schema_ref();
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut arrays: Vec<ArrayRef> = batch.columns().to_vec();
        match schema.index_of(&self.name) {
            Ok(at) => (fields[at], arrays[at]) = (field, array),
            Err(_) => {
                fields.push(field);
                arrays.push(array);
            }
        }
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), arrays, &options)
            .map_err(|e| Error::source_failed(format!("{}: adding a column", self.describe()), e))
    }
}

/// The columns of `batch` an expression reads (`names`), resolved once.
fn resolve_columns<'a>(
    batch: &'a RecordBatch,
    names: &[Arc<str>],
) -> Result<Vec<(Arc<str>, Column<'a>)>> {
    names
        .iter()
        .map(|name| Ok((name.clone(), Column::resolve(batch, name)?)))
        .collect()
}

/// A closure over rows: the typed API's map and flat_map land here.
pub struct MapRows {
    name: String,
    f: Box<dyn FnMut(Row) -> Result<Vec<Row>> + Send>,
}

impl MapRows {
    /// Wraps a row function that returns zero or more rows.
    pub fn new(name: &str, f: impl FnMut(Row) -> Result<Vec<Row>> + Send + 'static) -> Self {
        MapRows {
            name: name.to_string(),
            f: Box::new(f),
        }
    }
}

impl Operator for MapRows {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn on_row(&mut self, row: Row, _: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        out.extend((self.f)(row)?);
        Ok(())
    }
}

/// Builds [`MapRows`] that write each row as the user's type `U` writes
/// itself.
pub struct AsType;

impl AsType {
    /// Each row read into `U` and made a row again from `U`'s own
    /// serialization (its field names, order, formats; strings stay
    /// strings). A row that does not read into `U` is an error naming the
    /// type and the reason.
    pub fn build<U>(name: &str) -> MapRows
    where
        U: DeserializeOwned + Serialize + 'static,
    {
        let type_name = std::any::type_name::<U>();
        MapRows::new(name, move |row| {
            let value: U = crate::typed::from_row(&row).map_err(|reason| Error::Expression {
                expression: format!("read row as {type_name}"),
                reason,
            })?;
            let row =
                crate::typed::to_row_as_written(&value).map_err(|reason| Error::Expression {
                    expression: format!("write {type_name}"),
                    reason,
                })?;
            Ok(vec![row])
        })
    }
}

/// Builds [`MapRows`] from a function over the user's serde types.
pub struct FlatMapTyped;

impl FlatMapTyped {
    /// `f` receives each row deserialized as `In` and returns `Out` values,
    /// which become rows again. A row that does not deserialize is an error
    /// naming the type and the reason, and goes to the dead-letter output.
    pub fn build<In, Out, I>(name: &str, f: Arc<dyn Fn(In) -> I + Send + Sync>) -> MapRows
    where
        In: DeserializeOwned + 'static,
        Out: Serialize + 'static,
        I: IntoIterator<Item = Out> + 'static,
    {
        let type_name = std::any::type_name::<In>();
        MapRows::new(name, move |row| {
            let input: In = crate::typed::from_row(&row).map_err(|reason| Error::Expression {
                expression: format!("deserialize row into {type_name}"),
                reason,
            })?;
            f(input)
                .into_iter()
                .map(|o| {
                    crate::typed::to_row(&o).map_err(|reason| Error::Expression {
                        expression: "serialize output row".into(),
                        reason,
                    })
                })
                .collect()
        })
    }
}
