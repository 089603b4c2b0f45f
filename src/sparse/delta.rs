//! [`RowsAtSync`]: what a host leader needs for the sparse half of lazy synchronisation
//! (`ringrec train --sync-every k`, designs 000 and 002).
//!
//! Between two syncs each host's table takes only its own ranks' updates, so the hosts'
//! tables differ. The leader keeps the row each key had at the last sync, recorded the
//! first time the key is updated after it ([`RowsAtSync::record`]: a key not in the table
//! reads as its deterministic initial row, the same on every host). At the sync it sends
//! the zero-filtered delta `row now - row at the last sync`, only for rows that changed
//! ([`RowsAtSync::deltas`]); the exchange combines the hosts' deltas per key, and every
//! leader sets `row = row at the last sync + combined delta` for every key of the combined
//! list ([`RowsAtSync::rows_after_sync`]). The row at the last sync is the same on every
//! host (the tables were identical right after it, and a key a host did not touch still
//! holds it), and so is the combined delta: right after a sync every host holds the same
//! rows, bit for bit.

use std::collections::HashMap;

use crate::embedding::{EmbeddingTable, TableResult};

/// The rows at the last sync of the keys this host updated since (leader only).
#[derive(Debug, Default)]
pub struct RowsAtSync {
    dim: usize,
    /// Key -> its row's index in `rows`.
    index: HashMap<u64, usize>,
    /// The recorded rows, `dim` values each, in the order they were recorded.
    rows: Vec<f32>,
    /// Scratch for lookups.
    scratch: Vec<f32>,
}

impl RowsAtSync {
    /// An empty record for rows of `dim` values.
    pub fn new(dim: usize) -> RowsAtSync {
        RowsAtSync { dim, ..RowsAtSync::default() }
    }

    /// Keys recorded since the last sync (rows this host touched).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no key was recorded since the last sync.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Records the rows `table` holds now for those of `keys` not recorded yet: call it
    /// before an update of `keys` is applied.
    pub fn record(&mut self, table: &EmbeddingTable, keys: &[u64]) -> TableResult<()> {
        let new: Vec<u64> = keys.iter().copied().filter(|k| !self.index.contains_key(k)).collect();
        if new.is_empty() {
            return Ok(());
        }
        self.scratch.resize(new.len() * self.dim, 0.0);
        table.lookup(&new, &mut self.scratch)?;
        let first = self.rows.len() / self.dim.max(1);
        for (i, k) in new.into_iter().enumerate() {
            self.index.insert(k, first + i);
        }
        self.rows.extend_from_slice(&self.scratch);
        Ok(())
    }

    /// The zero-filtered deltas: for every recorded key whose row in `table` differs from
    /// the recorded one (bitwise), the key and `row now - row then`, in key order, into
    /// `keys` and `deltas` (cleared first).
    pub fn deltas(&mut self, table: &EmbeddingTable, keys: &mut Vec<u64>, deltas: &mut Vec<f32>) -> TableResult<()> {
        let dim = self.dim;
        let mut recorded: Vec<(u64, usize)> = self.index.iter().map(|(k, i)| (*k, *i)).collect();
        recorded.sort_unstable();
        let all: Vec<u64> = recorded.iter().map(|(k, _)| *k).collect();
        self.scratch.resize(all.len() * dim, 0.0);
        table.lookup(&all, &mut self.scratch)?;
        keys.clear();
        deltas.clear();
        for ((k, i), now) in recorded.iter().zip(self.scratch.chunks_exact(dim)) {
            let then = &self.rows[i * dim..(i + 1) * dim];
            if now.iter().zip(then).any(|(a, b)| a.to_bits() != b.to_bits()) {
                keys.push(*k);
                deltas.extend(now.iter().zip(then).map(|(a, b)| a - b));
            }
        }
        Ok(())
    }

