//! Growth: a copy of a table at a larger capacity ([`EmbeddingTable::grow_into`]), every
//! key rehashed into a new file, its row, optimizer state and usage with it; the admission
//! sketch is copied as it is (it does not depend on the capacity). A row's values do not
//! depend on its slot, so growing never changes what a lookup returns.
//!
//! Keys are inserted in the old table's slot order, starting after a free slot (so each
//! cluster goes in probe order): the same old table always gives the same new file, on
//! every host. With multiply-shift home slots, a key's home in a table twice as large is
//! twice its old home (or one more), so the writes move forward through the new file
//! almost sequentially.

use std::path::Path;

use super::error::{TableError, TableResult};
use super::format::{self, Header, Layout, OptimizerKind, EMPTY_KEY, FORMAT, HEADER_FIELDS};
use super::index;
use super::table::EmbeddingTable;
use super::update::{split_parts, Parts};

impl EmbeddingTable {
    /// A copy of this table at `capacity` slots (a power of two, larger than its own), in a
    /// new file at `path` created like [`EmbeddingTable::create`] (exclusively, its space
    /// reserved, removed on any error), read-write. Every row keeps its values, optimizer
    /// state and usage; the header carries the generation and the counts on, with one more
    /// growth. This table is not changed.
    pub fn grow_into(&self, path: &Path, capacity: u64) -> TableResult<EmbeddingTable> {
        let h = self.header;
        if !capacity.is_power_of_two() || capacity <= h.capacity || capacity > format::MAX_CAPACITY {
            return Err(TableError::Config(format!("cannot grow a table of {} slots to {capacity}: a larger power of two up to {} is needed", h.capacity, format::MAX_CAPACITY)));
        }
        let layout = Layout::compute(h.dim, h.dtype, capacity, h.optimizer, h.extras)
            .ok_or_else(|| TableError::Config(format!("{capacity} slots x dim {} does not fit in memory", h.dim)))?;
        let mut counts = h.counts;
        counts.growths += 1;
        let new = Header { capacity, layout, counts, sums_valid: false, sums_crc: 0, replaced: false, ..h };
        let old_l = h.layout;
        let old_index: &[u64] = bytemuck::try_cast_slice(self.section(old_l.index_offset, old_l.index_len)?).map_err(|_| FORMAT.layout(&self.path, "misaligned index"))?;
        let old_rows = self.section(old_l.rows_offset, old_l.rows_len)?;
        let old_state: &[f32] = bytemuck::try_cast_slice(self.section(old_l.state_offset, old_l.state_len)?).map_err(|_| FORMAT.layout(&self.path, "misaligned state"))?;
        let old_usage: &[[u32; 2]] = bytemuck::try_cast_slice(self.section(old_l.usage_offset, old_l.usage_len)?).map_err(|_| FORMAT.layout(&self.path, "misaligned usage"))?;
        let old_sketch = self.section(old_l.sketch_offset, old_l.sketch_len)?;
        let rb = h.row_bytes() as usize;
        let old_cap = h.capacity as usize;
        let fits = old_index.len() == old_cap && old_rows.len() == old_cap * rb && (old_state.is_empty() || old_state.len() == old_cap) && (old_usage.is_empty() || old_usage.len() == old_cap);
        if !fits {
            return Err(FORMAT.layout(&self.path, "a section does not hold one entry per slot").into());
        }
        let shift = 64 - capacity.trailing_zeros();
        let src = self.path.clone();
        Self::make(path, &new, |map| {
            map[..HEADER_FIELDS].copy_from_slice(&new.encode());
            let p: Parts<'_, u8> = split_parts(path, map, &layout)?;
            p.index.fill(EMPTY_KEY);
            if h.optimizer == OptimizerKind::Adagrad && h.adagrad_init != 0.0 {
                p.state.fill(h.adagrad_init);
            }
            p.sketch.copy_from_slice(old_sketch);
            let usage: &mut [[u32; 2]] = bytemuck::try_cast_slice_mut(p.usage).map_err(|_| FORMAT.layout(path, "misaligned usage"))?;
            let start = old_index.iter().position(|k| *k == EMPTY_KEY).unwrap_or(0);
            for i in 1..=old_cap {
                let s = (start + i) & (old_cap - 1);
                let key = old_index[s];
                if key == EMPTY_KEY {
                    continue;
                }
                let Some((to, true)) = index::probe(p.index, key, shift) else {
                    return Err(TableError::CorruptIndex { path: src.clone(), detail: format!("key {key:#x} is stored twice, or the new index is full") });
                };
                p.index[to] = key;
                p.rows[to * rb..(to + 1) * rb].copy_from_slice(&old_rows[s * rb..(s + 1) * rb]);
                if let (Some(d), Some(v)) = (p.state.get_mut(to), old_state.get(s)) {
                    *d = *v;
                }
                if let (Some(d), Some(v)) = (usage.get_mut(to), old_usage.get(s)) {
                    *d = *v;
                }
            }
            Ok(())
        })
    }

    /// Marks this live table as replaced by a grown copy (header flag): a local rank that
    /// reads it after the host barrier maps the new table.
    pub fn mark_replaced(&mut self) -> TableResult<()> {
        let h = Header { replaced: true, ..self.header };
        self.write_header(h)
    }
}
