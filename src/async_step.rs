//! An asynchronous call per row (Flink's Async I/O): a step that asks an
//! external service — a model server scoring a transaction — for each row,
//! with at most `concurrency` calls in flight, each bounded by a timeout.
//!
//! A batch's rows are gathered and their calls run together when the
//! batch ends; the batch ends (and commits) only once every call answered,
//! so the step keeps the query's guarantees: under `exactly_once` each
//! row's answer is written once. A call that fails or times out fails the
//! batch, which is not committed and runs again from the last commit (the
//! runner's retries, bounded by `task_timeout`). Under the real-time
//! trigger each row's call is made as the row arrives.

use crate::error::{Error, Result};
use crate::operators::{BatchContext, Operator};
use crate::row::Row;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The user's call, boxed.
type Call<In, Out> = Arc<
    dyn Fn(In) -> Pin<Box<dyn Future<Output = std::result::Result<Out, CallError>> + Send>>
        + Send
        + Sync,
>;

/// What a call may fail with: any error.
pub type CallError = Box<dyn std::error::Error + Send + Sync>;

/// How an async step calls (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncOptions {
    /// Calls in flight at most.
    pub concurrency: usize,
    /// How long one call may take.
    pub timeout: Duration,
    /// Whether output rows keep their input rows' order (`true`), or come
    /// in the order the calls answered.
    pub ordered: bool,
}

impl Default for AsyncOptions {
    fn default() -> Self {
        AsyncOptions {
            concurrency: 100,
            timeout: Duration::from_secs(10),
            ordered: true,
        }
    }
}

/// The operator (see the module documentation).
pub struct AsyncStep<In, Out> {
    name: String,
    call: Call<In, Out>,
    options: AsyncOptions,
    pending: Vec<In>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl<In, Out> AsyncStep<In, Out>
where
    In: DeserializeOwned + Send + 'static,
    Out: Serialize + Send + 'static,
{
    /// A step named `name` calling `call` for each row.
    pub fn new<F, Fut, E>(name: &str, options: AsyncOptions, call: F) -> Result<Self>
    where
        F: Fn(In) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Out, E>> + Send + 'static,
        E: Into<CallError> + 'static,
    {
        if options.concurrency == 0 {
            return Err(Error::config(
                "map_async.concurrency",
                "at least one call must be allowed in flight",
            ));
        }
        if options.timeout.is_zero() {
            return Err(Error::config(
                "map_async.timeout",
                "a call needs a timeout longer than zero",
            ));
        }
        let call: Call<In, Out> = Arc::new(move |input| {
            let future = call(input);
            Box::pin(async move { future.await.map_err(Into::into) })
        });
        Ok(AsyncStep {
            name: name.to_string(),
            call,
            options,
            pending: Vec::new(),
            runtime: None,
        })
    }

    fn runtime(&mut self) -> Result<&tokio::runtime::Runtime> {
        if self.runtime.is_none() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::io(format!("starting the runtime of {}", self.name), e))?;
            self.runtime = Some(runtime);
        }
        Ok(self.runtime.as_ref().expect("just made"))
    }

    /// Calls for every input, `concurrency` at a time; the answers in input
    /// order, or in the order they came.
    fn call_all(&mut self, inputs: Vec<In>) -> Result<Vec<Out>> {
        let (call, options, name) = (self.call.clone(), self.options, self.name.clone());
        let count = inputs.len();
        let runtime = self.runtime()?;
        let answers = runtime.block_on(async move {
            let permits = Arc::new(tokio::sync::Semaphore::new(options.concurrency));
            let mut calls = tokio::task::JoinSet::new();
            for (index, input) in inputs.into_iter().enumerate() {
                let permit =
                    permits.clone().acquire_owned().await.map_err(|e| {
                        Error::Internal(format!("{name}: the call limit closed: {e}"))
                    })?;
                let future = call(input);
                calls.spawn(async move {
                    let answer = tokio::time::timeout(options.timeout, future).await;
                    drop(permit);
                    (index, answer)
                });
            }
            let mut answers: Vec<(usize, Out)> = Vec::with_capacity(count);
            while let Some(joined) = calls.join_next().await {
                let (index, answer) =
                    joined.map_err(|e| Error::Source(format!("{name}: a call panicked: {e}")))?;
                match answer {
                    Ok(Ok(out)) => answers.push((index, out)),
                    Ok(Err(e)) => {
                        return Err(Error::Source(format!(
                            "{name}: the call for row {index} of the batch failed: {e}"
                        )))
                    }
                    Err(_) => {
                        return Err(Error::Source(format!(
                            "{name}: the call for row {index} of the batch took longer than {:?}",
                            options.timeout
                        )))
                    }
                }
            }
            Ok::<_, Error>(answers)
        })?;
        let mut answers = answers;
        if self.options.ordered {
            answers.sort_by_key(|(index, _)| *index);
        }
        Ok(answers.into_iter().map(|(_, out)| out).collect())
    }

    fn emit(&self, answers: Vec<Out>, out: &mut Vec<Row>) -> Result<()> {
        for answer in answers {
            out.push(
                crate::typed::to_row(&answer).map_err(|reason| Error::Expression {
                    expression: format!("{}: serialize an answer", self.name),
                    reason,
                })?,
            );
        }
        Ok(())
    }
}

impl<In, Out> Operator for AsyncStep<In, Out>
where
    In: DeserializeOwned + Send + 'static,
    Out: Serialize + Send + 'static,
{
    fn describe(&self) -> String {
        format!(
            "{} (async, {} in flight, {:?} timeout, {})",
            self.name,
            self.options.concurrency,
            self.options.timeout,
            if self.options.ordered {
                "ordered"
            } else {
                "unordered"
            }
        )
    }

    fn on_row(&mut self, row: Row, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let input: In = crate::typed::from_row(&row).map_err(|reason| Error::Expression {
            expression: format!(
                "{}: deserialize row into {}",
                self.name,
                std::any::type_name::<In>()
            ),
            reason,
        })?;
        if ctx.real_time {
            let answers = self.call_all(vec![input])?;
            return self.emit(answers, out);
        }
        self.pending.push(input);
        Ok(())
    }

    fn on_batch_end(&mut self, _ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let inputs = std::mem::take(&mut self.pending);
        if inputs.is_empty() {
            return Ok(());
        }
        let answers = self.call_all(inputs)?;
        self.emit(answers, out)
    }
}
