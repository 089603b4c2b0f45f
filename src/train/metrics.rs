//! Evaluation metrics over all ranks' predictions and process statistics.

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
}
