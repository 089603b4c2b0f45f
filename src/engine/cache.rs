//! The response cache: after a tensor was negotiated once, a steady-state step costs one
//! bit per tensor in one small allreduce instead of a round trip to the coordinator
//! (Horovod's response cache).
//!
//! Every rank inserts the same requests in the same order (those of the responses every
//! rank executed), so bit positions agree everywhere. A full cache takes no new entries;
//! a removed entry frees its bit for the next insertion.

use std::collections::HashMap;

use super::message::{OpKind, Request};

/// What the cache knows of a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Cached with this exact call: its bit.
    Hit(usize),
    /// The name is cached with a different call (shape, dtype, ...): its bit, to invalidate.
    Stale(usize),
    /// Not cached.
    Miss,
}

/// Bit position → cached request.
pub struct ResponseCache {
    slots: Vec<Option<Request>>,
    by_name: HashMap<String, usize>,
}

impl ResponseCache {
    /// A cache of `capacity` entries (0 disables it).
    pub fn new(capacity: usize) -> ResponseCache {
        ResponseCache { slots: (0..capacity).map(|_| None).collect(), by_name: HashMap::new() }
    }

    /// Number of bits.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Whether the request may be cached at all: allreduce and broadcast outside groups
    /// (allgather sizes change from call to call).
    pub fn cacheable(r: &Request) -> bool {
        matches!(r.kind, OpKind::Allreduce | OpKind::Broadcast) && r.group.is_none()
    }

    /// Looks `r` up.
    pub fn lookup(&self, r: &Request) -> Lookup {
        match self.by_name.get(&r.name) {
            None => Lookup::Miss,
            Some(&bit) => match &self.slots[bit] {
                Some(c) if c.same_call(r) && Self::cacheable(r) => Lookup::Hit(bit),
                _ => Lookup::Stale(bit),
            },
        }
    }

    /// The request cached at `bit`.
    pub fn get(&self, bit: usize) -> Option<&Request> {
        self.slots.get(bit).and_then(|s| s.as_ref())
    }

    /// Caches `r` at the lowest free bit (nothing when full, not cacheable or present).
    pub fn insert(&mut self, r: &Request) {
        if !Self::cacheable(r) || self.by_name.contains_key(&r.name) {
            return;
        }
        if let Some(bit) = self.slots.iter().position(|s| s.is_none()) {
            let mut r = r.clone();
            r.age_us = 0;
            self.by_name.insert(r.name.clone(), bit);
            self.slots[bit] = Some(r);
        }
    }

    /// Drops the entry at `bit`.
    pub fn remove(&mut self, bit: usize) {
        if let Some(Some(r)) = self.slots.get_mut(bit).map(|s| s.take()) {
            self.by_name.remove(&r.name);
        }
    }
}

/// A fixed-length bit vector over u64 words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bits(pub Vec<u64>);

impl Bits {
    /// `n` zero bits.
    pub fn zeros(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    /// Sets bit `i`.
    pub fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    /// Bit `i`.
    pub fn get(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 == 1
    }
    /// Positions of the set bits, ascending.
    pub fn ones(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (w, word) in self.0.iter().enumerate() {
            let mut x = *word;
            while x != 0 {
                out.push(w * 64 + x.trailing_zeros() as usize);
                x &= x - 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::compression::Compression;
    use super::*;
    use crate::dtype::{DType, ReduceOp};

    fn req(name: &str, n: usize) -> Request {
        Request { name: name.into(), kind: OpKind::Allreduce, dtype: DType::F32, location: crate::tensor::Location::Host, shape: vec![n], op: ReduceOp::Sum, root: 0, compression: Compression::None, group: None, age_us: 5 }
    }

    #[test]
    fn hits_stale_entries_and_bit_reuse() {
        let mut c = ResponseCache::new(2);
        assert_eq!(c.lookup(&req("a", 3)), Lookup::Miss);
        c.insert(&req("a", 3));
        c.insert(&req("b", 3));
        c.insert(&req("c", 3)); // full
        assert_eq!(c.lookup(&req("a", 3)), Lookup::Hit(0));
        assert_eq!(c.lookup(&req("b", 3)), Lookup::Hit(1));
        assert_eq!(c.lookup(&req("c", 3)), Lookup::Miss);
        assert_eq!(c.lookup(&req("a", 4)), Lookup::Stale(0));
        c.remove(0);
        assert_eq!(c.lookup(&req("a", 3)), Lookup::Miss);
        c.insert(&req("c", 3));
        assert_eq!(c.lookup(&req("c", 3)), Lookup::Hit(0));
        let mut g = req("g", 1);
        g.kind = OpKind::Allgather;
        c.remove(1);
        c.insert(&g);
        assert_eq!(c.lookup(&g), Lookup::Miss);
    }

    #[test]
    fn bits() {
        let mut b = Bits::zeros(130);
        assert_eq!(b.0.len(), 3);
        b.set(0);
        b.set(64);
        b.set(129);
        assert_eq!(b.ones(), vec![0, 64, 129]);
    }
}
