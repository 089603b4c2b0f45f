//! [`Fields`]: the shape of a data set's rows — how many dense features and single-hot
//! categorical fields each row has. A Criteo TSV has 13 and 26 ([`Fields::CRITEO`]); a
//! Parquet file (or schema) has exactly its columns, any number of either. The cache
//! records its own ([`super::cache`], header words 16 and 20), and the batch, the model,
//! checkpoints and bundles take theirs from the data.
//!
//! **Keys.** Single-hot field `f` is salted as categorical field `f`
//! ([`super::criteo::category_key`]); multi-hot (list) field `g` as categorical field
//! `max(sparse, 26) + g` ([`Fields::list_field`]): after every single-hot field, and for data
//! of at most 26 single-hot fields `26 + g`, the number it had when every file was padded to
//! Criteo's 26 — so caches, checkpoints and bundles made then keep their keys.

use std::fmt;

use super::criteo::{category_key, NUM_DENSE, NUM_SPARSE};

/// The most dense features, and the most single-hot fields, a cache header may declare (a
/// sanity bound on a file's words; the model takes any number below it).
pub const MAX_FIELDS: usize = 1 << 16;

/// Dense features and single-hot categorical fields per row (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Fields {
    /// Dense features per row.
    pub dense: usize,
    /// Single-hot categorical fields per row (one key each).
    pub sparse: usize,
}

impl Fields {
    /// A Criteo line's: 13 dense features (I1..I13), 26 categorical fields (C1..C26).
    pub const CRITEO: Fields = Fields { dense: NUM_DENSE, sparse: NUM_SPARSE };

    /// The categorical field number list field `g` is salted as (see the module docs).
    pub fn list_field(&self, g: usize) -> usize {
        self.sparse.max(NUM_SPARSE) + g
    }

    /// The key of id `id` of list field `g`.
    pub fn list_key(&self, g: usize, id: u64) -> u64 {
        category_key(self.list_field(g), id)
    }

    /// The shape in words with `lists` multi-hot fields after the single-hot ones.
    pub fn with_lists(&self, lists: usize) -> String {
        format!("{} dense, {} single-hot and {lists} multi-hot fields", self.dense, self.sparse)
    }

    /// Why a header's counts cannot be a row's shape (`None`: they can).
    pub fn check(&self) -> Option<String> {
        (self.dense > MAX_FIELDS || self.sparse > MAX_FIELDS).then(|| format!("{self}: more than {MAX_FIELDS} of one kind"))
    }
}

impl Default for Fields {
    /// A Criteo line's ([`Fields::CRITEO`]).
    fn default() -> Fields {
        Fields::CRITEO
    }
}

impl fmt::Display for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} dense and {} single-hot categorical fields", self.dense, self.sparse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_fields_keep_their_salt_up_to_26_single_hot_fields_and_follow_them_beyond() {
        let small = Fields { dense: 0, sparse: 3 };
        assert_eq!((small.list_field(0), small.list_field(5)), (26, 31));
        assert_eq!(small.list_key(1, 7), crate::data::lists::list_key(1, 7), "the key before fields were counted");
        let wide = Fields { dense: 2, sparse: 30 };
        assert_eq!(wide.list_field(0), 30);
        assert_ne!(wide.list_key(0, 7), category_key(29, 7));
        assert_eq!(Fields::default(), Fields::CRITEO);
        assert!(Fields { dense: MAX_FIELDS + 1, sparse: 0 }.check().is_some());
        assert_eq!(Fields::CRITEO.to_string(), "13 dense and 26 single-hot categorical fields");
    }
}
