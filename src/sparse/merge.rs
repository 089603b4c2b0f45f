//! The k-way merge of sorted sparse lists, with the one summation rule of the exchange: per
//! key, the lists' rows **in list order** (the first row copied, the next ones added), the
//! counts summed, then (optionally, fused into the merge) the row normalised.
//!
//! One merge core writes into a sink: a growing [`SparseList`], a counter (the length of the
//! result, so it can be laid out before it is written), or a serialized list in place (a
//! send buffer, the host's shared segment), so a merged list is written exactly once.

use super::error::SparseResult;
use super::list::{self, ListRef, SparseList};
use super::SparseNormalize;

/// What a merge does to a finished row: nothing, or one of the normalisations (the same
/// f32 division per value as [`list::normalise`], so fusing it changes no bit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Finish {
    /// Leave the sum.
    Sum,
    /// Divide by a constant (the world size).
    Divide(f32),
    /// Divide by the row's count.
    DivideByCount,
    /// `--sparse-normalize weighted`: the row's last value is the sum of its holders'
    /// weights `w`; the other values are divided by `w * world / total` (0 where that is
    /// not a positive number). With equal integer weights `w * world / total` is exactly
    /// the count, so the bits are those of [`Finish::DivideByCount`].
    Weighted {
        /// Ranks.
        world: f32,
        /// The sum of all ranks' weights.
        total: f32,
    },
}

impl Finish {
    /// The finish that implements `how` with `world` ranks.
    pub fn normalise(how: SparseNormalize, world: usize) -> Finish {
        match how {
            SparseNormalize::None => Finish::Sum,
            SparseNormalize::World => Finish::Divide(world as f32),
            SparseNormalize::Frequency => Finish::DivideByCount,
            // Every rank weighing 1 unless the exchanger is told otherwise.
            SparseNormalize::Weighted => Finish::Weighted { world: world as f32, total: world as f32 },
        }
    }
    /// Applies it to one summed row of `count` contributions.
    #[inline]
    pub fn apply(self, row: &mut [f32], count: u32) {
        let d = match self {
            Finish::Sum => return,
            Finish::Divide(d) => d,
            Finish::DivideByCount => count as f32,
            Finish::Weighted { world, total } => {
                let Some((w, grads)) = row.split_last_mut() else { return };
                let d = *w * world / total;
                if d > 0.0 && d.is_finite() {
                    grads.iter_mut().for_each(|g| *g /= d);
                } else {
                    grads.iter_mut().for_each(|g| *g = 0.0);
                }
                return;
            }
        };
        row.iter_mut().for_each(|g| *g /= d);
    }
}

/// Adds `row` to `acc`, value by value.
#[inline]
pub(crate) fn add_row(acc: &mut [f32], row: &[f32]) {
    for (a, g) in acc.iter_mut().zip(row) {
        *a += *g;
    }
}

/// Where the merge core puts its rows.
trait Sink {
    /// A new row: `key`, `count`, values copied from `row`.
    fn push(&mut self, key: u64, count: u32, row: &[f32]);
    /// Adds `row` to the last row and `count` to its count.
    fn add(&mut self, count: u32, row: &[f32]);
    /// The last row has all its contributions.
    fn finish(&mut self);
    /// Rows of one list only, as they are (each one finished).
    fn extend(&mut self, l: ListRef<'_>);
}

/// Appends to a [`SparseList`].
struct ListSink<'a> {
    out: &'a mut SparseList,
    finish: Finish,
}

impl Sink for ListSink<'_> {
    #[inline]
    fn push(&mut self, key: u64, count: u32, row: &[f32]) {
        self.out.keys.push(key);
        self.out.counts.push(count);
        self.out.grads.extend_from_slice(row);
    }
    #[inline]
    fn add(&mut self, count: u32, row: &[f32]) {
        let start = self.out.grads.len() - row.len();
        add_row(&mut self.out.grads[start..], row);
        if let Some(c) = self.out.counts.last_mut() {
            *c = c.saturating_add(count);
        }
    }
    #[inline]
    fn finish(&mut self) {
        if self.finish != Finish::Sum {
            let (Some(c), dim) = (self.out.counts.last(), self.out.dim) else { return };
            let start = self.out.grads.len() - dim;
            self.finish.apply(&mut self.out.grads[start..], *c);
        }
    }
    fn extend(&mut self, l: ListRef<'_>) {
        let (first, dim) = (self.out.len(), self.out.dim);
        l.append_to(self.out);
        if self.finish != Finish::Sum {
            for (row, c) in self.out.grads[first * dim..].chunks_exact_mut(dim.max(1)).zip(&self.out.counts[first..]) {
                self.finish.apply(row, *c);
            }
        }
    }
}

