//! What a window aggregation computes: each aggregate's function, the
//! columns it reads and the column it writes. A module of its own so that
//! the state codec and the session windows read it without importing the
//! window aggregation that uses them.

use crate::aggregate::AggregateFn;
use crate::error::Result;
use std::sync::Arc;

/// What an aggregate reads from each row.
#[derive(Debug, Clone, PartialEq)]
pub enum AggregateInput {
    /// Every row (`count(*)`).
    Star,
    /// One column.
    Column(Arc<str>),
    /// A column and the column it is ordered by (`max_by`, `min_by`).
    By {
        /// The column whose value is kept.
        value: Arc<str>,
        /// The column that decides which row's value.
        ordering: Arc<str>,
    },
}

/// One aggregate of a window aggregation: function, input and output name.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    /// The function.
    pub function: AggregateFn,
    /// Its input.
    pub input: AggregateInput,
    /// The output column name.
    pub output: Arc<str>,
}

impl AggregateSpec {
    /// An aggregate with Spark's default output name (`sum(amount)`,
    /// `count` for `count(*)`), renamed with [`AggregateSpec::alias`].
    pub fn new(function: AggregateFn, input: AggregateInput) -> Self {
        let output = match &input {
            AggregateInput::Star => function.name().to_string(),
            AggregateInput::Column(c) => format!("{}({c})", function.name()),
            AggregateInput::By { value, ordering } => {
                format!("{}({value}, {ordering})", function.name())
            }
        };
        AggregateSpec {
            function,
            input,
            output: Arc::from(output),
        }
    }

    /// `count(*)`, named `count`.
    ///
    /// ```
    /// use tidemark_operators::AggregateSpec;
    /// assert_eq!(AggregateSpec::count().output.as_ref(), "count");
    /// ```
    pub fn count() -> Self {
        AggregateSpec::new(
            AggregateFn::built_in("count").expect("count is built in"),
            AggregateInput::Star,
        )
    }

    /// A built-in aggregate of one column, e.g. `of("sum", "amount")`,
    /// named as Spark names it (`sum(amount)`).
    pub fn of(function: &str, column: &str) -> Result<Self> {
        let f = AggregateFn::built_in(function)?;
        if f.takes_ordering() {
            return Err(crate::error::Error::config(
                "aggregates.by",
                format!("`{function}` needs the column ordering the rows: use AggregateSpec::by"),
            ));
        }
        Ok(AggregateSpec::new(
            f,
            AggregateInput::Column(Arc::from(column)),
        ))
    }

    /// Spark's `max_by(value, ordering)` or `min_by(value, ordering)`:
    /// the `value` of the row with the largest (smallest) `ordering`.
    ///
    /// ```
    /// use tidemark_operators::AggregateSpec;
    /// let spec = AggregateSpec::by("max_by", "auction", "price").unwrap();
    /// assert_eq!(spec.output.as_ref(), "max_by(auction, price)");
    /// ```
    pub fn by(function: &str, value: &str, ordering: &str) -> Result<Self> {
        let f = AggregateFn::built_in(function)?;
        if !f.takes_ordering() {
            return Err(crate::error::Error::config(
                "aggregates.by",
                format!("`{function}` takes one column; `by` is for max_by and min_by"),
            ));
        }
        Ok(AggregateSpec::new(
            f,
            AggregateInput::By {
                value: Arc::from(value),
                ordering: Arc::from(ordering),
            },
        ))
    }

    /// Renames the output column.
    pub fn alias(mut self, name: &str) -> Self {
        self.output = Arc::from(name);
        self
    }
}
