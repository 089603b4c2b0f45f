//! Dense optimizers over the flat parameter vector (run identically on every rank, on the
//! allreduced gradient, so replicas stay bit-identical).

/// Which dense optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
pub enum DenseOptimizer {
    /// Plain SGD: `w -= lr * g`.
    Sgd,
    /// Adam (Kingma & Ba) with bias correction.
    Adam,
}

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

    /// One step on `params` with gradient `grad`.
    pub fn step(&mut self, params: &mut [f32], grad: &[f32]) {
        self.step += 1;
        match self.kind {
            DenseOptimizer::Sgd => {
                for (p, g) in params.iter_mut().zip(grad) {
                    *p -= self.lr * g;
                }
            }
            DenseOptimizer::Adam => {
                let (alpha, eps_hat) = adam_factors(self.lr, self.step);
                for i in 0..params.len().min(grad.len()) {
                    let g = grad[i];
                    self.m[i] = BETA1 * self.m[i] + (1.0 - BETA1) * g;
                    self.v[i] = BETA2 * self.v[i] + (1.0 - BETA2) * g * g;
                    params[i] -= alpha * self.m[i] / (self.v[i].sqrt() + eps_hat);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sgd_and_adam_first_steps_by_hand() {
        let mut p = vec![1.0f32, -2.0];
        let mut s = DenseOptimState::new(DenseOptimizer::Sgd, 0.1, 2);
        s.step(&mut p, &[0.5, -1.0]);
        assert_eq!(p, vec![0.95, -1.9]);
        // Adam's first step moves each weight by ~lr * sign(g).
        let mut p = vec![1.0f32, -2.0];
        let mut a = DenseOptimState::new(DenseOptimizer::Adam, 0.01, 2);
        a.step(&mut p, &[0.5, -1.0]);
        assert!((p[0] - 0.99).abs() < 1e-6 && (p[1] + 1.99).abs() < 1e-6, "{p:?}");
        assert_eq!(a.step, 1);
    }
}
