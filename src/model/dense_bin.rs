//! `dense.bin`: the one file of the dense model — a checkpoint's (with the dense optimizer's
//! moments) and an export bundle's (without) — its encoder and its one decoder, which also
//! reads every older layout.
//!
//! Version 2: a framed file ([`crate::frame`]; magic `"RRMLP\0\0\0"`), whose payload is
//! (little-endian):
//! ```text
//! offset          size       field
//! 0               8          step (u64): global training steps the weights were trained for
//! 8               4          layers L (u32, 1..=64: hidden layers + 1)
//! 12              4 (L + 1)  widths (u32): input, hidden..., 1
//! 16 + 4L         4          moments K (u32): optimizer vectors after the parameters
//!                            (0: none, SGD or a bundle; 2: Adam's first and second moments)
//! 20 + 4L         4 P        parameters (f32), layer by layer (l = 0..L): W_l, widths[l] x
//!                            widths[l+1] row-major (W_l[i][o] at i * widths[l+1] + o), then
//!                            b_l (widths[l+1] values); P = sum of widths[l] * widths[l+1] + widths[l+1]
//! 20 + 4L + 4P    4 P K      the K moments, P values each, in the parameters' order
//! ```
//! A bundle's `dense.bin` is a checkpoint's without the moments: one layout, one reader
//! (`ringrec train --init-dense` takes either).
//!
//! Older layouts, still read:
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

use crate::frame::{Frame, FrameError, Head};

/// The frame of `dense.bin`.
pub static DENSE_FRAME: Frame = Frame {
    magic: *b"RRMLP\0\0\0",
    version: 2,
    framed_since: 2,
    noun: "dense weight file",
    not_this: "pass a checkpoint's or an export bundle's dense.bin",
    restore: "write it again (ringrec export again; a damaged checkpoint is skipped for the previous one)",
};

/// The first 8 bytes of a checkpoint's `dense.bin` of an older ringrec (see the module docs).
pub const LEGACY_CHECKPOINT_MAGIC: [u8; 8] = *b"RRDENSE2";
/// The most layers a `dense.bin` may have.
pub const MAX_LAYERS: usize = 64;

/// The MLP's layer widths and flat parameters (the layout of [`crate::model::Mlp`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenseWeights {
    /// Input, hidden widths..., 1.
    pub widths: Vec<usize>,
    /// Per layer W (row-major, in x out) then b.
    pub params: Vec<f32>,
}

impl DenseWeights {
    /// The hidden widths (between the input and the logit).
    pub fn hidden(&self) -> &[usize] {
        self.widths.get(1..self.widths.len().saturating_sub(1)).unwrap_or(&[])
    }

    /// The input width.
    pub fn input(&self) -> usize {
        self.widths.first().copied().unwrap_or(0)
    }

    /// Parameters a model of `widths` has.
    pub fn count(widths: &[usize]) -> Option<usize> {
        widths.windows(2).try_fold(0usize, |n, p| n.checked_add(p[0].checked_mul(p[1])?.checked_add(p[1])?))
    }

    /// The `dense.bin` bytes of these weights trained for `step` steps, without moments.
    pub fn encode(&self, step: u64) -> Result<Vec<u8>, String> {
        encode(step, &self.widths, &self.params, &[])
    }

    /// Reads a `dense.bin` of any version ([`read`]) for its weights (`--init-dense`, a
    /// bundle's); a file that records no shape (an older checkpoint's) is refused.
    pub fn read(path: &Path) -> Result<DenseWeights, FrameError> {
        let f = read(path)?;
        if f.widths.is_empty() {
            return Err(DENSE_FRAME.layout(path, "it records no layer widths (a checkpoint's dense.bin of an older ringrec): pass the checkpoint directory itself, or export it to a bundle"));
        }
        Ok(DenseWeights { widths: f.widths, params: f.params })
    }
}

/// What a `dense.bin` holds.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseFile {
    /// Steps trained (none in `RRMLP` version 1).
    pub step: Option<u64>,
    /// Input, hidden widths..., 1 (empty in `RRDENSE2`).
    pub widths: Vec<usize>,
    /// Parameters.
    pub params: Vec<f32>,
    /// The optimizer's moments, each as long as `params` (`RRDENSE2`: its two sections,
    /// empty for SGD).
    pub moments: Vec<Vec<f32>>,
}

/// Why widths, parameters and moments do not make one model; `None` when they do.
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