/// Counts the rows of the result.
struct Counter(usize);

impl Sink for Counter {
    #[inline]
    fn push(&mut self, _: u64, _: u32, _: &[f32]) {
        self.0 += 1;
    }
    #[inline]
    fn add(&mut self, _: u32, _: &[f32]) {}
    #[inline]
    fn finish(&mut self) {}
    fn extend(&mut self, l: ListRef<'_>) {
        self.0 += l.len();
    }
}

/// Writes into the sections of a serialized list laid out for exactly the result's rows.
struct WireSink<'a> {
    keys: &'a mut [u64],
    counts: &'a mut [u32],
    rows: &'a mut [f32],
    dim: usize,
    /// Rows written.
    at: usize,
    finish: Finish,
}

impl Sink for WireSink<'_> {
    #[inline]
    fn push(&mut self, key: u64, count: u32, row: &[f32]) {
        let i = self.at;
        self.keys[i] = key;
        self.counts[i] = count;
        self.rows[i * self.dim..(i + 1) * self.dim].copy_from_slice(row);
        self.at += 1;
    }
    #[inline]
    fn add(&mut self, count: u32, row: &[f32]) {
        let i = self.at - 1;
        add_row(&mut self.rows[i * self.dim..(i + 1) * self.dim], row);
        self.counts[i] = self.counts[i].saturating_add(count);
    }
    #[inline]
    fn finish(&mut self) {
        let i = self.at - 1;
        self.finish.apply(&mut self.rows[i * self.dim..(i + 1) * self.dim], self.counts[i]);
    }
    fn extend(&mut self, l: ListRef<'_>) {
        let (i, n, dim) = (self.at, l.len(), self.dim);
        self.keys[i..i + n].copy_from_slice(l.keys);
        match l.counts {
            Some(c) => self.counts[i..i + n].copy_from_slice(c),
            None => self.counts[i..i + n].fill(1),
        }
        let rows = &mut self.rows[i * dim..(i + n) * dim];
        rows.copy_from_slice(l.grads);
        if self.finish != Finish::Sum {
            for (row, c) in rows.chunks_exact_mut(dim.max(1)).zip(&self.counts[i..i + n]) {
                self.finish.apply(row, *c);
            }
        }
        self.at += n;
    }
}

/// The merge core: both paths (two lists, k lists) follow the one summation rule.
fn merge_core(lists: &[ListRef<'_>], out: &mut impl Sink) {
    match lists {
        [] => {}
        [one] => out.extend(*one),
        [a, b] => merge_two(a, b, out),
        _ => merge_k(lists, out),
    }
}

fn merge_k(lists: &[ListRef<'_>], out: &mut impl Sink) {
    let mut heads = vec![0usize; lists.len()];
    loop {
        let mut min = None;
        for (l, h) in lists.iter().zip(&heads) {
            if let Some(k) = l.keys.get(*h) {
                if min.is_none_or(|m| *k < m) {
                    min = Some(*k);
                }
            }
        }
        let Some(key) = min else { break };
        let mut first = true;
        for (l, h) in lists.iter().zip(heads.iter_mut()) {
            if l.keys.get(*h) == Some(&key) {
                if first {
                    out.push(key, l.count(*h), l.row(*h));
                    first = false;
                } else {
                    out.add(l.count(*h), l.row(*h));
                }
                *h += 1;
            }
        }
        out.finish();
    }
}

/// Two-list merge, same rule (a's row first).
fn merge_two(a: &ListRef<'_>, b: &ListRef<'_>, out: &mut impl Sink) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (ka, kb) = (a.keys[i], b.keys[j]);
        if ka < kb {
            out.push(ka, a.count(i), a.row(i));
            i += 1;
        } else if kb < ka {
            out.push(kb, b.count(j), b.row(j));
            j += 1;
        } else {
            out.push(ka, a.count(i), a.row(i));
            out.add(b.count(j), b.row(j));
            i += 1;
            j += 1;
        }
        out.finish();
    }
    out.extend(a.rows(i..a.len()));
    out.extend(b.rows(j..b.len()));
}

/// Merges sorted lists of the same dim into one: per key, the row is the sum of the lists'
/// rows **in list order** (the first list's row copied, the next ones added), and the count
/// is the sum of their counts. This one order is what makes every host, and the flat and
/// hierarchical modes, produce bit-identical results.
pub fn merge(lists: &[&SparseList], dim: usize) -> SparseList {
    let mut out = SparseList::empty(dim);
    merge_into(lists, dim, &mut out);
    out
}