    /// The rows every host sets after a sync: for each key of `keys` (the combined list),
    /// its row at the last sync (recorded here, else what `table` holds now, which is that
    /// row) plus its combined delta from `combined`, into `out` (resized). Then forgets
    /// every recorded row: the next interval starts.
    pub fn rows_after_sync(&mut self, table: &EmbeddingTable, keys: &[u64], combined: &[f32], out: &mut Vec<f32>) -> TableResult<()> {
        let dim = self.dim;
        out.resize(keys.len() * dim, 0.0);
        table.lookup(keys, out)?;
        for ((k, row), delta) in keys.iter().zip(out.chunks_exact_mut(dim)).zip(combined.chunks_exact(dim)) {
            if let Some(i) = self.index.get(k) {
                row.copy_from_slice(&self.rows[i * dim..(i + 1) * dim]);
            }
            for (v, d) in row.iter_mut().zip(delta) {
                *v += d;
            }
        }
        self.clear();
        Ok(())
    }

    /// Forgets every recorded row.
    pub fn clear(&mut self) {
        self.index.clear();
        self.rows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::TableConfig;

    fn table(dir: &std::path::Path, name: &str) -> EmbeddingTable {
        EmbeddingTable::create(&dir.join(name), &TableConfig::new(2, 64)).expect("table")
    }

    #[test]
    fn two_hosts_end_identical_after_a_sync() {
        let dir = std::env::temp_dir().join(format!("ringrec-delta-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let (mut a, mut b) = (table(&dir, "a"), table(&dir, "b"));
        let (mut ra, mut rb) = (RowsAtSync::new(2), RowsAtSync::new(2));
        // Host a updates keys 1 and 2, host b keys 2 and 3 (key 3 twice).
        ra.record(&a, &[1, 2]).unwrap();
        a.apply_updates(&[1, 2], &[1.0, 0.0, 0.5, 0.5], 0.1).unwrap();
        rb.record(&b, &[2, 3]).unwrap();
        b.apply_updates(&[2, 3], &[-0.5, 1.0, 2.0, 0.0], 0.1).unwrap();
        rb.record(&b, &[3]).unwrap();
        b.apply_updates(&[3], &[2.0, 0.0], 0.1).unwrap();
        let (mut ka, mut da, mut kb, mut db) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        ra.deltas(&a, &mut ka, &mut da).unwrap();
        rb.deltas(&b, &mut kb, &mut db).unwrap();
        assert_eq!(ka, vec![1, 2]);
        assert_eq!(kb, vec![2, 3]);
        // Key 1's second value had a zero gradient: its delta is exactly 0; key 3 moved
        // twice by -0.1 * 2.0 in its first value.
        assert_eq!(da[1], 0.0);
        assert!((db[2] + 0.4).abs() < 1e-6, "{db:?}");
        // Combined per key: the mean over the hosts that changed it.
        let keys = [1u64, 2, 3];
        let combined: Vec<f32> = vec![da[0], da[1], (da[2] + db[0]) / 2.0, (da[3] + db[1]) / 2.0, db[2], db[3]];
        let (mut oa, mut ob) = (Vec::new(), Vec::new());
        ra.rows_after_sync(&a, &keys, &combined, &mut oa).unwrap();
        rb.rows_after_sync(&b, &keys, &combined, &mut ob).unwrap();
        assert_eq!(oa.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), ob.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        assert!(ra.is_empty() && rb.is_empty());
        a.put_rows(&keys, &oa).unwrap();
        b.put_rows(&keys, &ob).unwrap();
        let (mut la, mut lb) = (vec![0f32; 6], vec![0f32; 6]);
        a.lookup(&keys, &mut la).unwrap();
        b.lookup(&keys, &mut lb).unwrap();
        assert_eq!(la, lb);
        assert_ne!(la, {
            let mut init = vec![0f32; 6];
            table(&dir, "c").lookup(&keys, &mut init).unwrap();
            init
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
