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

/// A call's index in the batch and its answer, or its timeout.
type Answered<Out> = (
    usize,
    std::result::Result<std::result::Result<Out, CallError>, tokio::time::error::Elapsed>,
);

/// Waits for the next call to answer and keeps its answer; a failure or a
/// timeout is the batch's error.
async fn take_answer<Out: Send + 'static>(
    calls: &mut tokio::task::JoinSet<Answered<Out>>,
    answers: &mut Vec<(usize, Out)>,
    name: &str,
    timeout: Duration,
) -> Result<()> {
    let Some(joined) = calls.join_next().await else {
        return Ok(());
    };
    let (index, answer) =
        joined.map_err(|e| Error::source_failed(format!("{name}: a call panicked"), e))?;
    match answer {
        Ok(Ok(out)) => {
            answers.push((index, out));
            Ok(())
        }
        Ok(Err(e)) => Err(Error::source_failed(
            format!("{name}: the call for row {index} of the batch failed"),
            e,
        )),
        Err(_) => Err(Error::Source(format!(
            "{name}: the call for row {index} of the batch took longer than {timeout:?}"
        ))),
    }
}

/// The operator (see the module documentation).
pub struct AsyncStep<In, Out> {
    name: String,
    call: Call<In, Out>,
    options: AsyncOptions,
    pending: Vec<In>,
}

/// The runtime every async step's calls run on, shared by every task of
/// the process: a client the user's call captures (an HTTP or gRPC
/// client) keeps its connections' background work on the runtime that
/// opened them, and it runs there between batches and for every task.
fn calls_runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tidemark-async-calls")
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime of async steps", e))?;
    Ok(RUNTIME.get_or_init(|| runtime))
}

/// Runs `future` to its end on the calls' runtime; from a thread that is
/// itself inside a runtime (a `#[tokio::test]` driving the test driver),
/// on a thread of its own, since a runtime cannot block inside another.
fn run_to_end<T: Send>(future: impl Future<Output = T> + Send) -> Result<T> {
    let runtime = calls_runtime()?;
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(runtime.block_on(future));
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime.block_on(future))
            .join()
            .map_err(|_| Error::Internal("an async step's calls panicked".into()))
    })
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
        })
    }

    /// Calls for every input, `concurrency` at a time; the answers in input
    /// order, or in the order they came. The first failure ends the batch
    /// as soon as it comes (the other calls are cancelled).
    fn call_all(&mut self, inputs: Vec<In>) -> Result<Vec<Out>> {
        let (call, options, name) = (self.call.clone(), self.options, self.name.clone());
        let count = inputs.len();
        let mut answers = run_to_end(async move {
            let mut calls = tokio::task::JoinSet::new();
            let mut answers: Vec<(usize, Out)> = Vec::with_capacity(count);
            for (index, input) in inputs.into_iter().enumerate() {
                // A free slot: the answers that came are taken first.
                while calls.len() >= options.concurrency {
                    take_answer(&mut calls, &mut answers, &name, options.timeout).await?;
                }
                let future = call(input);
                calls.spawn(
                    async move { (index, tokio::time::timeout(options.timeout, future).await) },
                );
            }
            while !calls.is_empty() {
                take_answer(&mut calls, &mut answers, &name, options.timeout).await?;
            }
            Ok::<_, Error>(answers)
        })??;
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
