//! Rank 0's side of negotiation: which named tensors every rank has submitted, whether
//! they agree, and which have waited too long (stall detection).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::message::{Request, Response};

struct Entry {
    reqs: Vec<Option<Request>>,
    first_seen: Instant,
}

/// The coordinator's message table.
pub struct Coordinator {
    size: usize,
    order: Vec<String>,
    table: HashMap<String, Entry>,
    groups: HashMap<String, Vec<Response>>,
    stall_check: Option<Duration>,
    stall_shutdown: Option<Duration>,
    last_warning: Option<Instant>,
}

impl Coordinator {
    /// For `size` ranks; warns about tensors waiting longer than `stall_check` and stops
    /// the job after `stall_shutdown` (`None`: never).
    pub fn new(size: usize, stall_check: Option<Duration>, stall_shutdown: Option<Duration>) -> Coordinator {
        Coordinator { size, order: Vec::new(), table: HashMap::new(), groups: HashMap::new(), stall_check, stall_shutdown, last_warning: None }
    }

    /// True while some tensor waits for some rank.
    pub fn has_pending(&self) -> bool {
        !self.table.is_empty() || !self.groups.is_empty()
    }

    /// Records `rank`'s requests.
    pub fn ingest(&mut self, rank: usize, reqs: Vec<Request>, now: Instant) {
        for r in reqs {
            let since = now.checked_sub(Duration::from_micros(r.age_us)).unwrap_or(now);
            let e = self.table.entry(r.name.clone()).or_insert_with(|| {
                self.order.push(r.name.clone());
                Entry { reqs: vec![None; self.size], first_seen: since }
            });
            e.first_seen = e.first_seen.min(since);
            e.reqs[rank] = Some(r);
        }
    }

    /// Takes the tensors every rank has submitted, in the order they were first seen:
    /// a response each (an error response where ranks disagree). Grouped tensors come out
    /// together once the whole group is ready.
    pub fn ready(&mut self) -> Vec<Response> {
        let mut out = Vec::new();
        let mut keep = Vec::new();
        for name in std::mem::take(&mut self.order) {
            let complete = self.table.get(&name).is_some_and(|e| e.reqs.iter().all(|r| r.is_some()));
            if !complete {
                keep.push(name);
                continue;
            }
            let Some(e) = self.table.remove(&name) else { continue };
            let reqs: Vec<Request> = e.reqs.into_iter().flatten().collect();
            let first = &reqs[0];
            let bad: Vec<usize> = (1..reqs.len()).filter(|r| !reqs[*r].same_call(first)).collect();
            let mut resp = Response::for_request(first);
            if !bad.is_empty() {
                let mut detail = format!("rank 0: {}", first.describe());
                for r in bad.iter().take(8) {
                    detail.push_str(&format!("; rank {r}: {}", reqs[*r].describe()));
                }
                if bad.iter().any(|r| reqs[*r].location != first.location) {
                    detail.push_str("; some ranks gave a device tensor, others one in host memory");
                }
                resp.error = Some(detail);
                out.push(resp);
                continue;
            }
            match &first.group {
                None => out.push(resp),
                Some(g) => {
                    let members = self.groups.entry(g.id.clone()).or_default();
                    members.push(resp);
                    if members.len() >= g.size as usize {
                        out.extend(self.groups.remove(&g.id).unwrap_or_default());
                    }
                }
            }
        }
        self.order = keep;
        out
    }

