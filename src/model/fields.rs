//! Fields of several widths (`--table`, issue 33): the model's input built on the device from
//! the rows of several tables. Each field has its table's width; a sample's input holds its
//! fields' values one after another in field order (single-hot fields, then the multi-hot
//! ones pooled), then its dense features. The batch's unique keys are staged grouped by
//! table, each key's row its table's width, at `key_at[u]` in one staging buffer
//! ([`crate::model::DenseModel::stage_tables`]); [`Op::GatherFields`] gathers and pools them
//! into the input and [`Op::GatherFieldsGrad`] sums the input gradient back per key, each key's
//! gradient row at the same place as its row. With one width for every field the values and
//! the sums are those of the one-table path's [`Op::GatherRows`], [`Op::PoolBags`],
//! [`Op::SegmentSum`] and [`Op::PoolBagsGrad`], bit for bit.

use crate::device::{Device, DeviceError, DeviceResult, FieldCols, Op};

/// Each field's width (see the module docs): `widths[f]` values for field `f`, the first
/// `single` fields single-hot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldWidths {
    /// Values per field, in field order.
    pub widths: Vec<usize>,
    /// Single-hot fields (the first ones); the others are multi-hot.
    pub single: usize,
}

impl FieldWidths {
    /// Per field its first column in a sample's input, then the columns in all.
    pub fn field_col(&self) -> Vec<u32> {
        let mut at = 0;
        let mut out: Vec<u32> = Vec::with_capacity(self.widths.len() + 1);
        for w in &self.widths {
            out.push(at as u32);
            at += w;
        }
        out.push(at as u32);
        out
    }

    /// Columns of a sample's fields.
    pub fn cols(&self) -> usize {
        self.widths.iter().sum()
    }

    /// Per column, its field.
    pub fn col_field(&self) -> Vec<u32> {
        self.widths.iter().enumerate().flat_map(|(f, w)| std::iter::repeat_n(f as u32, *w)).collect()
    }
}

/// A [`FieldWidths`] on the device, with the model's multi-hot mean mask.
pub struct FieldsOnDevice<D: Device> {
    widths: FieldWidths,
    field_col: D::Buf<u32>,
    col_field: D::Buf<u32>,
    mean: u32,
    widest: usize,
}

impl<D: Device> FieldsOnDevice<D> {
    /// `widths` on `dev`, its multi-hot fields pooled as `mean` says. An error when the
    /// columns are not `cols` (the model's embedding columns) or a field is empty.
    pub(super) fn new(dev: &D, widths: FieldWidths, cols: usize, mean: u32) -> DeviceResult<FieldsOnDevice<D>> {
        if widths.cols() != cols || widths.single > widths.widths.len() || widths.widths.contains(&0) || u32::try_from(cols).is_err() {
            return Err(DeviceError::refused("fields of several widths", format!("fields of {:?} values ({} single-hot), the model takes {cols} embedding columns", widths.widths, widths.single)));
        }
        let widest = widths.widths.iter().copied().max().unwrap_or(0);
        Ok(FieldsOnDevice { field_col: dev.buffer_from(&widths.field_col())?, col_field: dev.buffer_from(&widths.col_field())?, widest, mean, widths })
    }

    /// The fields' widths.
    pub fn widths(&self) -> &FieldWidths {
        &self.widths
    }

    /// Single-hot fields.
    pub(super) fn single(&self) -> usize {
        self.widths.single
    }

    /// The launch's view of the columns.
    fn cols(&self) -> FieldCols<'_, D> {
        let w = &self.widths;
        FieldCols { field_col: &self.field_col, col_field: &self.col_field, cols: w.cols(), fields: w.widths.len(), single: w.single, mean: self.mean }
    }

    /// The input `out` (`rows` rows of `stride` values) from the staged rows `emb` at
    /// `key_at`, the single-hot fields' keys `inverse` and the bags (`bags`: their offsets and
    /// ids): [`Op::GatherFields`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gather(&self, dev: &D, emb: &D::Buf<f32>, key_at: &D::Buf<u32>, inverse: &D::Buf<u32>, bags: (&D::Buf<u32>, &D::Buf<u32>), out: &mut D::Buf<f32>, rows: usize, stride: usize) -> DeviceResult<()> {
        let (offsets, index) = bags;
        dev.exec(Op::GatherFields { emb, key_at, inverse, index, offsets, cols: self.cols(), out, rows, stride })
    }

    /// The key gradients `out` (`floats` values at `key_at`, `keys` keys) from the input
    /// gradient `src` and the keys' lists `lists`: [`Op::GatherFieldsGrad`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn key_grads(&self, dev: &D, src: &D::Buf<f32>, key_at: &D::Buf<u32>, lists: KeyLists<'_, D>, out: &mut D::Buf<f32>, keys: usize, floats: usize, rows: usize, stride: usize) -> DeviceResult<()> {
        let KeyLists { offsets, slots, bag_offsets, key_offsets, bag_slots } = lists;
        let cols = self.cols();
        dev.exec(Op::GatherFieldsGrad { src, key_at, offsets, slots, bag_offsets, key_offsets, bag_slots, cols, out, keys, widest: self.widest, floats, rows, stride })
    }
}

