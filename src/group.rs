//! An MPI communicator and what keeps MPI alive for it ([`Group`], [`MpiContext`]): the
//! handle every collective, segment and thread that talks to other ranks holds. Made by
//! [`crate::topology::Topology::init`] (world, local, cross), which re-exports both.

use std::sync::Arc;

use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};

/// Keeps MPI initialised while anything that holds a communicator is alive.
/// Every owner of a [`SimpleCommunicator`] also holds one of these, declared *after*
/// the communicator so the communicator is freed before `MPI_Finalize`.
pub struct MpiContext {
    _universe: Universe,
}

impl MpiContext {
    /// Holds MPI initialised for as long as the context lives.
    pub(crate) fn new(universe: Universe) -> MpiContext {
        MpiContext { _universe: universe }
    }
}

impl std::fmt::Debug for MpiContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MpiContext")
    }
}

/// An MPI communicator with the context that keeps MPI alive for it.
pub struct Group {
    /// The communicator. Declared first: dropped (freed) before `ctx`.
    pub comm: SimpleCommunicator,
    /// Keeps MPI initialised.
    pub ctx: Arc<MpiContext>,
}

impl Group {
    /// This process' rank in the group.
    pub fn rank(&self) -> usize {
        self.comm.rank() as usize
    }
    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.comm.size() as usize
    }
    /// A private copy of the communicator (its own tag space), as backends take.
    pub fn duplicate(&self) -> Group {
        Group { comm: self.comm.duplicate(), ctx: self.ctx.clone() }
    }
}
