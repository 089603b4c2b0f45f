//! The dense part of the CTR network on the CPU: an MLP (ReLU hidden layers) to one logit,
//! binary cross-entropy with logits.
//!
//! Parameters live in one flat `Vec<f32>` — per layer `W` (in x out, row-major) then `b`
//! (out) — so the dense gradient is one flat buffer for a single allreduce.

use super::gemm::sgemm;

/// Shape of the MLP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpShape {
    /// Input width (embedding dims x fields + dense features).
    pub input: usize,
    /// Hidden layer widths (ReLU after each).
    pub hidden: Vec<usize>,
}

impl MlpShape {
    /// Layer widths, input to the single output.
    pub fn widths(&self) -> Vec<usize> {
        let mut w = vec![self.input];
        w.extend(&self.hidden);
        w.push(1);
        w
    }
    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.widths().windows(2).map(|p| p[0] * p[1] + p[1]).sum()
    }
    /// Multiply-adds x 2 per sample for forward + backward (weights and inputs gradients).
    pub fn flops_per_sample(&self) -> f64 {
        let macs: usize = self.widths().windows(2).map(|p| p[0] * p[1]).sum();
        6.0 * macs as f64
    }
}

/// The MLP with its parameters and scratch buffers.
pub struct Mlp {
    shape: MlpShape,
    widths: Vec<usize>,
    /// (weight offset, bias offset) per layer in the flat parameter vector.
    offsets: Vec<(usize, usize)>,
    params: Vec<f32>,
    acts: Vec<Vec<f32>>,
    deltas: Vec<Vec<f32>>,
    threads: usize,
}

/// splitmix64: a small, fast, well-mixed generator for deterministic initialisation.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Mlp {
    /// Glorot-uniform weights and zero biases drawn from `seed` (the same on every rank).
    pub fn new(shape: MlpShape, seed: u64, threads: usize) -> Mlp {
        let widths = shape.widths();
        let mut offsets = Vec::new();
        let mut at = 0;
        for p in widths.windows(2) {
            offsets.push((at, at + p[0] * p[1]));
            at += p[0] * p[1] + p[1];
        }
        let mut params = vec![0f32; at];
        let mut rng = seed ^ 0xD1B5_4A32_D192_ED03;
        for (l, p) in widths.windows(2).enumerate() {
            let limit = (6.0 / (p[0] + p[1]) as f64).sqrt();
            let w = offsets[l].0;
            for x in &mut params[w..w + p[0] * p[1]] {
                let u = (splitmix64(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                *x = ((2.0 * u - 1.0) * limit) as f32;
            }
        }
        Mlp { shape, widths, offsets, params, acts: Vec::new(), deltas: Vec::new(), threads: threads.max(1) }
    }

    /// The shape.
    pub fn shape(&self) -> &MlpShape {
        &self.shape
    }
    /// Flat parameters.
    pub fn params(&self) -> &[f32] {
        &self.params
    }
    /// Flat parameters, to update or broadcast into.
    pub fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }
    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.params.len()
    }

    fn ensure(&mut self, batch: usize) {
        let layers = self.widths.len();
        if self.acts.len() != layers {
            self.acts = vec![Vec::new(); layers];
            self.deltas = vec![Vec::new(); layers];
        }
        for (l, w) in self.widths.iter().enumerate() {
            if self.acts[l].len() < batch * w {
                self.acts[l].resize(batch * w, 0.0);
                self.deltas[l].resize(batch * w, 0.0);
            }
        }
    }

    /// Forward pass of `batch` rows of `x` (batch x input); writes logits into `out`.
    pub fn forward(&mut self, x: &[f32], batch: usize, out: &mut [f32]) {
        self.ensure(batch);
        let last = self.widths.len() - 2;
        for l in 0..=last {
            let (fan_in, fan_out) = (self.widths[l], self.widths[l + 1]);
            let (w, b) = self.offsets[l];
            let (lo, hi) = self.acts.split_at_mut(l + 1);
            // Layer 0 reads the caller's input in place (no copy into acts[0]).
            let input = if l == 0 { &x[..batch * fan_in] } else { &lo[l][..batch * fan_in] };
            let z = &mut hi[0][..batch * fan_out];
            sgemm(batch, fan_out, fan_in, input, false, &self.params[w..w + fan_in * fan_out], false, z, false, self.threads);
            // Fused bias (+ ReLU on hidden layers): one pass over the output.
            let bias = &self.params[b..b + fan_out];
            for row in z.chunks_exact_mut(fan_out) {
                if l < last {
                    for (v, bb) in row.iter_mut().zip(bias) {
                        *v = (*v + bb).max(0.0);
                    }
                } else {
                    for (v, bb) in row.iter_mut().zip(bias) {
                        *v += bb;
                    }
                }
            }
        }
        out[..batch].copy_from_slice(&self.acts[last + 1][..batch]);
    }

    /// Forward, binary cross-entropy against `labels`, backward. Gradients are of
    /// `loss_scale * sum_i loss_i` (the trainer passes 1 / global batch, so summing the
    /// ranks' gradients gives the gradient of the global mean loss). Writes the parameter
    /// gradient into `grad` (overwritten) and the input gradient into `dx` (batch x input).
    /// Returns the unscaled sum of the per-sample losses.
    pub fn forward_backward(&mut self, x: &[f32], labels: &[f32], batch: usize, loss_scale: f32, grad: &mut [f32], dx: &mut [f32]) -> f64 {
        let mut logits = vec![0f32; batch];
        self.forward(x, batch, &mut logits);
        let layers = self.widths.len();
        let mut loss = 0f64;
        {
            let d = &mut self.deltas[layers - 1][..batch];
            for i in 0..batch {
                let (z, y) = (logits[i], labels[i]);
                loss += bce_with_logits(z, y) as f64;
                d[i] = (sigmoid(z) - y) * loss_scale;
            }
        }
        for l in (0..layers - 1).rev() {
            let (fan_in, fan_out) = (self.widths[l], self.widths[l + 1]);
            let (w, b) = self.offsets[l];
            let delta = &self.deltas[l + 1][..batch * fan_out];
            let input = if l == 0 { &x[..batch * fan_in] } else { &self.acts[l][..batch * fan_in] };
            // dW = input^T * delta; db = column sums of delta.
            sgemm(fan_in, fan_out, batch, input, true, delta, false, &mut grad[w..w + fan_in * fan_out], false, self.threads);
            let db = &mut grad[b..b + fan_out];
            db.fill(0.0);
            for row in delta.chunks_exact(fan_out) {
                for (g, d) in db.iter_mut().zip(row) {
                    *g += d;
                }
            }
            // d(input) = delta * W^T, then through the ReLU of the layer below.
            let (lo, hi) = self.deltas.split_at_mut(l + 1);
            let target: &mut [f32] = if l == 0 { &mut dx[..batch * fan_in] } else { &mut lo[l][..batch * fan_in] };
            sgemm(batch, fan_in, fan_out, &hi[0][..batch * fan_out], false, &self.params[w..w + fan_in * fan_out], true, target, false, self.threads);
            if l > 0 {
                for (d, a) in target.iter_mut().zip(&self.acts[l][..batch * fan_in]) {
                    if *a <= 0.0 {
                        *d = 0.0;
                    }
                }
            }
        }
        loss
    }
}

