//! Test hooks that break a batch's commit where a real fault would, so that
//! tests can show recovery from every step of the commit protocol. Each is
//! off unless its environment variable names the batch.
//!
//! - `TIDEMARK_CRASH_AFTER_SINK_COMMIT=<batch id>` aborts the process right
//!   after the sink committed that batch and before the source offsets are
//!   committed, as a `kill -9` at the worst moment would.
//! - `TIDEMARK_CRASH_AFTER_SOURCE_COMMIT=<batch id>` aborts it right after
//!   the source committed, before a sink that commits per task published
//!   what it staged (Delta from Kafka).
//! - `TIDEMARK_FAIL_COMMIT=<step>:<batch id>` makes step `<step>` of that
//!   batch's commit fail once per process as a rebalance or a broker error
//!   would (the batch is aborted and replayed): `before_sink_commit`,
//!   `after_sink_commit` (for Delta: after the table commit, or after
//!   staging when it commits per task), or
//!   `after_offsets_added` (inside the Kafka transaction, once the offsets
//!   were added to it).
//!
//! The hooks exist only with the `fault-injection` cargo feature (the
//! CLI's tests turn it on); without it every hook does nothing, so no
//! environment variable can crash or fail a shipped binary.

use crate::error::{Error, Result};
use std::sync::Mutex;

/// Steps already failed in this process (each fails once, so that its
/// replay can succeed).
static FIRED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// A step armed for the source's transaction to fail at.
static ARMED: Mutex<Option<String>> = Mutex::new(None);

/// Aborts the process at `point` of batch `batch_id` when
/// `TIDEMARK_CRASH_<POINT>` names that batch.
pub(super) fn crash_point(point: &str, batch_id: u64) {
    if !cfg!(feature = "fault-injection") {
        return;
    }
    let variable = format!("TIDEMARK_CRASH_{}", point.to_uppercase());
    if std::env::var(&variable).is_ok_and(|v| v.trim() == batch_id.to_string()) {
        eprintln!("{variable}={batch_id}: aborting");
        std::process::abort();
    }
}

/// Whether `TIDEMARK_FAIL_COMMIT` names `step` of `batch_id` and that step
/// has not failed yet in this process (it is marked failed).
fn due(step: &str, batch_id: u64) -> bool {
    if !cfg!(feature = "fault-injection") {
        return false;
    }
    let wanted = format!("{step}:{batch_id}");
    if !std::env::var("TIDEMARK_FAIL_COMMIT").is_ok_and(|v| v.trim() == wanted) {
        return false;
    }
    let mut fired = FIRED.lock().unwrap_or_else(|p| p.into_inner());
    if fired.contains(&wanted) {
        return false;
    }
    fired.push(wanted);
    true
}

/// Fails `step` of batch `batch_id` as an aborted batch, once, when
/// `TIDEMARK_FAIL_COMMIT` says so.
pub(super) fn fail_point(step: &str, batch_id: u64) -> Result<()> {
    if due(step, batch_id) {
        eprintln!("TIDEMARK_FAIL_COMMIT={step}:{batch_id}: failing the commit");
        return Err(Error::BatchAborted(format!(
            "injected failure at {step} of batch {batch_id}"
        )));
    }
    Ok(())
}

/// Arms `step` for the source's transaction of batch `batch_id` when
/// `TIDEMARK_FAIL_COMMIT` says so (see [`fire_armed`]).
pub(super) fn arm(step: &str, batch_id: u64) {
    if due(step, batch_id) {
        *ARMED.lock().unwrap_or_else(|p| p.into_inner()) = Some(step.to_string());
    }
}

/// Whether `step` was armed for the transaction being committed (disarms
/// it): the transactional source fails its commit there.
pub fn fire_armed(step: &str) -> bool {
    if !cfg!(feature = "fault-injection") {
        return false;
    }
    let mut armed = ARMED.lock().unwrap_or_else(|p| p.into_inner());
    if armed.as_deref() == Some(step) {
        *armed = None;
        eprintln!("TIDEMARK_FAIL_COMMIT={step}: failing the transaction");
        return true;
    }
    false
}
