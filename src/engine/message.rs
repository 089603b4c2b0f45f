//! What ranks tell the coordinator (requests) and what it answers (responses), with their
//! byte encoding.

use super::compression::Compression;
use crate::dtype::{DType, ReduceOp};
use crate::tensor::Location;

fn location_code(l: Location) -> u8 {
    match l {
        Location::Host => 0,
        Location::Device => 1,
    }
}

fn location_from(c: u8) -> Option<Location> {
    match c {
        0 => Some(Location::Host),
        1 => Some(Location::Device),
        _ => None,
    }
}

/// The collective a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Reduce element-wise over ranks.
    Allreduce,
    /// Concatenate every rank's tensor along the first dimension.
    Allgather,
    /// Copy the root's tensor to every rank.
    Broadcast,
}

impl OpKind {
    /// Its name in messages and the timeline.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Allreduce => "allreduce",
            OpKind::Allgather => "allgather",
            OpKind::Broadcast => "broadcast",
        }
    }
    /// The timeline's activity name.
    pub fn activity(self) -> &'static str {
        match self {
            OpKind::Allreduce => "ALLREDUCE",
            OpKind::Allgather => "ALLGATHER",
            OpKind::Broadcast => "BROADCAST",
        }
    }
    fn code(self) -> u8 {
        self as u8
    }
    fn from_code(c: u8) -> Option<OpKind> {
        [OpKind::Allreduce, OpKind::Allgather, OpKind::Broadcast].get(c as usize).copied()
    }
}

/// Membership in a grouped submission: all members are executed in the same cycle.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupTag {
    /// The group's id (the same on every rank).
    pub id: String,
    /// Number of tensors in the group.
    pub size: u32,
}

/// One rank's request for one named tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The tensor name, unique among the tensors in flight.
    pub name: String,
    /// The collective.
    pub kind: OpKind,
    /// Element type.
    pub dtype: DType,
    /// Where the tensor lives (host memory or a device).
    pub location: Location,
    /// Shape.
    pub shape: Vec<usize>,
    /// Reduction (allreduce).
    pub op: ReduceOp,
    /// Root rank (broadcast).
    pub root: u32,
    /// Compression in effect (see [`Compression::effective`]).
    pub compression: Compression,
    /// The group it belongs to, if any.
    pub group: Option<GroupTag>,
    /// Microseconds since the rank submitted it (for stall reports; not part of the call).
    pub age_us: u64,
}

impl Request {
    /// Number of elements.
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Same call as `o` (everything but the age)? For allgather the first dimension may differ.
    pub fn same_call(&self, o: &Request) -> bool {
        let shapes = match self.kind {
            OpKind::Allgather => self.shape.len() == o.shape.len() && self.shape.get(1..) == o.shape.get(1..),
            _ => self.shape == o.shape,
        };
        self.name == o.name && self.kind == o.kind && self.dtype == o.dtype && self.location == o.location && shapes && self.op == o.op && self.root == o.root && self.compression == o.compression && self.group == o.group
    }

    /// `allreduce float32 [4, 5] sum`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} {} {:?}", self.kind.name(), self.dtype, self.shape);
        if self.location == Location::Device {
            s.push_str(" on a device");
        }
        match self.kind {
            OpKind::Allreduce => s.push_str(&format!(" {}", self.op)),
            OpKind::Broadcast => s.push_str(&format!(" root {}", self.root)),
            OpKind::Allgather => {}
        }
        if self.compression != Compression::None {
            s.push_str(&format!(" compression {}", self.compression.name()));
        }
        if let Some(g) = &self.group {
            s.push_str(&format!(" group {} of {}", g.id, g.size));
        }
        s
    }
}

/// One tensor of a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Tensor name.
    pub name: String,
    /// Elements (allreduce, broadcast); 0 for allgather, whose sizes differ per rank.
    pub count: u64,
}

/// What every rank executes: one collective over one or (after fusion) several tensors,
/// or an error for them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The collective.
    pub kind: OpKind,
    /// Element type.
    pub dtype: DType,
    /// Where the tensors live.
    pub location: Location,
    /// Reduction.
    pub op: ReduceOp,
    /// Broadcast root.
    pub root: u32,
    /// Compression.
    pub compression: Compression,
    /// The tensors, in buffer order.
    pub entries: Vec<Entry>,
    /// When set, the tensors fail with this message instead.
    pub error: Option<String>,
}