/// Logistic function.
pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Numerically stable binary cross-entropy of a logit `z` against a 0/1 label `y`.
pub fn bce_with_logits(z: f32, y: f32) -> f32 {
    z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loss_of(m: &mut Mlp, x: &[f32], y: &[f32], batch: usize) -> f64 {
        let mut g = vec![0f32; m.num_params()];
        let mut dx = vec![0f32; x.len()];
        m.forward_backward(x, y, batch, 1.0, &mut g, &mut dx)
    }

    #[test]
    fn gradients_match_finite_differences() {
        let shape = MlpShape { input: 7, hidden: vec![5, 4] };
        let mut m = Mlp::new(shape.clone(), 42, 1);
        assert_eq!(m.num_params(), 7 * 5 + 5 + 5 * 4 + 4 + 4 + 1);
        let batch = 6;
        let mut rng = 99u64;
        let x: Vec<f32> = (0..batch * 7).map(|_| (splitmix64(&mut rng) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect();
        let y: Vec<f32> = (0..batch).map(|i| (i % 2) as f32).collect();
        let mut g = vec![0f32; m.num_params()];
        let mut dx = vec![0f32; x.len()];
        m.forward_backward(&x, &y, batch, 1.0, &mut g, &mut dx);
        // Central differences at two step sizes; where they disagree a ReLU kink lies in
        // between and the point is skipped (at most a few).
        let mut skipped = 0;
        for (p, want) in g.iter().enumerate() {
            let orig = m.params[p];
            let mut fds = [0f32; 2];
            for (j, h) in [1e-2f32, 5e-3].into_iter().enumerate() {
                m.params[p] = orig + h;
                let up = loss_of(&mut m, &x, &y, batch);
                m.params[p] = orig - h;
                let down = loss_of(&mut m, &x, &y, batch);
                fds[j] = ((up - down) / (2.0 * h as f64)) as f32;
            }
            m.params[p] = orig;
            if (fds[0] - fds[1]).abs() > 1e-3 * (1.0 + fds[1].abs()) {
                skipped += 1;
                continue;
            }
            assert!((fds[1] - want).abs() <= 2e-3 * (1.0 + fds[1].abs()), "param {p}: fd {fds:?} vs {want}");
        }
        assert!(skipped <= m.num_params() / 10, "{skipped} kinks");
        let h = 1e-3f32;
        let mut xp = x.clone();
        for i in (0..x.len()).step_by(5) {
            xp[i] = x[i] + h;
            let up = loss_of(&mut m, &xp, &y, batch);
            xp[i] = x[i] - h;
            let down = loss_of(&mut m, &xp, &y, batch);
            xp[i] = x[i];
            let fd = ((up - down) / (2.0 * h as f64)) as f32;
            assert!((fd - dx[i]).abs() <= 2e-3 * (1.0 + fd.abs()), "input {i}: fd {fd} vs {}", dx[i]);
        }
    }

    #[test]
    fn bce_is_stable_and_correct() {
        assert!((bce_with_logits(0.0, 1.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!((bce_with_logits(100.0, 1.0)).abs() < 1e-6);
        assert!((bce_with_logits(-100.0, 1.0) - 100.0).abs() < 1e-3);
        assert!(bce_with_logits(-100.0, 0.0).is_finite());
    }

    #[test]
    fn same_seed_same_params_and_shape_counts() {
        let s = MlpShape { input: 429, hidden: vec![256, 128] };
        assert_eq!(s.num_params(), 429 * 256 + 256 + 256 * 128 + 128 + 128 + 1);
        assert_eq!(Mlp::new(s.clone(), 7, 1).params(), Mlp::new(s.clone(), 7, 2).params());
        assert_ne!(Mlp::new(s.clone(), 7, 1).params(), Mlp::new(s, 8, 1).params());
    }
}
