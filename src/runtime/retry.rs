//! Waiting between tries of something that failed and may heal (a broker
//! restarting, a leader being elected), and logging the failure without
//! flooding the log: a retry loop with neither ran at full speed during a
//! broker restart and wrote two million warnings in two seconds.

use std::time::{Duration, Instant};

/// A capped exponential backoff: the wait after the first failure of a
/// streak, doubled after each further one up to a cap; a success starts
/// the next streak from the first wait again.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
    failures: u32,
}

impl Backoff {
    /// Waits `first` after a first failure, doubling up to `cap`.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Backoff {
            first,
            cap,
            next: first,
            failures: 0,
        }
    }

    /// Counts a failure and returns how long to wait before the next try.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// Counts a failure and waits what [`Backoff::failed`] says, but not
    /// past `deadline` (a batch's end) by more than the first wait: a
    /// deadline already passed still waits that long, so that a loop
    /// calling this never spins.
    pub fn wait_after_failure(&mut self, deadline: Option<Instant>) {
        let wait = self.failed();
        let wait = match deadline {
            Some(deadline) => wait.min(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(self.first),
            ),
            None => wait,
        };
        std::thread::sleep(wait);
    }

    /// The streak ended well: the next failure waits the first wait again.
    pub fn succeeded(&mut self) {
        self.next = self.first;
        self.failures = 0;
    }

    /// Failures in the current streak.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// A warning that may repeat many times a second: it is logged at its first
/// occurrence and then at most once per interval, saying how often it
/// happened since it was last logged.
#[derive(Debug, Clone)]
pub struct RepeatedWarning {
    interval: Duration,
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl RepeatedWarning {
    /// Logged at most once per `interval`.
    pub const fn new(interval: Duration) -> Self {
        RepeatedWarning {
            interval,
            last_logged: None,
            unlogged: 0,
        }
    }

    /// Counts one occurrence. `Some(n)` when this one is to be logged, `n`
    /// being the occurrences since the last one logged, this one included.
    pub fn occurred(&mut self) -> Option<u64> {
        self.unlogged = self.unlogged.saturating_add(1);
        let due = self
            .last_logged
            .is_none_or(|at| at.elapsed() >= self.interval);
        if !due {
            return None;
        }
        self.last_logged = Some(Instant::now());
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// The interval the engine's repeated warnings are logged at.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_its_cap_and_a_success_starts_again() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let waits: Vec<u128> = (0..5).map(|_| backoff.failed().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 700, 700]);
        assert_eq!(backoff.failures(), 5);
        backoff.succeeded();
        assert_eq!(backoff.failures(), 0);
        assert_eq!(backoff.failed(), Duration::from_millis(100));
    }

    #[test]
    fn a_wait_ends_at_its_deadline_but_never_spins() {
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(30));
        backoff.failed();
        let started = Instant::now();
        backoff.wait_after_failure(Some(Instant::now() + Duration::from_millis(50)));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(40) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        // Past its deadline it still waits the first wait, never spins.
        let started = Instant::now();
        backoff.wait_after_failure(Some(Instant::now()));
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert_eq!(backoff.failures(), 3);
    }

    #[test]
    fn a_repeated_warning_is_logged_once_per_interval_with_its_count() {
        let mut warning = RepeatedWarning::new(Duration::from_millis(200));
        assert_eq!(warning.occurred(), Some(1), "the first is logged at once");
        let logged: Vec<u64> = (0..1000).filter_map(|_| warning.occurred()).collect();
        assert!(logged.is_empty(), "{logged:?}");
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(warning.occurred(), Some(1001));
    }
}
