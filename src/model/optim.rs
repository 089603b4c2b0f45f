//! Dense optimizers over the flat parameter vector (run identically on every rank, on the
//! allreduced gradient, so replicas stay bit-identical): [`Optimizer`] on a device, and
//! its state on the host ([`DenseOptimState`], what checkpoints hold).

use crate::device::{Device, DeviceError, DeviceResult, Op};

/// Which dense optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DenseOptimizer {
    /// Plain SGD: `w -= lr * g`.
    Sgd,
    /// Adam (Kingma & Ba) with bias correction.
    Adam,
}
crate::config::named_enum!(DenseOptimizer { Sgd => "sgd", Adam => "adam" });

/// Optimizer state.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DenseOptimState {
    /// Which optimizer.
    pub kind: DenseOptimizer,
    /// Learning rate.
    pub lr: f32,
    /// Steps taken.
    pub step: u64,
    /// Adam first moments (empty for SGD).
    pub m: Vec<f32>,
    /// Adam second moments (empty for SGD).
    pub v: Vec<f32>,
}

/// Adam's first-moment decay.
pub const BETA1: f32 = 0.9;
/// Adam's second-moment decay.
pub const BETA2: f32 = 0.999;
/// Adam's epsilon.
pub const EPS: f32 = 1e-8;

/// Adam's bias correction at step `t` (1-based) folded into the step size and epsilon:
/// `(alpha, eps_hat)` with `alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)` and
/// `eps_hat = eps * sqrt(1 - beta2^t)`; the update is `p -= alpha * m / (sqrt(v) + eps_hat)`.
/// The CPU step and the GPU kernel both use it, so they round alike.
pub fn adam_factors(lr: f32, t: u64) -> (f32, f32) {
    let t = t.min(i32::MAX as u64) as i32;
    let c1 = 1.0 - BETA1.powi(t);
    let c2 = 1.0 - BETA2.powi(t);
    (lr * c2.sqrt() / c1, EPS * c2.sqrt())
}

impl DenseOptimState {
    /// Fresh state for `n` parameters.
    pub fn new(kind: DenseOptimizer, lr: f32, n: usize) -> DenseOptimState {
        let (m, v) = match kind {
            DenseOptimizer::Sgd => (Vec::new(), Vec::new()),
            DenseOptimizer::Adam => (vec![0.0; n], vec![0.0; n]),
        };
        DenseOptimState { kind, lr, step: 0, m, v }
    }
}

/// A dense optimizer with its state on a device.
pub struct Optimizer<D: Device> {
    kind: DenseOptimizer,
    lr: f32,
    step: u64,
    /// Adam's moments (one element each for SGD).
    m: D::Buf<f32>,
    v: D::Buf<f32>,
    n: usize,
}

impl<D: Device> Optimizer<D> {
    /// The optimizer `state` (fresh or resumed) for `n` parameters, on `dev`.
    pub fn new(dev: &D, state: &DenseOptimState, n: usize) -> DeviceResult<Optimizer<D>> {
        let (m, v) = match state.kind {
            DenseOptimizer::Sgd => (dev.alloc(0)?, dev.alloc(0)?),
            DenseOptimizer::Adam => {
                if state.m.len() != n || state.v.len() != n {
                    return Err(DeviceError::refused("restoring the optimizer", format!("moments of {} and {} values for {n} parameters", state.m.len(), state.v.len())));
                }
                (dev.buffer_from(&state.m)?, dev.buffer_from(&state.v)?)
            }
        };
        Ok(Optimizer { kind: state.kind, lr: state.lr, step: state.step, m, v, n })
    }

    /// One step on `params` with the (allreduced) gradient of each of `layers` (its range
    /// in the flat parameters, its gradient buffer).
    pub fn step(&mut self, dev: &D, params: &mut D::Buf<f32>, layers: &[(std::ops::Range<usize>, &D::Buf<f32>)]) -> DeviceResult<()> {
        self.step += 1;
        let (alpha, eps_hat) = adam_factors(self.lr, self.step);
        for (r, g) in layers {
            let (at, n) = (r.start, r.len());
            match self.kind {
                DenseOptimizer::Sgd => dev.exec(Op::Sgd { p: params, at, g, lr: self.lr, n })?,
                DenseOptimizer::Adam => dev.exec(Op::Adam { p: params, at, g, m: &mut self.m, v: &mut self.v, alpha, beta1: BETA1, beta2: BETA2, eps_hat, n })?,
            }
        }
        Ok(())
    }

    /// The state with its moments copied to the host (checkpoints).
    pub fn state(&self, dev: &D) -> DeviceResult<DenseOptimState> {
        let (m, v) = match self.kind {
            DenseOptimizer::Sgd => (Vec::new(), Vec::new()),
            DenseOptimizer::Adam => (dev.to_vec(&self.m, self.n)?, dev.to_vec(&self.v, self.n)?),
        };
        Ok(DenseOptimState { kind: self.kind, lr: self.lr, step: self.step, m, v })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::CpuDevice;

    fn run(kind: DenseOptimizer, lr: f32, p: &[f32], g: &[f32]) -> (Vec<f32>, DenseOptimState) {
        let dev = CpuDevice::new(1);
        let mut o = Optimizer::new(&dev, &DenseOptimState::new(kind, lr, p.len()), p.len()).unwrap();
        let mut params = p.to_vec();
        o.step(&dev, &mut params, &[(0..p.len(), &g.to_vec())]).unwrap();
        (params, o.state(&dev).unwrap())
    }

    #[test]
    fn sgd_and_adam_first_steps_by_hand() {
        let (p, _) = run(DenseOptimizer::Sgd, 0.1, &[1.0, -2.0], &[0.5, -1.0]);
        assert_eq!(p, vec![0.95, -1.9]);
        // Adam's first step moves each weight by ~lr * sign(g).
        let (p, a) = run(DenseOptimizer::Adam, 0.01, &[1.0, -2.0], &[0.5, -1.0]);
        assert!((p[0] - 0.99).abs() < 1e-6 && (p[1] + 1.99).abs() < 1e-6, "{p:?}");
        assert_eq!(a.step, 1);
        assert_eq!(a.m.len(), 2);
    }

    #[test]
    fn a_state_of_the_wrong_size_is_refused() {
        let dev = CpuDevice::new(1);
        let s = DenseOptimState::new(DenseOptimizer::Adam, 0.1, 3);
        assert!(Optimizer::new(&dev, &s, 4).err().unwrap().to_string().contains("moments of 3 and 3 values for 4 parameters"));
    }
}
