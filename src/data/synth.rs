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
//!   [`ValueShape`] (`ringrec data synth --vocab-scale N --zipf S`) multiplies every
//!   vocabulary by N and draws with exponent S instead ([`ZipfRanks`]: no table, so 26
//!   fields of up to 10^5 N values cost nothing to set up); the default shape draws from
//!   the cumulative table as always, so the default file stays the same byte for byte.
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
//!
//! **Interactions** ([`PlantedModel::Interactions`], `ringrec data synth --interactions`):
//! the same values (a row's integers and categoricals are those of the logistic file of the
//! same seed), labelled by a model that only interaction models fit well. Each
//! (field, value) of the fields of at most [`INTERACTION_MAX_VOCAB`] values (13 of the 26:
//! their values recur often enough to be learned) has a latent vector `v(f, j)` of
//! [`LATENT_DIM`] values (`N(0, 1)`, a hash of `(seed, f, j)`), and the logit is
//! `b + a1 * first + a2 * fm + a3 * deep`:
//! - `first`: the logistic model's logit above (first-order part, every field);
//! - `fm`: a planted factorisation machine, the sum over interacting field pairs `f < g` of
//!   `<v(f, j_f), v(g, j_g)>` (= `0.5 * sum_c ((sum_f v_fc)^2 - sum_f v_fc^2)`);
//! - `deep`: a random 2-layer ReLU net (`N(0, 1 / fan_in)` weights, [`DEEP_HIDDEN`] units)
//!   over the latent vectors of the first [`DEEP_FIELDS`] interacting fields and the 13
//!   dense values.
//!
//! `a1, a2, a3` scale each part to the standard deviation [`FIRST_ORDER_STD`], [`FM_STD`],
//! [`DEEP_STD`] over the calibration rows, then `b` is calibrated to the same CTR.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::fileio::AtomicFile;
use super::criteo::{dense_value, NUM_DENSE, NUM_SPARSE};
use super::error::{DataError, DataResult};
use super::zipf::ZipfRanks;
use crate::hash::{splitmix64, Stream, GOLDEN};

/// Length of the latent vector of a (field, value) in the interactions model.
pub const LATENT_DIM: usize = 8;
/// Hidden units of the planted deep part of the interactions model.
pub const DEEP_HIDDEN: usize = 16;
/// Fields of at most this many values interact (have latent vectors); the larger ones
/// only have first-order weights, since their rare values could not be learned anyway.
pub const INTERACTION_MAX_VOCAB: usize = 1000;
/// How many interacting fields (the first ones) feed the planted deep part.
pub const DEEP_FIELDS: usize = 4;
/// Standard deviation of the first-order part of the interactions model's logit.
pub const FIRST_ORDER_STD: f64 = 0.5;
/// Standard deviation of the factorisation-machine part of the interactions model's logit.
pub const FM_STD: f64 = 1.5;
/// Standard deviation of the deep part of the interactions model's logit.
pub const DEEP_STD: f64 = 0.5;
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
pub(crate) const AUC_BINS: usize = 1 << 16;
const ROW_SALT: u64 = 0x5359_4e54_4845_5449; // "SYNTHETI"
/// Width of the planted deep part's input: the latent vectors of DEEP_FIELDS, the dense values.
const DEEP_INPUT: usize = DEEP_FIELDS * LATENT_DIM + NUM_DENSE;

/// The model that labels the synthetic rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlantedModel {
    /// Logistic over the categorical values and the dense features (`ringrec data synth`).
    #[default]
    Logistic,
    /// First-order part plus a planted factorisation machine plus a small deep part
    /// (`ringrec data synth --interactions`).
    Interactions,
}

/// The categorical values' vocabularies and skew.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ValueShape {
    /// Every field's vocabulary is its default one (10 to 100,000 values) times this.
    pub vocab_scale: u32,
    /// The Zipf exponent of the draw by rank.
    pub zipf: f64,
}

impl Default for ValueShape {
    fn default() -> ValueShape {
        ValueShape { vocab_scale: 1, zipf: ZIPF_EXPONENT }
    }
}

