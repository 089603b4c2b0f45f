//! `dense.bin`: the one file of the dense model — a checkpoint's (with the dense optimizer's
//! moments) and an export bundle's (without) — its encoder and its one decoder, which also
//! reads every older layout.
//!
//! A framed file ([`crate::frame`]; magic `"RRMLP\0\0\0"`) of one of two payload layouts. A
//! file is written at the oldest version that holds its model: an `mlp` over ringrec's
//! Criteo input (26 fields, 13 dense features) is version 2, byte for byte what earlier
//! builds wrote (so they, and scorers written against version 2, still read a default
//! run's checkpoints and bundles: its widths say everything about it); every other model
//! is version 3, which records the [`ModelSpec`]; a wide-deep over fields of different dims
//! ([`ModelSpec::field_dims`]) is version 4, version 3 with its field dims.
//!
//! Version 2 (`mlp`), little-endian:
//! ```text
//! offset          size       field
//! 0               8          step (u64): global training steps the weights were trained for
//! 8               4          layers L (u32, 1..=64: hidden layers + 1)
//! 12              4 (L + 1)  widths (u32): input (26 dim + 13), hidden..., 1
//! 16 + 4L         4          moments K (u32): optimizer vectors after the parameters
//!                            (0: none, SGD or a bundle; 2: Adam's first and second moments)
//! 20 + 4L         4 P        parameters (f32), layer by layer (l = 0..L): W_l, widths[l] x
//!                            widths[l+1] row-major (W_l[i][o] at i * widths[l+1] + o), then
//!                            b_l (widths[l+1] values); P = sum of widths[l] * widths[l+1] + widths[l+1]
//! 20 + 4L + 4P    4 P K      the K moments, P values each, in the parameters' order
//! ```
//!
//! Version 3 (every model), little-endian, H hidden and B bottom widths:
//! ```text
//! offset          size       field
//! 0               8          step (u64)
//! 8               4          model kind (u32): 0 mlp, 1 dlrm, 2 dcn, 3 deepfm, 4 wide-deep
//! 12              4          sparse fields F (u32)
//! 16              4          dim d (u32): embedding values per field (the table row is d,
//!                            or d + 1 for deepfm and wide-deep: ModelSpec::row_width)
//! 20              4          dense features n (u32)
//! 24              4          H (u32, 0..=64): hidden widths (--hidden)
//! 28              4          B (u32, 0..=64): bottom widths (--bottom-mlp; dlrm)
//! 32              4          interaction_self (u32, 0 or 1; dlrm)
//! 36              4          cross layers (u32; dcn)
//! 40              4          cross rank (u32; dcn; 0 = full matrices)
//! 44              4          cross structure (u32; dcn): 0 stacked, 1 parallel
//! 48              4 H        hidden widths (u32)
//! 48 + 4H         4 B        bottom widths (u32)
//! 48 + 4(H + B)   4          moments K (u32, 0 or 2)
//! 52 + 4(H + B)   8          parameters P (u64): ModelSpec::num_params of the spec above
//! 60 + 4(H + B)   4 P        parameters (f32) in the spec's flat layout (its groups in
//!                            order, ModelSpec::groups; an MLP layer W then b as above)
//! ...             4 P K      the K moments, P values each
//! ```
//! The fields a kind does not use are written as the spec holds them and ignored.
//!
//! Version 4 (a wide-deep over fields of different dims): version 3 with, after the bottom
//! widths, G (u32, 1..) and the G field dims `d_f` (u32) in field order (F is 1 and d their
//! sum); the moments count, parameter count, parameters and moments follow, 8 + 4G bytes on.
//! A bundle's `dense.bin` is a checkpoint's without the moments: one layout, one reader
//! (`ringrec train --init-dense` takes either, of any model).
//!
//! Older layouts, still read (as `mlp`):
//! - `RRMLP` version 1 (bundles): magic, u32 version 1, u32 L, L + 1 u32 widths, the P
//!   parameters, then the CRC-32 of every byte before it; no step, no moments.
//! - `RRDENSE2` (checkpoints): magic `"RRDENSE2"`, u64 step, then three sections — parameters,
//!   Adam's first and second moments (empty for SGD) — each a u64 count and its f32 values;
//!   no shape (the checkpoint's manifest records `--hidden`) and no CRC (the manifest holds
//!   the file's).
//!
//! Every decoded value is finite: ringrec never writes another.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::spec::{CrossStructure, ModelKind, ModelSpec};
use crate::data::criteo::{NUM_DENSE, NUM_SPARSE};
use crate::frame::{Frame, FrameError, Head};

/// The frame of `dense.bin`.
pub static DENSE_FRAME: Frame = Frame {
    magic: *b"RRMLP\0\0\0",
    version: 4,
    framed_since: 2,
    noun: "dense weight file",
    not_this: "pass a checkpoint's or an export bundle's dense.bin",
    restore: "write it again (ringrec export again; a damaged checkpoint is skipped for the previous one)",
};

/// The layout version of an `mlp` over ringrec's Criteo input (see the module docs).
pub const MLP_VERSION: u32 = 2;
/// The layout version of a model with [`ModelSpec::field_dims`] (see the module docs).
pub const FIELD_DIMS_VERSION: u32 = 4;
/// The first 8 bytes of a checkpoint's `dense.bin` of an older ringrec (see the module docs).
pub const LEGACY_CHECKPOINT_MAGIC: [u8; 8] = *b"RRDENSE2";
/// The most layers a `dense.bin` may have (and the most hidden or bottom widths).
pub const MAX_LAYERS: usize = 64;

/// A model and its flat parameters ([`ModelSpec::num_params`] of them, in its groups'
/// layout).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenseWeights {
    /// Which model, and its shape.
    #[serde(with = "as_record")]
    pub spec: ModelSpec,
    /// Its parameters, in the spec's flat layout.
    pub params: Vec<f32>,
}

