//! A synthetic Criteo-format TSV with a planted logistic model, so a model can learn
//! something real and the best achievable AUC is known.
//!
//! Row `r` is drawn from its own random stream `splitmix64(seed ^ splitmix64(r + SALT))`,
//! so a file is the same for a seed on any machine and any number of threads.
//!
//! - **Categoricals** C1..C26: field `f` has a vocabulary of `V_f` values, from 10 to
//!   100,000 (log-spaced, in a scrambled field order), drawn Zipf(1.1) by rank; rank `j`
//!   is written as 8 hex digits `fmix32(j ^ salt_f)` (a bijection, so ranks never merge).
//!   Some fields are often missing (empty), as in the real logs (up to 35%).
//! - **Integers** I1..I13: `floor(exp(mu_k + 1.2 z)) - 1` with `z` roughly normal; I2 is
//!   shifted down by 2, so it takes the values -3..; each is missing with 2% to 20%
//!   probability.
//! - **Label**: `P(click) = sigmoid(b + sum_f w(f, value_f) + sum_k v_k ln(1 + max(x_k, 0)))`,
//!   with `w(f, j) ~ 0.2 N(0, 1)` a hash of `(seed, f, j)` (missing has its own weight),
//!   `v_k ~ 0.2 N(0, 1)`, and the bias `b` calibrated on the first 20,000 rows so the CTR
//!   is about 25%. The dense term uses exactly the reader's transform
//!   ([`dense_value`]), so a logistic model over hashed categoricals and the reader's dense
//!   features can in principle reach the planted model's (Bayes) AUC.
//!
//! [`SynthSummary::bayes_auc`] is the AUC of the planted probabilities against the drawn
//! labels (from a 65,536-bin histogram of the probability: constant memory, error < 1e-4).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::fileio::AtomicFile;
use super::criteo::{dense_value, NUM_DENSE, NUM_SPARSE};
use super::error::{DataError, DataResult};
use crate::hash::{splitmix64, Stream, GOLDEN};

/// Target click-through rate of the calibrated bias.
pub const TARGET_CTR: f64 = 0.25;
/// Zipf exponent of the categorical values.
pub const ZIPF_EXPONENT: f64 = 1.1;
/// Standard deviation of the planted weight of a categorical value.
pub const CAT_WEIGHT_SCALE: f64 = 0.2;
/// Standard deviation of the planted weight of a dense feature.
pub const DENSE_WEIGHT_SCALE: f64 = 0.2;
/// Rows used to calibrate the bias.
const CALIBRATION_ROWS: u64 = 20_000;
/// Rows generated per parallel task.
const CHUNK_ROWS: u64 = 4096;
/// Bins of the probability histogram of the Bayes AUC.
const AUC_BINS: usize = 1 << 16;
const ROW_SALT: u64 = 0x5359_4e54_4845_5449; // "SYNTHETI"

/// What [`synth`] wrote.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SynthSummary {
    /// The TSV file.
    pub path: PathBuf,
    /// Rows written.
    pub rows: u64,
    /// Rows labelled 1.
    pub positives: u64,
    /// `positives / rows`.
    pub ctr: f64,
    /// AUC of the planted model's probabilities on these rows (the best any model can
    /// expect on them); 0.5 when there is only one class.
    pub bayes_auc: f64,
    /// Size of the file.
    pub bytes: u64,
    /// The seed.
    pub seed: u64,
}

/// Roughly standard normal from one 64-bit hash: four 16-bit uniforms (Irwin-Hall).
fn gauss(h: u64) -> f64 {
    let s: u64 = (0..4).map(|i| (h >> (16 * i)) & 0xFFFF).sum();
    (s as f64 / 65536.0 - 2.0) * 3f64.sqrt()
}

/// murmur3's 32-bit finaliser: a bijection of u32.
fn fmix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    x = x.wrapping_mul(0xc2b2_ae35);
    x ^ (x >> 16)
}

/// The planted model and the value distributions of one seed.
struct Planted {
    seed: u64,
    /// Per field: cumulative Zipf weights of ranks 0..V_f.
    cdf: Vec<Vec<f64>>,
    cat_missing: [f64; NUM_SPARSE],
    hex_salt: [u32; NUM_SPARSE],
    dense_mu: [f64; NUM_DENSE],
    dense_missing: [f64; NUM_DENSE],
    dense_w: [f64; NUM_DENSE],
    bias: f64,
}

/// One generated row: raw integers (None = missing), categorical ranks (None = missing).
struct Row {
    ints: [Option<i64>; NUM_DENSE],
    cats: [Option<u32>; NUM_SPARSE],
    /// Planted logit without the bias.
    logit: f64,
    /// Uniform draw that decides the label.
    u: f64,
}

