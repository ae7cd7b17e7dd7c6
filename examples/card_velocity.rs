//! Card velocity: a fraud rule written as a stateful processor.
//!
//! Per card (the record key), in offset order:
//! - a card's *period* runs from its first row (or its last idle row); its
//!   idle time is the period's latest `ts` + 30 minutes, kept as an
//!   event-time timer. A row at or after the idle time first emits the
//!   idle row and clears the card; otherwise the idle row is emitted when
//!   the watermark reaches the idle time. The idle row counts and sums
//!   every row of the period;
//! - an approved row of 500 or more, with at least 3 kept declines in the
//!   10 minutes up to it, emits an alert and forgets the kept declines.
//!
//! Settings from the environment: `KAFKA_BOOTSTRAP` and `STATE_DIR`
//! (required), `INPUT_TOPIC` (`card-transactions`), `OUTPUT_TOPIC`
//! (`card-alerts`), `APP_ID` (`card-velocity`). Runs `exactly_once` until
//! SIGTERM or SIGINT (exit 0), resuming from its state directory and
//! committed offsets; malformed records go to `<APP_ID>-dlq`.
//!
//! ```text
//! KAFKA_BOOTSTRAP=127.0.0.1:9092 STATE_DIR=/tmp/cv cargo run --example card_velocity
//! ```

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidemark::operators::processor::*;
use tidemark::time::{format_rfc3339, parse_rfc3339, TimestampMicros};
use tidemark::watermark::WatermarkScope;
use tidemark_connectors::KafkaApp;

const MINUTE: TimestampMicros = 60_000_000;
/// A card is idle this long after its period's latest row.
const IDLE_AFTER: TimestampMicros = 30 * MINUTE;
/// Declines count toward an alert this long before the approval.
const DECLINE_WINDOW: TimestampMicros = 10 * MINUTE;
const LARGE_AMOUNT: f64 = 500.0;
const DECLINES_FOR_ALERT: usize = 3;

/// One transaction, as the input topic holds it: the input's columns are
/// this type's fields (`KafkaApp::stream`).
#[derive(Deserialize)]
struct Transaction {
    /// The record key's column: the processor is handed it as its key.
    #[allow(dead_code)]
    card: String,
    ts: String,
    amount: f64,
    status: Status,
}

#[derive(Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Status {
    Approved,
    Declined,
}

/// The card's current period.
#[derive(Serialize, Deserialize)]
struct Period {
    latest: TimestampMicros,
    transactions: u64,
    total: f64,
    /// How many declines the `declines` list keeps (so that a card with
    /// none never reads it).
    #[serde(default)]
    kept_declines: u64,
    /// The oldest kept decline's time (so that the list is read to forget
    /// declines only once one can go).
    #[serde(default)]
    oldest_decline: Option<TimestampMicros>,
}

/// What the processor writes.
#[derive(Serialize)]
#[serde(untagged)]
enum Alert {
    Idle {
        card: String,
        ts: String,
        rule: &'static str,
        transactions: u64,
        total: f64,
    },
    DeclinesThenLarge {
        card: String,
        ts: String,
        rule: &'static str,
        declines: u64,
        amount: f64,
    },
}

/// The per-card rules (see the module documentation).
struct CardVelocity {
    period: ValueState<Period>,
    /// The event times of the period's kept declines.
    declines: ListState<TimestampMicros>,
}

impl CardVelocity {
    fn new(states: &mut StateDeclarations) -> tidemark::Result<Self> {
        Ok(CardVelocity {
            period: states.value("period")?,
            declines: states.list("declines")?,
        })
    }

    /// Emits the period's idle row and forgets the card.
    fn go_idle(
        &self,
        card: &str,
        period: &Period,
        ctx: &mut ProcessorContext<'_, Alert>,
    ) -> ProcessorResult {
        ctx.emit(Alert::Idle {
            card: card.to_string(),
            ts: format_rfc3339(period.latest + IDLE_AFTER),
            rule: "idle",
            transactions: period.transactions,
            total: period.total,
        });
        ctx.clear_all()
    }