/// A [`ModelSpec`] as a [`SpecRecord`] for serde.
mod as_record {
    use super::{ModelSpec, SpecRecord};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    pub fn serialize<S: Serializer>(v: &ModelSpec, s: S) -> Result<S::Ok, S::Error> {
        SpecRecord::from(v).serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ModelSpec, D::Error> {
        SpecRecord::deserialize(d)?.spec().map_err(serde::de::Error::custom)
    }
}

/// A [`ModelSpec`] as JSON records it (a bundle's `model.json`, what rank 0 shares): the
/// kind, the input's counts, `--hidden`, and the kind's own shape fields only (absent for
/// the kinds that do not use them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpecRecord {
    /// `mlp`, `dlrm`, `dcn`, `deepfm` or `wide-deep` (`--model`).
    pub kind: String,
    /// Sparse fields F.
    pub fields: usize,
    /// Embedding values per field d (`--dim`).
    pub dim: usize,
    /// Dense features n.
    pub dense_features: usize,
    /// The deep (dlrm: top) MLP's hidden widths (`--hidden`).
    pub hidden: Vec<usize>,
    /// dlrm: the bottom MLP's hidden widths (`--bottom-mlp`); its last layer is `dim` wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottom: Option<Vec<usize>>,
    /// dlrm: each vector's dot with itself too (`--interaction-self`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_self: Option<bool>,
    /// dcn: cross layers (`--cross-layers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_layers: Option<usize>,
    /// dcn: cross rank, 0 = full matrices (`--cross-rank`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_rank: Option<usize>,
    /// dcn: `stacked` or `parallel` (`--cross-structure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_structure: Option<String>,
    /// wide-deep over fields of different dims: each field's dim ([`ModelSpec::field_dims`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_dims: Option<Vec<usize>>,
}

impl From<&ModelSpec> for SpecRecord {
    fn from(s: &ModelSpec) -> SpecRecord {
        let (dlrm, dcn) = (s.kind == ModelKind::Dlrm, s.kind == ModelKind::Dcn);
        SpecRecord {
            kind: s.kind.to_string(),
            fields: s.fields,
            dim: s.dim,
            dense_features: s.ndense,
            hidden: s.hidden.clone(),
            bottom: dlrm.then(|| s.bottom.clone()),
            interaction_self: dlrm.then_some(s.interaction_self),
            cross_layers: dcn.then_some(s.cross_layers),
            cross_rank: dcn.then_some(s.cross_rank),
            cross_structure: dcn.then(|| s.cross_structure.to_string()),
            field_dims: (!s.field_dims.is_empty()).then(|| s.field_dims.clone()),
        }
    }
}

impl SpecRecord {
    /// The spec it records (the fields it leaves out at their defaults), checked
    /// ([`ModelSpec::check`]); an error names the field.
    pub fn spec(&self) -> Result<ModelSpec, String> {
        let kind: ModelKind = self.kind.parse().map_err(|e| format!("kind: {e}"))?;
        let base = ModelSpec::mlp(self.fields, self.dim, self.dense_features, self.hidden.clone());
        let cross_structure = match &self.cross_structure {
            Some(c) => c.parse::<CrossStructure>().map_err(|e| format!("cross_structure: {e}"))?,
            None => base.cross_structure,
        };
        let spec = ModelSpec {
            kind,
            bottom: self.bottom.clone().unwrap_or_else(|| base.bottom.clone()),
            interaction_self: self.interaction_self.unwrap_or(base.interaction_self),
            cross_layers: self.cross_layers.unwrap_or(base.cross_layers),
            cross_rank: self.cross_rank.unwrap_or(base.cross_rank),
            cross_structure,
            field_dims: self.field_dims.clone().unwrap_or_default(),
            ..base
        };
        match spec.check() {
            Some(e) => Err(e),
            None => Ok(spec),
        }
    }
}

/// The `mlp` over ringrec's Criteo input that widths `[26 dim + 13, hidden..., 1]` (a
/// version 1 or 2 file's) give; an error says why they are not one.
pub fn mlp_of_widths(widths: &[usize]) -> Result<ModelSpec, String> {
    let input = widths.first().copied().unwrap_or(0);
    let dim = input.checked_sub(NUM_DENSE).filter(|r| *r > 0 && r % NUM_SPARSE == 0).map(|r| r / NUM_SPARSE);
    let dim = dim.ok_or_else(|| format!("widths {widths:?}: the input {input} is not {NUM_SPARSE} x dim + {NUM_DENSE} (ringrec's Criteo input)"))?;
    Ok(ModelSpec::mlp(NUM_SPARSE, dim, NUM_DENSE, widths.get(1..widths.len().saturating_sub(1)).unwrap_or(&[]).to_vec()))
}

/// The version-2 widths of `spec`, when it is an `mlp` over ringrec's Criteo input (which
/// [`mlp_of_widths`] reads back as the same model); `None` for a version-3 model.
pub fn mlp_widths(spec: &ModelSpec) -> Option<Vec<usize>> {
    if spec.kind != ModelKind::Mlp || spec.fields != NUM_SPARSE || spec.ndense != NUM_DENSE || spec.hidden.len() >= MAX_LAYERS {
        return None;
    }
    Some(spec.mlp_widths())
}

impl DenseWeights {
    /// The hidden widths of the deep (dlrm: top) MLP.
    pub fn hidden(&self) -> &[usize] {
        &self.spec.hidden
    }

    /// Parameters a version-2 model of `widths` has.
    pub fn count(widths: &[usize]) -> Option<usize> {
        widths.windows(2).try_fold(0usize, |n, p| n.checked_add(p[0].checked_mul(p[1])?.checked_add(p[1])?))
    }

    /// The `dense.bin` bytes of these weights trained for `step` steps, without moments.
    pub fn encode(&self, step: u64) -> Result<Vec<u8>, String> {
        encode(step, &self.spec, &self.params, &[])
    }