impl Response {
    /// The response that executes `r` alone.
    pub fn for_request(r: &Request) -> Response {
        Response {
            kind: r.kind,
            dtype: r.dtype,
            location: r.location,
            op: r.op,
            root: r.root,
            compression: r.compression,
            entries: vec![Entry { name: r.name.clone(), count: if r.kind == OpKind::Allgather { 0 } else { r.count() as u64 } }],
            error: None,
        }
    }

    /// Bytes its tensors occupy (allreduce and broadcast).
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.count as usize).sum::<usize>() * self.dtype.size()
    }

    /// The bytes this rank contributes as they travel: (allreduced, allgathered). fp16/bf16
    /// halve an allreduce (unless the backend `widens_halves` back to f32 to reduce them);
    /// 1-bit sends its encodings (one scale per `onebit_block` values) by allgather;
    /// broadcasts count in neither.
    pub fn wire_bytes(&self, widens_halves: bool, onebit_block: usize) -> (usize, usize) {
        let count = || self.entries.iter().map(|e| e.count as usize).sum::<usize>();
        match (self.kind, self.compression) {
            (OpKind::Allreduce, Compression::Fp16 | Compression::Bf16) => (count() * if widens_halves { 4 } else { 2 }, 0),
            (OpKind::Allreduce, c) if c.is_onebit() => (0, self.entries.iter().map(|e| super::compression::onebit_len(e.count as usize, onebit_block)).sum()),
            (OpKind::Allreduce, _) => (self.bytes(), 0),
            (OpKind::Allgather, _) => (0, self.bytes()),
            (OpKind::Broadcast, _) => (0, 0),
        }
    }
}

/// What the coordinator broadcasts each negotiation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseList {
    /// Ready tensors, in execution order (before fusion).
    pub responses: Vec<Response>,
    /// The fusion threshold every rank uses (bytes).
    pub fusion_threshold: u64,
    /// The cycle time every rank uses (microseconds).
    pub cycle_time_us: u64,
    /// True while the autotuner still searches (negotiation then runs every cycle).
    pub tuning: bool,
    /// A stall warning every rank prints (empty: none).
    pub stall_warning: String,
    /// When not empty, the engine stops on every rank with this message.
    pub shutdown: String,
}

/// Little-endian writer.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }

    /// Appends a request.
    pub fn request(&mut self, r: &Request) {
        self.str(&r.name);
        self.u8(r.kind.code());
        self.u32(r.dtype.code());
        self.u8(location_code(r.location));
        self.u32(r.shape.len() as u32);
        for d in &r.shape {
            self.u64(*d as u64);
        }
        self.u32(r.op.code());
        self.u32(r.root);
        self.u8(r.compression.code());
        match &r.group {
            Some(g) => {
                self.u8(1);
                self.str(&g.id);
                self.u32(g.size);
            }
            None => self.u8(0),
        }
        self.u64(r.age_us);
    }

    /// Appends a response list.
    pub fn response_list(&mut self, l: &ResponseList) {
        self.u64(l.fusion_threshold);
        self.u64(l.cycle_time_us);
        self.u8(l.tuning as u8);
        self.str(&l.stall_warning);
        self.str(&l.shutdown);
        self.u32(l.responses.len() as u32);
        for r in &l.responses {
            self.u8(r.kind.code());
            self.u32(r.dtype.code());
            self.u8(location_code(r.location));
            self.u32(r.op.code());
            self.u32(r.root);
            self.u8(r.compression.code());
            self.str(r.error.as_deref().unwrap_or(""));
            self.u8(r.error.is_some() as u8);
            self.u32(r.entries.len() as u32);
            for e in &r.entries {
                self.str(&e.name);
                self.u64(e.count);
            }
        }
    }
}

