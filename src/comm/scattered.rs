//! A buffer made of several byte slices, seen as their concatenation: the fusion buffer of
//! several tensors without copying them into one allocation first.

use std::ops::Range;

use super::FusedLayout;
use crate::dtype::DType;

/// Several mutable byte slices addressed as one buffer of `len()` bytes.
pub struct Scattered<'a> {
    parts: Vec<&'a mut [u8]>,
    /// `ends[i]` = end offset of part i in the concatenation.
    ends: Vec<usize>,
}

impl<'a> Scattered<'a> {
    /// The concatenation of `parts`, in order.
    pub fn new(parts: Vec<&'a mut [u8]>) -> Scattered<'a> {
        let ends = parts
            .iter()
            .scan(0usize, |acc, p| {
                *acc += p.len();
                Some(*acc)
            })
            .collect();
        Scattered { parts, ends }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// True when there is nothing to move.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (part index, range inside the part, offset inside `r`) for every part `r` touches.
    fn spans(&self, r: Range<usize>) -> Vec<(usize, Range<usize>, usize)> {
        debug_assert!(r.end <= self.len());
        let mut out = Vec::new();
        let mut i = self.ends.partition_point(|e| *e <= r.start);
        while i < self.parts.len() && !r.is_empty() {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            if start >= r.end {
                break;
            }
            let (s, e) = (r.start.max(start), r.end.min(self.ends[i]));
            if e > s {
                out.push((i, s - start..e - start, s - r.start));
            }
            i += 1;
        }
        out
    }

    /// Copies bytes `r` of the concatenation into `dst` (`dst.len() == r.len()`).
    pub fn read(&self, r: Range<usize>, dst: &mut [u8]) {
        for (i, pr, off) in self.spans(r) {
            let len = pr.len();
            dst[off..off + len].copy_from_slice(&self.parts[i][pr]);
        }
    }

    /// Copies `src` into bytes `r` of the concatenation (`src.len() == r.len()`).
    pub fn write(&mut self, r: Range<usize>, src: &[u8]) {
        for (i, pr, off) in self.spans(r) {
            let len = pr.len();
            self.parts[i][pr].copy_from_slice(&src[off..off + len]);
        }
    }

    /// Bytes `r` as one slice, when they lie inside one part.
    pub fn contiguous_mut(&mut self, r: Range<usize>) -> Option<&mut [u8]> {
        let i = self.ends.partition_point(|e| *e <= r.start).min(self.parts.len().saturating_sub(1));
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        if self.parts.is_empty() || r.start < start || r.end > self.ends[i] {
            return None;
        }
        Some(&mut self.parts[i][r.start - start..r.end - start])
    }
}

/// Reading and writing byte ranges of a buffer that may or may not be contiguous; what the
/// shared-memory backend needs to move a fusion buffer through its slots.
pub trait ByteView {
    /// Total bytes.
    fn view_len(&self) -> usize;
    /// Copies bytes `r` into `dst`.
    fn read_range(&self, r: Range<usize>, dst: &mut [u8]);
    /// Copies `src` into bytes `r`.
    fn write_range(&mut self, r: Range<usize>, src: &[u8]);
    /// Bytes `r` as one mutable slice, when they are contiguous.
    fn range_mut(&mut self, r: Range<usize>) -> Option<&mut [u8]>;
    /// True when it is a whole number of aligned elements of `esz` bytes (every piece).
    fn is_whole_for(&self, esz: usize) -> bool;
}

fn whole(b: &[u8], esz: usize) -> bool {
    b.len() % esz == 0 && (b.as_ptr() as usize) % esz == 0
}

impl ByteView for [u8] {
    fn view_len(&self) -> usize {
        self.len()
    }
    fn read_range(&self, r: Range<usize>, dst: &mut [u8]) {
        dst.copy_from_slice(&self[r]);
    }
    fn write_range(&mut self, r: Range<usize>, src: &[u8]) {
        self[r].copy_from_slice(src);
    }
    fn range_mut(&mut self, r: Range<usize>) -> Option<&mut [u8]> {
        Some(&mut self[r])
    }
    fn is_whole_for(&self, esz: usize) -> bool {
        whole(self, esz)
    }
}

impl ByteView for Scattered<'_> {
    fn view_len(&self) -> usize {
        self.len()
    }
    fn read_range(&self, r: Range<usize>, dst: &mut [u8]) {
        self.read(r, dst)
    }
    fn write_range(&mut self, r: Range<usize>, src: &[u8]) {
        self.write(r, src)
    }
    fn range_mut(&mut self, r: Range<usize>) -> Option<&mut [u8]> {
        self.contiguous_mut(r)
    }
    fn is_whole_for(&self, esz: usize) -> bool {
        self.parts.iter().all(|p| whole(p, esz))
    }
}

/// The [`FusedLayout`] of `bufs`' parts as members of `dtype` elements cut at `levels`;
/// the plain concatenation when a part is not a whole number of elements (the backend's
/// header check refuses such a buffer on every rank).
pub fn layout_of(bufs: &Scattered<'_>, dtype: DType, levels: &[usize]) -> FusedLayout {
    let esz = dtype.size();
    if bufs.parts.iter().any(|p| p.len() % esz != 0) {
        return FusedLayout::new(&[bufs.len() / esz], &[]);
    }
    FusedLayout::new(&bufs.parts.iter().map(|p| p.len() / esz).collect::<Vec<_>>(), levels)
}

/// A zeroed byte buffer aligned to 8 bytes (any element type's alignment).
pub fn aligned_bytes(len: usize) -> Vec<u64> {
    vec![0u64; len.div_ceil(8)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_across_part_boundaries() {
        let mut a = vec![1u8, 2, 3];
        let mut b: Vec<u8> = vec![];
        let mut c = vec![4u8, 5, 6, 7];
        let mut s = Scattered::new(vec![&mut a[..], &mut b[..], &mut c[..]]);
        assert_eq!(s.len(), 7);
        let mut out = vec![0u8; 7];
        s.read(0..7, &mut out);
        assert_eq!(out, vec![1, 2, 3, 4, 5, 6, 7]);
        let mut mid = vec![0u8; 3];
        s.read(2..5, &mut mid);
        assert_eq!(mid, vec![3, 4, 5]);
        s.write(1..6, &[9, 9, 9, 9, 9]);
        assert!(s.contiguous_mut(2..4).is_none());
        assert_eq!(s.contiguous_mut(3..5).map(|x| x.to_vec()), Some(vec![9, 9]));
        assert_eq!(s.contiguous_mut(0..3).map(|x| x.to_vec()), Some(vec![1, 9, 9]));
        drop(s);
        assert_eq!(a, vec![1, 9, 9]);
        assert_eq!(c, vec![9, 9, 9, 7]);
    }

    #[test]
    fn empty_ranges_and_empty_views() {
        let mut s = Scattered::new(vec![]);
        assert!(s.is_empty());
        s.read(0..0, &mut []);
        s.write(0..0, &[]);
        let mut a = [1u8; 4];
        let mut s = Scattered::new(vec![&mut a[..]]);
        s.read(4..4, &mut []);
        assert_eq!(s.contiguous_mut(4..4).map(|x| x.len()), Some(0));
    }
}
