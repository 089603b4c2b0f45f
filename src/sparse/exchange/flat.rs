//! The `flat` mode of the exchange: every rank's list to every rank over the world, merged
//! in the order `hier` uses, so both modes are bit-identical.

use super::*;

impl SparseExchanger {
    /// `flat`: every rank allgathers every rank's list over the world and merges them all.
    pub(super) fn flat(&mut self, own: SparseResult<()>, st: &mut SparseStats) -> SparseResult<()> {
        if self.host_only {
            return Err(SparseError::Invalid("the flat exchange has no host-only steps (--sync-every > 1 needs --sparse-exchange hier)".into()));
        }
        let mine = encode_piece(self.rank, self.wire_dim, own, &self.b.own, false, &mut self.b.send);
        let t = Instant::now();
        let gathered = match &mut self.net {
            Some(net) => net.allgatherv_raw(&self.b.send).map_err(SparseError::from),
            None => Err(SparseError::Invalid("the flat exchange has no world communicator".into())),
        };
        st.cross_s = t.elapsed().as_secs_f64();
        let global = match (mine, gathered) {
            (Err(e), _) => Err(e),
            (Ok(()), Err(e)) => Err(e),
            (Ok(()), Ok(g)) => {
                let sent = self.b.send.len() as u64;
                for r in (0..self.world).filter(|r| *r != self.rank) {
                    let received = g.counts.get(r).copied().unwrap_or(0) as u64;
                    if self.host_ranks[self.host_id].contains(&r) {
                        st.host_bytes_sent += sent;
                        st.host_bytes_received += received;
                    } else {
                        st.cross_bytes_sent += sent;
                        st.cross_bytes_received += received;
                    }
                }
                self.merge_world(&g, st)
            }
        };
        if global.is_ok() {
            self.normalise(st);
        }
        global
    }

    /// Every rank's list, grouped like `hier` does: per host in local-rank order, then the
    /// hosts in host order, into `b.result`.
    fn merge_world(&mut self, g: &Gathered, st: &mut SparseStats) -> SparseResult<()> {
        let t = Instant::now();
        if g.counts.len() != self.world {
            return Err(SparseError::Invalid(format!("world allgather returned {} pieces for {} ranks", g.counts.len(), self.world)));
        }
        let b = &mut self.b;
        at_least(&mut b.pieces, self.world);
        at_least(&mut b.hosts, self.num_hosts);
        for r in (0..self.world).filter(|r| *r != self.rank) {
            decode_piece(g.piece(r), self.wire_dim, r, 1, &mut b.pieces[r])?;
        }
        for (h, ranks) in self.host_ranks.iter().enumerate() {
            let refs: Vec<&SparseList> = ranks.iter().map(|r| if *r == self.rank { &b.own } else { &b.pieces[*r] }).collect();
            merge_into(&refs, self.wire_dim, &mut b.hosts[h]);
        }
        let refs: Vec<&SparseList> = b.hosts[..self.num_hosts].iter().collect();
        merge_into(&refs, self.wire_dim, &mut b.result);
        if self.local_rank == 0 {
            st.keys_host = b.hosts[self.host_id].len() as u64;
        }
        st.merge_s += t.elapsed().as_secs_f64();
        Ok(())
    }
}