    /// A warning naming each tensor that waited longer than the stall-check time and the
    /// ranks that have not submitted it (at most once per check interval), and the
    /// shutdown message once one waited longer than the shutdown time.
    pub fn stall_report(&mut self, now: Instant) -> (String, String) {
        let Some(check) = self.stall_check else { return (String::new(), String::new()) };
        let mut stalled = Vec::new();
        let mut oldest = Duration::ZERO;
        for name in &self.order {
            let Some(e) = self.table.get(name) else { continue };
            let waited = now.saturating_duration_since(e.first_seen);
            if waited >= check {
                let missing: Vec<usize> = (0..self.size).filter(|r| e.reqs[*r].is_none()).collect();
                stalled.push(format!("'{name}' (waiting {:.1} s for rank(s) {missing:?})", waited.as_secs_f64()));
                oldest = oldest.max(waited);
            }
        }
        if stalled.is_empty() {
            return (String::new(), String::new());
        }
        let list = stalled.join(", ");
        let hint = "one or more ranks did not submit these tensors: check that every rank runs the same model and submits the same names";
        if self.stall_shutdown.is_some_and(|s| oldest >= s) {
            let secs = self.stall_shutdown.map_or(0.0, |s| s.as_secs_f64());
            return (String::new(), format!("stalled for more than {secs:.0} s (RINGREC_STALL_SHUTDOWN_TIME_SECONDS): {list}; {hint}"));
        }
        if self.last_warning.is_some_and(|t| now.duration_since(t) < check) {
            return (String::new(), String::new());
        }
        self.last_warning = Some(now);
        (format!("stall: tensor(s) waiting for more than {:.0} s: {list}; {hint}", check.as_secs_f64()), String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::super::compression::Compression;
    use super::super::message::{GroupTag, OpKind};
    use super::*;
    use crate::dtype::{DType, ReduceOp};

    fn req(name: &str, n: usize) -> Request {
        Request { name: name.into(), kind: OpKind::Allreduce, dtype: DType::F32, location: crate::tensor::Location::Host, shape: vec![n], op: ReduceOp::Sum, root: 0, compression: Compression::None, group: None, age_us: 0 }
    }

    #[test]
    fn ready_when_every_rank_submitted_and_mismatches_named() {
        let now = Instant::now();
        let mut c = Coordinator::new(3, Some(Duration::from_secs(1)), Some(Duration::from_secs(3)));
        c.ingest(0, vec![req("a", 4), req("b", 4)], now);
        c.ingest(1, vec![req("b", 4), req("a", 4)], now);
        assert!(c.ready().is_empty());
        c.ingest(2, vec![req("b", 5)], now);
        let r = c.ready();
        assert_eq!(r.len(), 1);
        let e = r[0].error.as_deref().unwrap();
        assert!(e.contains("rank 0: allreduce float [4] sum; rank 2: allreduce float [5] sum"), "{e}");
        assert!(!e.contains("device"), "{e}");
        // 'a' still waits for rank 2: a stall warning after 1 s, shutdown after 3 s.
        assert_eq!(c.stall_report(now + Duration::from_millis(500)), (String::new(), String::new()));
        let (w, s) = c.stall_report(now + Duration::from_millis(1500));
        assert!(w.contains("'a' (waiting 1.5 s for rank(s) [2])"), "{w}");
        assert!(s.is_empty());
        assert_eq!(c.stall_report(now + Duration::from_millis(1600)).0, "", "one warning per interval");
        let (_, s) = c.stall_report(now + Duration::from_millis(3100));
        assert!(s.contains("stalled for more than 3 s") && s.contains("'a'"), "{s}");
        // A device tensor on one rank and a host tensor on another: named, and said so.
        let mut c = Coordinator::new(2, None, None);
        c.ingest(0, vec![Request { location: crate::tensor::Location::Device, ..req("d", 4) }], now);
        c.ingest(1, vec![req("d", 4)], now);
        let e = c.ready()[0].error.clone().unwrap_or_default();
        assert!(e.contains("rank 0: allreduce float [4] on a device sum; rank 1: allreduce float [4] sum; some ranks gave a device tensor, others one in host memory"), "{e}");
    }

    #[test]
    fn groups_come_out_together() {
        let now = Instant::now();
        let mut c = Coordinator::new(1, None, None);
        let g = Some(GroupTag { id: "g".into(), size: 2 });
        c.ingest(0, vec![Request { group: g.clone(), ..req("x", 1) }], now);
        assert!(c.ready().is_empty());
        assert!(c.has_pending());
        c.ingest(0, vec![Request { group: g, ..req("y", 1) }, req("z", 1)], now);
        let names: Vec<String> = c.ready().iter().map(|r| r.entries[0].name.clone()).collect();
        assert_eq!(names, vec!["x", "y", "z"]);
        assert!(!c.has_pending());
    }
}
