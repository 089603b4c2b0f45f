//! The training run's side of per-sample weights ([`crate::data::weights`]): each
//! training file's kept rows and weights, computed when the file is opened (the same on
//! every rank), the counts of merged and dropped rows, and a batch's weights and its
//! global weight sum.
//!
//! **Weighted aggregation.** A weighted step's loss is `sum_i w_i l_i / W`, with `W` the
//! sum of the weights of the *global* batch. Every rank knows every row's weight from the
//! data alone, so each computes `W` itself (summed in f64 in position order: the same bits
//! on every rank), scales its loss gradient by `1 / W` and stages its own samples'
//! weights; the engine's plain sum over the ranks is then the gradient of the weighted
//! mean, with no extra collective. A run without weights ([`WeightConfig::active`] false)
//! takes none of these paths.

use std::path::PathBuf;

use crate::data::cache::Dataset;
use crate::data::weights::{weigh_file, FileWeights, WeightConfig};
use crate::data::DataResult;

/// The weighting of a run's training files.
#[derive(Debug)]
pub struct Weighting {
    merge: bool,
    min_weight: f64,
    /// The decay weight of each training file, by position.
    day_weights: Vec<f64>,
    /// Rows merged into earlier identical rows, over the files weighed so far.
    pub merged: u64,
    /// Rows dropped for weighing too little, over the files weighed so far.
    pub dropped: u64,
}

impl Weighting {
    /// The weighting of `files` (the training files as resolved, in order) under `cfg`;
    /// `None` when `cfg` weighs every row 1 and keeps every row.
    pub fn new(cfg: &WeightConfig, files: &[PathBuf]) -> DataResult<Option<Weighting>> {
        if !cfg.active() {
            return Ok(None);
        }
        let days = cfg.days(files)?;
        Ok(Some(Weighting { merge: cfg.merge_duplicates, min_weight: cfg.min_weight(), day_weights: cfg.day_weights(&days), merged: 0, dropped: 0 }))
    }

    /// Weighs rows `0..rows` of training file `i` (its cache `ds`) and counts what was
    /// merged and dropped.
    pub fn weigh(&mut self, i: usize, ds: &Dataset, rows: usize) -> FileWeights {
        let w = weigh_file(ds, rows, self.day_weights.get(i).copied().unwrap_or(1.0), self.merge, self.min_weight);
        self.merged += w.merged;
        self.dropped += w.dropped;
        w
    }
}

/// The weight settings in words (the ranks compare them; a weighted checkpoint records
/// them). `--weight-column` appears only when given, so the words of the settings before
/// it existed (in older checkpoints) are unchanged.
pub fn describe(cfg: &WeightConfig) -> String {
    let days: Vec<String> = cfg.day_of.iter().map(|(p, d)| format!("{}={d}", p.display())).collect();
    let column = cfg.weight_column.as_ref().map_or(String::new(), |c| format!(" --weight-column {c}"));
    format!(
        "--decay-base {:?} --decay-unit {} --day-of [{}] --min-sample-weight {} --merge-duplicates {}{column}",
        cfg.decay_base,
        cfg.decay_unit,
        days.join(", "),
        cfg.min_weight(),
        cfg.merge_duplicates
    )
}

/// A batch's weights: this rank's samples' (in batch order) and the global batch's sum.
#[derive(Debug, Default)]
pub struct BatchWeights {
    /// This rank's samples' weights.
    pub mine: Vec<f32>,
    /// The sum of the global batch's weights (f64, in position order).
    pub global_sum: f64,
}

/// `--loss-normalize`: what a weighted step's loss sum `sum_i w_i l_i` is divided by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LossNormalize {
    /// The global batch's weight sum: the weighted mean (design 001/002's aggregation).
    /// Inside a batch whose rows weigh the same (one day's), the weights cancel.
    #[default]
    Weights,
    /// The global batch's rows, as Keras' `sum_over_batch_size` and PyTorch's weighted
    /// `reduction="mean"`: a batch of light (old) rows moves the model less, so time decay
    /// acts on days trained in order too.
    Rows,
}

