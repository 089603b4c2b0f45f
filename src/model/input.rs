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

/// The per-key lists of an inverse map on the host; a kernel device builds the same from
/// the inverse map it holds ([`crate::device::Op::BuildCsr`]).
pub use crate::device::csr::build_csr;
