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