impl ValueShape {
    /// The largest `vocab_scale`: every rank of the largest field fits in 32 bits.
    pub const MAX_VOCAB_SCALE: u32 = 40_000;

    /// A shape, checked: a scale of 1 to [`Self::MAX_VOCAB_SCALE`], an exponent in (0, 10].
    pub fn new(vocab_scale: u32, zipf: f64) -> DataResult<ValueShape> {
        if !(1..=Self::MAX_VOCAB_SCALE).contains(&vocab_scale) {
            return Err(DataError::InvalidArgument(format!("vocabulary scale {vocab_scale}: give 1 to {}", Self::MAX_VOCAB_SCALE)));
        }
        if !(zipf > 0.0 && zipf <= 10.0) {
            return Err(DataError::InvalidArgument(format!("Zipf exponent {zipf}: give a number in (0, 10]")));
        }
        Ok(ValueShape { vocab_scale, zipf })
    }

    /// Each field's vocabulary (values, the missing one not counted).
    pub fn vocabularies(&self) -> [u64; NUM_SPARSE] {
        // Log-spaced 10..1e5 in a scrambled order (7 is coprime with 26).
        std::array::from_fn(|f| 10f64.powf(1.0 + 4.0 * ((f * 7) % NUM_SPARSE) as f64 / (NUM_SPARSE - 1) as f64).round() as u64 * self.vocab_scale.max(1) as u64)
    }

    /// The keys the 26 fields can take together (their vocabularies summed).
    pub fn key_space(&self) -> u64 {
        self.vocabularies().iter().sum()
    }
}

/// How one field's values are drawn by rank.
enum ValueDraw {
    /// The default shape: cumulative Zipf weights of ranks 0..V_f, searched.
    Table(Vec<f64>),
    /// Any other shape: the inverted continuous power law.
    Ranks(ZipfRanks),
}

impl ValueDraw {
    fn new(vocab: u64, shape: &ValueShape) -> ValueDraw {
        if *shape != ValueShape::default() {
            return ValueDraw::Ranks(ZipfRanks::new(vocab, shape.zipf));
        }
        let mut acc = 0.0;
        ValueDraw::Table(
            (0..vocab)
                .map(|j| {
                    acc += ((j + 1) as f64).powf(-ZIPF_EXPONENT);
                    acc
                })
                .collect(),
        )
    }

    /// The vocabulary's size.
    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            ValueDraw::Table(cdf) => cdf.len(),
            ValueDraw::Ranks(z) => z.len() as usize,
        }
    }

    /// The rank of the uniform draw `u`.
    fn rank(&self, u: f64) -> u32 {
        match self {
            ValueDraw::Table(cdf) => {
                let total = cdf.last().copied().unwrap_or(0.0);
                cdf.partition_point(|&c| c <= u * total).min(cdf.len().saturating_sub(1)) as u32
            }
            ValueDraw::Ranks(z) => z.rank(u) as u32,
        }
    }
}

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
    /// The model that labelled the rows.
    pub model: PlantedModel,
    /// The categorical values' vocabularies and skew.
    pub shape: ValueShape,
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
    /// Per field: how its values are drawn by rank.
    draw: Vec<ValueDraw>,
    cat_missing: [f64; NUM_SPARSE],
    hex_salt: [u32; NUM_SPARSE],
    dense_mu: [f64; NUM_DENSE],
    dense_missing: [f64; NUM_DENSE],
    dense_w: [f64; NUM_DENSE],
    /// The interactions model's extra parts (None: logistic).
    interactions: Option<Interactions>,
    bias: f64,
}

/// The planted factorisation machine and deep part of [`PlantedModel::Interactions`].
struct Interactions {
    seed: u64,
    /// Per field: whether it has latent vectors (vocabulary <= INTERACTION_MAX_VOCAB).
    interacting: [bool; NUM_SPARSE],
    /// The fields feeding the deep part: the first DEEP_FIELDS interacting ones.
    deep_fields: Vec<usize>,
    /// Deep part: first layer, `DEEP_INPUT x DEEP_HIDDEN` row-major, then its biases.
    w1: Vec<f64>,
    b1: [f64; DEEP_HIDDEN],
    /// Deep part: the output layer's weights.
    w2: [f64; DEEP_HIDDEN],
    /// Scales of the first-order, FM and deep parts (1 until calibrated).
    scale: [f64; 3],
}