impl Planted {
    fn new(seed: u64) -> Planted {
        let h = |a: u64, b: u64| splitmix64(seed ^ splitmix64(a.wrapping_mul(GOLDEN) ^ b));
        let cdf = (0..NUM_SPARSE)
            .map(|f| {
                // Log-spaced 10..1e5 in a scrambled order (7 is coprime with 26).
                let v = 10f64.powf(1.0 + 4.0 * ((f * 7) % NUM_SPARSE) as f64 / (NUM_SPARSE - 1) as f64).round() as usize;
                let mut acc = 0.0;
                (0..v)
                    .map(|j| {
                        acc += ((j + 1) as f64).powf(-ZIPF_EXPONENT);
                        acc
                    })
                    .collect()
            })
            .collect();
        let cat_missing = std::array::from_fn(|f| match f % 6 {
            2 => 0.35,
            4 => 0.05,
            _ => 0.0,
        });
        let hex_salt = std::array::from_fn(|f| h(1, f as u64) as u32);
        let dense_mu = std::array::from_fn(|k| 0.3 + (k as f64 * 0.77) % 3.5);
        let dense_missing = std::array::from_fn(|k| if k % 4 == 0 { 0.2 } else { 0.02 });
        let dense_w = std::array::from_fn(|k| DENSE_WEIGHT_SCALE * gauss(h(2, k as u64)));
        let mut p = Planted { seed, cdf, cat_missing, hex_salt, dense_mu, dense_missing, dense_w, bias: 0.0 };
        p.calibrate();
        p
    }

    /// Weight of rank `j` (None = missing) of field `f`.
    fn cat_weight(&self, f: usize, j: Option<u32>) -> f64 {
        let v = j.map_or(u64::MAX, |j| j as u64);
        CAT_WEIGHT_SCALE * gauss(splitmix64(self.seed ^ splitmix64((3 + f as u64).wrapping_mul(GOLDEN) ^ v)))
    }

    fn row(&self, r: u64) -> Row {
        let mut rng = Stream(splitmix64(self.seed ^ splitmix64(r.wrapping_add(ROW_SALT))));
        let mut logit = 0.0;
        let ints = std::array::from_fn(|k| {
            let missing = rng.unit() < self.dense_missing[k];
            let z = gauss(rng.next_u64());
            if missing {
                return None;
            }
            let mut x = (self.dense_mu[k] + 1.2 * z).exp().floor() as i64 - 1;
            if k == 1 {
                x -= 2;
            }
            logit += self.dense_w[k] * dense_value(x) as f64;
            Some(x)
        });
        let cats = std::array::from_fn(|f| {
            let missing = rng.unit() < self.cat_missing[f];
            let u = rng.unit();
            let j = if missing {
                None
            } else {
                let cdf = &self.cdf[f];
                let total = cdf.last().copied().unwrap_or(0.0);
                let j = cdf.partition_point(|&c| c <= u * total).min(cdf.len().saturating_sub(1));
                Some(j as u32)
            };
            logit += self.cat_weight(f, j);
            j
        });
        Row { ints, cats, logit, u: rng.unit() }
    }

