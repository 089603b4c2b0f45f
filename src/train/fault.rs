//! Fault injection for the tests of failure handling: the `RINGREC_FAULT_*` settings (read
//! once in [`crate::config::RuntimeConfig`]) as one value whose hooks
//! [`super::Trainer::step`] calls before the step's work — a rank that exits abruptly (`RINGREC_FAULT_EXIT`, once
//! per `RINGREC_FAULT_ONCE` file), or a step's gradients made NaN (`RINGREC_FAULT_NAN`,
//! through the loss scale, so every gradient the step produces is NaN). A run without
//! these settings takes none of these paths.

use std::path::PathBuf;

use crate::topology::Topology;

/// This rank's injected faults (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Faults {
    rank: usize,
    /// `RINGREC_FAULT_EXIT` on this rank: exit before the step after this many steps.
    exit: Option<u64>,
    /// `RINGREC_FAULT_NAN` on this rank: the gradients of the step after this many steps.
    nan: Option<u64>,
    /// `RINGREC_FAULT_ONCE`: the exit fires only while this file does not exist, and
    /// creates it.
    once: Option<PathBuf>,
}

impl Faults {
    /// The faults `topo.config` injects on this rank.
    pub fn new(topo: &Topology) -> Faults {
        let c = &topo.config;
        let mine = |f: Option<(usize, u64)>| f.filter(|(rank, _)| *rank == topo.rank).map(|(_, step)| step);
        Faults { rank: topo.rank, exit: mine(c.fault_exit), nan: mine(c.fault_nan), once: c.fault_once.clone() }
    }

    /// Before the step after `step` steps: exits the process (status 3) when this rank's
    /// exit is due.
    pub fn before_step(&self, step: u64) {
        if self.exit == Some(step) && self.fires() {
            crate::eprint_line(&format!("ringrec: fault injection: rank {} exits at step {step}", self.rank));
            std::process::exit(3);
        }
    }

    /// The loss scale `scale` of the step after `step` steps (`local`: a local step of
    /// `--sync-every`), or NaN when this rank's gradients of that step are to be NaN
    /// (saying so).
    pub fn poison_grads(&self, step: u64, local: bool, scale: f32) -> f32 {
        if self.nan != Some(step) {
            return scale;
        }
        let which = if local { "local step" } else { "step" };
        crate::eprint_line(&format!("ringrec: fault injection: rank {} makes the gradients of {which} {} NaN", self.rank, step + 1));
        f32::NAN
    }

    /// Whether a due fault fires: always, or with `RINGREC_FAULT_ONCE` only when its file
    /// can still be created (by this call).
    fn fires(&self) -> bool {
        self.once.as_ref().is_none_or(|p| std::fs::OpenOptions::new().write(true).create_new(true).open(p).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_ranks_named_step_gets_nan_gradients() {
        let none = Faults::default();
        assert_eq!(none.poison_grads(3, false, 0.25), 0.25);
        let nan = Faults { rank: 1, nan: Some(3), ..Faults::default() };
        assert_eq!(nan.poison_grads(2, false, 0.25), 0.25);
        assert!(nan.poison_grads(3, true, 0.25).is_nan());
        assert_eq!(nan.poison_grads(4, false, 0.25), 0.25);
        // An exit due at another step does nothing here.
        Faults { exit: Some(9), ..nan }.before_step(3);
    }

    #[test]
    fn a_fault_once_fires_while_its_file_does_not_exist() {
        let p = std::env::temp_dir().join(format!("ringrec-fault-once-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let f = Faults { once: Some(p.clone()), ..Faults::default() };
        assert!(f.fires());
        assert!(!f.fires(), "the first firing created {}", p.display());
        std::fs::remove_file(&p).expect("the fault created its file");
        assert!(Faults::default().fires());
    }
}
