//! `--sparse-normalize weighted`: per key, the sum of the ranks' gradients divided by the
//! sum of the weights of the ranks whose batch held the key, times `world / (sum of all
//! ranks' weights)`, so that equal weights give exactly `frequency`.
//!
//! **Design: the weight travels as one more value of each row.** Each rank's list has rows
//! of `dim + 1` values: the key's gradient, then the rank's weight. The exchange (dedupe,
//! host board, cross-host ranges, merge) sums rows value by value in its one summation
//! order, so a merged row ends in the sum of its holders' weights, with no new section:
//! the lists stay wire-format version 1 with `dim + 1` in their header (lists of the other
//! normalisations are exactly as before), and the merge code is unchanged but for the
//! finish rule ([`Finish::Weighted`]), which divides by `w * world / total` and keeps `w`.
//! Before the leader applies the result (or a caller reads it), the extra value is
//! stripped (the result returned and applied has rows of `dim`). The cost: 4 bytes more
//! per row sent. Every rank says its weight and the total before each step
//! ([`SparseExchanger::set_weights`]: the trainer knows both from the data, no
//! collective); without it every rank weighs 1.
//!
//! A rank's keys may repeat (the exchange's input contract): they are deduplicated first,
//! so each holder adds its weight once per key.

use super::*;

impl SparseExchanger {
    /// This rank's weight and the sum of all ranks' weights for the coming steps (only
    /// `--sparse-normalize weighted` uses them; every rank must give the same `total`).
    pub fn set_weights(&mut self, mine: f32, total: f32) {
        self.weights = (mine, total);
    }

    /// Whether rows carry the rank's weight as one more value.
    pub(super) fn weighted(&self) -> bool {
        self.normalize == SparseNormalize::Weighted
    }

    /// How a merged row is finished.
    pub(super) fn finish_rule(&self) -> Finish {
        match self.normalize {
            SparseNormalize::Weighted => Finish::Weighted { world: self.world as f32, total: self.weights.1 },
            how => Finish::normalise(how, self.world),
        }
    }

    /// This rank's `keys` and `grads` (rows of the table's dim) as a list of distinct keys
    /// whose rows end in this rank's weight, in `out`.
    pub(super) fn weigh_rows(&mut self, keys: &[u64], grads: &[f32], out: &mut SparseList) -> SparseResult<()> {
        let mut summed = std::mem::take(&mut self.b.summed);
        let r = self.pre.index(keys, grads, self.dim).and_then(|_| self.pre.write_list(grads, &mut summed));
        if r.is_ok() {
            out.clear(self.wire_dim);
            out.keys.extend_from_slice(&summed.keys);
            for row in summed.grads.chunks_exact(self.dim) {
                out.grads.extend_from_slice(row);
                out.grads.push(self.weights.0);
            }
            out.counts.resize(out.keys.len(), 1);
        }
        self.b.summed = summed;
        r
    }

    /// The result's rows without their weight value, into `b.stripped`.
    pub(super) fn strip(&mut self) {
        let mut out = std::mem::take(&mut self.b.stripped);
        out.clear();
        let full = self.full_result();
        for row in full.grads.chunks_exact(self.wire_dim) {
            out.extend_from_slice(&row[..self.dim]);
        }
        self.b.stripped = out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of (gradient, weight) as one rank's list.
    fn list(keys: &[u64], rows: &[[f32; 3]]) -> SparseList {
        SparseList { dim: 3, keys: keys.to_vec(), grads: rows.iter().flatten().copied().collect(), counts: vec![1; keys.len()] }
    }

    #[test]
    fn weighted_divides_by_the_holders_weights_and_equal_weights_are_frequency() {
        // 3 ranks of weights 1, 2, 5 (total 8): key 7 held by ranks 0 and 2, key 9 by all.
        let lists = [list(&[7, 9], &[[1.0, 2.0, 1.0], [3.0, 3.0, 1.0]]), list(&[9], &[[6.0, 0.0, 2.0]]), list(&[7, 9], &[[4.0, 8.0, 5.0], [1.0, 1.0, 5.0]])];
        let views: Vec<ListRef<'_>> = lists.iter().map(|l| l.view()).collect();
        let mut out = SparseList::empty(3);
        merge_views_into(&views, 3, Finish::Weighted { world: 3.0, total: 8.0 }, &mut out);
        // key 7: (5, 10) / (6 * 3 / 8); key 9: (10, 4) / (8 * 3 / 8).
        let d7 = 6.0f32 * 3.0 / 8.0;
        assert_eq!(out.keys, vec![7, 9]);
        assert_eq!(out.grads, vec![5.0 / d7, 10.0 / d7, 6.0, 10.0 / 3.0, 4.0 / 3.0, 8.0]);
        assert_eq!(out.counts, vec![2, 3]);

        // Equal weights (60 rows each, 4 ranks): the bits of frequency.
        let g = [0.3f32, -1.7, 2.9];
        let rank = |k: &[u64], w: f32| SparseList { dim: 4, keys: k.to_vec(), grads: k.iter().flat_map(|_| g.iter().copied().chain([w])).collect(), counts: vec![1; k.len()] };
        let lists = [rank(&[1, 2], 60.0), rank(&[2], 60.0), rank(&[1, 2, 3], 60.0), rank(&[2], 60.0)];
        let views: Vec<ListRef<'_>> = lists.iter().map(|l| l.view()).collect();
        let mut weighted = SparseList::empty(4);
        merge_views_into(&views, 4, Finish::Weighted { world: 4.0, total: 240.0 }, &mut weighted);
        let plain: Vec<SparseList> = lists.iter().map(|l| SparseList { dim: 3, keys: l.keys.clone(), grads: l.grads.chunks(4).flat_map(|r| r[..3].to_vec()).collect(), counts: l.counts.clone() }).collect();
        let views: Vec<ListRef<'_>> = plain.iter().map(|l| l.view()).collect();
        let mut freq = SparseList::empty(3);
        merge_views_into(&views, 3, Finish::DivideByCount, &mut freq);
        let stripped: Vec<f32> = weighted.grads.chunks(4).flat_map(|r| r[..3].to_vec()).collect();
        assert_eq!(stripped.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), freq.grads.iter().map(|v| v.to_bits()).collect::<Vec<_>>());

        // Holders that weigh nothing: zeros, never a NaN.
        let mut row = [1.0f32, 2.0, 0.0];
        Finish::Weighted { world: 2.0, total: 4.0 }.apply(&mut row, 1);
        assert_eq!(row, [0.0, 0.0, 0.0]);
    }
}
