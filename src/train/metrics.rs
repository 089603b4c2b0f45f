//! Evaluation metrics over all ranks' predictions and process statistics: AUC, log loss,
//! and the two CTR teams report beside them (He et al. 2014, "Practical Lessons from
//! Predicting Clicks on Ads at Facebook"): normalised entropy (NE, the log loss over the
//! entropy of the observed click rate: 1 for a constant predictor at the base rate, lower
//! is better) and calibration (mean predicted probability over the observed click rate: 1
//! is calibrated). All four are computed by [`Evaluation::of`] over the same set.

/// The held-out evaluation of a set of predictions (rank 0 of a run or of `predict`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// Mean log loss.
    pub logloss: f64,
    /// Area under the ROC curve over all ranks' predictions.
    pub auc: f64,
    /// Normalised entropy: `logloss` / the entropy of the observed click rate (`None` when
    /// the set holds one class only: its entropy is 0).
    pub ne: Option<f64>,
    /// Mean predicted probability / observed click rate (`None` without a positive).
    pub calibration: Option<f64>,
}

impl Evaluation {
    /// The four metrics of `scores` (probabilities) against `labels` (0 or 1).
    pub fn of(scores: &[f32], labels: &[f32]) -> Evaluation {
        let logloss = logloss(scores, labels);
        Evaluation { logloss, auc: auc(scores, labels), ne: ne(logloss, labels), calibration: calibration(scores, labels) }
    }
}

/// Exact area under the ROC curve of `(score, label)` pairs: the Mann-Whitney U statistic
/// with tied scores sharing their average rank. 0.5 when only one class is present.
pub fn auc(scores: &[f32], labels: &[f32]) -> f64 {
    let n = scores.len().min(labels.len());
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_unstable_by(|a, b| scores[*a].total_cmp(&scores[*b]));
    let positives = labels[..n].iter().filter(|y| **y > 0.5).count() as f64;
    let negatives = n as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return 0.5;
    }
    let mut rank_sum = 0f64;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        // ranks i+1 ..= j+1 share their average
        let avg = (i + j + 2) as f64 / 2.0;
        for k in &idx[i..=j] {
            if labels[*k] > 0.5 {
                rank_sum += avg;
            }
        }
        i = j + 1;
    }
    (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)
}

/// Mean binary cross-entropy of probabilities (clamped to [1e-7, 1-1e-7]).
pub fn logloss(probs: &[f32], labels: &[f32]) -> f64 {
    let n = probs.len().min(labels.len());
    if n == 0 {
        return 0.0;
    }
    let mut s = 0f64;
    for i in 0..n {
        let p = (probs[i] as f64).clamp(1e-7, 1.0 - 1e-7);
        s -= if labels[i] > 0.5 { p.ln() } else { (1.0 - p).ln() };
    }
    s / n as f64
}

/// The observed click rate of `labels` (the share labelled 1), `None` when empty.
fn click_rate(labels: &[f32]) -> Option<f64> {
    (!labels.is_empty()).then(|| labels.iter().filter(|y| **y > 0.5).count() as f64 / labels.len() as f64)
}

/// Normalised entropy of a set whose mean log loss is `logloss`: that over the binary
/// entropy `-(p ln p + (1-p) ln(1-p))` of the observed click rate `p` of `labels`; `None`
/// when the set is empty or holds one class only (entropy 0).
pub fn ne(logloss: f64, labels: &[f32]) -> Option<f64> {
    let p = click_rate(labels).filter(|p| *p > 0.0 && *p < 1.0)?;
    let entropy = -(p * p.ln() + (1.0 - p) * (1.0 - p).ln());
    Some(logloss / entropy)
}

/// Calibration: the mean predicted probability over the observed click rate of `labels`;
/// `None` when the set is empty or has no positive.
pub fn calibration(probs: &[f32], labels: &[f32]) -> Option<f64> {
    let n = probs.len().min(labels.len());
    let p = click_rate(&labels[..n]).filter(|p| *p > 0.0)?;
    let mean = probs[..n].iter().map(|x| *x as f64).sum::<f64>() / n as f64;
    Some(mean / p)
}

/// Peak resident set size of this process in MiB (`VmHWM`), 0 when unknown.
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn auc_by_hand_with_ties() {
        assert_eq!(auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]), 0.75);
        assert_eq!(auc(&[0.1, 0.2, 0.3], &[0.0, 1.0, 1.0]), 1.0);
        assert_eq!(auc(&[0.5, 0.5], &[0.0, 1.0]), 0.5);
        assert_eq!(auc(&[0.3, 0.2], &[1.0, 1.0]), 0.5);
        // tie between one positive and one negative counts half
        assert_eq!(auc(&[0.1, 0.5, 0.5, 0.9], &[0.0, 1.0, 0.0, 1.0]), 0.875);
    }
    #[test]
    fn logloss_by_hand() {
        let l = logloss(&[0.5, 0.5], &[1.0, 0.0]);
        assert!((l - std::f64::consts::LN_2).abs() < 1e-12);
    }
    #[test]
    fn a_constant_predictor_at_the_base_rate_has_ne_1_and_calibration_1() {
        // 1 click in 4, every score 0.25: log loss = -(ln 0.25 + 3 ln 0.75) / 4 = H(0.25).
        let (s, y) = ([0.25f32; 4], [1.0, 0.0, 0.0, 0.0]);
        let e = Evaluation::of(&s, &y);
        let h = -(0.25f64.ln() + 3.0 * 0.75f64.ln()) / 4.0;
        assert!((e.logloss - h).abs() < 1e-12);
        assert!((e.ne.unwrap() - 1.0).abs() < 1e-12, "{e:?}");
        assert!((e.calibration.unwrap() - 1.0).abs() < 1e-12, "{e:?}");
        assert_eq!(e.auc, 0.5);
    }
    #[test]
    fn a_perfect_predictor_has_ne_near_0_and_a_biased_one_shows_in_calibration() {
        let y = [1.0, 0.0, 0.0, 0.0];
        let e = Evaluation::of(&[1.0, 0.0, 0.0, 0.0], &y);
        // The clamp to [1e-7, 1 - 1e-7]: log loss -ln(1 - 1e-7) per row, NE about 1.8e-7.
        assert!(e.ne.unwrap() > 0.0 && e.ne.unwrap() < 1e-6, "{e:?}");
        assert_eq!((e.auc, e.calibration), (1.0, Some(1.0)));
        // Twice the base rate everywhere: calibration 2; NE above 1 (worse than the rate).
        let e = Evaluation::of(&[0.5; 4], &y);
        assert!((e.calibration.unwrap() - 2.0).abs() < 1e-12);
        let h = -(0.25f64.ln() + 3.0 * 0.75f64.ln()) / 4.0;
        assert!((e.ne.unwrap() - std::f64::consts::LN_2 / h).abs() < 1e-12 && e.ne.unwrap() > 1.0, "{e:?}");
        // One class only: no NE (entropy 0); no positive: no calibration.
        let e = Evaluation::of(&[0.1, 0.2], &[0.0, 0.0]);
        assert_eq!((e.ne, e.calibration), (None, None));
        assert_eq!(Evaluation::of(&[0.9], &[1.0]).ne, None);
        assert_eq!(Evaluation::of(&[0.5], &[1.0]).calibration, Some(0.5));
        assert_eq!((ne(0.3, &[]), calibration(&[], &[])), (None, None));
    }
}