/// The three parts of an interactions row's logit, unscaled.
struct Parts {
    first: f64,
    fm: f64,
    deep: f64,
}

impl Interactions {
    fn new(seed: u64, vocab: [u64; NUM_SPARSE]) -> Interactions {
        let h = |a: u64, b: u64| splitmix64(seed ^ splitmix64(a.wrapping_mul(GOLDEN) ^ b ^ 0x4641_4354_4f52_5321));
        let s1 = (1.0 / DEEP_INPUT as f64).sqrt();
        let s2 = (1.0 / DEEP_HIDDEN as f64).sqrt();
        let interacting = std::array::from_fn(|f| vocab[f] <= INTERACTION_MAX_VOCAB as u64);
        Interactions {
            seed,
            interacting,
            deep_fields: (0..NUM_SPARSE).filter(|&f| interacting[f]).take(DEEP_FIELDS).collect(),
            w1: (0..DEEP_INPUT * DEEP_HIDDEN).map(|i| s1 * gauss(h(1, i as u64))).collect(),
            b1: std::array::from_fn(|i| 0.5 * gauss(h(2, i as u64))),
            w2: std::array::from_fn(|i| s2 * gauss(h(3, i as u64))),
            scale: [1.0; 3],
        }
    }

    /// The latent vector of rank `j` (None = missing) of field `f`.
    fn latent(&self, f: usize, j: Option<u32>) -> [f64; LATENT_DIM] {
        let v = j.map_or(u64::MAX, |j| j as u64);
        let key = splitmix64(self.seed ^ splitmix64((100 + f as u64).wrapping_mul(GOLDEN) ^ v));
        std::array::from_fn(|c| gauss(splitmix64(key ^ (c as u64 + 1).wrapping_mul(GOLDEN))))
    }

    /// The unscaled parts of a row's logit (`first` is the logistic model's logit).
    fn parts(&self, row: &Row) -> Parts {
        let mut sum = [0.0; LATENT_DIM];
        let mut sq = 0.0;
        let mut input = [0.0; DEEP_INPUT];
        for (f, &j) in row.cats.iter().enumerate().filter(|(f, _)| self.interacting[*f]) {
            let v = self.latent(f, j);
            for c in 0..LATENT_DIM {
                sum[c] += v[c];
                sq += v[c] * v[c];
            }
            if let Some(slot) = self.deep_fields.iter().position(|&g| g == f) {
                input[slot * LATENT_DIM..(slot + 1) * LATENT_DIM].copy_from_slice(&v);
            }
        }
        let fm = 0.5 * (sum.iter().map(|s| s * s).sum::<f64>() - sq);
        for (k, x) in row.ints.iter().enumerate() {
            input[DEEP_FIELDS * LATENT_DIM + k] = x.map_or(0.0, |x| dense_value(x) as f64);
        }
        let deep = (0..DEEP_HIDDEN)
            .map(|u| {
                let z = self.b1[u] + input.iter().enumerate().map(|(i, x)| x * self.w1[i * DEEP_HIDDEN + u]).sum::<f64>();
                self.w2[u] * z.max(0.0)
            })
            .sum();
        Parts { first: row.logit, fm, deep }
    }

    /// The logit without the bias.
    fn logit(&self, row: &Row) -> f64 {
        let p = self.parts(row);
        self.scale[0] * p.first + self.scale[1] * p.fm + self.scale[2] * p.deep
    }