/// Bounds-checked little-endian reader: every read is `None` past the end.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads `buf` from the start.
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }
    /// True when everything was read.
    pub fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }

    /// Reads a request.
    pub fn request(&mut self) -> Option<Request> {
        let name = self.str()?;
        let kind = OpKind::from_code(self.u8()?)?;
        let dtype = DType::from_code(self.u32()?)?;
        let location = location_from(self.u8()?)?;
        let dims = self.u32()? as usize;
        if dims > 64 {
            return None;
        }
        let shape = (0..dims).map(|_| self.u64().map(|d| d as usize)).collect::<Option<Vec<_>>>()?;
        let op = ReduceOp::from_code(self.u32()?)?;
        let root = self.u32()?;
        let compression = Compression::from_code(self.u8()?)?;
        let group = match self.u8()? {
            0 => None,
            _ => Some(GroupTag { id: self.str()?, size: self.u32()? }),
        };
        let age_us = self.u64()?;
        Some(Request { name, kind, dtype, location, shape, op, root, compression, group, age_us })
    }

    /// Reads a response list.
    pub fn response_list(&mut self) -> Option<ResponseList> {
        let fusion_threshold = self.u64()?;
        let cycle_time_us = self.u64()?;
        let tuning = self.u8()? != 0;
        let stall_warning = self.str()?;
        let shutdown = self.str()?;
        let n = self.u32()? as usize;
        let mut responses = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            let kind = OpKind::from_code(self.u8()?)?;
            let dtype = DType::from_code(self.u32()?)?;
            let location = location_from(self.u8()?)?;
            let op = ReduceOp::from_code(self.u32()?)?;
            let root = self.u32()?;
            let compression = Compression::from_code(self.u8()?)?;
            let err = self.str()?;
            let error = (self.u8()? != 0).then_some(err);
            let m = self.u32()? as usize;
            let entries = (0..m).map(|_| Some(Entry { name: self.str()?, count: self.u64()? })).collect::<Option<Vec<_>>>()?;
            responses.push(Response { kind, dtype, location, op, root, compression, entries, error });
        }
        Some(ResponseList { responses, fusion_threshold, cycle_time_us, tuning, stall_warning, shutdown })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(name: &str) -> Request {
        Request {
            name: name.into(),
            kind: OpKind::Allreduce,
            dtype: DType::F32,
            location: Location::Host,
            shape: vec![3, 4],
            op: ReduceOp::Average,
            root: 0,
            compression: Compression::Fp16,
            group: Some(GroupTag { id: "g".into(), size: 2 }),
            age_us: 17,
        }
    }

    #[test]
    fn requests_and_responses_round_trip() {
        let mut w = Writer::default();
        w.request(&req("a"));
        w.request(&Request { group: None, kind: OpKind::Broadcast, root: 3, location: Location::Device, ..req("b") });
        let mut r = Reader::new(&w.0);
        assert_eq!(r.request(), Some(req("a")));
        let b = r.request().unwrap();
        assert_eq!((b.root, b.location), (3, Location::Device));
        assert!(r.at_end());
        let mut resp = Response::for_request(&req("a"));
        resp.error = Some("bad".into());
        let on_device = Response::for_request(&Request { location: Location::Device, ..req("c") });
        let l = ResponseList { responses: vec![resp, on_device], fusion_threshold: 9, cycle_time_us: 1000, tuning: true, stall_warning: "w".into(), shutdown: String::new() };
        let mut w = Writer::default();
        w.response_list(&l);
        assert_eq!(Reader::new(&w.0).response_list(), Some(l));
        // Truncated input never panics.
        for cut in 0..w.0.len() {
            assert!(Reader::new(&w.0[..cut]).response_list().is_none());
        }
    }

    #[test]
    fn allgather_requests_may_differ_in_the_first_dimension() {
        let a = Request { kind: OpKind::Allgather, shape: vec![3, 4], ..req("x") };
        assert!(a.same_call(&Request { shape: vec![5, 4], ..a.clone() }));
        assert!(!a.same_call(&Request { shape: vec![5, 3], ..a.clone() }));
        assert!(!req("x").same_call(&Request { shape: vec![4, 3], ..req("x") }));
        assert!(req("x").same_call(&Request { age_us: 99, ..req("x") }));
        // A tensor on a device is not the same call as one in host memory.
        assert!(!req("x").same_call(&Request { location: Location::Device, ..req("x") }));
    }
}
