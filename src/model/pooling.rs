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

/// The pooling a model records (a checkpoint's `--multi-hot-pooling`, a bundle's
/// `input.multi_hot`): every multi-hot field by name, `FIELD=MODE,...` in field order, so
/// that the record names the fields as well; without multi-hot fields, `spoken` (the flag as
/// given) or `sum`.
pub fn describe_pooling(modes: &[Pooling], names: &[String], spoken: Option<&str>) -> String {
    if names.is_empty() {
        return spoken.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("sum").to_string();
    }
    names.iter().zip(modes).map(|(n, m)| format!("{n}={m}")).collect::<Vec<_>>().join(",")
}

/// The multi-hot fields a recorded pooling names, with their modes (`l0=sum,l1=mean`);
/// empty for a record without names (`sum`: a model without multi-hot fields, or one
/// recorded before the names were).
pub fn recorded_fields(recorded: &str) -> Result<Vec<(String, Pooling)>, String> {
    if !recorded.contains('=') {
        recorded.trim().parse::<Pooling>().map_err(|e| format!("--multi-hot-pooling: {e}"))?;
        return Ok(Vec::new());
    }
    let names: Vec<String> = recorded.split(',').filter_map(|p| p.split_once('=')).map(|(n, _)| n.trim().to_string()).collect();
    Ok(names.iter().cloned().zip(parse_pooling(recorded, &names)?).collect())
}

/// The pooling of the multi-hot fields `names` of a model that recorded `recorded` (`None`:
/// a checkpoint or bundle written before the pooling was recorded, which summed every
/// field), checked against a `flag` given again: a flag that pools a field otherwise is
/// refused naming both values (`model`: what recorded it, for the message).
pub fn recorded_pooling(recorded: Option<&str>, flag: Option<&str>, names: &[String], model: &str) -> Result<Vec<Pooling>, String> {
    let recorded = recorded.unwrap_or("sum");
    let theirs = parse_pooling(recorded, names).map_err(|e| format!("{model}: its recorded pooling: {e}"))?;
    if let Some(flag) = flag {
        let mine = parse_pooling(flag, names)?;
        if let Some(at) = (0..names.len()).find(|&f| mine[f] != theirs[f]) {
            return Err(format!(
                "--multi-hot-pooling {flag}: the {model} pools its multi-hot fields as {recorded} (field {}: {} there, {} here); leave the flag out to score as it was trained",
                names[at], theirs[at], mine[at]
            ));
        }
    }
    Ok(theirs)
}

/// Whether two recorded poolings are the same model's: equal, or one mode without names
/// (`sum`, a checkpoint's from before the names were recorded) and the other every field
/// pooled so.
pub fn same_pooling(a: &str, b: &str) -> bool {
    let one = |named: &str, word: &str| match (recorded_fields(named), word.trim().parse::<Pooling>()) {
        (Ok(fields), Ok(w)) => fields.iter().all(|(_, m)| *m == w),
        _ => false,
    };
    a == b || (!a.contains('=') && b.contains('=') && one(b, a)) || (!b.contains('=') && a.contains('=') && one(a, b))
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

    #[test]
    fn a_recorded_pooling_names_every_field_and_refuses_a_contradicting_flag() {
        let names: Vec<String> = ["l0", "l1"].iter().map(|s| s.to_string()).collect();
        let rec = describe_pooling(&parse_pooling("l1=mean", &names).unwrap(), &names, Some("l1=mean"));
        assert_eq!(rec, "l0=sum,l1=mean");
        assert_eq!(describe_pooling(&[], &[], Some(" mean ")), "mean");
        assert_eq!(describe_pooling(&[], &[], None), "sum");
        assert_eq!(recorded_fields(&rec).unwrap(), [("l0".to_string(), Pooling::Sum), ("l1".to_string(), Pooling::Mean)]);
        assert!(recorded_fields("sum").unwrap().is_empty());
        assert_eq!(recorded_pooling(Some(&rec), None, &names, "checkpoint").unwrap(), [Pooling::Sum, Pooling::Mean]);
        assert_eq!(recorded_pooling(Some(&rec), Some("l1=mean"), &names, "checkpoint").unwrap(), [Pooling::Sum, Pooling::Mean]);
        assert_eq!(recorded_pooling(None, None, &names, "checkpoint").unwrap(), [Pooling::Sum; 2], "a record from before: sum");
        let e = recorded_pooling(Some(&rec), Some("mean"), &names, "checkpoint").unwrap_err();
        assert!(e.contains("--multi-hot-pooling mean") && e.contains("l0=sum,l1=mean") && e.contains("field l0: sum there, mean here"), "{e}");
        assert!(recorded_pooling(None, Some("mean"), &names, "checkpoint").unwrap_err().contains("pools its multi-hot fields as sum"));
        assert!(same_pooling("sum", "l0=sum,l1=sum") && same_pooling("l0=mean,l1=mean", "mean") && same_pooling("sum", "sum"));
        assert!(!same_pooling("sum", "l0=sum,l1=mean") && !same_pooling("mean", "sum") && !same_pooling("l0=sum", "l1=sum"));
    }
}