    /// Reads a `dense.bin` of any version ([`read`]) for its weights (`--init-dense`, a
    /// bundle's); a file that records no shape (an older checkpoint's) is refused.
    pub fn read(path: &Path) -> Result<DenseWeights, FrameError> {
        let f = read(path)?;
        match f.spec {
            Some(spec) => Ok(DenseWeights { spec, params: f.params }),
            None => Err(DENSE_FRAME.layout(path, "it records no layer widths (a checkpoint's dense.bin of an older ringrec): pass the checkpoint directory itself, or export it to a bundle")),
        }
    }
}

/// What a `dense.bin` holds.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseFile {
    /// Steps trained (none in `RRMLP` version 1).
    pub step: Option<u64>,
    /// The model (`None` in `RRDENSE2`, which records no shape).
    pub spec: Option<ModelSpec>,
    /// Parameters.
    pub params: Vec<f32>,
    /// The optimizer's moments, each as long as `params` (`RRDENSE2`: its two sections,
    /// empty for SGD).
    pub moments: Vec<Vec<f32>>,
}

/// Why widths, parameters and moments do not make one version-2 model; `None` when they do.
fn shape_error(widths: &[usize], params: usize, moments: impl Iterator<Item = usize>) -> Option<String> {
    let layers = widths.len().saturating_sub(1);
    if !(1..=MAX_LAYERS).contains(&layers) {
        return Some(format!("{layers} layers, expected 1..={MAX_LAYERS}"));
    }
    if widths.contains(&0) || widths.last() != Some(&1) || widths.iter().any(|w| u32::try_from(*w).is_err()) {
        return Some(format!("widths {widths:?}: every width must be positive (a u32) and the last 1 (one logit)"));
    }
    match DenseWeights::count(widths) {
        Some(n) if n == params => {}
        n => return Some(format!("{params} parameters, but widths {widths:?} need {}", n.map_or_else(|| "more than 2^64".into(), |n| n.to_string()))),
    }
    moments.enumerate().find(|(_, m)| *m != params).map(|(k, m)| format!("optimizer moment {k} has {m} values, the model {params}"))
}

