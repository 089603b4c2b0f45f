//! Header agreement over MPI: every rank allgathers a 32-byte [`Header`] and compares.

use mpi::collective::CommunicatorCollectives;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::{check_headers, Header};
use crate::CommResult;

/// Allgathers `mine` over `comm`; returns every rank's header.
pub fn exchange(comm: &SimpleCommunicator, mine: &Header) -> Vec<Header> {
    let words = mine.to_words();
    let mut all = vec![0u64; 4 * comm.size() as usize];
    comm.all_gather_into(&words[..], &mut all[..]);
    all.chunks_exact(4).map(|c| Header::from_words(&[c[0], c[1], c[2], c[3]])).collect()
}

/// Fails on every rank, naming the disagreeing ranks, unless all headers agree.
pub fn agree(comm: &SimpleCommunicator, mine: &Header) -> CommResult<Vec<Header>> {
    let all = exchange(comm, mine);
    check_headers(mine, &all)?;
    Ok(all)
}
