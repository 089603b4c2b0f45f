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
//!
//! Making the new file — allocating its space and mapping it, which the kernel does by
//! zeroing every page — costs more than the rehash. A [`Spare`] is that file made ahead
//! (by a background thread while training goes on, [`super::manage::Ahead`]);
//! [`EmbeddingTable::grow_with`] then only fills it.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use super::error::{TableError, TableResult};
use super::format::{self, Header, Layout, OptimizerKind, EMPTY_KEY, FORMAT, HEADER_FIELDS};
use super::host::SegmentGuard;
use super::index;
use super::table::EmbeddingTable;
use super::update::{split_parts, Parts};

/// A new table file made ready for a growth: created exclusively, its space reserved,
/// mapped read-write, still empty. Dropped unused, its file is removed.
pub struct Spare {
    path: PathBuf,
    capacity: u64,
    layout: Layout,
    made: Option<(File, MmapMut)>,
    /// Removes the file unless a growth took it (also on a second SIGTERM).
    guard: SegmentGuard,
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spare").field("path", &self.path).field("capacity", &self.capacity).finish()
    }
}

impl Spare {
    /// Makes the file at `path` for a table of `like`'s shape at `capacity` slots: the slow
    /// part of a growth (the kernel allocates and zeroes every page).
    pub fn make(path: &Path, like: &Header, capacity: u64) -> TableResult<Spare> {
        if !capacity.is_power_of_two() || capacity <= like.capacity || capacity > format::MAX_CAPACITY {
            return Err(TableError::Config(format!("cannot grow a table of {} slots to {capacity}: a larger power of two up to {} is needed", like.capacity, format::MAX_CAPACITY)));
        }
        let layout = Layout::compute(like.dim, like.dtype, capacity, like.optimizer, like.extras)
            .ok_or_else(|| TableError::Config(format!("{capacity} slots x dim {} does not fit in memory", like.dim)))?;
        let made = EmbeddingTable::new_file(path, layout.file_len)?;
        Ok(Spare { path: path.to_path_buf(), capacity, layout, made: Some(made), guard: SegmentGuard::new(path) })
    }

    /// Slots of the table it is made for.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Its file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl EmbeddingTable {
    /// A copy of this table at `capacity` slots (a power of two, larger than its own), in a
    /// new file at `path` created like [`EmbeddingTable::create`] (exclusively, its space
    /// reserved, removed on any error), read-write. Every row keeps its values, optimizer
    /// state and usage; the header carries the generation and the counts on, with one more
    /// growth. This table is not changed.
    pub fn grow_into(&self, path: &Path, capacity: u64) -> TableResult<EmbeddingTable> {
        self.grow_with(Spare::make(path, &self.header, capacity)?)
    }

    /// [`EmbeddingTable::grow_into`] the file `spare` made ready (for a table of this
    /// shape).
    pub fn grow_with(&self, mut spare: Spare) -> TableResult<EmbeddingTable> {
        let h = self.header;
        let layout = Layout::compute(h.dim, h.dtype, spare.capacity, h.optimizer, h.extras);
        let (Some((file, map)), Some(layout)) = (spare.made.take(), layout.filter(|l| *l == spare.layout)) else {
            return Err(TableError::Config(format!("{} was made for a table of another shape", spare.path.display())));
        };
        let mut counts = h.counts;
        counts.growths += 1;
        let capacity = spare.capacity;
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
        let (src, path) = (self.path.clone(), spare.path.clone());
        let grown = Self::fill_new(&path, file, map, &new, |map| {
            map[..HEADER_FIELDS].copy_from_slice(&new.encode());
            let p: Parts<'_, u8> = split_parts(&path, map, &layout)?;
            p.index.fill(EMPTY_KEY);
            if h.optimizer == OptimizerKind::Adagrad && h.adagrad_init != 0.0 {
                p.state.fill(h.adagrad_init);
            }
            p.sketch.copy_from_slice(old_sketch);
            let usage: &mut [[u32; 2]] = bytemuck::try_cast_slice_mut(p.usage).map_err(|_| FORMAT.layout(&path, "misaligned usage"))?;
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
        });
        if grown.is_ok() {
            // The file is the new table's now; its owner removes it.
            spare.guard.disarm();
        }
        grown
    }

    /// Marks this live table as replaced by a grown copy (header flag): a local rank that
    /// reads it after the host barrier maps the new table.
    pub fn mark_replaced(&mut self) -> TableResult<()> {
        let h = Header { replaced: true, ..self.header };
        self.write_header(h)
    }
}