    /// Counts a row into the card's period (opening one if none is
    /// open) and applies the decline rule.
    fn count(
        &self,
        card: &str,
        row: &Transaction,
        ts: TimestampMicros,
        period: &mut Option<Period>,
        ctx: &mut ProcessorContext<'_, Alert>,
    ) -> ProcessorResult {
        let p = period.get_or_insert(Period {
            latest: ts,
            transactions: 0,
            total: 0.0,
            kept_declines: 0,
            oldest_decline: None,
        });
        p.latest = p.latest.max(ts);
        p.transactions += 1;
        p.total += row.amount;
        match row.status {
            Status::Declined => {
                self.declines.append(ctx, &ts)?;
                p.kept_declines += 1;
                p.oldest_decline = Some(p.oldest_decline.map_or(ts, |o| o.min(ts)));
            }
            Status::Approved if row.amount >= LARGE_AMOUNT && p.kept_declines >= 3 => {
                let recent = self
                    .declines
                    .get(ctx)?
                    .into_iter()
                    .filter(|d| *d > ts - DECLINE_WINDOW && *d <= ts)
                    .count();
                if recent >= DECLINES_FOR_ALERT {
                    ctx.emit(Alert::DeclinesThenLarge {
                        card: card.to_string(),
                        ts: format_rfc3339(ts),
                        rule: "declines_then_large",
                        declines: recent as u64,
                        amount: row.amount,
                    });
                    self.declines.clear(ctx)?;
                    p.kept_declines = 0;
                    p.oldest_decline = None;
                }
            }
            Status::Approved => {}
        }
        Ok(())
    }

    /// Forgets the declines the watermark passed by 10 minutes (they can
    /// count no more).
    fn forget_old_declines(
        &self,
        period: &mut Period,
        ctx: &mut ProcessorContext<'_, Alert>,
    ) -> ProcessorResult {
        let watermark = ctx.watermark();
        match period.oldest_decline {
            Some(oldest) if oldest.saturating_add(DECLINE_WINDOW) <= watermark => {}
            // Kept by a version that did not note the oldest: read the list.
            None if period.kept_declines > 0 => {}
            _ => return Ok(()),
        }
        let kept = self.declines.get(ctx)?;
        let keep: Vec<TimestampMicros> = kept
            .iter()
            .copied()
            .filter(|d| d.saturating_add(DECLINE_WINDOW) > watermark)
            .collect();
        if keep.len() < kept.len() {
            self.declines.put(ctx, &keep)?;
            period.kept_declines = keep.len() as u64;
        }
        period.oldest_decline = keep.iter().copied().min();
        Ok(())
    }
}

impl StatefulProcessor for CardVelocity {
    type Input = Transaction;
    type Output = Alert;

    fn handle_inputs(
        &mut self,
        key: &GroupKey,
        rows: Vec<Transaction>,
        ctx: &mut ProcessorContext<'_, Alert>,
    ) -> ProcessorResult {
        let card = key.as_str().unwrap_or_default().to_string();
        // Read once, written once: the rows of a batch change it in memory.
        let mut period = self.period.get(ctx)?;
        let mut timer = period.as_ref().map(|p| p.latest + IDLE_AFTER);
        for row in rows {
            let ts =
                parse_rfc3339(&row.ts).ok_or_else(|| format!("`ts` {:?} is not a time", row.ts))?;
            if let Some(p) = period.as_ref().filter(|p| ts >= p.latest + IDLE_AFTER) {
                self.go_idle(&card, p, ctx)?;
                (period, timer) = (None, None);
            }
            self.count(&card, &row, ts, &mut period, ctx)?;
        }
        let Some(mut period) = period else {
            return Ok(());
        };
        self.forget_old_declines(&mut period, ctx)?;
        let idle_at = period.latest + IDLE_AFTER;
        if timer != Some(idle_at) {
            if let Some(old) = timer {
                ctx.delete_timer(TimeDomain::EventTime, old)?;
            }
            ctx.register_event_time_timer(idle_at)?;
        }
        self.period.set(ctx, &period)
    }

    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        timer: Timer,
        ctx: &mut ProcessorContext<'_, Alert>,
    ) -> ProcessorResult {
        let card = key.as_str().unwrap_or_default().to_string();
        match self.period.get(ctx)? {
            Some(period) if period.latest + IDLE_AFTER == timer.time => {
                self.go_idle(&card, &period, ctx)
            }
            _ => Ok(()),
        }
    }
}

fn required(name: &str) -> anyhow::Result<String> {
    std::env::var(name).map_err(|_| anyhow::anyhow!("set {name}"))
}

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let running = KafkaApp::new(&setting("APP_ID", "card-velocity"))
        .bootstrap(&required("KAFKA_BOOTSTRAP")?)
        .stream::<Transaction>(&setting("INPUT_TOPIC", "card-transactions"))
        .keyed_by(&["card"])
        .event_time("ts", "1 minute")
        .watermark_scope(WatermarkScope::Partition)
        .process("card_velocity", &["card"], CardVelocity::new)
        .output_mode(tidemark::operators::OutputMode::Update)
        .to_topic(&setting("OUTPUT_TOPIC", "card-alerts"), &["card"])
        .create_output_topic()
        .state_dir(required("STATE_DIR")?)
        .exactly_once()
        .trigger_every(Duration::from_millis(500))
        .start()?;
    running.stop_on_signals()?;
    let summary = running.wait()?;
    eprintln!(
        "{} batches, {} records in, {} rows out, {} bad records",
        summary.batches, summary.input_records, summary.output_rows, summary.bad_records
    );
    Ok(())
}