/// The version-2 `dense.bin` bytes of a model of `widths` with `params`, trained for
/// `step` steps, and the optimizer's `moments` (none for SGD or a bundle); an error says why
/// they do not make one model.
pub fn encode(step: u64, widths: &[usize], params: &[f32], moments: &[&[f32]]) -> Result<Vec<u8>, String> {
    if let Some(e) = shape_error(widths, params.len(), moments.iter().map(|m| m.len())) {
        return Err(e);
    }
    let len = 20 + 4 * (widths.len() - 1) + 4 * params.len() * (1 + moments.len());
    let mut out = Vec::with_capacity(len + 36);
    let mut w = DENSE_FRAME.writer(&mut out, len as u64).map_err(|e| e.to_string())?;
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
            (Head::Framed { .. }, payload) => decode_v2(path, payload)?,
            (Head::Legacy { version: 1 }, _) => decode_v1(path, b)?,
            (Head::Legacy { version }, _) => return Err(FrameError::BadHeader { format: &DENSE_FRAME, path: path.to_path_buf(), field: "version", detail: format!("{version}, expected 1 or 2") }),
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

/// The first non-finite value of `v` (its index), if any (in parallel).
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    use rayon::prelude::*;
    v.par_iter().position_first(|x| !x.is_finite())
}

/// The little-endian u32 at `at`, if `b` holds it.
fn word(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at.checked_add(4)?).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
}

/// The layer count at `at` and the widths after it, checked to be a model's, and its
/// number of parameters.
fn model_at(path: &Path, b: &[u8], at: usize) -> Result<(Vec<usize>, usize), FrameError> {
    let bad = |detail: String| DENSE_FRAME.layout(path, detail);
    let layers = word(b, at).ok_or_else(|| bad("truncated in its header".into()))? as usize;
    if !(1..=MAX_LAYERS).contains(&layers) {
        return Err(bad(format!("{layers} layers, expected 1..={MAX_LAYERS}")));
    }
    let widths = (0..=layers).map(|i| word(b, at + 4 + 4 * i).map(|w| w as usize)).collect::<Option<Vec<usize>>>().ok_or_else(|| bad("truncated in its widths".into()))?;
    let n = DenseWeights::count(&widths).unwrap_or(0);
    match shape_error(&widths, n, std::iter::empty()) {
        Some(e) => Err(bad(e)),
        None => Ok((widths, n)),
    }
}

/// Version 2's payload.
fn decode_v2(path: &Path, p: &[u8]) -> Result<DenseFile, FrameError> {
    let bad = |detail: String| DENSE_FRAME.layout(path, detail);
    let step = p.get(..8).map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes"))).ok_or_else(|| bad("truncated in its header".into()))?;
    let (widths, n) = model_at(path, p, 8)?;
    let at = 12 + 4 * widths.len();
    let k = word(p, at).ok_or_else(|| bad("truncated in its header".into()))? as usize;
    if k > 2 {
        return Err(bad(format!("{k} optimizer moments, expected 0 or 2 at most")));
    }
    let want = n.checked_mul(4 * (1 + k)).and_then(|v| v.checked_add(at + 4));
    if want != Some(p.len()) {
        return Err(bad(format!("{} payload bytes, but widths {widths:?} and {k} moments need {}", p.len(), want.map_or_else(|| "more than 2^64".into(), |w| w.to_string()))));
    }
    let mut vs = p[at + 4..].chunks_exact(4 * n).map(bytemuck::pod_collect_to_vec::<u8, f32>);
    let params = vs.next().unwrap_or_default();
    Ok(DenseFile { step: Some(step), widths, params, moments: vs.collect() })
}

