//! The sample-weight flags of `ringrec train` ([`ringrec::data::weights`]), flattened into
//! its flags: time decay, merging, the minimum weight and the weight column.

use std::path::PathBuf;

use ringrec::data::weights::{parse_day_of, parse_decay_base, DecayUnit, WeightConfig};

/// Per-sample weights: time decay, merged duplicates, dropped light samples.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WeightArgs {
    /// Time decay: a sample of age a (days before the newest --data file's day) weighs
    /// BASE^-a: e, 2, or a number above 1. Default: every sample weighs 1.
    #[arg(long, value_name = "BASE", value_parser = parse_decay_base)]
    pub decay_base: Option<f64>,
    /// The unit of age for --decay-base: day (a file's day: its position in --data, or --day-of).
    #[arg(long, default_value = "day", value_name = "UNIT")]
    pub decay_unit: DecayUnit,
    /// The day of a --data file, FILE=N (repeatable); files not named are day = their
    /// position in --data (0, 1, ...). The newest day is the largest.
    #[arg(long, value_name = "FILE=N", value_parser = parse_day_of)]
    pub day_of: Vec<(PathBuf, i64)>,
    /// Samples weighing less than W are left out and counted
    /// (`samples_dropped_by_weight`) [default: 0.001 with --decay-base, else 0].
    #[arg(long, value_name = "W")]
    pub min_sample_weight: Option<f64>,
    /// Identical samples (same label, dense values and keys) of one --data file become
    /// one sample whose weight is multiplied by their count (the first kept, in file
    /// order; `samples_merged` counts the rows merged away).
    #[arg(long)]
    pub merge_duplicates: bool,
    /// The --data and --eval-data lines have 41 tab-separated fields: field N (1-based, like
    /// `cut -f`; e.g. 41 last, 2 right after the label) is the sample's weight, a finite
    /// number >= 0, and the other 40 are Criteo's in order. A training row weighs its
    /// weight times its decay weight; merged rows add their weights. A bad weight makes
    /// the line malformed (counted, --max-bad-lines). Evaluation stays unweighted.
    #[arg(long, value_name = "N")]
    pub weight_column: Option<u32>,
}

impl WeightArgs {
    /// The library's configuration.
    pub fn config(&self) -> WeightConfig {
        WeightConfig {
            decay_base: self.decay_base,
            decay_unit: self.decay_unit,
            day_of: self.day_of.clone(),
            min_sample_weight: self.min_sample_weight,
            merge_duplicates: self.merge_duplicates,
            weight_column: self.weight_column,
        }
    }
}
