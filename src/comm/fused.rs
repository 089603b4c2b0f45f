//! The layout of a fusion buffer in which every tensor is reduced as if it were alone.
//!
//! A ring of p ranks (3 or more) adds an element's p inputs in an order set by the ring
//! part the element falls in: part i starts at rank i and travels right. Cut a fusion
//! buffer into p parts by its total length and an element's part — so the bits of its
//! sum — depend on where its tensor sits in the buffer, that is on which tensors the
//! engine's cycle happened to fuse with it. [`FusedLayout`] cuts every member (tensor) by
//! its own length instead: part i of the buffer is `part(len_m, p, i)` of every member m,
//! in member order, and the buffer is laid out part-major (part 0 of every member, then
//! part 1, ...). A backend that reduces part i of such a buffer as its part i reduces
//! every element exactly as it reduces it in its tensor alone (where the layout of one
//! member is the plain concatenation).
//!
//! Layouts nest, one level per cut of the backend's algorithm: the ring has one level
//! (`[p]`); `hier` two (`[local size, hosts]`: the host's ranks share the buffer, then
//! each share goes round the ring across hosts). A backend whose sums do not depend on an
//! element's position (`shm`: rank order for every element) or whose order is not
//! ringrec's to set (`mpi`, NCCL) has none: the layout is the concatenation.

use std::ops::Range;

use super::scattered::ByteView;
use crate::partition::part;
use crate::{CommError, CommResult};

/// A run of consecutive elements of one member, placed at `at` in the fusion buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The member (tensor) index.
    pub member: usize,
    /// Its elements inside the member.
    pub range: Range<usize>,
    /// Element offset in the fusion buffer.
    pub at: usize,
}

/// One part at one level: its elements in the fusion buffer and its parts one level down.
#[derive(Clone, Debug)]
struct Node {
    range: Range<usize>,
    children: Vec<Node>,
}

/// A fusion buffer's layout: members cut by their own lengths at every level, part-major
/// (see the module docs).
#[derive(Clone, Debug)]
pub struct FusedLayout {
    levels: Vec<usize>,
    /// Member m's elements, `starts[m]..starts[m + 1]`, in the members' concatenation.
    starts: Vec<usize>,
    blocks: Vec<Block>,
    root: Node,
}

impl FusedLayout {
    /// The layout of members of `lens` elements for a backend cutting at `levels` (part
    /// counts, outermost first; empty: the concatenation).
    pub fn new(lens: &[usize], levels: &[usize]) -> FusedLayout {
        let starts: Vec<usize> = std::iter::once(0)
            .chain(lens.iter().scan(0usize, |acc, n| {
                *acc += n;
                Some(*acc)
            }))
            .collect();
        let members: Vec<(usize, Range<usize>)> = lens.iter().enumerate().map(|(m, n)| (m, 0..*n)).collect();
        let mut blocks = Vec::new();
        let mut at = 0;
        let root = Self::node(&members, levels, &mut at, &mut blocks);
        FusedLayout { levels: levels.to_vec(), starts, blocks, root }
    }

    /// Lays out `members` (ranges inside members) cut at `levels` from element `at` on.
    fn node(members: &[(usize, Range<usize>)], levels: &[usize], at: &mut usize, blocks: &mut Vec<Block>) -> Node {
        let start = *at;
        let Some((&p, below)) = levels.split_first() else {
            for (m, r) in members.iter().filter(|(_, r)| !r.is_empty()) {
                blocks.push(Block { member: *m, range: r.clone(), at: *at });
                *at += r.len();
            }
            return Node { range: start..*at, children: Vec::new() };
        };
        let children = (0..p)
            .map(|i| {
                let sub: Vec<(usize, Range<usize>)> = members
                    .iter()
                    .map(|(m, r)| {
                        let q = part(r.len(), p, i);
                        (*m, r.start + q.start..r.start + q.end)
                    })
                    .collect();
                Self::node(&sub, below, at, blocks)
            })
            .collect();
        Node { range: start..*at, children }
    }