/// `RRMLP` version 1 (the whole file).
fn decode_v1(path: &Path, b: &[u8]) -> Result<DenseFile, FrameError> {
    let bad = |detail: String| DENSE_FRAME.layout(path, detail);
    let (widths, n) = model_at(path, b, 12)?;
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
    Ok(DenseFile { step: None, widths, params: bytemuck::pod_collect_to_vec(&body[at..]), moments: Vec::new() })
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
    Ok(DenseFile { step: Some(step), widths: Vec::new(), params, moments })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("d/dense.bin")
    }

    fn weights() -> DenseWeights {
        DenseWeights { widths: vec![3, 2, 1], params: (0..(3 * 2 + 2 + 2 + 1)).map(|i| i as f32 * 0.5 - 1.0).collect() }
    }

    /// `RRMLP` version 1 as the old `DenseWeights::encode` wrote it (its documented layout).
    fn v1_bytes(w: &DenseWeights) -> Vec<u8> {
        let mut b = b"RRMLP\0\0\0".to_vec();
        b.extend(1u32.to_le_bytes());
        b.extend(((w.widths.len() - 1) as u32).to_le_bytes());
        w.widths.iter().for_each(|x| b.extend((*x as u32).to_le_bytes()));
        w.params.iter().for_each(|x| b.extend(x.to_le_bytes()));
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

    #[test]
    fn the_layout_round_trips_with_and_without_moments() {
        let w = weights();
        let b = w.encode(40).unwrap();
        assert_eq!(b.len(), 32 + (20 + 4 * 2 + 4 * 11) + 4);
        assert_eq!(&b[..8], b"RRMLP\0\0\0");
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 2);
        let f = decode(p(), &b).unwrap();
        assert_eq!(f, DenseFile { step: Some(40), widths: w.widths.clone(), params: w.params.clone(), moments: vec![] });
        let (m, v): (Vec<f32>, Vec<f32>) = ((0..11).map(|i| i as f32).collect(), (0..11).map(|i| i as f32 * 1e-3).collect());
        let b = encode(7, &w.widths, &w.params, &[&m, &v]).unwrap();
        assert_eq!(b.len(), 32 + 20 + 8 + 4 * 33 + 4);
        let f = decode(p(), &b).unwrap();
        assert_eq!((f.step, &f.params, &f.moments), (Some(7), &w.params, &vec![m.clone(), v.clone()]));
        // A checkpoint's is a bundle's with moments: --init-dense reads the weights of either.
        let dir = std::env::temp_dir().join(format!("ringrec-dense-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("dense.bin"), &b).unwrap();
        assert_eq!(DenseWeights::read(&dir.join("dense.bin")).unwrap(), w);
        std::fs::remove_dir_all(&dir).unwrap();
        // A model that is not one is not encoded.
        assert!(encode(0, &[3, 2, 2], &[0.0; 14], &[]).unwrap_err().contains("the last 1"));
        assert!(encode(0, &[3, 2, 1], &[0.0; 10], &[]).unwrap_err().contains("need 11"));
        assert!(encode(0, &w.widths, &w.params, &[&m[..3]]).unwrap_err().contains("moment 0 has 3 values"));
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
        newer[8] = 3;
        let sum = crate::hash::crc32(&newer[..24]);
        newer[24..28].copy_from_slice(&sum.to_le_bytes());
        assert!(e(&newer).to_string().contains("format version 3, newer than version 2"), "{}", e(&newer));
        // A valid frame around a payload that is not a model (a writer's bug).
        let mut payload = 0u64.to_le_bytes().to_vec();
        [1u32, 3, 2, 0].iter().for_each(|x| payload.extend(x.to_le_bytes()));
        payload.extend([0u8; 4 * 8]);
        let err = e(&DENSE_FRAME.encode(&payload));
        assert!(err.to_string().contains("the last 1 (one logit)"), "{err}");
        // A NaN.
        let nan = DenseWeights { widths: vec![1, 1], params: vec![0.5, f32::NAN] };
        let err = e(&nan.encode(0).unwrap());
        assert!(err.to_string().contains("parameter value 1 is NaN"), "{err}");
    }

    #[test]
    fn old_files_still_read() {
        let w = weights();
        // A bundle's RRMLP version 1.
        let v1 = v1_bytes(&w);
        assert_eq!(v1.len(), 20 + 4 * 2 + 4 * 11 + 4);
        assert_eq!(decode(p(), &v1).unwrap(), DenseFile { step: None, widths: w.widths.clone(), params: w.params.clone(), moments: vec![] });
        let mut bad = v1.clone();
        bad[30] ^= 1;
        assert!(matches!(decode(p(), &bad), Err(FrameError::Corrupt { .. })));
        assert!(decode(p(), &v1[..v1.len() - 1]).unwrap_err().to_string().contains("truncated or its header is damaged"));
        // A checkpoint's RRDENSE2, Adam and SGD.
        let (m, v) = ([0.1f32, 0.2, 0.3], [0.01f32, 0.02, 0.03]);
        let adam = rrdense2_bytes(12, [&[1.0, 2.0, 3.0], &m, &v]);
        assert_eq!(decode(p(), &adam).unwrap(), DenseFile { step: Some(12), widths: vec![], params: vec![1.0, 2.0, 3.0], moments: vec![m.to_vec(), v.to_vec()] });
        let sgd = rrdense2_bytes(5, [&[1.0, 2.0], &[], &[]]);
        assert_eq!(decode(p(), &sgd).unwrap(), DenseFile { step: Some(5), widths: vec![], params: vec![1.0, 2.0], moments: vec![] });
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
