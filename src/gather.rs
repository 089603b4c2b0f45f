//! MPI's own gathers of byte pieces of any length ([`mpi_allgatherv`], [`mpi_gatherv`]: the
//! lengths travel first) and their result, [`Gathered`]. Below every layer that gathers:
//! the settings check of [`crate::topology::Topology::agree_settings`], the `mpi` and
//! `hier` backends of `comm` (which re-exports [`Gathered`]).

use mpi::collective::{CommunicatorCollectives, Root};
use mpi::datatype::PartitionMut;
use mpi::topology::Communicator;

use crate::{CommError, CommResult};

/// The result of an allgatherv or gatherv: every rank's bytes, concatenated in rank order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gathered {
    /// All pieces, rank 0 first.
    pub data: Vec<u8>,
    /// Length in bytes of each rank's piece.
    pub counts: Vec<usize>,
}

impl Gathered {
    /// Rank `r`'s piece.
    pub fn piece(&self, r: usize) -> &[u8] {
        let start: usize = self.counts[..r].iter().sum();
        &self.data[start..start + self.counts[r]]
    }
}

/// MPI_Allgatherv of byte pieces (lengths exchanged first).
pub fn mpi_allgatherv(comm: &mpi::topology::SimpleCommunicator, send: &[u8]) -> CommResult<Gathered> {
    let n = comm.size() as usize;
    let mine = send.len() as u64;
    let mut lens = vec![0u64; n];
    comm.all_gather_into(&mine, &mut lens[..]);
    let counts: Vec<usize> = lens.iter().map(|l| *l as usize).collect();
    let total: usize = counts.iter().sum();
    if counts.iter().any(|c| *c > i32::MAX as usize) || total > i32::MAX as usize {
        return Err(CommError::Invalid("allgatherv over MPI is limited to 2 GiB in total".into()));
    }
    let mut data = vec![0u8; total];
    if total == 0 {
        return Ok(Gathered { data, counts });
    }
    let c32: Vec<i32> = counts.iter().map(|c| *c as i32).collect();
    let displs = displacements(&c32);
    let anchor = [0u8; 8];
    {
        let mut part = PartitionMut::new(&mut data[..], &c32[..], &displs[..]);
        comm.all_gather_varcount_into(not_in_place(send, &anchor), &mut part);
    }
    Ok(Gathered { data, counts })
}

/// MPI_Gatherv of byte pieces to `root`.
pub fn mpi_gatherv(comm: &mpi::topology::SimpleCommunicator, send: &[u8], root: usize) -> CommResult<Option<Gathered>> {
    let n = comm.size() as usize;
    let me = comm.rank() as usize;
    let root_proc = comm.process_at_rank(root as i32);
    // Every rank learns every length, so all agree on skipping an empty gather.
    let mine = send.len() as u64;
    let mut lens = vec![0u64; n];
    comm.all_gather_into(&mine, &mut lens[..]);
    let counts: Vec<usize> = lens.iter().map(|l| *l as usize).collect();
    let total: usize = counts.iter().sum();
    if total > i32::MAX as usize {
        return Err(CommError::Invalid("gatherv over MPI is limited to 2 GiB in total".into()));
    }
    if total == 0 {
        return Ok((me == root).then(|| Gathered { data: Vec::new(), counts }));
    }
    let anchor = [0u8; 8];
    let send = not_in_place(send, &anchor);
    if me == root {
        let c32: Vec<i32> = counts.iter().map(|c| *c as i32).collect();
        let displs = displacements(&c32);
        let mut data = vec![0u8; total];
        {
            let mut part = PartitionMut::new(&mut data[..], &c32[..], &displs[..]);
            root_proc.gather_varcount_into_root(send, &mut part);
        }
        Ok(Some(Gathered { data, counts }))
    } else {
        root_proc.gather_varcount_into(send);
        Ok(None)
    }
}

/// An empty slice that does not point at address 1: Open MPI defines `MPI_IN_PLACE` as
/// `(void *)1`, which is exactly where Rust puts empty byte slices.
fn not_in_place<'a>(s: &'a [u8], anchor: &'a [u8; 8]) -> &'a [u8] {
    if s.is_empty() {
        &anchor[..0]
    } else {
        s
    }
}

fn displacements(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}
