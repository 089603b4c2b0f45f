//! The CTR network's input layout: per sample, the embedding rows of its `fields` sparse
//! features (`dim` values each, field order), then its dense features.
//! `inverse[s * fields + f]` names the row of sample s's field f among the batch's unique
//! keys; its transpose, each key's list of (sample, field) slots ([`build_csr`]), drives
//! the per-key sum of the input gradient.

/// The input layout: `fields` sparse features of `dim` values each, then `ndense` dense
/// features per sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputLayout {
    /// Sparse (embedding) fields per sample.
    pub fields: usize,
    /// Values per embedding row.
    pub dim: usize,
    /// Dense features per sample.
    pub ndense: usize,
}

impl InputLayout {
    /// Values per input row.
    pub fn width(&self) -> usize {
        self.fields * self.dim + self.ndense
    }
}

/// Each of `keys` keys' slots in CSR form: `slots[offsets[u]..offsets[u + 1]]` are the
/// slots `p` (in increasing order: sample order, then field order — the one summation
/// order of a key's gradient inside a rank) with `inverse[p] == u`. `next` is scratch.
/// An error names a slot whose key is out of range.
pub fn build_csr(inverse: &[u32], keys: usize, offsets: &mut [u32], slots: &mut [u32], next: &mut Vec<u32>) -> Result<(), String> {
    if let Some(bad) = inverse.iter().find(|u| **u as usize >= keys) {
        return Err(format!("inverse names row {bad} of {keys} unique keys"));
    }
    offsets[..keys + 1].fill(0);
    for u in inverse {
        offsets[*u as usize + 1] += 1;
    }
    for u in 0..keys {
        offsets[u + 1] += offsets[u];
    }
    next.clear();
    next.extend_from_slice(&offsets[..keys]);
    for (p, u) in inverse.iter().enumerate() {
        let at = &mut next[*u as usize];
        slots[*at as usize] = p as u32;
        *at += 1;
    }
    Ok(())
}

/// Reference implementations of the input and its backward on plain slices (tests).
#[cfg(test)]
pub mod reference {
    /// Fills one sample's input row from the unique keys' rows `emb`, the sample's
    /// `inverse` entries (one per field) and its dense features.
    pub fn fill_row(row: &mut [f32], emb: &[f32], inverse: &[u32], dense: &[f32], dim: usize) {
        let fields = inverse.len();
        for (f, u) in inverse.iter().enumerate() {
            let u = *u as usize;
            row[f * dim..(f + 1) * dim].copy_from_slice(&emb[u * dim..(u + 1) * dim]);
        }
        row[fields * dim..].copy_from_slice(dense);
    }

    /// Sums the input gradient `dx` (batch x width) of each (sample, field) slot into its
    /// key's row of `key_grads` (keys x dim, overwritten), in sample order then field order.
    pub fn scatter_key_grads(dx: &[f32], inverse: &[u32], batch: usize, fields: usize, dim: usize, width: usize, key_grads: &mut [f32]) {
        key_grads.fill(0.0);
        for s in 0..batch {
            let row = &dx[s * width..(s + 1) * width];
            for f in 0..fields {
                let u = inverse[s * fields + f] as usize;
                for (g, d) in key_grads[u * dim..(u + 1) * dim].iter_mut().zip(&row[f * dim..(f + 1) * dim]) {
                    *g += d;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reference::*;
    use super::*;

    #[test]
    fn rows_and_key_gradients_by_hand() {
        // 2 samples, 2 fields, dim 2, 1 dense; keys: sample 0 = (k0, k1), sample 1 = (k1, k1).
        let emb = [1.0, 2.0, 3.0, 4.0];
        let inverse = [0u32, 1, 1, 1];
        let mut row = [0f32; 5];
        fill_row(&mut row, &emb, &inverse[2..], &[9.0], 2);
        assert_eq!(row, [3.0, 4.0, 3.0, 4.0, 9.0]);
        let dx = [1.0, 1.0, 2.0, 2.0, 0.5, /* sample 1 */ 10.0, 10.0, 20.0, 20.0, 0.5];
        let mut g = [7f32; 4];
        scatter_key_grads(&dx, &inverse, 2, 2, 2, 5, &mut g);
        assert_eq!(g, [1.0, 1.0, 32.0, 32.0]);
    }

    #[test]
    fn csr_lists_each_keys_slots_in_order_and_refuses_a_missing_key() {
        let inverse = [2u32, 0, 2, 1, 0, 2];
        let (mut offsets, mut slots, mut next) = ([9u32; 4], [9u32; 6], Vec::new());
        build_csr(&inverse, 3, &mut offsets, &mut slots, &mut next).unwrap();
        assert_eq!(offsets, [0, 2, 3, 6]);
        assert_eq!(slots, [1, 4, 3, 0, 2, 5]);
        let e = build_csr(&[0, 3], 3, &mut offsets, &mut slots, &mut next).unwrap_err();
        assert_eq!(e, "inverse names row 3 of 3 unique keys");
    }
}