    /// The part counts it was cut at.
    pub fn levels(&self) -> &[usize] {
        &self.levels
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.root.range.end
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The runs of members' elements, in buffer order.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The parts of the part at `path` (one index per level, from the outermost; empty:
    /// the whole buffer), as element ranges relative to that part's start. `None` when the
    /// path goes below the last level or past a level's count.
    pub fn parts(&self, path: &[usize]) -> Option<Vec<Range<usize>>> {
        let mut node = &self.root;
        for i in path {
            node = node.children.get(*i)?;
        }
        if node.children.is_empty() {
            return None;
        }
        let base = node.range.start;
        Some(node.children.iter().map(|c| c.range.start - base..c.range.end - base).collect())
    }

    /// [`FusedLayout::parts`] of a buffer of `n` elements that a backend cutting at `levels`
    /// reduces: a layout made for other levels or another length is an error (an engine
    /// bug: the layout comes from the backend's own [`super::Collectives::fusion_levels`]).
    pub fn parts_for(&self, levels: &[usize], n: usize, path: &[usize]) -> CommResult<Vec<Range<usize>>> {
        if self.levels != levels || self.len() != n {
            return Err(CommError::Invalid(format!("a fusion buffer of {n} elements laid out as {} elements cut at {:?} reached a backend cutting at {levels:?}", self.len(), self.levels)));
        }
        self.parts(path).ok_or_else(|| CommError::Invalid(format!("no parts at {path:?} in a fusion layout cut at {levels:?}")))
    }

    /// Bytes of member `b.member`'s run `b` in the members' concatenation.
    fn natural(&self, b: &Block, esz: usize) -> Range<usize> {
        let s = self.starts[b.member];
        (s + b.range.start) * esz..(s + b.range.end) * esz
    }

    /// Copies the members' concatenation `src` (elements of `esz` bytes) into the fusion
    /// buffer `dst` (at least `len() * esz` bytes) in this layout.
    pub fn pack<V: ByteView + ?Sized>(&self, src: &V, esz: usize, dst: &mut [u8]) {
        for b in &self.blocks {
            src.read_range(self.natural(b, esz), &mut dst[b.at * esz..(b.at + b.range.len()) * esz]);
        }
    }

    /// Copies the fusion buffer `src` back into the members' concatenation `dst`.
    pub fn unpack<V: ByteView + ?Sized>(&self, src: &[u8], esz: usize, dst: &mut V) {
        for b in &self.blocks {
            dst.write_range(self.natural(b, esz), &src[b.at * esz..(b.at + b.range.len()) * esz]);
        }
    }
}

/// `n` elements cut into `p` near-equal consecutive parts ([`part`]): the layout of one
/// tensor alone.
pub fn even_parts(n: usize, p: usize) -> Vec<Range<usize>> {
    (0..p).map(|i| part(n, p, i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_member_is_its_own_concatenation() {
        let l = FusedLayout::new(&[10], &[3]);
        assert_eq!(l.parts(&[]), Some(even_parts(10, 3)));
        assert_eq!(l.blocks().iter().map(|b| (b.range.clone(), b.at)).collect::<Vec<_>>(), vec![(0..3, 0), (3..6, 3), (6..10, 6)]);
        // Two levels: the outer parts, then each cut again by its own length (hier).
        let l = FusedLayout::new(&[10], &[2, 3]);
        assert_eq!(l.parts(&[]), Some(vec![0..5, 5..10]));
        assert_eq!(l.parts(&[1]), Some(even_parts(5, 3)));
        assert_eq!(l.parts(&[1, 0]), None);
        assert_eq!(l.parts(&[2]), None);
    }

    #[test]
    fn members_are_cut_by_their_own_lengths_part_major() {
        // Members of 1, 4 and 3 elements, 2 parts: part 0 = [], 0..2 of b, 0..1 of c.
        let l = FusedLayout::new(&[1, 4, 3], &[2]);
        assert_eq!(l.len(), 8);
        let runs: Vec<(usize, Range<usize>, usize)> = l.blocks().iter().map(|b| (b.member, b.range.clone(), b.at)).collect();
        assert_eq!(runs, vec![(1, 0..2, 0), (2, 0..1, 2), (0, 0..1, 3), (1, 2..4, 4), (2, 1..3, 6)]);
        assert_eq!(l.parts(&[]), Some(vec![0..3, 3..8]));
        // The concatenation goes through the layout and back unchanged.
        let src: Vec<u8> = (0..8u8).collect();
        let mut packed = vec![0u8; 8];
        l.pack(&src[..], 1, &mut packed);
        assert_eq!(packed, vec![1, 2, 5, 0, 3, 4, 6, 7]);
        let mut back = vec![0u8; 8];
        l.unpack(&packed, 1, &mut back[..]);
        assert_eq!(back, src);
        // No levels: the concatenation itself.
        let flat = FusedLayout::new(&[1, 4, 3], &[]);
        assert_eq!(flat.parts(&[]), None);
        let mut same = vec![0u8; 8];
        flat.pack(&src[..], 1, &mut same);
        assert_eq!(same, src);
    }

    #[test]
    fn a_member_lands_in_the_same_parts_whatever_it_is_fused_with() {
        // Member 7's part i, relative to part i's start in the buffer, is the same run of
        // its elements alone or fused: only its offset inside the part moves.
        let alone = FusedLayout::new(&[7], &[2, 3]);
        let fused = FusedLayout::new(&[5, 7, 1000], &[2, 3]);
        let runs = |l: &FusedLayout, m: usize| l.blocks().iter().filter(|b| b.member == m).map(|b| b.range.clone()).collect::<Vec<_>>();
        assert_eq!(runs(&alone, 0), runs(&fused, 1));
        for l in 0..2 {
            for i in 0..3 {
                let inside = |lay: &FusedLayout, m: usize| {
                    let outer = lay.parts(&[]).unwrap()[l].clone();
                    let inner = lay.parts(&[l]).unwrap()[i].clone();
                    let r = outer.start + inner.start..outer.start + inner.end;
                    lay.blocks().iter().filter(|b| b.member == m && r.contains(&b.at)).map(|b| b.range.clone()).collect::<Vec<_>>()
                };
                assert_eq!(inside(&alone, 0), inside(&fused, 1), "part ({l}, {i})");
            }
        }
    }
}