/// The `dense.bin` bytes (version 2 for a Criteo `mlp`, 4 for a model with field dims, else
/// 3) of the model `spec` with
/// `params`, trained for `step` steps, and the optimizer's `moments` (none for SGD or a
/// bundle); an error says why they do not make one model.
pub fn encode(step: u64, spec: &ModelSpec, params: &[f32], moments: &[&[f32]]) -> Result<Vec<u8>, String> {
    if let Some(e) = spec.check() {
        return Err(format!("{}: {e}", spec.describe()));
    }
    if let Some(widths) = mlp_widths(spec) {
        return encode_v2(step, &widths, params, moments);
    }
    let n = spec.num_params();
    if params.len() != n {
        return Err(format!("{} parameters, but the {} has {n}", params.len(), spec.describe()));
    }
    if let Some((k, m)) = moments.iter().enumerate().find(|(_, m)| m.len() != n) {
        return Err(format!("optimizer moment {k} has {} values, the model {n}", m.len()));
    }
    let word = |v: usize, what: &str| u32::try_from(v).map_err(|_| format!("{what} {v} does not fit the file's u32"));
    if spec.hidden.len() > MAX_LAYERS || spec.bottom.len() > MAX_LAYERS {
        return Err(format!("{} hidden and {} bottom widths, at most {MAX_LAYERS} each", spec.hidden.len(), spec.bottom.len()));
    }
    let mut head = Vec::with_capacity(60 + 4 * (spec.hidden.len() + spec.bottom.len()));
    head.extend(step.to_le_bytes());
    let fixed = [
        kind_code(spec.kind) as usize,
        spec.fields,
        spec.dim,
        spec.ndense,
        spec.hidden.len(),
        spec.bottom.len(),
        usize::from(spec.interaction_self),
        spec.cross_layers,
        spec.cross_rank,
        usize::from(spec.cross_structure == CrossStructure::Parallel),
    ];
    let dims = if spec.field_dims.is_empty() { Vec::new() } else { [&[spec.field_dims.len()][..], &spec.field_dims].concat() };
    for v in fixed.iter().chain(&spec.hidden).chain(&spec.bottom).chain(&dims).chain([&moments.len()]) {
        head.extend(word(*v, "a shape value")?.to_le_bytes());
    }
    head.extend((n as u64).to_le_bytes());
    let len = head.len() + 4 * n * (1 + moments.len());
    let mut out = Vec::with_capacity(len + 36);
    let version = if dims.is_empty() { 3 } else { FIELD_DIMS_VERSION };
    let mut w = DENSE_FRAME.writer_of(version, &mut out, len as u64).map_err(|e| e.to_string())?;
    (|| -> std::io::Result<()> {
        w.write_all(&head)?;
        for v in std::iter::once(params).chain(moments.iter().copied()) {
            w.write_all(bytemuck::cast_slice(v))?;
        }
        w.finish().map(|_| ())
    })()
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Version 3's code of a model kind (see the module docs).
fn kind_code(k: ModelKind) -> u32 {
    match k {
        ModelKind::Mlp => 0,
        ModelKind::Dlrm => 1,
        ModelKind::Dcn => 2,
        ModelKind::DeepFm => 3,
        ModelKind::WideDeep => 4,
    }
}

/// The kind of version 3's code.
fn kind_of(code: u32) -> Option<ModelKind> {
    [ModelKind::Mlp, ModelKind::Dlrm, ModelKind::Dcn, ModelKind::DeepFm, ModelKind::WideDeep].into_iter().find(|k| kind_code(*k) == code)
}

/// The version-2 bytes of an `mlp` of `widths` (see [`encode`]).
fn encode_v2(step: u64, widths: &[usize], params: &[f32], moments: &[&[f32]]) -> Result<Vec<u8>, String> {
    if let Some(e) = shape_error(widths, params.len(), moments.iter().map(|m| m.len())) {
        return Err(e);
    }
    let len = 20 + 4 * (widths.len() - 1) + 4 * params.len() * (1 + moments.len());
    let mut out = Vec::with_capacity(len + 36);
    let mut w = DENSE_FRAME.writer_of(MLP_VERSION, &mut out, len as u64).map_err(|e| e.to_string())?;
    (|| -> std::io::Result<()> {
        w.write_all(&step.to_le_bytes())?;
        w.write_all(&((widths.len() - 1) as u32).to_le_bytes())?;
        for x in widths {
            w.write_all(&(*x as u32).to_le_bytes())?;
        }
        w.write_all(&(moments.len() as u32).to_le_bytes())?;
        for v in std::iter::once(params).chain(moments.iter().copied()) {
            w.write_all(bytemuck::cast_slice(v))?;
        }
        w.finish().map(|_| ())
    })()
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Reads and decodes the `dense.bin` at `path`.
pub fn read(path: &Path) -> Result<DenseFile, FrameError> {
    let b = crate::fileio::read_input(path).map_err(|e| crate::fileio::IoError::new(path, "read", e))?;
    decode(path, &b)
}

/// Decodes and checks the bytes of a `dense.bin` of any version (see the module docs) read
/// from `path`: frame (or the old layout's length and CRC), shape, finite values.
pub fn decode(path: &Path, b: &[u8]) -> Result<DenseFile, FrameError> {
    let f = if b.starts_with(&LEGACY_CHECKPOINT_MAGIC) {
        decode_rrdense2(path, b)?
    } else {
        match DENSE_FRAME.decode(path, b)? {
            (Head::Framed { version: MLP_VERSION, .. }, payload) => decode_v2(path, payload)?,
            (Head::Framed { version, .. }, payload) => decode_v3(path, payload, version == FIELD_DIMS_VERSION)?,
            (Head::Legacy { version: 1 }, _) => decode_v1(path, b)?,
            (Head::Legacy { version }, _) => return Err(FrameError::BadHeader { format: &DENSE_FRAME, path: path.to_path_buf(), field: "version", detail: format!("{version}, expected 1 to 4") }),
        }
    };
    let all = std::iter::once(("parameter", &f.params)).chain(f.moments.iter().map(|m| ("optimizer moment", m)));
    for (k, (what, v)) in all.enumerate() {
        if let Some(i) = first_non_finite(v) {
            let which = if k == 0 { String::new() } else { format!(" {}", k - 1) };
            return Err(DENSE_FRAME.layout(path, format!("{what}{which} value {i} is {} (not finite)", v[i])));
        }
    }
    Ok(f)
}

/// The first non-finite value of `v` (its index), if any: [`first_all_ones`] of its
/// exponent bits. On every step's path (the leader's merged sparse gradient) as well as
/// every checkpoint's.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    first_all_ones(bytemuck::cast_slice::<f32, u32>(v), 0x7f80_0000)
}

/// Words per chunk of [`first_all_ones`].
const FINITE_CHUNK: usize = 1 << 16;

/// Below this many words [`first_all_ones`] scans on the calling thread: waking the pool
/// costs more than the scan (1 Mi words take about 0.1 ms).
const FINITE_PAR_MIN: usize = 1 << 20;

/// The index of the first word whose `mask` bits are all set (a value whose exponent is all
/// ones: an infinity or a NaN, with the mask of its float format). Chunks are tested with a
/// branch-free fold per word (vectorised), in parallel from [`FINITE_PAR_MIN`] words, and
/// only the first chunk that holds one is searched word by word. (A per-word
/// `par_iter().position_first` took about 10 ms per step on a 2-rank multi-hot run's merged
/// list of 40,000 keys: its folder tests the search's state at every word.)
pub fn first_all_ones<W: Copy + Into<u32> + Sync>(words: &[W], mask: u32) -> Option<usize> {
    use rayon::prelude::*;
    let hit = |c: &[W]| c.iter().fold(false, |acc, &w| acc | (w.into() & mask == mask));
    let chunk = if words.len() < FINITE_PAR_MIN { words.chunks(FINITE_CHUNK).position(hit) } else { words.par_chunks(FINITE_CHUNK).position_first(hit) }?;
    let c = &words[chunk * FINITE_CHUNK..words.len().min((chunk + 1) * FINITE_CHUNK)];
    c.iter().position(|&w| w.into() & mask == mask).map(|i| chunk * FINITE_CHUNK + i)
}

/// The little-endian u32 at `at`, if `b` holds it.
fn word(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at.checked_add(4)?).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
}

/// The layer count at `at` and the widths after it, checked to be a Criteo `mlp`'s: its
/// spec, its widths and its number of parameters.
fn model_at(path: &Path, b: &[u8], at: usize) -> Result<(ModelSpec, Vec<usize>, usize), FrameError> {
    let bad = |detail: String| DENSE_FRAME.layout(path, detail);
    let layers = word(b, at).ok_or_else(|| bad("truncated in its header".into()))? as usize;
    if !(1..=MAX_LAYERS).contains(&layers) {
        return Err(bad(format!("{layers} layers, expected 1..={MAX_LAYERS}")));
    }
    let widths = (0..=layers).map(|i| word(b, at + 4 + 4 * i).map(|w| w as usize)).collect::<Option<Vec<usize>>>().ok_or_else(|| bad("truncated in its widths".into()))?;
    let n = DenseWeights::count(&widths).unwrap_or(0);
    if let Some(e) = shape_error(&widths, n, std::iter::empty()) {
        return Err(bad(e));
    }
    Ok((mlp_of_widths(&widths).map_err(bad)?, widths, n))
}

/// The parameters and `k` moments of `n` values each that fill `p` from `at` to its end
/// (`model` names the model in the error when they do not).
fn values(path: &Path, p: &[u8], at: usize, n: usize, k: usize, model: &dyn Fn() -> String) -> Result<(Vec<f32>, Vec<Vec<f32>>), FrameError> {
    let bad = |detail: String| DENSE_FRAME.layout(path, detail);
    if k > 2 {
        return Err(bad(format!("{k} optimizer moments, expected 0 or 2 at most")));
    }
    let want = n.checked_mul(4 * (1 + k)).and_then(|v| v.checked_add(at));
    if want != Some(p.len()) {
        return Err(bad(format!("{} payload bytes, but {} and {k} moments need {}", p.len(), model(), want.map_or_else(|| "more than 2^64".into(), |w| w.to_string()))));
    }
    if n == 0 {
        return Ok((Vec::new(), vec![Vec::new(); k]));
    }
    let mut vs = p[at..].chunks_exact(4 * n).map(bytemuck::pod_collect_to_vec::<u8, f32>);
    let params = vs.next().unwrap_or_default();
    Ok((params, vs.collect()))
}

