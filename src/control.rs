//! The control channel: the world's small agreements — the largest, least or summed value
//! of a few numbers, every rank's few numbers, rank 0's decision — for code that otherwise
//! speaks to its peers through the engine (tensors). The trainer's scalars travel here (its
//! stop-signal check, its `--stop-at-*` decision, its summary's counts), so `src/train`
//! calls no MPI itself.
//!
//! Every call is collective over the world ([`Topology::world`]) and registers its wait
//! with the watchdog under the caller's words (`what`), so a rank that never joins is named
//! ([`crate::watchdog::waiting`]). The values are plain numbers MPI knows (`u64`, `i32`,
//! `f64`, ...), a few at a time: bulk data goes through the collectives backends
//! ([`crate::comm`]) or the engine.

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::datatype::Equivalence;
use mpi::traits::{Communicator, Root};

use crate::topology::Topology;

/// The world's control channel (see the module docs), from [`Topology::control`].
#[derive(Clone, Copy)]
pub struct Control<'a> {
    topo: &'a Topology,
}

impl Topology {
    /// The control channel over the world's ranks ([`crate::control`]).
    pub fn control(&self) -> Control<'_> {
        Control { topo: self }
    }
}

impl Control<'_> {
    /// Waits until every rank got here (`what`: the watchdog's words for the wait).
    pub fn barrier(&self, what: &'static str) {
        let _w = crate::watchdog::waiting(what);
        self.topo.world.comm.barrier();
    }

    /// The largest of every rank's `mine`, on every rank.
    pub fn all_max<T: Equivalence + Copy + Default>(&self, what: &'static str, mine: T) -> T {
        self.reduce(what, [mine], SystemOperation::max())[0]
    }

    /// The least of every rank's `mine`, on every rank.
    pub fn all_min<T: Equivalence + Copy + Default>(&self, what: &'static str, mine: T) -> T {
        self.reduce(what, [mine], SystemOperation::min())[0]
    }

    /// The sum of every rank's `mine`, on every rank.
    pub fn all_sum<T: Equivalence + Copy + Default>(&self, what: &'static str, mine: T) -> T {
        self.all_sum_each(what, [mine])[0]
    }

    /// Each of `mine`'s values summed over the ranks, on every rank.
    pub fn all_sum_each<T: Equivalence + Copy + Default, const N: usize>(&self, what: &'static str, mine: [T; N]) -> [T; N] {
        self.reduce(what, mine, SystemOperation::sum())
    }

    /// Every rank's `mine`, in rank order, on every rank.
    pub fn all_gather<T: Equivalence + Copy + Default, const N: usize>(&self, what: &'static str, mine: [T; N]) -> Vec<[T; N]> {
        let mut all = vec![T::default(); N * self.topo.size];
        {
            let _w = crate::watchdog::waiting(what);
            self.topo.world.comm.all_gather_into(&mine, &mut all[..]);
        }
        all.chunks_exact(N.max(1))
            .map(|c| {
                let mut a = [T::default(); N];
                a.copy_from_slice(&c[..N]);
                a
            })
            .collect()
    }

    /// Rank 0's `mine`, on every rank (the others' `mine` is ignored): rank 0 decides,
    /// every rank learns the decision.
    pub fn broadcast<T: Equivalence + Copy + Default, const N: usize>(&self, what: &'static str, mine: [T; N]) -> [T; N] {
        let mut v = mine;
        let _w = crate::watchdog::waiting(what);
        self.topo.world.comm.process_at_rank(0).broadcast_into(&mut v);
        v
    }

    /// `mine` reduced element-wise by `op` over the ranks, on every rank.
    fn reduce<T: Equivalence + Copy + Default, const N: usize>(&self, what: &'static str, mine: [T; N], op: SystemOperation) -> [T; N] {
        let mut out = [T::default(); N];
        let _w = crate::watchdog::waiting(what);
        self.topo.world.comm.all_reduce_into(&mine, &mut out, op);
        out
    }
}

#[cfg(test)]
mod tests {
    /// The trainer speaks to its peers through the engine (tensors), the collectives
    /// backends (start-up and evaluation data) and the control channel (scalars): no file
    /// under `src/train` calls MPI itself.
    #[test]
    fn the_trainer_calls_no_mpi() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/train");
        let mut files = vec![dir];
        let mut offenders = Vec::new();
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).expect("src/train is readable").map(|e| e.expect("a directory entry").path()));
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).expect("a source file is readable");
                offenders.extend(text.lines().enumerate().filter(|(_, l)| l.contains("mpi::")).map(|(i, l)| format!("{}:{}: {}", p.display(), i + 1, l.trim())));
            }
        }
        assert!(offenders.is_empty(), "src/train calls MPI; use topo.control() (src/control.rs):\n{}", offenders.join("\n"));
    }
}
