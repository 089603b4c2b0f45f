//! Checkpoints: everything a run needs to continue bit-identically.
//!
//! `<dir>/dense.json` (step, epoch position, dense optimizer state, config fingerprint) with
//! `<dir>/dense.bin` (the dense parameters and the optimizer moments, little-endian f32) and
//! `<dir>/table-<step>.rrt` (the host table of that step, byte for byte). Rank 0 writes the dense part; the
//! leader of host 0 writes the table (every host's table is identical). Each file is
//! written to a temporary name, fsynced and renamed, the directory fsynced, so a crash
//! mid-save leaves the previous checkpoint whole; `dense.json` is renamed last and names
//! the step, whose table file carries the step in its name, so a reader never pairs files
//! of different steps (`step` is repeated in the binary header and checked). Older tables
//! are removed after `dense.json` moved on.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::fileio::{write_atomic, IoError};
use crate::model::{DenseOptimState, DenseOptimizer};

/// The dense half of a checkpoint.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DenseCheckpoint {
    /// Global steps completed.
    pub step: u64,
    /// Epoch of the next step.
    pub epoch: u64,
    /// Step within that epoch.
    pub step_in_epoch: u64,
    /// What the run was configured with; a resume with another configuration is refused.
    pub fingerprint: String,
    /// Optimizer kind, lr, step.
    pub optimizer: DenseOptimizer,
    /// Dense learning rate.
    pub lr: f32,
    /// Optimizer steps.
    pub optim_step: u64,
    /// Parameters (stored in dense.bin, not in the JSON).
    #[serde(skip)]
    pub params: Vec<f32>,
    /// Adam moments (dense.bin).
    #[serde(skip)]
    pub m: Vec<f32>,
    /// Adam moments (dense.bin).
    #[serde(skip)]
    pub v: Vec<f32>,
}

const BIN_MAGIC: &[u8; 8] = b"RRDENSE1";

fn push_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    out.extend_from_slice(bytemuck::cast_slice(v));
}

fn take_f32s(b: &[u8], at: &mut usize) -> Result<Vec<f32>, String> {
    let n = b.get(*at..*at + 8).ok_or("truncated")?;
    let n = u64::from_le_bytes(n.try_into().map_err(|_| "truncated")?) as usize;
    *at += 8;
    let bytes = b.get(*at..*at + n.checked_mul(4).ok_or("bad length")?).ok_or("truncated")?;
    *at += n * 4;
    Ok(bytemuck::pod_collect_to_vec(bytes))
}

impl DenseCheckpoint {
    /// Builds one from the optimizer state.
    pub fn new(step: u64, epoch: u64, step_in_epoch: u64, fingerprint: String, params: &[f32], opt: &DenseOptimState) -> DenseCheckpoint {
        DenseCheckpoint {
            step,
            epoch,
            step_in_epoch,
            fingerprint,
            optimizer: opt.kind,
            lr: opt.lr,
            optim_step: opt.step,
            params: params.to_vec(),
            m: opt.m.clone(),
            v: opt.v.clone(),
        }
    }

    /// The optimizer state it holds.
    pub fn optim_state(&self) -> DenseOptimState {
        DenseOptimState { kind: self.optimizer, lr: self.lr, step: self.optim_step, m: self.m.clone(), v: self.v.clone() }
    }

    /// Writes `dense.bin` then `dense.json` into `dir` (created if needed).
    pub fn save(&self, dir: &Path) -> Result<(), IoError> {
        std::fs::create_dir_all(dir).map_err(|e| IoError::new(dir, "create the directory", e))?;
        let mut bin = Vec::with_capacity(16 + 4 * (self.params.len() + self.m.len() + self.v.len()) + 24);
        bin.extend_from_slice(BIN_MAGIC);
        bin.extend_from_slice(&self.step.to_le_bytes());
        push_f32s(&mut bin, &self.params);
        push_f32s(&mut bin, &self.m);
        push_f32s(&mut bin, &self.v);
        write_atomic(&dir.join("dense.bin"), 0o644, |w| w.write_all(&bin))?;
        write_atomic(&dir.join("dense.json"), 0o644, |w| serde_json::to_writer_pretty(w, self).map_err(std::io::Error::other))
    }

    /// Reads a checkpoint written by [`DenseCheckpoint::save`].
    pub fn load(dir: &Path) -> Result<DenseCheckpoint, String> {
        let jp = dir.join("dense.json");
        let json = std::fs::read(&jp).map_err(|e| format!("{}: {e}; is --checkpoint-dir the directory of an earlier run?", jp.display()))?;
        let mut ck: DenseCheckpoint = serde_json::from_slice(&json).map_err(|e| format!("{}: not a ringrec checkpoint ({e})", jp.display()))?;
        let bp = dir.join("dense.bin");
        let bin = std::fs::read(&bp).map_err(|e| format!("{}: {e}", bp.display()))?;
        let bad = |what: &str| format!("{}: {what}; the checkpoint is damaged, resume from an older copy or start again", bp.display());
        if bin.get(..8) != Some(&BIN_MAGIC[..]) {
            return Err(bad("wrong magic"));
        }
        let step = u64::from_le_bytes(bin.get(8..16).and_then(|b| b.try_into().ok()).ok_or_else(|| bad("truncated"))?);
        if step != ck.step {
            return Err(bad(&format!("holds step {step} but dense.json says {}", ck.step)));
        }
        let mut at = 16;
        ck.params = take_f32s(&bin, &mut at).map_err(|e| bad(&e))?;
        ck.m = take_f32s(&bin, &mut at).map_err(|e| bad(&e))?;
        ck.v = take_f32s(&bin, &mut at).map_err(|e| bad(&e))?;
        if at != bin.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(ck)
    }
}

/// Path of the table of global step `step` inside a checkpoint directory.
pub fn table_path(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("table-{step:012}.rrt"))
}

/// Removes tables of steps before `step` (called once `dense.json` names `step`).
pub fn remove_older_tables(dir: &Path, step: u64) {
    let keep = table_path(dir, step);
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("table-") && name.ends_with(".rrt") && p != keep {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn round_trip_and_damage_is_refused() {
        let dir = std::env::temp_dir().join(format!("ringrec-ckpt-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut opt = DenseOptimState::new(DenseOptimizer::Adam, 0.01, 3);
        (opt.step, opt.m, opt.v) = (1, vec![0.01, -0.02, 0.03], vec![1e-5, 4e-5, 9e-5]);
        let ck = DenseCheckpoint::new(7, 1, 2, "cfg".into(), &[1.5, -2.0, 0.25], &opt);
        ck.save(&dir).unwrap();
        let back = DenseCheckpoint::load(&dir).unwrap();
        assert_eq!(back, ck);
        assert_eq!(back.optim_state(), opt);
        let bin = dir.join("dense.bin");
        let bytes = std::fs::read(&bin).unwrap();
        std::fs::write(&bin, &bytes[..bytes.len() - 3]).unwrap();
        assert!(DenseCheckpoint::load(&dir).unwrap_err().contains("damaged"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