crate::config::named_enum!(LossNormalize { Weights => "weights", Rows => "rows" });

/// The loss scale of a step and what its global loss sum is divided by: 1 / the global
/// batch and the global batch (unweighted: the bits of a run without weights; a weighted
/// run under [`LossNormalize::Rows`]), or 1 / the global weight sum and that sum. A global
/// batch whose weights sum to 0 (every row of weight 0: `--weight-column`) gets scale 0 and
/// divisor 1 under [`LossNormalize::Weights`] (under `Rows` its gradients are zero
/// anyway): its reported loss is 0, never NaN; the trainer then skips its dense optimizer
/// step (Adam's moments would move the parameters even so), and the table's SGD and
/// Adagrad leave rows with a zero gradient as they are: the step changes no parameter.
pub fn loss_scale(weights: Option<&BatchWeights>, global_batch: usize, normalize: LossNormalize) -> (f32, f64) {
    match (weights, normalize) {
        (Some(w), LossNormalize::Weights) if w.global_sum > 0.0 => ((1.0 / w.global_sum) as f32, w.global_sum),
        (Some(_), LossNormalize::Weights) => (0.0, 1.0),
        _ => (1.0 / global_batch as f32, global_batch as f64),
    }
}

/// This rank's weight and the global batch's (`--sparse-normalize weighted`): the sums of
/// the sample weights, or the sample counts in a run without weights.
pub fn rank_weights(weights: Option<&BatchWeights>, mine: usize, global: usize) -> (f32, f32) {
    match weights {
        Some(w) => (w.mine.iter().map(|v| *v as f64).sum::<f64>() as f32, w.global_sum as f32),
        None => (mine as f32, global as f32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::weights::WeightColumn;

    #[test]
    fn unweighted_runs_have_no_weighting_and_describe_names_every_flag() {
        assert!(Weighting::new(&WeightConfig::default(), &[PathBuf::from("a")]).unwrap().is_none());
        let cfg = WeightConfig { decay_base: Some(2.0), merge_duplicates: true, ..WeightConfig::default() };
        let w = Weighting::new(&cfg, &[PathBuf::from("/nonexistent/a"), PathBuf::from("/nonexistent/b")]).unwrap().unwrap();
        assert_eq!(w.day_weights, vec![0.5, 1.0]);
        assert_eq!(w.min_weight, 0.001);
        let d = describe(&cfg);
        assert!(d.contains("--decay-base Some(2.0)") && d.contains("--merge-duplicates true") && d.contains("--min-sample-weight 0.001"), "{d}");
        assert!(!d.contains("--weight-column"), "{d}");
        let col = WeightConfig { weight_column: Some(WeightColumn::Field(41)), ..WeightConfig::default() };
        assert!(col.active());
        assert!(describe(&col).ends_with("--merge-duplicates false --weight-column 41"), "{}", describe(&col));
    }

    #[test]
    fn loss_scale_divides_by_the_weight_sum_or_the_rows() {
        let w = BatchWeights { mine: vec![0.25; 3], global_sum: 2.5 };
        assert_eq!(loss_scale(Some(&w), 10, LossNormalize::Weights), (0.4, 2.5));
        assert_eq!(loss_scale(Some(&w), 10, LossNormalize::Rows), (0.1, 10.0));
        assert_eq!(loss_scale(None, 8, LossNormalize::Weights), (0.125, 8.0));
        assert_eq!(loss_scale(None, 8, LossNormalize::Rows), (0.125, 8.0));
        let nothing = BatchWeights { mine: vec![0.0; 2], global_sum: 0.0 };
        assert_eq!(loss_scale(Some(&nothing), 4, LossNormalize::Weights), (0.0, 1.0), "a batch weighing nothing moves nothing");
        assert_eq!(loss_scale(Some(&nothing), 4, LossNormalize::Rows), (0.25, 4.0), "its gradients are zero already");
        assert_eq!("rows".parse::<LossNormalize>(), Ok(LossNormalize::Rows));
        assert_eq!("mean".parse::<LossNormalize>().unwrap_err(), "`mean` is not one of weights, rows");
    }
}
