//! The live web page: a running query's progress over time, as Spark UI's
//! Structured Streaming tab shows it. The page and its script are embedded
//! (nothing is fetched from the internet); it polls `/api/progress`.

use axum::extract::State;
use axum::response::Html;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tidemark::progress::QueryProgress;

/// How many recent progress reports are kept (Spark keeps 100:
/// `spark.sql.streaming.numRecentProgressUpdates`).
const RECENT: usize = 100;

/// The page, its style and script in one file.
const PAGE: &str = include_str!("ui/index.html");

/// The recent progress of one query, fed by its progress listener and read
/// by the page.
#[derive(Clone, Default)]
pub struct ProgressHistory {
    inner: Arc<Mutex<History>>,
}

#[derive(Default)]
struct History {
    recent: VecDeque<Value>,
    batches: u64,
    last: Option<Value>,
}

impl ProgressHistory {
    /// Keeps `progress` among the recent reports.
    pub fn record(&self, progress: &QueryProgress) {
        let Ok(report) = serde_json::to_value(progress) else {
            return;
        };
        let mut history = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if history.recent.len() == RECENT {
            history.recent.pop_front();
        }
        history.recent.push_back(report.clone());
        history.batches += 1;
        history.last = Some(report);
    }

    /// The recent reports, oldest first (Spark's `recentProgress`).
    pub fn recent(&self) -> Vec<Value> {
        let history = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        history.recent.iter().cloned().collect()
    }

    /// Spark's `StreamingQueryStatus`, plus the query's names and the
    /// batches run.
    pub fn status(&self) -> Value {
        let history = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(last) = &history.last else {
            return json!({
                "message": "Initializing sources",
                "isDataAvailable": false,
                "isTriggerActive": false,
                "batches": 0,
            });
        };
        let data = last["numInputRows"].as_u64().unwrap_or(0) > 0;
        json!({
            "name": last["name"],
            "id": last["id"],
            "runId": last["runId"],
            "message": if data { "Waiting for next trigger" } else { "Waiting for data to arrive" },
            "isDataAvailable": data,
            "isTriggerActive": false,
            "batches": history.batches,
            "lastBatchId": last["batchId"],
        })
    }
}

pub(crate) fn router(history: ProgressHistory) -> Router {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/api/progress",
            get(|State(h): State<ProgressHistory>| async move { Json(h.recent()) }),
        )
        .route(
            "/api/status",
            get(|State(h): State<ProgressHistory>| async move { Json(h.status()) }),
        )
        .route("/healthz", get(crate::connections::healthz))
        .with_state(history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_keeps_the_last_hundred_reports_and_says_what_the_query_waits_for() {
        let history = ProgressHistory::default();
        assert_eq!(history.status()["message"], "Initializing sources");
        for batch in 0..150 {
            let progress = QueryProgress {
                batch_id: batch,
                num_input_rows: batch % 2,
                ..Default::default()
            };
            history.record(&progress);
        }
        let recent = history.recent();
        assert_eq!(recent.len(), 100);
        assert_eq!(recent[0]["batchId"], 50);
        assert_eq!(history.status()["batches"], 150);
        assert_eq!(history.status()["message"], "Waiting for next trigger");
    }
}
