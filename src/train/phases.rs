//! [`PhaseTimer`]: wall time per phase of a step, summed over the run (one timer for
//! every phase: a step moves from one phase to the next).

use std::collections::BTreeMap;
use std::time::Instant;

/// Seconds spent per named phase.
#[derive(Default)]
pub struct PhaseTimer {
    totals: BTreeMap<&'static str, f64>,
    current: Option<(&'static str, Instant)>,
}

impl PhaseTimer {
    /// Ends the current phase (if any) and starts `name`.
    pub fn enter(&mut self, name: &'static str) {
        let now = Instant::now();
        self.close(now);
        self.current = Some((name, now));
    }

    /// Ends the current phase.
    pub fn stop(&mut self) {
        self.close(Instant::now());
    }

    fn close(&mut self, now: Instant) {
        if let Some((name, since)) = self.current.take() {
            *self.totals.entry(name).or_insert(0.0) += (now - since).as_secs_f64();
        }
    }

    /// Seconds spent in `name` so far.
    pub fn seconds(&self, name: &str) -> f64 {
        self.totals.get(name).copied().unwrap_or(0.0)
    }

    /// Every phase's seconds, by name.
    pub fn totals(&self) -> BTreeMap<String, f64> {
        self.totals.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_a_stopped_timer_adds_nothing() {
        let mut t = PhaseTimer::default();
        t.enter("a");
        std::thread::sleep(std::time::Duration::from_millis(20));
        t.enter("b");
        t.enter("a");
        std::thread::sleep(std::time::Duration::from_millis(5));
        t.stop();
        t.stop();
        assert!(t.seconds("a") >= 0.025, "{}", t.seconds("a"));
        assert!(t.seconds("b") < 0.01);
        assert_eq!(t.seconds("c"), 0.0);
        assert_eq!(t.totals().keys().collect::<Vec<_>>(), ["a", "b"]);
    }
}