    /// Bias such that the mean click probability over the first rows is TARGET_CTR.
    fn calibrate(&mut self) {
        let logits: Vec<f64> = (0..CALIBRATION_ROWS).into_par_iter().map(|r| self.row(r).logit).collect();
        let ctr = |b: f64| logits.iter().map(|l| sigmoid(l + b)).sum::<f64>() / logits.len() as f64;
        let (mut lo, mut hi) = (-30.0, 30.0);
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if ctr(mid) < TARGET_CTR {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.bias = 0.5 * (lo + hi);
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn push_int(out: &mut Vec<u8>, x: i64) {
    if x < 0 {
        out.push(b'-');
    }
    let mut v = x.unsigned_abs();
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend(digits[..n].iter().rev());
}

fn push_hex8(out: &mut Vec<u8>, x: u32) {
    const D: &[u8; 16] = b"0123456789abcdef";
    for i in (0..8).rev() {
        out.push(D[((x >> (4 * i)) & 0xF) as usize]);
    }
}

/// One chunk of rows: its text, and the histogram of planted probabilities by label.
struct Chunk {
    text: Vec<u8>,
    /// Probability bins of the positive rows.
    pos: Vec<u32>,
    /// Probability bins of the negative rows.
    neg: Vec<u32>,
}

fn gen_chunk(p: &Planted, rows: std::ops::Range<u64>) -> Chunk {
    let mut c = Chunk { text: Vec::with_capacity((rows.end - rows.start) as usize * 220), pos: Vec::new(), neg: Vec::new() };
    for r in rows {
        let row = p.row(r);
        let prob = sigmoid(row.logit + p.bias);
        let label = row.u < prob;
        let bin = ((prob * AUC_BINS as f64) as usize).min(AUC_BINS - 1) as u32;
        if label { &mut c.pos } else { &mut c.neg }.push(bin);
        c.text.push(if label { b'1' } else { b'0' });
        for x in row.ints {
            c.text.push(b'\t');
            if let Some(x) = x {
                push_int(&mut c.text, x);
            }
        }
        for (f, j) in row.cats.into_iter().enumerate() {
            c.text.push(b'\t');
            if let Some(j) = j {
                push_hex8(&mut c.text, fmix32(j ^ p.hex_salt[f]));
            }
        }
        c.text.push(b'\n');
    }
    c
}

/// AUC from per-bin counts of positives and negatives (ties within a bin count half).
fn histogram_auc(pos: &[u64], neg: &[u64]) -> f64 {
    let (tp, tn): (u64, u64) = (pos.iter().sum(), neg.iter().sum());
    if tp == 0 || tn == 0 {
        return 0.5;
    }
    let (mut below, mut area) = (0u64, 0f64);
    for (p, n) in pos.iter().zip(neg) {
        area += *p as f64 * (below as f64 + 0.5 * *n as f64);
        below += n;
    }
    area / (tp as f64 * tn as f64)
}

/// Writes `rows` synthetic rows in Criteo format to `out` (atomically) and returns what the
/// planted model scores on them. Deterministic for a seed; uses every core.
pub fn synth(out: &Path, rows: u64, seed: u64) -> DataResult<SynthSummary> {
    let planted = Planted::new(seed);
    let tmp = AtomicFile::create(out, crate::fileio::PRIVATE)?;
    let werr = |e| DataError::io(tmp.path(), "write", e);
    let mut w = BufWriter::with_capacity(1 << 20, tmp.file());
    let (mut pos, mut neg) = (vec![0u64; AUC_BINS], vec![0u64; AUC_BINS]);
    let mut bytes = 0u64;
    // Generate a group of chunks in parallel, write them in order, repeat: memory stays
    // bounded by one group's text.
    let group = CHUNK_ROWS * 64;
    let mut start = 0;
    while start < rows {
        let end = rows.min(start + group);
        let chunks: Vec<Chunk> =
            (start..end).step_by(CHUNK_ROWS as usize).collect::<Vec<u64>>().into_par_iter().map(|a| gen_chunk(&planted, a..end.min(a + CHUNK_ROWS))).collect();
        for c in chunks {
            w.write_all(&c.text).map_err(werr)?;
            bytes += c.text.len() as u64;
            for b in c.pos {
                pos[b as usize] += 1;
            }
            for b in c.neg {
                neg[b as usize] += 1;
            }
        }
        start = end;
    }
    w.flush().map_err(werr)?;
    drop(w);
    tmp.commit()?;
    let positives: u64 = pos.iter().sum();
    Ok(SynthSummary {
        path: out.to_path_buf(),
        rows,
        positives,
        ctr: if rows == 0 { 0.0 } else { positives as f64 / rows as f64 },
        bayes_auc: histogram_auc(&pos, &neg),
        bytes,
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmix32_is_a_bijection_on_a_sample() {
        let mut seen: Vec<u32> = (0..100_000u32).map(fmix32).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100_000);
    }

    #[test]
    fn integers_are_written_like_display() {
        for x in [0i64, 1, -1, -3, 9, 10, 12345, i64::MIN, i64::MAX] {
            let mut v = Vec::new();
            push_int(&mut v, x);
            assert_eq!(String::from_utf8(v).unwrap(), x.to_string());
        }
        let mut v = Vec::new();
        push_hex8(&mut v, 0x00ab_cdef);
        assert_eq!(v, b"00abcdef");
    }

    #[test]
    fn histogram_auc_of_known_cases() {
        // Perfect separation, perfect inversion, all tied.
        assert_eq!(histogram_auc(&[0, 0, 3], &[2, 0, 0]), 1.0);
        assert_eq!(histogram_auc(&[3, 0, 0], &[0, 0, 2]), 0.0);
        assert_eq!(histogram_auc(&[0, 4, 0], &[0, 4, 0]), 0.5);
        // Pos in bins 1,2; neg in bins 0,2: pairs (1>0)=1, (1<2)=0, (2>0)=1, (2=2)=0.5 -> 2.5/4.
        assert_eq!(histogram_auc(&[0, 1, 1], &[1, 0, 1]), 0.625);
        assert_eq!(histogram_auc(&[0, 0], &[1, 1]), 0.5);
    }

    #[test]
    fn vocabularies_span_ten_to_a_hundred_thousand() {
        let p = Planted::new(1);
        let sizes: Vec<usize> = p.cdf.iter().map(|c| c.len()).collect();
        assert_eq!(*sizes.iter().min().unwrap(), 10);
        assert_eq!(*sizes.iter().max().unwrap(), 100_000);
    }
}
