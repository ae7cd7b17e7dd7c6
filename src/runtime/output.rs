//! What a batch's tasks emit, in order, for the sink: rows, and the
//! columnar batches of chains that run on columns all the way to the sink
//! (filters, projections and computed columns only), so a sink that can
//! write columns ([`Sink::write_output`](super::Sink::write_output)) never
//! makes a row of them.

use crate::error::Result;
use crate::row::Row;
use arrow_array::RecordBatch;

/// Which task emitted which rows: `(partition, end)` runs, each covering
/// the rows from the previous run's end up to `end`.
pub type TaskRuns = Vec<(i32, usize)>;

/// A columnar batch one task emitted, and where it sits among the rows.
#[derive(Debug, Clone)]
pub struct ColumnsOutput {
    /// It comes before row `before_row` of the batch's rows (after every
    /// row emitted earlier).
    pub before_row: usize,
    /// The task (input partition) that emitted it.
    pub partition: i32,
    /// Its rows, in order.
    pub batch: RecordBatch,
}

/// One stretch of a batch's output: rows, or the columns of a batch.
#[derive(Debug, Clone, Copy)]
pub enum OutputPart<'a> {
    /// Rows task `partition` emitted.
    Rows {
        /// The task (input partition).
        partition: i32,
        /// Its rows, in order.
        rows: &'a [Row],
    },
    /// A columnar batch task `partition` emitted.
    Columns {
        /// The task (input partition).
        partition: i32,
        /// Its rows, in order.
        batch: &'a RecordBatch,
    },
}

/// Everything a batch's tasks emitted, in the order they emitted it.
#[derive(Debug, Clone, Copy)]
pub struct BatchOutput<'a> {
    /// The rows.
    pub rows: &'a [Row],
    /// Which task emitted which of `rows`: `(partition, end)` runs, each
    /// covering the rows from the previous run's end up to `end`; rows
    /// past the last run count as the last run's (or partition 0's).
    pub tasks: &'a [(i32, usize)],
    /// The columnar batches, in order, each placed among `rows`.
    pub columns: &'a [ColumnsOutput],
}

impl<'a> BatchOutput<'a> {
    /// Output of rows only.
    pub fn of_rows(rows: &'a [Row], tasks: &'a [(i32, usize)]) -> Self {
        BatchOutput {
            rows,
            tasks,
            columns: &[],
        }
    }

    /// How many rows there are, columns included.
    pub fn num_rows(&self) -> usize {
        self.rows.len()
            + self
                .columns
                .iter()
                .map(|c| c.batch.num_rows())
                .sum::<usize>()
    }

    /// The stretches in order: each task's run of rows, with the columnar
    /// batches between them where they were emitted.
    pub fn parts(&self) -> Vec<OutputPart<'a>> {
        let mut parts = Vec::with_capacity(self.tasks.len() + self.columns.len());
        let mut columns = self.columns.iter().peekable();
        let mut start = 0;
        for &(partition, end) in self.tasks {
            // A run of rows may hold columns emitted between its rows.
            let mut from = start;
            while let Some(c) = columns.next_if(|c| c.before_row < end) {
                if c.before_row > from {
                    parts.push(OutputPart::Rows {
                        partition,
                        rows: &self.rows[from..c.before_row],
                    });
                    from = c.before_row;
                }
                parts.push(OutputPart::Columns {
                    partition: c.partition,
                    batch: &c.batch,
                });
            }
            if end > from {
                parts.push(OutputPart::Rows {
                    partition,
                    rows: &self.rows[from..end],
                });
            }
            start = end;
        }
        // Runs should cover every row; rows past the last are not lost.
        if start < self.rows.len() {
            let partition = self.tasks.last().map_or(0, |(p, _)| *p);
            parts.push(OutputPart::Rows {
                partition,
                rows: &self.rows[start..],
            });
        }
        parts.extend(columns.map(|c| OutputPart::Columns {
            partition: c.partition,
            batch: &c.batch,
        }));
        parts
    }

    /// All of it as rows, with their task runs: what a sink that writes
    /// rows only is given.
    pub fn to_rows(&self) -> Result<(Vec<Row>, TaskRuns)> {
        let mut rows = Vec::with_capacity(self.num_rows());
        let mut tasks = TaskRuns::new();
        for part in self.parts() {
            let partition = match part {
                OutputPart::Rows {
                    partition,
                    rows: some,
                } => {
                    rows.extend_from_slice(some);
                    partition
                }
                OutputPart::Columns { partition, batch } => {
                    rows.extend(crate::columns::rows_of(batch)?);
                    partition
                }
            };
            mark_task(&rows, &mut tasks, partition);
        }
        Ok((rows, tasks))
    }
}