/// A loaded batch's lists on the device: each key's single-hot slots (`offsets`, `slots`:
/// [`crate::model::input::build_csr`]), where each bag's ids start (`bag_offsets`) and each
/// key's bags (`key_offsets`, `bag_slots`: [`crate::model::pooling::build_bag_csr`]).
pub(super) struct KeyLists<'a, D: Device> {
    pub(super) offsets: &'a D::Buf<u32>,
    pub(super) slots: &'a D::Buf<u32>,
    pub(super) bag_offsets: &'a D::Buf<u32>,
    pub(super) key_offsets: &'a D::Buf<u32>,
    pub(super) bag_slots: &'a D::Buf<u32>,
}

impl FieldWidths {
    /// Checks a staged batch: the row offsets `key_at` (one per key and one more) rise from 0
    /// to `floats`, and every key a field names — single-hot through `inverse` (`single` per
    /// sample), multi-hot through the bags (`bag_offsets`, `bag_index`) — exists and has that
    /// field's width. An error names the first that does not.
    pub fn check_staged(&self, key_at: &[u32], floats: usize, inverse: &[u32], bag_offsets: &[u32], bag_index: &[u32]) -> Result<(), String> {
        if key_at.first() != Some(&0) || key_at.last().map(|l| *l as usize) != Some(floats) || key_at.windows(2).any(|w| w[1] < w[0]) {
            return Err(format!("key offsets do not rise from 0 to the {floats} staged values"));
        }
        let keys = key_at.len() - 1;
        let fits = |u: u32, f: usize| (u as usize) < keys && (key_at[u as usize + 1] - key_at[u as usize]) as usize == self.widths[f];
        let single = self.single.max(1);
        if let Some(p) = (0..inverse.len()).find(|p| !fits(inverse[*p], p % single)) {
            return Err(format!("slot {p} names key {} of {keys}, not a row of field {}'s {} values", inverse[p], p % single, self.widths[p % single]));
        }
        let bags = self.widths.len() - self.single;
        for (b, w) in bag_offsets.windows(2).enumerate() {
            let f = self.single + b % bags.max(1);
            if let Some(u) = bag_index.get(w[0] as usize..w[1] as usize).unwrap_or_default().iter().find(|u| !fits(**u, f)) {
                return Err(format!("bag {b} names key {u} of {keys}, not a row of field {f}'s {} values", self.widths[f]));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_follow_the_fields_widths() {
        let w = FieldWidths { widths: vec![2, 3, 1], single: 2 };
        assert_eq!(w.field_col(), [0, 2, 5, 6]);
        assert_eq!(w.col_field(), [0, 0, 1, 1, 1, 2]);
        assert_eq!(w.cols(), 6);
        // Keys 0 and 1 of width 2 and 3, key 2 of width 1: sample 0's fields 0, 1, then a bag.
        let key_at = [0, 2, 5, 6];
        assert!(w.check_staged(&key_at, 6, &[0, 1], &[0, 2], &[2, 2]).is_ok());
        assert!(w.check_staged(&key_at, 6, &[0, 1], &[0, 0], &[]).is_ok(), "an empty bag");
        assert!(w.check_staged(&key_at, 6, &[1, 1], &[0, 0], &[]).unwrap_err().contains("slot 0 names key 1"));
        assert!(w.check_staged(&key_at, 6, &[0, 1], &[0, 1], &[3]).unwrap_err().contains("bag 0 names key 3 of 3"));
        assert!(w.check_staged(&[0, 2, 1, 6], 6, &[], &[0], &[]).unwrap_err().contains("do not rise"));
        assert!(w.check_staged(&key_at, 7, &[], &[0], &[]).is_err());
    }
}