/// Version 2's payload (a Criteo `mlp`).
fn decode_v2(path: &Path, p: &[u8]) -> Result<DenseFile, FrameError> {
    let bad = |detail: String| DENSE_FRAME.layout(path, detail);
    let step = p.get(..8).map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes"))).ok_or_else(|| bad("truncated in its header".into()))?;
    let (spec, widths, n) = model_at(path, p, 8)?;
    let at = 12 + 4 * widths.len();
    let k = word(p, at).ok_or_else(|| bad("truncated in its header".into()))? as usize;
    let (params, moments) = values(path, p, at + 4, n, k, &|| format!("widths {widths:?}"))?;
    Ok(DenseFile { step: Some(step), spec: Some(spec), params, moments })
}

/// Version 3's payload (any model), or version 4's (`field_dims`: with the field dims).
fn decode_v3(path: &Path, p: &[u8], field_dims: bool) -> Result<DenseFile, FrameError> {
    let field = |field: &'static str, detail: String| FrameError::BadHeader { format: &DENSE_FRAME, path: path.to_path_buf(), field, detail };
    let truncated = || DENSE_FRAME.layout(path, "truncated in its header");
    let step = p.get(..8).map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes"))).ok_or_else(truncated)?;
    let at = |i: usize| word(p, 8 + 4 * i).map(|w| w as usize).ok_or_else(truncated);
    let kind = word(p, 8).ok_or_else(truncated)?;
    let kind = kind_of(kind).ok_or_else(|| field("model kind", format!("{kind}, expected 0 to 4 (mlp, dlrm, dcn, deepfm, wide-deep)")))?;
    let [fields, dim, ndense, h, b, inter, cross_layers, cross_rank, structure] = [at(1)?, at(2)?, at(3)?, at(4)?, at(5)?, at(6)?, at(7)?, at(8)?, at(9)?];
    // Every width and count of a model is at most its number of parameters, which the
    // payload holds: a larger one is damage (and would overflow the counts below).
    let most = p.len() / 4;
    // (Fields a kind does not use are not read: any value is harmless there.)
    let dcn = kind == ModelKind::Dcn;
    for (name, v) in [("sparse fields", fields), ("dim", dim), ("dense features", ndense), ("cross layers", if dcn { cross_layers } else { 0 }), ("cross rank", if dcn { cross_rank } else { 0 })] {
        if v > most {
            return Err(field(name, format!("{v}, more than the {most} values the file holds")));
        }
    }
    for (name, v) in [("hidden widths", h), ("bottom widths", b)] {
        if v > MAX_LAYERS {
            return Err(field(name, format!("{v}, at most {MAX_LAYERS}")));
        }
    }
    let flag = |name: &'static str, v: usize| if v <= 1 { Ok(v == 1) } else { Err(field(name, format!("{v}, expected 0 or 1"))) };
    let (interaction_self, parallel) = (flag("interaction_self", inter)?, flag("cross structure", structure)?);
    let widths = (10..10 + h + b).map(at).collect::<Result<Vec<usize>, _>>()?;
    let used = if kind == ModelKind::Dlrm { &widths[..] } else { &widths[..h] };
    if let Some(w) = used.iter().find(|w| **w > most) {
        return Err(field("hidden or bottom widths", format!("a width of {w}, more than the {most} values the file holds")));
    }
    let cross_structure = if parallel { CrossStructure::Parallel } else { CrossStructure::Stacked };
    let mut off = 48 + 4 * (h + b);
    let mut dims = Vec::new();
    if field_dims {
        let g = word(p, off).ok_or_else(truncated)? as usize;
        if g == 0 || g > most {
            return Err(field("field dims", format!("{g} field dims, expected 1 to the {most} values the file holds")));
        }
        dims = (0..g).map(|i| word(p, off + 4 + 4 * i).map(|w| w as usize).ok_or_else(truncated)).collect::<Result<_, _>>()?;
        if let Some(d) = dims.iter().find(|d| **d > most) {
            return Err(field("field dims", format!("a dim of {d}, more than the {most} values the file holds")));
        }
        off += 4 * (g + 1);
    }
    let spec = ModelSpec { kind, fields, dim, ndense, hidden: widths[..h].to_vec(), bottom: widths[h..].to_vec(), interaction_self, cross_layers, cross_rank, cross_structure, field_dims: dims };
    if spec.concat_width() > most {
        return Err(field("sparse fields", format!("{fields} fields of {dim} and {ndense} dense features: wider than the file")));
    }
    if dcn && cross_layers.saturating_mul(spec.concat_width()) > most {
        return Err(field("cross layers", format!("{cross_layers} layers of {} values at least: more than the file holds", spec.concat_width())));
    }
    if let Some(e) = spec.check() {
        return Err(field("model", format!("{}: {e}", spec.describe())));
    }
    let k = word(p, off).ok_or_else(truncated)? as usize;
    let count = p.get(off + 4..off + 12).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).ok_or_else(truncated)?;
    let n = spec.num_params();
    if count != n as u64 {
        return Err(field("parameter count", format!("{count}, but the {} has {n}", spec.describe())));
    }
    let (params, moments) = values(path, p, off + 12, n, k, &|| format!("the {}", spec.describe()))?;
    Ok(DenseFile { step: Some(step), spec: Some(spec), params, moments })
}

