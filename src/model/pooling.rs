//! Multi-hot pooling (issue 33): how each multi-hot field's bag of ids becomes one vector
//! per sample, `EmbeddingBag`'s semantics. The batch holds a field's ids per sample in CSR
//! form (bag `b` = field `b % bags` of sample `b / bags`, its ids
//! `index[offsets[b]..offsets[b + 1]]`, rows among the batch's unique keys, deduplicated
//! with the single-hot keys); [`Op::PoolBags`](crate::device::Op::PoolBags) pools them into
//! the input rows and [`Op::PoolBagsGrad`](crate::device::Op::PoolBagsGrad) spreads the
//! pooled gradient back to every id of the bag, summed per key in bag order
//! ([`build_bag_csr`]), after the key's single-hot slots.

use super::input::build_csr;
use crate::device::ops::MAX_BAGS;

/// How a multi-hot field's bag is pooled (`--multi-hot-pooling`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The sum of the bag's embedding rows (`EmbeddingBag(mode="sum")`).
    #[default]
    Sum,
    /// Their mean (`EmbeddingBag(mode="mean")`); the backward divides by the bag's length.
    Mean,
}

crate::config::named_enum!(Pooling { Sum => "sum", Mean => "mean" });

/// The pooling of each of `fields` multi-hot fields named `names` from a flag's value:
/// one mode for all (`sum`, `mean`) or a comma-separated list of `FIELD=MODE` (fields not
/// named are summed). An error names the word or field it does not know.
pub fn parse_pooling(spec: &str, names: &[String]) -> Result<Vec<Pooling>, String> {
    if !spec.contains('=') {
        let mode: Pooling = spec.trim().parse().map_err(|e| format!("--multi-hot-pooling: {e}"))?;
        return Ok(vec![mode; names.len()]);
    }
    let mut modes = vec![Pooling::Sum; names.len()];
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (field, mode) = part.split_once('=').ok_or_else(|| format!("--multi-hot-pooling: `{part}` is not FIELD=sum|mean"))?;
        let at = names.iter().position(|n| n == field.trim()).ok_or_else(|| format!("--multi-hot-pooling: `{}` is not a multi-hot field (they are: {})", field.trim(), names.join(", ")))?;
        modes[at] = mode.trim().parse().map_err(|e| format!("--multi-hot-pooling: {}: {e}", field.trim()))?;
    }
    Ok(modes)
}

/// The `mean` mask of a pooling launch: bit `f` set when field `f` is pooled by its mean.
/// An error when there are more fields than a launch takes ([`MAX_BAGS`]).
pub fn mean_mask(modes: &[Pooling]) -> Result<u32, String> {
    if modes.len() > MAX_BAGS {
        return Err(format!("{} multi-hot fields; at most {MAX_BAGS} are pooled", modes.len()));
    }
    Ok(modes.iter().enumerate().filter(|(_, m)| **m == Pooling::Mean).fold(0, |mask, (f, _)| mask | 1 << f))
}

/// Each of `keys` keys' bags in CSR form, the order of its gradient's sum:
/// `slots[key_offsets[u]..key_offsets[u + 1]]` are the bags `b` holding key `u`, in bag
/// order, once per occurrence (`index` and `offsets` as in the module docs; `slots` as long
/// as `index`). `next` is scratch. An error names an id out of range or offsets that do not
/// rise.
pub fn build_bag_csr(index: &[u32], offsets: &[u32], keys: usize, key_offsets: &mut [u32], slots: &mut [u32], next: &mut Vec<u32>) -> Result<(), String> {
    if offsets.first() != Some(&0) || offsets.windows(2).any(|w| w[1] < w[0]) || offsets.last().is_some_and(|l| *l as usize != index.len()) {
        return Err(format!("bag offsets do not rise from 0 to the {} ids", index.len()));
    }
    // A key's positions in `index` in increasing order are its bags in bag order (the bags
    // lie one after another); each position then becomes its bag.
    build_csr(index, keys, key_offsets, slots, next)?;
    next.clear();
    for (b, w) in offsets.windows(2).enumerate() {
        next.extend(std::iter::repeat_n(b as u32, (w[1] - w[0]) as usize));
    }
    for s in slots[..index.len()].iter_mut() {
        *s = next[*s as usize];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_bags_are_listed_in_bag_order_once_per_occurrence() {
        // Bags: [0, 2], [], [2, 2, 1].
        let (index, offsets) = ([0u32, 2, 2, 2, 1], [0u32, 2, 2, 5]);
        let (mut ko, mut slots, mut next) = (vec![0u32; 4], vec![0u32; 5], Vec::new());
        build_bag_csr(&index, &offsets, 3, &mut ko, &mut slots, &mut next).unwrap();
        assert_eq!(ko, [0, 1, 2, 5]);
        assert_eq!(slots, [0, 2, 0, 2, 2]);
        assert!(build_bag_csr(&index, &offsets, 2, &mut ko, &mut slots, &mut next).unwrap_err().contains("row 2 of 2"));
        assert!(build_bag_csr(&index, &[0, 3, 2, 5], 3, &mut ko, &mut slots, &mut next).is_err());
        assert!(build_bag_csr(&index, &[1, 3, 3, 5], 3, &mut ko, &mut slots, &mut next).is_err());
    }

    #[test]
    fn the_pooling_flag_takes_one_mode_or_one_per_field() {
        let names: Vec<String> = ["l0", "l1", "l2"].iter().map(|s| s.to_string()).collect();
        assert_eq!(parse_pooling("mean", &names).unwrap(), vec![Pooling::Mean; 3]);
        assert_eq!(parse_pooling("l1=mean", &names).unwrap(), [Pooling::Sum, Pooling::Mean, Pooling::Sum]);
        assert_eq!(mean_mask(&parse_pooling("l0=mean, l2=mean", &names).unwrap()).unwrap(), 0b101);
        assert!(parse_pooling("max", &names).unwrap_err().contains("max"));
        assert!(parse_pooling("l9=sum", &names).unwrap_err().contains("l9"));
        assert!(mean_mask(&[Pooling::Mean; 33]).is_err());
    }
}
