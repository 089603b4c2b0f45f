//! [`PhaseTimer`]: wall time per phase of a step, summed over the run (one timer for
//! every phase: a step moves from one phase to the next); [`DeviceWait`]: the time the
//! device waited for the host between steps (the `gpu_wait` phase).

use std::collections::BTreeMap;
use std::time::Instant;

use crate::device::{Device, DeviceResult};

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

/// The time the dense model's device stood idle between steps, waiting for the host (the
/// `gpu_wait` of `phase_seconds`): a [`Device::mark`] after a step's last work, one before
/// the next step's first (its upload), and the device's time between the two. On a GPU
/// that is the CUDA events' elapsed time, on the host-kernels device its queue's
/// timestamps, on the CPU device the host time between the steps' device work.
pub struct DeviceWait<M> {
    /// The mark after the last step's work.
    after: Option<M>,
    /// The last gap's two marks, timed at the next gap (long reached then: no wait).
    pending: Option<(M, M)>,
    seconds: f64,
}

impl<M> Default for DeviceWait<M> {
    fn default() -> DeviceWait<M> {
        DeviceWait { after: None, pending: None, seconds: 0.0 }
    }
}

impl<M> DeviceWait<M> {
    /// After a step's last work on `dev`.
    pub fn step_done<D: Device<Mark = M>>(&mut self, dev: &D) -> DeviceResult<()> {
        self.after = Some(dev.mark()?);
        Ok(())
    }

    /// Before a step's first work on `dev`: closes the gap since the last step.
    pub fn step_starts<D: Device<Mark = M>>(&mut self, dev: &D) -> DeviceResult<()> {
        if let Some(from) = self.after.take() {
            let to = dev.mark()?;
            if let Some((a, b)) = self.pending.replace((from, to)) {
                self.seconds += dev.seconds_between(&a, &b)?;
            }
        }
        Ok(())
    }

    /// Seconds the device waited so far (times the last gap: may wait for its mark).
    pub fn seconds<D: Device<Mark = M>>(&mut self, dev: &D) -> DeviceResult<f64> {
        if let Some((a, b)) = self.pending.take() {
            self.seconds += dev.seconds_between(&a, &b)?;
        }
        Ok(self.seconds)
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

    #[test]
    fn the_device_wait_counts_the_gaps_between_steps_only() {
        let dev = crate::device::CpuDevice::new(1);
        let mut w = DeviceWait::default();
        let t = Instant::now();
        w.step_starts(&dev).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        w.step_done(&dev).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        w.step_starts(&dev).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        w.step_done(&dev).unwrap();
        let s = w.seconds(&dev).unwrap();
        // The 30 ms between the steps, not the 40 ms of the steps themselves.
        assert!(s >= 0.03 && s <= t.elapsed().as_secs_f64() - 0.04, "{s}");
    }
}