/// [`merge`] into `out`, reusing its memory.
pub fn merge_into(lists: &[&SparseList], dim: usize, out: &mut SparseList) {
    let views: Vec<ListRef<'_>> = lists.iter().map(|l| l.view()).collect();
    merge_views_into(&views, dim, Finish::Sum, out);
}

/// [`merge_into`] of borrowed lists (parts of lists, lists read in place from received
/// bytes or shared memory), each row finished by `finish`: the same rule, the same bits.
pub fn merge_views_into(lists: &[ListRef<'_>], dim: usize, finish: Finish, out: &mut SparseList) {
    out.clear(dim);
    merge_core(lists, &mut ListSink { out, finish });
}

/// The number of rows the merge of `lists` has (the distinct keys of them all).
pub fn merged_len(lists: &[ListRef<'_>]) -> usize {
    if let [a, b] = lists {
        return distinct_of_two(a.keys, b.keys);
    }
    let mut n = Counter(0);
    merge_core(lists, &mut n);
    n.0
}

/// The distinct keys of two increasing key lists, with no branch per key: where hashed keys
/// of two lists interleave at random, a branch is mispredicted about every other key.
fn distinct_of_two(a: &[u64], b: &[u64]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        i += usize::from(x <= y);
        j += usize::from(y <= x);
        n += 1;
    }
    n + (a.len() - i) + (b.len() - j)
}

/// Merges `lists` (like [`merge_views_into`]) straight into `out`, serialized with counts:
/// `out` must be exactly `encoded_len` of the `n` rows the merge has ([`merged_len`]).
/// Where the list cannot be written in place (a big-endian machine, `out` not 8-byte
/// aligned) it is merged into `scratch`, then serialized.
pub fn merge_to_wire(lists: &[ListRef<'_>], dim: usize, finish: Finish, n: usize, out: &mut [u8], scratch: &mut SparseList) -> SparseResult<()> {
    if let Some(sections) = list::wire_sections(out, n, dim, true)? {
        merge_to_sections(lists, dim, finish, sections);
        return Ok(());
    }
    merge_views_into(lists, dim, finish, scratch);
    scratch.view().encode_to(true, out)
}

/// Merges `lists` (like [`merge_views_into`]) into the keys, counts and values of exactly the
/// rows the merge has ([`merged_len`]), laid out like a serialized list's sections.
pub(crate) fn merge_to_sections(lists: &[ListRef<'_>], dim: usize, finish: Finish, (keys, counts, rows): list::Sections<'_>) {
    let mut sink = WireSink { keys, counts, rows, dim, at: 0, finish };
    merge_core(lists, &mut sink);
    debug_assert_eq!(sink.at, sink.keys.len(), "merged_len disagrees with the merge");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::list::tests::{bits, list};
    use crate::sparse::list::{normalise, view, KeyRange, Viewed};

    #[test]
    fn merge_sums_in_list_order_and_adds_counts() {
        let a = list(&[1, 3], &[1.0, 3.0], &[1, 2], 1);
        let b = list(&[2, 3], &[2.0, 30.0], &[1, 1], 1);
        let c = list(&[3, 9], &[300.0, 9.0], &[3, 1], 1);
        let m = merge(&[&a, &b, &c], 1);
        assert_eq!(m.keys, vec![1, 2, 3, 9]);
        assert_eq!(m.counts, vec![1, 1, 6, 1]);
        assert_eq!(m.grads, vec![1.0, 2.0, 333.0, 9.0]);
        // The 2-list path and the k-list path agree bit for bit.
        let x = list(&[1, 2, 4], &[1e8, 0.1, -0.0], &[1, 1, 1], 1);
        let y = list(&[2, 4, 5], &[1.0, -0.0, 7.0], &[1, 1, 1], 1);
        let e = SparseList::empty(1);
        assert_eq!(bits(&merge(&[&x, &y], 1).grads), bits(&merge(&[&x, &y, &e], 1).grads));
        // -0.0 stays -0.0 (the first row is copied, not added to +0.0).
        assert_eq!(merge(&[&x, &y], 1).grads[2].to_bits(), (-0.0f32).to_bits());
        assert_eq!(merge(&[], 3), SparseList::empty(3));
        assert_eq!(merge(&[&a], 1), a);
    }

    /// Lists with shared and distinct keys, values whose sums depend on the order.
    fn three_lists() -> Vec<SparseList> {
        let mk = |seed: u64, keep: u64| {
            let keys: Vec<u64> = (0..200u64).filter(|k| (k * 7 + seed) % keep != 0).map(|k| k * 1_000_003).collect();
            let grads: Vec<f32> = (0..keys.len() * 3).map(|i| ((i as f32 + seed as f32) * 0.37).sin() * 1e4f32.powi((i % 3) as i32 - 1)).collect();
            let counts = (0..keys.len()).map(|i| 1 + (i as u32 + seed as u32) % 3).collect();
            SparseList { dim: 3, keys, grads, counts }
        };
        vec![mk(1, 3), mk(2, 4), mk(5, 2)]
    }

    #[test]
    fn fused_normalisation_matches_merge_then_normalise() {
        let lists = three_lists();
        for k in 1..=3 {
            let refs: Vec<&SparseList> = lists[..k].iter().collect();
            let views: Vec<ListRef<'_>> = refs.iter().map(|l| l.view()).collect();
            for how in [SparseNormalize::Frequency, SparseNormalize::World, SparseNormalize::None] {
                let mut want = merge(&refs, 3);
                normalise(&mut want, how, 4);
                let mut got = SparseList::default();
                merge_views_into(&views, 3, Finish::normalise(how, 4), &mut got);
                assert_eq!((&got.keys, &got.counts), (&want.keys, &want.counts), "{k} lists, {how}");
                assert_eq!(bits(&got.grads), bits(&want.grads), "{k} lists, {how}");
                assert_eq!(merged_len(&views), want.len());
            }
        }
    }

    #[test]
    fn merged_len_of_two_lists_counts_shared_keys_once() {
        let l = |keys: &[u64]| list(keys, &vec![0.0; keys.len()], &vec![1; keys.len()], 1);
        let cases: [(&[u64], &[u64], usize); 6] =
            [(&[], &[], 0), (&[1, 2], &[], 2), (&[], &[0, u64::MAX - 1], 2), (&[1, 5, 9], &[1, 5, 9], 3), (&[1, 3, 5], &[2, 3, 4, 6], 6), (&[0, 10], &[1, 2, 3, 10, 11], 6)];
        for (a, b, want) in cases {
            let (a, b) = (l(a), l(b));
            assert_eq!(merged_len(&[a.view(), b.view()]), want, "{:?} {:?}", a.keys, b.keys);
            assert_eq!(merged_len(&[a.view(), b.view(), SparseList::empty(1).view()]), want, "the k-list count agrees");
        }
    }

    #[test]
    fn merge_to_wire_writes_what_encode_of_the_merge_writes() {
        let lists = three_lists();
        let views: Vec<ListRef<'_>> = lists.iter().map(|l| l.view()).collect();
        let finish = Finish::normalise(SparseNormalize::Frequency, 4);
        let mut want = SparseList::default();
        merge_views_into(&views, 3, finish, &mut want);
        let mut encoded = Vec::new();
        want.encode_into(true, &mut encoded).unwrap();
        let n = merged_len(&views);
        // An 8-byte aligned buffer (written in place) and a misaligned one (via scratch).
        let mut words = vec![0u64; encoded.len().div_ceil(8) + 1];
        for shift in [0usize, 4] {
            let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[shift..shift + encoded.len()];
            merge_to_wire(&views, 3, finish, n, out, &mut SparseList::default()).unwrap();
            assert_eq!(out, &encoded[..], "shift {shift}");
        }
        assert!(merge_to_wire(&views, 3, finish, n + 1, &mut vec![0; encoded.len()], &mut SparseList::default()).is_err());
    }

    #[test]
    fn key_ranges_split_lists_and_views_read_in_place() {
        let l = list(&[0, 5, u64::MAX / 2, u64::MAX / 2 + 1, u64::MAX - 1], &[1.0, 2.0, 3.0, 4.0, 5.0], &[1, 1, 2, 1, 3], 1);
        let parts: Vec<ListRef<'_>> = (0..2).map(|i| l.view().within(KeyRange::part(i, 2))).collect();
        assert_eq!(parts[0].keys, &[0, 5, u64::MAX / 2]);
        assert_eq!(parts[1].keys, &[u64::MAX / 2 + 1, u64::MAX - 1]);
        assert_eq!(parts[1].counts, Some(&[1u32, 3][..]));
        assert_eq!(KeyRange::part(0, 1), KeyRange { start: 0, end: None });
        let mut bytes = Vec::new();
        l.encode_into(true, &mut bytes).unwrap();
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        let aligned = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()];
        aligned.copy_from_slice(&bytes);
        let mut scratch = SparseList::default();
        let Viewed::List(v) = view(aligned, 1, 3, &mut scratch).unwrap() else { panic!("not a list") };
        assert_eq!(v, l.view());
        assert!(scratch.keys.is_empty(), "an aligned list is read in place");
        assert!(view(aligned, 1, 2, &mut scratch).is_err(), "count 3 above the limit");
    }
}