/// Records that the rows of `rows` added since the last mark came from task
/// `partition`: `tasks` holds `(partition, end)` runs, each covering the
/// rows from the previous run's end up to `end`.
pub(super) fn mark_task(rows: &[Row], tasks: &mut Vec<(i32, usize)>, partition: i32) {
    let end = rows.len();
    let start = tasks.last().map_or(0, |(_, e)| *e);
    if end == start {
        return;
    }
    match tasks.last_mut() {
        Some((p, e)) if *p == partition => *e = end,
        _ => tasks.push((partition, end)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::Value;
    use arrow_array::{ArrayRef, Int64Array};
    use std::sync::Arc;

    fn row(n: i64) -> Row {
        let mut row = Row::new();
        row.set("n", Value::Long(n));
        row
    }

    fn columns(before_row: usize, partition: i32, values: &[i64]) -> ColumnsOutput {
        let array: ArrayRef = Arc::new(Int64Array::from(values.to_vec()));
        ColumnsOutput {
            before_row,
            partition,
            batch: RecordBatch::try_from_iter([("n", array)]).unwrap(),
        }
    }

    fn numbers(rows: &[Row]) -> Vec<i64> {
        rows.iter()
            .map(|r| match r.get("n") {
                Some(Value::Long(n)) => *n,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn columns_take_their_place_among_the_rows_and_their_tasks() {
        // Task 0 emits columns 1-2, rows 3, columns 4; task 1 rows 5-6;
        // task 0 columns 7 after everything.
        let rows = vec![row(3), row(5), row(6)];
        let tasks = [(0, 1), (1, 3)];
        let cols = [
            columns(0, 0, &[1, 2]),
            columns(1, 0, &[4]),
            columns(3, 0, &[7]),
        ];
        let output = BatchOutput {
            rows: &rows,
            tasks: &tasks,
            columns: &cols,
        };
        assert_eq!(output.num_rows(), 7);
        let (all, runs) = output.to_rows().unwrap();
        assert_eq!(numbers(&all), vec![1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(runs, vec![(0, 4), (1, 6), (0, 7)]);
    }

    #[test]
    fn columns_inside_a_run_split_it() {
        let rows = vec![row(1), row(3)];
        let tasks = [(0, 2)];
        let cols = [columns(1, 0, &[2])];
        let output = BatchOutput {
            rows: &rows,
            tasks: &tasks,
            columns: &cols,
        };
        let parts = output.parts();
        assert_eq!(parts.len(), 3);
        assert_eq!(numbers(&output.to_rows().unwrap().0), vec![1, 2, 3]);
    }

    #[test]
    fn rows_past_the_last_run_are_kept() {
        let rows = vec![row(1), row(2)];
        let output = BatchOutput::of_rows(&rows, &[]);
        assert_eq!(numbers(&output.to_rows().unwrap().0), vec![1, 2]);
    }

    #[test]
    fn rows_alone_are_left_as_they_are() {
        let rows = vec![row(1), row(2)];
        let tasks = [(3, 2)];
        let output = BatchOutput::of_rows(&rows, &tasks);
        let (all, runs) = output.to_rows().unwrap();
        assert_eq!(numbers(&all), vec![1, 2]);
        assert_eq!(runs, vec![(3, 2)]);
    }
}