    /// Sets the scales so each part has its target standard deviation over `rows`.
    fn calibrate(&mut self, rows: &[Row]) {
        let parts: Vec<Parts> = rows.par_iter().map(|r| self.parts(r)).collect();
        let std = |get: fn(&Parts) -> f64| {
            let n = parts.len().max(1) as f64;
            let mean = parts.iter().map(get).sum::<f64>() / n;
            (parts.iter().map(|p| (get(p) - mean).powi(2)).sum::<f64>() / n).sqrt()
        };
        let target = [FIRST_ORDER_STD, FM_STD, DEEP_STD];
        let measured = [std(|p| p.first), std(|p| p.fm), std(|p| p.deep)];
        self.scale = std::array::from_fn(|i| if measured[i] > 0.0 { target[i] / measured[i] } else { 0.0 });
    }
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
    fn new(seed: u64, model: PlantedModel, shape: &ValueShape) -> Planted {
        let h = |a: u64, b: u64| splitmix64(seed ^ splitmix64(a.wrapping_mul(GOLDEN) ^ b));
        let vocab = shape.vocabularies();
        let draw: Vec<ValueDraw> = vocab.iter().map(|&v| ValueDraw::new(v, shape)).collect();
        let cat_missing = std::array::from_fn(|f| match f % 6 {
            2 => 0.35,
            4 => 0.05,
            _ => 0.0,
        });
        let hex_salt = std::array::from_fn(|f| h(1, f as u64) as u32);
        let dense_mu = std::array::from_fn(|k| 0.3 + (k as f64 * 0.77) % 3.5);
        let dense_missing = std::array::from_fn(|k| if k % 4 == 0 { 0.2 } else { 0.02 });
        let dense_w = std::array::from_fn(|k| DENSE_WEIGHT_SCALE * gauss(h(2, k as u64)));
        let interactions = (model == PlantedModel::Interactions).then(|| Interactions::new(seed, vocab));
        let mut p = Planted { seed, draw, cat_missing, hex_salt, dense_mu, dense_missing, dense_w, interactions, bias: 0.0 };
        p.calibrate();
        p
    }

