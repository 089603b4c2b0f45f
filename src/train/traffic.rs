//! The traffic of a run, per rank and by direction, inside its host and across hosts: the
//! sparse exchange's bytes as counted, the dense bytes as counted by ringrec's own backends
//! or as modelled ([`crate::comm::traffic`]), gathered on every rank for the summary.

use super::summary::RankTraffic;
use super::Trainer;
use crate::comm::count;
use crate::comm::traffic::Traffic;
use crate::device::Device;

impl<D: Device> Trainer<'_, D> {
    /// Every rank's dense traffic (the engine's collectives, and scope host's host
    /// allreduces) as modelled, and as counted where every rank's backends count it
    /// (collective: gathered on every rank).
    pub(super) fn dense_traffic(&self, s: &crate::engine::StatsSnapshot) -> (Vec<RankTraffic>, Option<Vec<RankTraffic>>) {
        let (host_counted, host_model) = self.local.as_ref().map_or((Some(Traffic::default()), Traffic::default()), |l| l.host_traffic());
        let mut m = Traffic::from_array(s.modelled_traffic);
        m.add(host_model);
        let model = self.gather_traffic(m.to_array().map(|b| b.round() as u64));
        let engine_counted = s.counted_traffic.map(|c| Traffic::from_array(c.map(|b| b as f64)));
        let mine = count::sum(engine_counted, host_counted).map_or([u64::MAX; 4], |t| t.to_array().map(|b| b as u64));
        let counted = self.gather_traffic(mine);
        let all = counted.iter().all(|t| t.intra_host_sent != u64::MAX);
        (model, all.then_some(counted))
    }

    /// Every rank's sparse-exchange bytes by direction, over every table (collective: gathered on every rank).
    pub(super) fn traffic_per_rank(&self) -> Vec<RankTraffic> {
        let mut t = crate::sparse::SparseStats::default();
        self.stages().iter().for_each(|(_, s)| t.add(&s.traffic_totals()));
        self.gather_traffic([t.host_bytes_sent, t.host_bytes_received, t.cross_bytes_sent, t.cross_bytes_received])
    }

    /// Every rank's `[intra sent, intra received, cross sent, cross received]` (collective:
    /// gathered on every rank).
    fn gather_traffic(&self, t: [u64; 4]) -> Vec<RankTraffic> {
        let all = self.topo.control().all_gather("every rank's traffic", [t[0], t[1], t[2], t[3], self.topo.host_id as u64]);
        all.iter()
            .enumerate()
            .map(|(rank, c)| RankTraffic { rank, host: c[4] as usize, intra_host_sent: c[0], intra_host_received: c[1], cross_host_sent: c[2], cross_host_received: c[3] })
            .collect()
    }
}