/// `RRMLP` version 1 (the whole file).
fn decode_v1(path: &Path, b: &[u8]) -> Result<DenseFile, FrameError> {
    let bad = |detail: String| DENSE_FRAME.layout(path, detail);
    let (spec, widths, n) = model_at(path, b, 12)?;
    let at = 16 + 4 * widths.len();
    let want = n.checked_mul(4).and_then(|p| p.checked_add(at + 4));
    if want != Some(b.len()) {
        return Err(bad(format!("{} bytes, but widths {widths:?} need {} ({n} parameters and the checksum); the file is truncated or its header is damaged", b.len(), want.map_or("more than 2^64".into(), |w| w.to_string()))));
    }
    let (body, trailer) = b.split_at(b.len() - 4);
    let (stored, computed) = (u32::from_le_bytes(trailer.try_into().expect("4 bytes")), crate::hash::crc32(body));
    if stored != computed {
        return Err(DENSE_FRAME.corrupt(path, stored, computed));
    }
    Ok(DenseFile { step: None, spec: Some(spec), params: bytemuck::pod_collect_to_vec(&body[at..]), moments: Vec::new() })
}

/// A checkpoint's `RRDENSE2` (the whole file).
fn decode_rrdense2(path: &Path, b: &[u8]) -> Result<DenseFile, FrameError> {
    let step = b.get(8..16).map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes"))).ok_or_else(|| DENSE_FRAME.truncated(path, b.len() as u64, 16))?;
    let mut at = 16;
    let mut sections = Vec::with_capacity(3);
    for _ in 0..3 {
        let n = b.get(at..at + 8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).ok_or_else(|| DENSE_FRAME.truncated(path, b.len() as u64, at as u64 + 8))?;
        let end = n.checked_mul(4).and_then(|l| l.checked_add(at as u64 + 8)).filter(|e| *e <= b.len() as u64);
        let end = end.ok_or_else(|| DENSE_FRAME.layout(path, format!("a section of {n} values, longer than the file's {} bytes", b.len())))? as usize;
        sections.push(bytemuck::pod_collect_to_vec::<u8, f32>(&b[at + 8..end]));
        at = end;
    }
    if at != b.len() {
        return Err(DENSE_FRAME.layout(path, format!("{} bytes after its last section", b.len() - at)));
    }
    let params = sections.remove(0);
    let moments = if sections.iter().all(Vec::is_empty) { Vec::new() } else { sections };
    Ok(DenseFile { step: Some(step), spec: None, params, moments })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("d/dense.bin")
    }

    #[test]
    fn the_first_non_finite_value_is_found_on_either_side_of_the_parallel_threshold() {
        for n in [FINITE_CHUNK * 3 + 7, FINITE_PAR_MIN + FINITE_CHUNK * 3 + 7] {
            let mut v = vec![-2.5f32; n];
            assert_eq!(first_non_finite(&v), None);
            v[n - 1] = f32::NAN;
            assert_eq!(first_non_finite(&v), Some(n - 1), "the last word of a short last chunk");
            v[n - FINITE_CHUNK - 2] = f32::NEG_INFINITY;
            assert_eq!(first_non_finite(&v), Some(n - FINITE_CHUNK - 2));
            v[FINITE_CHUNK + 1] = f32::INFINITY;
            v[FINITE_CHUNK + 3] = f32::NAN;
            assert_eq!(first_non_finite(&v), Some(FINITE_CHUNK + 1), "the first of a chunk's two");
            v[0] = f32::NAN;
            assert_eq!(first_non_finite(&v), Some(0));
        }
        assert_eq!(first_non_finite(&[]), None);
        assert_eq!(first_non_finite(&[f32::MAX, f32::MIN, f32::MIN_POSITIVE / 2.0, -0.0]), None);
    }

    /// A Criteo `mlp` of dim 1 (26 + 13 inputs), one hidden layer of 2: widths [39, 2, 1].
    const P: usize = 39 * 2 + 2 + 2 + 1;

    fn weights() -> DenseWeights {
        DenseWeights { spec: ModelSpec::mlp(26, 1, 13, vec![2]), params: (0..P).map(|i| i as f32 * 0.5 - 1.0).collect() }
    }

    /// Small specs of every model and shape (dim 2, 3 fields, 2 dense features).
    fn specs() -> Vec<ModelSpec> {
        let base = ModelSpec::mlp(3, 2, 2, vec![4]);
        vec![
            base.clone(),
            ModelSpec { kind: ModelKind::Dlrm, bottom: vec![3], interaction_self: true, ..base.clone() },
            ModelSpec { kind: ModelKind::Dcn, cross_layers: 2, ..base.clone() },
            ModelSpec { kind: ModelKind::Dcn, cross_layers: 1, cross_rank: 2, cross_structure: CrossStructure::Parallel, ..base.clone() },
            ModelSpec { kind: ModelKind::DeepFm, ..base.clone() },
            ModelSpec { kind: ModelKind::WideDeep, hidden: vec![], ..base.clone() },
            ModelSpec { kind: ModelKind::WideDeep, fields: 1, dim: 5, field_dims: vec![2, 3], ..base },
        ]
    }

    /// `RRMLP` version 1 as the old `DenseWeights::encode` wrote it (its documented layout).
    fn v1_bytes(widths: &[usize], params: &[f32]) -> Vec<u8> {
        let mut b = b"RRMLP\0\0\0".to_vec();
        b.extend(1u32.to_le_bytes());
        b.extend(((widths.len() - 1) as u32).to_le_bytes());
        widths.iter().for_each(|x| b.extend((*x as u32).to_le_bytes()));
        params.iter().for_each(|x| b.extend(x.to_le_bytes()));
        let crc = crate::hash::crc32(&b);
        b.extend(crc.to_le_bytes());
        b
    }

    /// `RRDENSE2` as the old checkpoint writer wrote it (its documented layout).
    fn rrdense2_bytes(step: u64, sections: [&[f32]; 3]) -> Vec<u8> {
        let mut b = b"RRDENSE2".to_vec();
        b.extend(step.to_le_bytes());
        for s in sections {
            b.extend((s.len() as u64).to_le_bytes());
            s.iter().for_each(|x| b.extend(x.to_le_bytes()));
        }
        b
    }

    /// `bytes` with the frame's header CRC and trailer made valid again after an edit.
    fn reseal(mut b: Vec<u8>) -> Vec<u8> {
        let sum = crate::hash::crc32(&b[..24]);
        b[24..28].copy_from_slice(&sum.to_le_bytes());
        let end = b.len() - 4;
        let all = crate::hash::crc32(&b[..end]);
        b[end..].copy_from_slice(&all.to_le_bytes());
        b
    }

    /// `payload` framed as version 2.
    fn framed_v2(payload: &[u8]) -> Vec<u8> {
        let mut b = DENSE_FRAME.header_of(2, payload.len() as u64).to_vec();
        b.extend(payload);
        b.extend([0; 4]);
        reseal(b)
    }

    #[test]
    fn the_layout_round_trips_with_and_without_moments() {
        let w = weights();
        let b = w.encode(40).unwrap();
        assert_eq!(b.len(), 32 + (20 + 4 * 2 + 4 * P) + 4);
        assert_eq!(&b[..8], b"RRMLP\0\0\0");
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 2, "a Criteo mlp stays version 2");
        let f = decode(p(), &b).unwrap();
        assert_eq!(f, DenseFile { step: Some(40), spec: Some(w.spec.clone()), params: w.params.clone(), moments: vec![] });
        let (m, v): (Vec<f32>, Vec<f32>) = ((0..P).map(|i| i as f32).collect(), (0..P).map(|i| i as f32 * 1e-3).collect());
        let b = encode(7, &w.spec, &w.params, &[&m, &v]).unwrap();
        assert_eq!(b.len(), 32 + 20 + 8 + 4 * 3 * P + 4);
        let f = decode(p(), &b).unwrap();
        assert_eq!((f.step, &f.params, &f.moments), (Some(7), &w.params, &vec![m.clone(), v.clone()]));
        // A checkpoint's is a bundle's with moments: --init-dense reads the weights of either.
        let dir = std::env::temp_dir().join(format!("ringrec-dense-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("dense.bin"), &b).unwrap();
        assert_eq!(DenseWeights::read(&dir.join("dense.bin")).unwrap(), w);
        std::fs::remove_dir_all(&dir).unwrap();
        // A model that is not one is not encoded.
        assert!(encode(0, &ModelSpec::mlp(26, 1, 13, vec![0]), &[0.0; 3], &[]).unwrap_err().contains("must be positive"));
        assert!(encode(0, &w.spec, &w.params[1..], &[]).unwrap_err().contains(&format!("need {P}")));
        assert!(encode(0, &w.spec, &w.params, &[&m[..3]]).unwrap_err().contains("moment 0 has 3 values"));
    }

    #[test]
    fn every_model_round_trips_as_version_3_or_4_with_field_dims() {
        for spec in specs() {
            let n = spec.num_params();
            let params: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let (m, v): (Vec<f32>, Vec<f32>) = (params.iter().map(|x| x * 0.1).collect(), params.iter().map(|x| x * x).collect());
            let dims = if spec.field_dims.is_empty() { 0 } else { 4 * (1 + spec.field_dims.len()) };
            let h = 4 * (spec.hidden.len() + spec.bottom.len()) + dims;
            for moments in [vec![], vec![&m[..], &v[..]]] {
                let b = encode(11, &spec, &params, &moments).unwrap();
                assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), if dims == 0 { 3 } else { 4 }, "{}", spec.describe());
                assert_eq!(b.len(), 32 + 60 + h + 4 * n * (1 + moments.len()) + 4, "{}", spec.describe());
                let f = decode(p(), &b).unwrap();
                assert_eq!(f, DenseFile { step: Some(11), spec: Some(spec.clone()), params: params.clone(), moments: moments.iter().map(|x| x.to_vec()).collect() });
            }
            // The record rank 0 shares and a bundle's model.json holds gives the same spec.
            let w = DenseWeights { spec: spec.clone(), params };
            let json = serde_json::to_string(&w).unwrap();
            assert_eq!(serde_json::from_str::<DenseWeights>(&json).unwrap(), w, "{json}");
            assert_eq!(json.contains("cross_layers"), spec.kind == ModelKind::Dcn, "{json}");
            assert_eq!(json.contains("field_dims"), dims > 0, "{json}");
            assert!(encode(0, &spec, &w.params[1..], &[]).unwrap_err().contains(&format!("has {n}")));
        }
        // An mlp over another input than Criteo's cannot be version 2: version 3 records it.
        let other = ModelSpec::mlp(3, 2, 2, vec![4]);
        assert_eq!(mlp_widths(&other), None);
        assert_eq!(mlp_widths(&ModelSpec::mlp(26, 16, 13, vec![256, 128])), Some(vec![429, 256, 128, 1]));
        assert_eq!(mlp_of_widths(&[429, 256, 128, 1]).unwrap(), ModelSpec::mlp(26, 16, 13, vec![256, 128]));
        assert!(mlp_of_widths(&[3, 2, 1]).unwrap_err().contains("is not 26 x dim + 13"));
    }

    #[test]
    fn a_version_3_header_that_is_not_a_model_is_named_by_its_field() {
        let spec = &specs()[1];
        let b = encode(1, spec, &vec![0.5; spec.num_params()], &[]).unwrap();
        let e = |at: usize, v: u32| {
            let mut bad = b.clone();
            bad[32 + at..32 + at + 4].copy_from_slice(&v.to_le_bytes());
            decode(p(), &reseal(bad)).unwrap_err().to_string()
        };
        let kind = e(8, 9);
        assert!(kind.contains("d/dense.bin: invalid dense weight file header field model kind: 9, expected 0 to 4"), "{kind}");
        assert!(e(32, 2).contains("field interaction_self: 2, expected 0 or 1"));
        assert!(e(44, 5).contains("field cross structure: 5"));
        assert!(e(24, 65).contains("field hidden widths: 65, at most 64"));
        assert!(e(16, 1 << 30).contains("field dim: 1073741824, more than"));
        assert!(e(12, 0).contains("field model:"), "{}", e(12, 0));
        // The recorded parameter count must be the spec's.
        let at = 52 + 4 * (spec.hidden.len() + spec.bottom.len());
        assert!(e(at, 7).contains(&format!("field parameter count: 7, but the {} has {}", spec.describe(), spec.num_params())), "{}", e(at, 7));
        // Another kind over the same bytes: the count no longer matches.
        assert!(e(8, 0).contains("field parameter count"), "{}", e(8, 0));
        // Moments that do not fill the payload.
        let k = 48 + 4 * (spec.hidden.len() + spec.bottom.len());
        assert!(e(k, 2).contains("payload bytes, but the dlrm"), "{}", e(k, 2));
        assert!(e(k, 3).contains("3 optimizer moments"), "{}", e(k, 3));
    }

    #[test]
    fn a_version_4_header_names_its_field_dims() {
        let spec = specs().into_iter().find(|s| !s.field_dims.is_empty()).unwrap();
        let b = encode(1, &spec, &vec![0.5; spec.num_params()], &[]).unwrap();
        let g = 48 + 4 * (spec.hidden.len() + spec.bottom.len());
        let e = |at: usize, v: u32| {
            let mut bad = b.clone();
            bad[32 + at..32 + at + 4].copy_from_slice(&v.to_le_bytes());
            decode(p(), &reseal(bad)).unwrap_err().to_string()
        };
        assert!(e(g, 0).contains("field field dims: 0 field dims, expected 1 to"), "{}", e(g, 0));
        assert!(e(g + 4, 1 << 30).contains("field field dims: a dim of 1073741824"), "{}", e(g + 4, 1 << 30));
        // Dims that do not sum to the model's dim describe no model.
        assert!(e(g + 4, 1).contains("field model:"), "{}", e(g + 4, 1));
        // The same bytes framed as version 3: the field dims are read as the moments count.
        let mut v3 = b.clone();
        v3[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(decode(p(), &reseal(v3)).is_err());
    }

    #[test]
    fn damage_is_named() {
        let b = weights().encode(1).unwrap();
        let e = |b: &[u8]| decode(p(), b).unwrap_err();
        let mut bad = b.clone();
        bad[60] ^= 1;
        assert!(matches!(e(&bad), FrameError::Corrupt { part: "contents", .. }), "{}", e(&bad));
        assert!(e(&bad).to_string().contains("d/dense.bin: contents checksum mismatch"));
        assert!(matches!(e(&b[..b.len() - 1]), FrameError::Truncated { .. }));
        assert!(e(b"RRSPARAM\x03\0\0\0").to_string().contains("is not a ringrec dense weight file"));
        let mut newer = b.clone();
        newer[8] = 5;
        let sum = crate::hash::crc32(&newer[..24]);
        newer[24..28].copy_from_slice(&sum.to_le_bytes());
        assert!(e(&newer).to_string().contains("format version 5, newer than version 4"), "{}", e(&newer));
        // A valid frame around a payload that is not a model (a writer's bug).
        let mut payload = 0u64.to_le_bytes().to_vec();
        [1u32, 3, 2, 0].iter().for_each(|x| payload.extend(x.to_le_bytes()));
        payload.extend([0u8; 4 * 8]);
        let err = e(&framed_v2(&payload));
        assert!(err.to_string().contains("the last 1 (one logit)"), "{err}");
        // A version-2 mlp whose input is not Criteo's.
        let mut payload = 0u64.to_le_bytes().to_vec();
        [2u32, 3, 2, 1, 0].iter().for_each(|x| payload.extend(x.to_le_bytes()));
        payload.extend([0u8; 4 * 11]);
        let err = e(&framed_v2(&payload));
        assert!(err.to_string().contains("is not 26 x dim + 13"), "{err}");
        // A NaN.
        let mut nan = weights();
        nan.params[1] = f32::NAN;
        let err = e(&nan.encode(0).unwrap());
        assert!(err.to_string().contains("parameter value 1 is NaN"), "{err}");
    }

    #[test]
    fn old_files_still_read() {
        let w = weights();
        let widths = [39, 2, 1];
        // A bundle's RRMLP version 1.
        let v1 = v1_bytes(&widths, &w.params);
        assert_eq!(v1.len(), 20 + 4 * 2 + 4 * P + 4);
        assert_eq!(decode(p(), &v1).unwrap(), DenseFile { step: None, spec: Some(w.spec.clone()), params: w.params.clone(), moments: vec![] });
        let mut bad = v1.clone();
        bad[30] ^= 1;
        assert!(matches!(decode(p(), &bad), Err(FrameError::Corrupt { .. })));
        assert!(decode(p(), &v1[..v1.len() - 1]).unwrap_err().to_string().contains("truncated or its header is damaged"));
        // A checkpoint's RRDENSE2, Adam and SGD.
        let (m, v) = ([0.1f32, 0.2, 0.3], [0.01f32, 0.02, 0.03]);
        let adam = rrdense2_bytes(12, [&[1.0, 2.0, 3.0], &m, &v]);
        assert_eq!(decode(p(), &adam).unwrap(), DenseFile { step: Some(12), spec: None, params: vec![1.0, 2.0, 3.0], moments: vec![m.to_vec(), v.to_vec()] });
        let sgd = rrdense2_bytes(5, [&[1.0, 2.0], &[], &[]]);
        assert_eq!(decode(p(), &sgd).unwrap(), DenseFile { step: Some(5), spec: None, params: vec![1.0, 2.0], moments: vec![] });
        for cut in [8, 12, 20, adam.len() - 1] {
            assert!(decode(p(), &adam[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = adam.clone();
        long.push(0);
        assert!(decode(p(), &long).unwrap_err().to_string().contains("1 bytes after its last section"));
        // It records no shape: not a source of weights alone.
        let dir = std::env::temp_dir().join(format!("ringrec-dense-old-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("dense.bin"), &adam).unwrap();
        assert!(DenseWeights::read(&dir.join("dense.bin")).unwrap_err().to_string().contains("records no layer widths"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