    /// The planted logit of a row, without the bias.
    fn logit(&self, row: &Row) -> f64 {
        match &self.interactions {
            None => row.logit,
            Some(ix) => ix.logit(row),
        }
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
            let j = if missing { None } else { Some(self.draw[f].rank(u)) };
            logit += self.cat_weight(f, j);
            j
        });
        Row { ints, cats, logit, u: rng.unit() }
    }

    /// The interactions model's part scales, then the bias such that the mean click
    /// probability over the first rows is TARGET_CTR.
    fn calibrate(&mut self) {
        let rows: Vec<Row> = (0..CALIBRATION_ROWS).into_par_iter().map(|r| self.row(r)).collect();
        if let Some(mut ix) = self.interactions.take() {
            ix.calibrate(&rows);
            self.interactions = Some(ix);
        }
        let logits: Vec<f64> = rows.par_iter().map(|r| self.logit(r)).collect();
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
        let prob = sigmoid(p.logit(&row) + p.bias);
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
pub(crate) fn histogram_auc(pos: &[u64], neg: &[u64]) -> f64 {
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

/// Writes `rows` synthetic rows in Criteo format to `out` (atomically), labelled by the
/// logistic planted model, and returns what the planted model scores on them.
/// Deterministic for a seed; uses every core.
pub fn synth(out: &Path, rows: u64, seed: u64) -> DataResult<SynthSummary> {
    synth_with(out, rows, seed, PlantedModel::Logistic)
}

/// [`synth`] with the labels of the planted `model`.
pub fn synth_with(out: &Path, rows: u64, seed: u64, model: PlantedModel) -> DataResult<SynthSummary> {
    synth_shaped(out, rows, seed, model, ValueShape::default())
}

/// [`synth_with`] with the categorical values of `shape` (vocabularies scaled, another
/// Zipf exponent).
pub fn synth_shaped(out: &Path, rows: u64, seed: u64, model: PlantedModel, shape: ValueShape) -> DataResult<SynthSummary> {
    let shape = ValueShape::new(shape.vocab_scale, shape.zipf)?;
    let planted = Planted::new(seed, model, &shape);
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
        model,
        shape,
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
        let p = Planted::new(1, PlantedModel::Logistic, &ValueShape::default());
        let sizes: Vec<usize> = p.draw.iter().map(|c| c.len()).collect();
        assert_eq!(*sizes.iter().min().unwrap(), 10);
        assert_eq!(*sizes.iter().max().unwrap(), 100_000);
    }

    /// A scratch directory of this test process.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ringrec-synth-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_logistic_file_is_byte_for_byte_as_before_interactions() {
        // FNV-1a of `ringrec data synth --rows 1000 --seed 1` as written before the
        // interactions model existed (254,824 bytes, CTR 0.2740, Bayes AUC 0.8197).
        let dir = scratch("pinned");
        let s = synth(&dir.join("a.tsv"), 1000, 1).unwrap();
        let bytes = std::fs::read(&s.path).unwrap();
        assert_eq!((bytes.len(), crate::hash::fnv1a64(&bytes)), (254_824, 0x4b4c_d7de_854a_fc3e));
        assert_eq!((s.positives, s.model), (274, PlantedModel::Logistic));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_scaled_shape_spreads_the_values_over_a_larger_key_space() {
        assert_eq!(ValueShape::default().key_space(), ValueShape::new(1, ZIPF_EXPONENT).unwrap().key_space());
        let wide = ValueShape::new(300, 1.05).unwrap();
        assert!(wide.key_space() > 90_000_000, "{}", wide.key_space());
        assert_eq!(wide.vocabularies().iter().max(), Some(&30_000_000));
        assert!(ValueShape::new(0, 1.05).is_err() && ValueShape::new(40_001, 1.05).is_err() && ValueShape::new(2, 0.0).is_err());
        let dir = scratch("shape");
        let distinct = |name: &str, shape: ValueShape| {
            let s = synth_shaped(&dir.join(name), 4000, 3, PlantedModel::Logistic, shape).unwrap();
            let text = std::fs::read_to_string(&s.path).unwrap();
            let mut keys: Vec<(usize, &str)> = text.lines().flat_map(|l| l.split('\t').enumerate().skip(1 + NUM_DENSE).filter(|(_, v)| !v.is_empty())).collect();
            keys.sort_unstable();
            keys.dedup();
            (s, text.clone(), keys.len())
        };
        let (s1, t1, narrow_keys) = distinct("a.tsv", ValueShape::default());
        let (_, t2, _) = distinct("b.tsv", ValueShape::new(1, ZIPF_EXPONENT).unwrap());
        assert_eq!(t1, t2, "the default shape, however given, is the default file");
        let (s3, t3, wide_keys) = distinct("c.tsv", wide);
        let (_, t4, _) = distinct("d.tsv", wide);
        assert_eq!(t3, t4, "deterministic");
        assert_eq!(s3.shape, wide);
        assert!(wide_keys > narrow_keys * 3 / 2, "{wide_keys} distinct keys vs {narrow_keys}");
        // The integers and labels' model are drawn the same way: only the values differ.
        assert!((s3.ctr - s1.ctr).abs() < 0.05, "ctr {} vs {}", s3.ctr, s1.ctr);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn interactions_are_deterministic_by_seed_and_keep_the_values() {
        let dir = scratch("seed");
        let read = |name: &str, seed: u64, model: PlantedModel| {
            let s = synth_with(&dir.join(name), 3000, seed, model).unwrap();
            (s, std::fs::read_to_string(dir.join(name)).unwrap())
        };
        let (a, ta) = read("a.tsv", 5, PlantedModel::Interactions);
        let (b, tb) = read("b.tsv", 5, PlantedModel::Interactions);
        let (_, tc) = read("c.tsv", 6, PlantedModel::Interactions);
        let (_, plain) = read("d.tsv", 5, PlantedModel::Logistic);
        assert_eq!(ta, tb, "same seed, same bytes");
        assert_eq!(SynthSummary { path: b.path.clone(), ..a }, b, "same seed, same summary");
        assert_ne!(ta, tc, "another seed, another file");
        // The values are the logistic file's; only the labels differ (on many rows).
        let (mut same_values, mut other_label) = (0, 0);
        for (x, y) in ta.lines().zip(plain.lines()) {
            let (lx, vx) = x.split_once('\t').unwrap();
            let (ly, vy) = y.split_once('\t').unwrap();
            same_values += usize::from(vx == vy);
            other_label += usize::from(lx != ly);
        }
        assert_eq!(same_values, 3000);
        assert!(other_label > 300, "{other_label} of 3000 labels differ");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_factorisation_machine_is_the_sum_of_pairwise_dots() {
        let p = Planted::new(2, PlantedModel::Interactions, &ValueShape::default());
        let ix = p.interactions.as_ref().unwrap();
        assert_eq!(ix.interacting.iter().filter(|&&i| i).count(), 13, "the fields of 10 to 1,000 values");
        assert_eq!(ix.deep_fields.len(), DEEP_FIELDS);
        for r in 0..20 {
            let row = p.row(r);
            // Only the fields of at most INTERACTION_MAX_VOCAB values interact.
            let v: Vec<[f64; LATENT_DIM]> = row.cats.iter().enumerate().map(|(f, &j)| if p.draw[f].len() <= INTERACTION_MAX_VOCAB { ix.latent(f, j) } else { [0.0; LATENT_DIM] }).collect();
            let mut pairs = 0.0;
            for f in 0..NUM_SPARSE {
                for g in f + 1..NUM_SPARSE {
                    pairs += (0..LATENT_DIM).map(|c| v[f][c] * v[g][c]).sum::<f64>();
                }
            }
            let parts = ix.parts(&row);
            assert!((parts.fm - pairs).abs() < 1e-9 * (1.0 + pairs.abs()), "row {r}: {} vs {pairs}", parts.fm);
            assert_eq!(parts.first, row.logit, "the first-order part is the logistic logit");
        }
        // Calibrated: each scaled part has its target standard deviation on the calibration rows.
        let rows: Vec<Row> = (0..CALIBRATION_ROWS).map(|r| p.row(r)).collect();
        for (i, target) in [FIRST_ORDER_STD, FM_STD, DEEP_STD].into_iter().enumerate() {
            let x: Vec<f64> = rows.iter().map(|r| ix.parts(r)).map(|q| ix.scale[i] * [q.first, q.fm, q.deep][i]).collect();
            let mean = x.iter().sum::<f64>() / x.len() as f64;
            let std = (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
            assert!((std - target).abs() < 1e-9, "part {i}: std {std}, target {target}");
        }
    }

    #[test]
    fn the_interactions_file_reads_back_and_its_bayes_auc_is_exact() {
        let dir = scratch("read");
        let path = dir.join("ix.tsv");
        let rows = 5000;
        let s = synth_with(&path, rows, 9, PlantedModel::Interactions).unwrap();
        let (samples, report) = crate::data::criteo::read_tsv(&path, 0).unwrap();
        assert_eq!((samples.len() as u64, report.bad()), (rows, 0));
        let positives = samples.iter().filter(|x| x.label == 1.0).count() as u64;
        assert_eq!(positives, s.positives);
        assert!((0.2..0.3).contains(&s.ctr), "ctr {}", s.ctr);
        // The exact AUC (Mann-Whitney, ties half) of the planted probabilities against the
        // labels read back agrees with the summary's histogram AUC.
        let p = Planted::new(9, PlantedModel::Interactions, &ValueShape::default());
        let mut scored: Vec<(f64, bool)> = samples.iter().enumerate().map(|(r, x)| (sigmoid(p.logit(&p.row(r as u64)) + p.bias), x.label == 1.0)).collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut neg_below, mut area) = (0u64, 0.0);
        let mut i = 0;
        while i < scored.len() {
            let k = i + scored[i..].iter().take_while(|x| x.0 == scored[i].0).count();
            let (pos, neg) = scored[i..k].iter().fold((0u64, 0u64), |(p, n), x| if x.1 { (p + 1, n) } else { (p, n + 1) });
            area += pos as f64 * (neg_below as f64 + 0.5 * neg as f64);
            neg_below += neg;
            i = k;
        }
        let exact = area / (positives as f64 * (rows - positives) as f64);
        assert!((s.bayes_auc - exact).abs() < 1e-4, "summary {} vs exact {exact}", s.bayes_auc);
        assert!(s.bayes_auc > 0.8, "the planted model separates the classes: {}", s.bayes_auc);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
